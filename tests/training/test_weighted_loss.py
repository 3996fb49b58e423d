"""Class weights and label smoothing (issue #17) stay exact under accumulation: a weighted step's loss is the
weighted sum over its examples divided by the total weight of all the step's examples, which is the big batch's
weighted mean, what torch's cross_entropy(weight=...) computes."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file

from leantrain import TrainConfig, train
from leantrain.errors import ConfigError
from leantrain.model.losses import class_weights, weighted_cross_entropy_sum
from leantrain.training.hooks import Hooks
from tests.conftest import EXACT_JOB, assert_trained_alike, write_csv


def test_summed_weighted_loss_over_total_weight_is_torchs_weighted_mean_however_split():
    torch.manual_seed(0)
    logits, labels = torch.randn(30, 3), torch.randint(0, 3, (30,))
    w = torch.tensor([1.0, 2.5, 0.4])
    expected = F.cross_entropy(logits, labels, weight=w, label_smoothing=0.1)  # torch's weighted mean
    parts = [weighted_cross_entropy_sum(logits[a : a + 7], labels[a : a + 7], w, 0.1) for a in range(0, 30, 7)]
    assert float(sum(parts) / w[labels].sum()) == pytest.approx(float(expected), rel=1e-6)


def test_auto_class_weights_are_inverse_class_frequency():
    labels = np.array([0] * 6 + [1] * 2 + [2] * 4)
    assert class_weights("auto", labels, 3) == pytest.approx([12 / (3 * 6), 12 / (3 * 2), 12 / (3 * 4)])
    assert class_weights("1,2,3", labels, 3) == pytest.approx([1, 2, 3])
    with pytest.raises(ConfigError, match="gives 2 weights for 3 classes"):
        class_weights("1,2", labels, 3)
    with pytest.raises(ConfigError, match="--class-weights"):
        TrainConfig(class_weights="1,-2")
    with pytest.raises(ConfigError, match="--label-smoothing"):
        TrainConfig(label_smoothing=1.0)


@pytest.fixture()
def imbalanced_csv(tmp_path_factory):
    """Three in four rows 'neg': the weights change the loss (on balanced data 'auto' would weigh 1 each)."""
    from tests.conftest import make_sentiment_rows

    rows = make_sentiment_rows(320, seed=4)
    rows = [r for r in rows if r[1] == "neg"] + [r for r in rows if r[1] == "pos"][:53]
    return write_csv(tmp_path_factory.mktemp("imbalanced") / "imbalanced.csv", rows)


@pytest.fixture()
def run(tiny_model_dir, imbalanced_csv, cache_dir, tmp_path):
    count = iter(range(100))

    def go(hooks=None, **changes):
        base = dict(
            model=str(tiny_model_dir),
            data=str(imbalanced_csv),
            cache_dir=str(cache_dir),
            output_dir=str(tmp_path / f"run{next(count)}"),
            report=False,
            **EXACT_JOB,
        )
        result = train(TrainConfig(**{**base, **changes}), hooks=hooks)
        return result, load_file(result.model_dir / "model.safetensors")

    return go


def loss_log(result) -> list[float]:
    rows = [json.loads(x) for x in (result.output_dir / "metrics.jsonl").read_text().splitlines()]
    return [r["loss"] for r in rows if "loss" in r]


WEIGHTED = dict(class_weights="auto", label_smoothing=0.1, max_steps=5)


def test_weighted_accumulation_equals_the_big_batch(run):
    big, w_big = run(batch_size=24, grad_accum=1, **WEIGHTED)
    small, w_small = run(batch_size=6, grad_accum=4, **WEIGHTED)
    start = run(batch_size=24, **{**WEIGHTED, "lr": 1e-30})[1]
    assert_trained_alike(w_big, w_small, start)
    assert loss_log(small) == pytest.approx(loss_log(big), abs=1e-5)
    # and the weights did something: the unweighted run trains elsewhere
    _, w_plain = run(batch_size=24, grad_accum=1, max_steps=5)
    assert max((w_plain[k] - w_big[k]).abs().max().item() for k in w_big) > 1e-3


class FirstStep(Hooks):
    """The micro-batches of the first optimizer step and the model they ran through."""

    def __init__(self):
        self.batches: list[dict] = []
        self.model = None

    def on_micro_batch(self, model, batch):
        if self.model is None or len(self.batches) < 4:
            self.model = model
            self.batches.append({k: v.clone() for k, v in batch.items() if torch.is_tensor(v)})


def test_the_logged_step_loss_is_torchs_weighted_mean_over_the_whole_step(run, imbalanced_csv):
    seen = FirstStep()
    # lr so small that no weight moves: the model after the run is the one the first step ran through
    result, _ = run(hooks=seen, batch_size=6, grad_accum=4, lr=1e-30, **{**WEIGHTED, "max_steps": 1})
    model = seen.model
    model.eval()
    with torch.no_grad():
        logits = [
            model(**{k: b[k] for k in ("input_ids", "attention_mask", "token_type_ids") if k in b}).logits
            for b in seen.batches
        ]
    labels = torch.cat([b["labels"] for b in seen.batches])
    counts = np.bincount(json_labels(result), minlength=2)
    w = torch.tensor(counts.sum() / (2 * counts), dtype=torch.float32)  # inverse class frequency
    expected = F.cross_entropy(torch.cat(logits), labels, weight=w, label_smoothing=0.1)
    assert len(labels) == 24 and 0 < int(labels.sum()) < 24  # both classes in the step
    assert loss_log(result)[0] == pytest.approx(float(expected), rel=1e-5)


def json_labels(result) -> np.ndarray:
    """The training rows' class ids, as the run's data facts count them (neg: 0, pos: 1)."""
    import yaml

    from leantrain.data.sources import read_table

    cfg = yaml.safe_load((result.output_dir / "config.yaml").read_text())
    df, _ = read_table(cfg["data"])
    from leantrain.data.prepare import stratified_split

    labels = (df["label"] == "pos").to_numpy().astype(np.int64)
    train_rows, _ = stratified_split(labels, cfg["eval_fraction"], cfg["seed"])
    return labels[train_rows]


@pytest.mark.parametrize(
    "option", [{"class_weights": "1,3"}, {"label_smoothing": 0.2}], ids=["class-weights", "label-smoothing"]
)
def test_one_sgd_step_moves_every_weight_by_torchs_gradient_of_that_loss(run, option):
    """Each option on its own, judged by the weights it trains (not by the logged loss): one plain SGD step from
    the same start equals the start minus lr x the gradient of torch's cross_entropy with that option alone."""
    from transformers import AutoModelForSequenceClassification

    seen = FirstStep()
    _, trained = run(hooks=seen, batch_size=24, max_steps=1, **option)
    start_run, start = run(batch_size=24, max_steps=1, lr=1e-30, **option)  # the same start, no step taken
    _, plain = run(batch_size=24, max_steps=1)
    model = AutoModelForSequenceClassification.from_pretrained(start_run.model_dir)
    model.train()  # the tiny model has no dropout: train mode computes what the step computed
    batch = seen.batches[0]
    logits = model(**{k: batch[k] for k in ("input_ids", "attention_mask", "token_type_ids") if k in batch}).logits
    weight = torch.tensor([1.0, 3.0]) if "class_weights" in option else None  # label order: neg, pos
    smoothing = option.get("label_smoothing", 0.0)
    F.cross_entropy(logits, batch["labels"], weight=weight, label_smoothing=smoothing).backward()
    lr = EXACT_JOB["lr"]
    for name, param in model.named_parameters():
        expected = start[name] - lr * param.grad
        assert (trained[name] - expected).abs().max().item() < 1e-5, name
    classifier = "classifier.weight"
    assert (plain[classifier] - trained[classifier]).abs().max().item() > 1e-3  # the option changed the step
