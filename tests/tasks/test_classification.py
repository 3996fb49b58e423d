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


def test_with_dropout_the_cut_draws_the_whole_models_masks(dropout_model_dir):
    """Dropout on (0.1): the cut's last layer draws the masks the whole sequence would and keeps the first token's,
    so its logits and gradients are the whole model's to rounding and the RNG ends where the whole model's does."""
    model = classifier(dropout_model_dir)
    task = task_for(dropout_model_dir)
    task.check_model(model)
    assert task.tail is not None and len(task.tail.dropouts()) == 2  # after the attention output, after the FFN
    batch = padded_batch(model.config.vocab_size)

    def step(forward) -> tuple[torch.Tensor, dict[str, torch.Tensor], torch.Tensor]:
        model.zero_grad()
        torch.manual_seed(7)
        out = forward()
        task.loss_sum(out, batch).backward()
        return out.logits.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}, torch.get_rng_state()

    cut_logits, cut_grads, cut_rng = step(lambda: task.forward(model, batch))
    full_logits, full_grads, full_rng = step(lambda: model(**task.model_inputs(batch)))
    torch.testing.assert_close(cut_logits, full_logits, rtol=1e-5, atol=1e-6)
    for name, grad in cut_grads.items():
        torch.testing.assert_close(grad, full_grads[name], rtol=1e-4, atol=1e-7, msg=name)
    assert torch.equal(cut_rng, full_rng)  # the same random numbers drawn: every later draw lines up
    assert all("forward" not in vars(d) for d in task.tail.dropouts())  # their own forward again


def test_activation_checkpointing_starts_from_the_same_loss_as_the_baseline_with_dropout(
    dropout_model_dir, sentiment_csv, tmp_path
):
    """`leantrain bench`'s step-1 loss: checkpointing runs the whole model (no cut), the baseline the cut; with dropout
    on the two drew different masks (0.69247 against 0.69198 on MiniLM). Now: the same to rounding."""
    import json

    from leantrain import train

    losses = {}
    for name, ckpt in (("baseline", False), ("ckpt", True)):
        cfg = TrainConfig(
            model=str(dropout_model_dir), data=str(sentiment_csv), output_dir=str(tmp_path / name),
            cache_dir=str(tmp_path / "cache"), batch_size=16, max_steps=3, log_every=1, precision="fp32",
            progress=False, report=False, activation_checkpointing=ckpt, seed=3,
        )  # fmt: skip
        rows = (train(cfg).output_dir / "metrics.jsonl").read_text().splitlines()
        losses[name] = [r["loss"] for r in map(json.loads, rows) if "loss" in r]
    assert losses["ckpt"] == pytest.approx(losses["baseline"], rel=1e-5)


TINY_BERT = dict(
    vocab_size=100, hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
    max_position_embeddings=64,
)  # fmt: skip


@pytest.mark.parametrize(
    ("head", "saved", "problem", "labels", "kept", "said"),
    [
        ("TokenClassification", ["O", "B-PER", "I-PER"], None, ["O", "B-PER", "I-PER"], True, None),
        ("TokenClassification", ["O", "B-PER", "I-PER"], None, ["B-PER", "I-PER", "O"], True, "reordered"),
        ("TokenClassification", ["O", "B-PER", "I-PER"], None, ["B-LOC", "I-LOC", "O"], False, "3 labels: B-LOC"),
        ("TokenClassification", ["O", "B-PER", "I-PER"], None, ["B-PER", "O"], False, "2 labels: B-PER, O"),
        ("SequenceClassification", ["stars"], "regression", ["score"], True, None),  # one number, whatever its name
        ("SequenceClassification", ["a", "b"], "multi_label_classification", ["a", "b", "c"], False, "3 labels"),
    ],
)
def test_a_trained_head_is_kept_for_its_own_labels_and_replaced_for_others(
    tmp_path, head, saved, problem, labels, kept, said
):
    import transformers

    from leantrain.model import loading

    config = transformers.BertConfig(**TINY_BERT, id2label=dict(enumerate(saved)), problem_type=problem)
    torch.manual_seed(0)
    trained = getattr(transformers, f"BertFor{head}")(config)
    trained.save_pretrained(tmp_path / "m")
    notes: list[str] = []
    model = loading.load_for_classification(str(tmp_path / "m"), labels, auto_model=f"AutoModelFor{head}", notes=notes)
    assert loading.head_labels(model.config) == labels
    body = trained.bert.state_dict()
    for key, value in model.bert.state_dict().items():
        assert torch.equal(value, body[key]), key
    rows = ([saved.index(name) for name in labels] if len(labels) > 1 else [0]) if kept else None
    if rows is not None:
        assert torch.equal(model.classifier.weight, trained.classifier.weight[rows])
    else:
        assert model.classifier.out_features == len(labels) and not torch.equal(
            model.classifier.weight[: len(saved)], trained.classifier.weight[: len(labels)]
        )
    assert len(notes) == (said is not None) and all(said in note for note in notes)


def test_a_body_of_other_sizes_is_refused_even_where_the_head_is_new(tmp_path):
    import json

    import transformers

    from leantrain.errors import ModelError
    from leantrain.model import loading

    transformers.BertForSequenceClassification(transformers.BertConfig(**TINY_BERT, num_labels=3)).save_pretrained(
        tmp_path / "m"
    )
    saved = json.loads((tmp_path / "m" / "config.json").read_text())
    saved["intermediate_size"] = 48  # edited by hand: the feed-forward's weights no longer fit
    (tmp_path / "m" / "config.json").write_text(json.dumps(saved))
    with pytest.raises(ModelError, match="other sizes than the config gives"):
        loading.load_for_classification(str(tmp_path / "m"), ["a", "b"])
