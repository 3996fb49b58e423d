"""Classification's forward (tasks/classification.py): the encoder's last layer after its attention runs at the
first token only, where the classifier reads, with the same logits, loss and gradients as the whole model."""

from __future__ import annotations

import pytest
import torch

from leantrain import TrainConfig
from leantrain.tasks.text_classification import TextClassification


def classifier(path, attention: str = "sdpa"):
    from leantrain.model import loading

    model = loading.load_for_classification(str(path), ["neg", "pos"])
    model.set_attn_implementation(attention)
    return model.train()


def padded_batch(vocab: int) -> dict[str, torch.Tensor]:
    """Four rows of different lengths, padded to 9 (the padding must not reach the first token)."""
    gen = torch.Generator().manual_seed(0)
    lengths = torch.tensor([9, 3, 6, 1])
    mask = (torch.arange(9) < lengths[:, None]).long()
    ids = torch.randint(1000, vocab, (4, 9), generator=gen) * mask
    return {"input_ids": ids, "attention_mask": mask, "labels": torch.tensor([0, 1, 1, 0])}


def task_for(path, **changes) -> TextClassification:
    return TextClassification(TrainConfig(model=str(path), data="unused.csv", **changes))


def feed_forward_rows(model) -> list[int]:
    """Records the rows each layer's feed-forward ran on (its first matrix's input, flattened)."""
    rows: list[int] = []
    for layer in model.bert.encoder.layer:
        layer.intermediate.dense.register_forward_hook(lambda _m, args, _out: rows.append(args[0][..., 0].numel()))
    return rows


def test_training_runs_the_last_layer_after_attention_at_the_first_token_only(tiny_model_dir):
    model = classifier(tiny_model_dir)
    task = task_for(tiny_model_dir)
    task.check_model(model)
    assert task.tail is not None
    batch = padded_batch(model.config.vocab_size)
    rows = feed_forward_rows(model)

    out = task.forward(model, batch)
    task.loss_sum(out, batch).backward()
    ours = {n: p.grad.clone() for n, p in model.named_parameters()}
    assert rows == [4 * 9, 4]  # the first layer at every position, the last at each row's first token
    model.zero_grad()
    full = model(**task.model_inputs(batch))
    task.loss_sum(full, batch).backward()

    torch.testing.assert_close(out.logits, full.logits, rtol=1e-5, atol=1e-6)
    for name, p in model.named_parameters():  # every parameter's gradient, the embeddings' included
        torch.testing.assert_close(ours[name], p.grad, rtol=1e-4, atol=1e-7, msg=name)
    assert task.tail_rows(batch) == 4
    assert not task.tail.attention._forward_hooks and not task.tail.residual._forward_pre_hooks  # hooks removed


@pytest.mark.parametrize("changes", [{"compile": True}, {"activation_checkpointing": True}])
def test_a_compiled_or_checkpointed_model_runs_every_position(tiny_model_dir, changes):
    """A compiled graph would not see the hooks, and a checkpointed layer recomputes without them."""
    model = classifier(tiny_model_dir)
    task = task_for(tiny_model_dir, **changes)
    task.check_model(model)
    batch = padded_batch(model.config.vocab_size)
    rows = feed_forward_rows(model)
    task.forward(model, batch)
    assert task.tail is None and rows == [36, 36] and task.tail_rows(batch) is None and task.tail_flops(model) == 0


def test_a_model_that_reads_more_than_the_first_token_keeps_every_position(tiny_model_dir):
    """A classifier over the mean of the last layer (not BERT's pooler) would read the cut rows: no tail."""
    model = classifier(tiny_model_dir)
    pooler = model.bert.pooler
    pooler.forward = lambda hidden: pooler.activation(pooler.dense(hidden.mean(dim=1)))
    task = task_for(tiny_model_dir)
    task.check_model(model)
    assert task.tail is None
    assert task_for(tiny_model_dir).tail is None  # and none before a model is checked


def test_flops_of_a_forward_with_a_first_token_tail_are_what_it_computes(tiny_model_dir):
    """The meter charges the cut batch less by what it skipped, as torch's FlopCounterMode counts both ways (an
    oracle outside leantrain; eager attention, which it counts). The closed form also counts biases and layer
    norms, 2% of the tail's FLOPs at this width, which the counter does not."""
    from dataclasses import replace

    from torch.utils.flop_counter import FlopCounterMode

    from leantrain.telemetry.flops import FlopMeter, flop_model

    model = classifier(tiny_model_dir, "eager")
    task = task_for(tiny_model_dir)
    task.check_model(model)
    batch = padded_batch(model.config.vocab_size)
    counts = []
    for forward in (task.forward, lambda m, b: m(**task.model_inputs(b))):
        with FlopCounterMode(display=False) as counter:
            task.loss_sum(forward(model, batch), batch).backward()
        counts.append(counter.get_total_flops())
    meter = FlopMeter(replace(flop_model(model), tail_per_row=task.tail_flops(model)))
    cut = meter.add(batch["input_ids"], batch["attention_mask"], None, task.tail_rows(batch))
    whole = meter.add(batch["input_ids"], batch["attention_mask"], None, None)
    assert whole - cut == pytest.approx(counts[1] - counts[0], rel=0.03)
    assert counts[1] - counts[0] > 0.1 * counts[1]  # the cut is a real share of this two-layer model
