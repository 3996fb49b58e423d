"""A step the device never waits for: no host reads of device values (host syncs) in an optimizer step that does not
log, evaluate or save, for every task family with a fixture, under fp32 and bf16, with accumulation, clipping, the NaN
guard, the OOM guard (--auto) and local SGD's settings on. Reads inside transformers' own model code (eager
transformers reads a padded batch's mask, or packed rows' positions, to pick its attention path) are counted apart:
held to zero too: leantrain makes those masks, or answers transformers' checks of them, from the host's facts
(`model.masks`).

On a CPU every tensor is a host tensor, so `HostSyncs` counts every read the loop makes of a tensor (what would wait
for a GPU); the data loader's collating is left out. GRPO samples completions with the model each step and reads
them: it syncs by design and is not held to zero here.
"""

from __future__ import annotations

import pytest

from leantrain import TrainConfig, train
from leantrain.telemetry.syncs import HostSyncs
from leantrain.training.hooks import SyncsPerStep
from tests.conftest import make_sentiment_rows, write_csv

#: six steps, logged at 4 and 6: steps 1, 2, 3 and 5 neither log, evaluate nor save
QUIET_STEPS = (1, 2, 3, 5)
#: a step that syncs: accumulation of 2 micro-batches, clipping, the NaN guard (--on-nan stop is the default)
STEP = dict(max_steps=6, log_every=4, grad_accum=2, max_grad_norm=1.0, progress=False, report=False, seed=1)


def syncs_per_step(cfg: TrainConfig):
    with HostSyncs() as syncs:
        steps = SyncsPerStep(syncs)
        result = train(cfg, hooks=steps)
    steps.finish()
    return steps.steps, result


def assert_quiet(cfg: TrainConfig, model_too: bool = True) -> None:
    """No sync in a quiet step; with `model_too`, not inside transformers either (the masks it would read to
    choose an attention path are made from the host's facts: `model.masks`)."""
    steps, result = syncs_per_step(cfg)
    assert result.metrics["optimizer_steps"] == 6
    assert set(QUIET_STEPS) <= set(steps), steps
    noisy = {s: dict(steps[s]) for s in QUIET_STEPS if any(model_too or not k.startswith("model_") for k in steps[s])}
    assert not noisy, f"host syncs in steps that neither log, evaluate nor save: {noisy}"
    assert steps[4], "a log step reads the loss: the counter sees nothing"  # the counter itself works


@pytest.fixture()
def classification(tiny_model_dir, sentiment_csv, tmp_path):
    def make(**changes) -> TrainConfig:
        base = dict(
            model=str(tiny_model_dir),
            data=str(sentiment_csv),
            cache_dir=str(tmp_path / "cache"),
            output_dir=str(tmp_path / f"run{len(list(tmp_path.glob('run*')))}"),
            batch_size=8,
            optimizer="adamw",
            **STEP,
        )
        return TrainConfig(**{**base, **changes})

    return make


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_a_quiet_step_never_reads_the_device(classification, precision):
    assert_quiet(classification(precision=precision))


def test_with_the_oom_guard_and_skip_on_nan_a_quiet_step_never_reads_the_device(classification):
    assert_quiet(classification(auto=True, memory="64GiB", on_nan="skip", batch_size=8))


def test_with_local_sgd_set_a_quiet_step_never_reads_the_device(classification):
    """One process: local SGD is off (nothing to average) but its settings run the loop's local-SGD branch."""
    assert_quiet(classification(local_sgd_steps=2, optimizer="sgd", lr=0.1))


def test_a_mixture_of_sources_steps_without_reading_the_device(classification, tmp_path):
    sources = []
    for name, seed, n in (("reviews", 1, 160), ("notes", 2, 60)):
        sources.append({"path": str(write_csv(tmp_path / f"{name}.csv", make_sentiment_rows(n, seed))), "weight": 0.5})
    assert_quiet(classification(data=sources))


def test_the_counter_sees_a_loss_read_back_each_micro_batch(classification, monkeypatch):
    """The test bites: a `float(loss)` per micro-batch, as the loop once had, is 2 syncs a quiet step."""
    from leantrain.training.trainer import Trainer

    real = Trainer.forward_backward_step

    def reads_the_loss(self, batch):
        loss = real(self, batch)
        float(loss)
        return loss

    monkeypatch.setattr(Trainer, "forward_backward_step", reads_the_loss)
    steps, _ = syncs_per_step(classification())
    assert all(steps[s]["item"] == 2 for s in QUIET_STEPS), steps


# -- the other task families, each on its own test fixture ------------------------------------------------------------


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory):
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from tests.tasks.test_causal_lm import write_tiny_llama

    folder = write_tiny_llama(tmp_path_factory.mktemp("tiny-llama-syncs"))
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(folder)).save_pretrained(folder)
    return folder


def _jsonl(tmp_path, name, rows):
    from tests.tasks.test_dpo import write_jsonl

    return str(write_jsonl(tmp_path / f"{name}.jsonl", rows))


def _family(name, llama_dir, tmp_path):
    """(task, data and model settings) of one task family, from its own test module's data."""
    from tests.tasks.test_causal_lm import documents
    from tests.tasks.test_dpo import pair_rows
    from tests.tasks.test_kto import judgement_rows

    if name == "causal-lm":
        corpus = tmp_path / "corpus.txt"
        corpus.write_text("\n\n".join(documents(120, seed=0)) + "\n")
        return dict(task="causal-lm", model=str(llama_dir), data=str(corpus), max_length=64)
    if name == "dpo":
        return dict(task="dpo", model=str(llama_dir), data=_jsonl(tmp_path, "pairs", pair_rows(96)), max_length=32)
    if name == "kto":
        data = _jsonl(tmp_path, "kto", judgement_rows(96))
        return dict(task="kto", model=str(llama_dir), data=data, max_length=32)
    rows = pair_rows(96)
    for i, r in enumerate(rows):
        r["margin"] = (i % 4) * 0.5
    return dict(task="reward-model", model=str(llama_dir), data=_jsonl(tmp_path, "rm", rows), max_length=32)


@pytest.mark.parametrize("family", ["causal-lm", "dpo", "kto", "reward-model"])
def test_llama_task_families_step_without_reading_the_device(family, llama_dir, tmp_path):
    settings = _family(family, llama_dir, tmp_path)
    out = dict(cache_dir=str(tmp_path / "cache"), output_dir=str(tmp_path / "run"), batch_size=4, optimizer="adamw")
    # DPO's and KTO's frozen reference and KTO's mismatched pairs get host-known masks of their own
    assert_quiet(TrainConfig(**settings, **out, **STEP), model_too=True)


def test_token_classification_steps_without_reading_the_device(tiny_model_dir, tmp_path):
    from tests.tasks.test_token_classification import make_sentences, write_conll

    data = write_conll(tmp_path / "train.conll", make_sentences(96, seed=1))
    cfg = dict(task="ner", model=str(tiny_model_dir), data=str(data), batch_size=4, optimizer="adamw")
    assert_quiet(TrainConfig(**cfg, cache_dir=str(tmp_path / "cache"), output_dir=str(tmp_path / "run"), **STEP))


def test_seq2seq_steps_without_reading_the_device(minilm_dir, tmp_path):
    import torch
    from transformers import AutoTokenizer, T5Config, T5ForConditionalGeneration

    from tests.tasks.test_seq2seq import write_pairs

    tokenizer = AutoTokenizer.from_pretrained(minilm_dir)
    config = T5Config(
        vocab_size=len(tokenizer), d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4, dropout_rate=0.0,
        decoder_start_token_id=tokenizer.pad_token_id, pad_token_id=tokenizer.pad_token_id,
    )  # fmt: skip
    torch.manual_seed(0)
    T5ForConditionalGeneration(config).save_pretrained(tmp_path / "t5")
    tokenizer.save_pretrained(tmp_path / "t5")
    data = write_pairs(tmp_path / "train.csv", 109, seed=1)
    # the run's closing evaluation (after the steps checked) generates 4 tokens a pair, not up to --max-target-length
    cfg = dict(model=str(tmp_path / "t5"), data=str(data), batch_size=4, optimizer="adamw", generation_max_new_tokens=4)
    out = dict(cache_dir=str(tmp_path / "cache"), output_dir=str(tmp_path / "run"))
    assert_quiet(TrainConfig(**cfg, **out, **STEP), model_too=True)


def test_the_counter_sees_transformers_read_the_mask_without_the_host_made_masks(classification, monkeypatch):
    """The model's own reads bite: without `HostKnownMask`, eager transformers reads each micro-batch's mask."""
    from leantrain.model.masks import HostKnownMask

    monkeypatch.setattr(HostKnownMask, "attach", classmethod(lambda cls, model, autocast=None: None))
    steps, _ = syncs_per_step(classification(attention="sdpa"))
    assert all(steps[s]["model_item"] == 2 for s in QUIET_STEPS), steps
