import contextlib

import pytest
import torch

from leantrain.model.training_speed import measure_training_speed


def test_a_real_measurement_of_the_embedded_classifier_leaves_the_random_state_alone(minilm_dir):
    torch.manual_seed(7)
    before = torch.random.get_rng_state()
    speed = measure_training_speed(str(minilm_dir), "fp32", batch=4, length=8, steps=1)
    assert torch.equal(torch.random.get_rng_state(), before)  # the run seeds after; a caller may not
    assert 0 < speed < 1e5


def test_the_measured_steps_run_their_forward_within_what_the_task_gives(minilm_dir):
    entered = []

    @contextlib.contextmanager
    def counted():
        entered.append(torch.is_grad_enabled())
        yield

    measure_training_speed(str(minilm_dir), "fp32", batch=2, length=8, steps=2, within=lambda model: counted)
    assert entered == [True] * 3  # the warm-up and the two timed steps, each a training forward
    assert measure_training_speed(str(minilm_dir), "fp32", batch=2, length=8, steps=1, within=lambda m: None) > 0


@pytest.mark.slow  # reads and tokenizes the whole tweet corpus (38k rows)
def test_the_measured_length_is_what_the_default_jobs_batches_pad_to(minilm_dir):
    import numpy as np
    from transformers import AutoTokenizer

    from leantrain.config.sections import DEFAULT_JOB_BATCH_SIZE, DEFAULT_JOB_LENGTH
    from leantrain.data.batching import GlobalBatchSampler
    from leantrain.data.sources import embedded_data_path, read_table
    from leantrain.model.loading import tweet_tokenizer

    table, _ = read_table(str(embedded_data_path()))
    tokenizer = tweet_tokenizer(AutoTokenizer.from_pretrained(minilm_dir), "MiniLM")  # as the job: --normalize-tweets
    lengths = np.array([len(ids) for ids in tokenizer(table["text"].tolist(), truncation=True)["input_ids"]])
    batches = GlobalBatchSampler(lengths, DEFAULT_JOB_BATCH_SIZE, seed=42).global_batches()
    padded = np.mean([lengths[batch].max() for batch in batches])  # the job's batches: grouped by length
    assert round(padded) == DEFAULT_JOB_LENGTH, padded
