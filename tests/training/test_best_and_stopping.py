"""Best model at the end and early stopping (issue #17), on planted evaluation curves: a text classifier whose
evaluations report accuracies set by the test, so where the run must stop and which step is best is known.
Checkpoint folders load as models (the save_pretrained layout)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import ClassVar

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from leantrain import TrainConfig, train
from leantrain.errors import ConfigError
from leantrain.tasks.text_classification import TextClassification
from leantrain.training import Hooks
from tests.hooks import DieAt, Killed


class PlantedCurve(TextClassification):
    """Text classification whose evaluations report the next accuracy of `curve` (loss: 1 - accuracy)."""

    curve: ClassVar[list[float]] = []
    seen: ClassVar[int] = 0

    def metrics(self, rows: dict[str, np.ndarray]) -> dict[str, float]:
        cls = type(self)
        accuracy = cls.curve[min(cls.seen, len(cls.curve) - 1)]
        cls.seen += 1
        return {"accuracy": accuracy, "macro_f1": accuracy, "loss": 1 - accuracy}


@pytest.fixture()
def planted(tiny_model_dir, sentiment_csv, cache_dir, tmp_path):
    def go(curve: list[float], hooks: Hooks | None = None, **changes):
        PlantedCurve.curve, PlantedCurve.seen = list(curve), 0
        return train(TrainConfig(**{**go.base, **changes}), task=PlantedCurve, hooks=hooks)

    go.base = dict(
        model=str(tiny_model_dir),
        data=str(sentiment_csv),
        cache_dir=str(cache_dir),
        output_dir=str(tmp_path / "run"),
        batch_size=16,
        max_steps=40,
        lr=3e-3,
        precision="fp32",
        progress=False,
        report=False,
        seed=1,
    )
    return go


def eval_steps(result) -> list[int]:
    rows = [json.loads(x) for x in (result.output_dir / "metrics.jsonl").read_text().splitlines()]
    return [r["step"] for r in rows if "eval_accuracy" in r]


CURVE = [0.5, 0.6, 0.65, 0.64, 0.66, 0.62, 0.61, 0.60, 0.59, 0.58]


@pytest.mark.parametrize(
    "threshold, stop_step",
    [
        (0.02, 10),  # 0.64 and 0.66 (+0.01) are no improvement of more than 0.02: the 5th evaluation stops
        (0.0, 14),  # 0.66 improves, then 0.62 and 0.61 do not: the 7th evaluation stops
    ],
)
def test_early_stopping_stops_at_the_planted_evaluation(planted, threshold, stop_step):
    result = planted(
        CURVE, eval_every=2, early_stopping_patience=2, early_stopping_threshold=threshold, metric_for_best="accuracy"
    )
    m = result.metrics
    assert m["optimizer_steps"] == stop_step
    assert eval_steps(result) == list(range(2, stop_step + 1, 2))  # no second evaluation of the last step
    saved = json.loads((result.output_dir / "metrics.json").read_text())
    assert saved["early_stopped"] is True
    assert f"at step {stop_step}" in saved["early_stopping_reason"]
    assert "eval accuracy has not improved" in saved["early_stopping_reason"]


def test_an_early_stop_between_log_rows_logs_the_steps_since_the_last_row(planted):
    # stops at step 10; rows every 4 steps: the steps 9-10 get a row of their own, which train_loss reads
    result = planted(CURVE, eval_every=2, early_stopping_patience=2, early_stopping_threshold=0.02, log_every=4)
    rows = [json.loads(x) for x in (result.output_dir / "metrics.jsonl").read_text().splitlines()]
    train_rows = [r for r in rows if "loss" in r]
    assert [r["step"] for r in train_rows] == [4, 8, 10]
    assert result.metrics["train_loss"] == train_rows[-1]["loss"]


def test_without_early_stopping_the_same_curve_trains_to_the_end(planted):
    result = planted(CURVE, eval_every=2, max_steps=16)
    assert result.metrics["optimizer_steps"] == 16 and result.metrics["early_stopped"] is None


def test_loss_as_the_yardstick_stops_when_it_stops_falling(planted):
    # loss = 1 - accuracy: lower is better; with the task default (accuracy) it would stop at the same place
    result = planted(CURVE, eval_every=2, early_stopping_patience=3, metric_for_best="eval_loss")
    assert result.metrics["optimizer_steps"] == 16  # best 0.66 at step 10, then three evaluations without


def test_load_best_at_end_publishes_the_best_steps_weights_bitwise(planted):
    # mid-run evaluations at steps 3, 6, 9; the final one at 12: the best is step 6
    result = planted([0.5, 0.9, 0.6, 0.7, 0.0], eval_every=3, max_steps=12, save_every=12, load_best_at_end=True)
    published = load_file(result.model_dir / "model.safetensors")
    best = load_file(result.output_dir / "checkpoints" / "step-000006" / "model.safetensors")
    last = load_file(result.output_dir / "checkpoints" / "step-000012" / "model.safetensors")
    assert published.keys() == best.keys()
    assert all(torch.equal(published[k], best[k]) for k in best)
    assert not all(torch.equal(published[k], last[k]) for k in last)  # the last step's weights were not kept
    m = result.metrics
    assert m["model_step"] == 6 and (m["best_metric"], m["best_value"], m["best_step"]) == ("accuracy", 0.9, 6)
    assert m["eval_accuracy"] == 0.0  # the published (best) model was evaluated again: the planted 5th value


def test_without_load_best_at_end_the_last_step_is_published(planted):
    result = planted([0.5, 0.9, 0.6, 0.7], eval_every=3, max_steps=12, save_every=12)
    published = load_file(result.model_dir / "model.safetensors")
    last = load_file(result.output_dir / "checkpoints" / "step-000012" / "model.safetensors")
    assert all(torch.equal(published[k], last[k]) for k in last)
    assert result.metrics["model_step"] == 12


def test_best_at_end_and_early_stopping_need_evaluations():
    with pytest.raises(ConfigError, match="--load-best-at-end judges evaluations: add --eval-every"):
        TrainConfig(load_best_at_end=True)
    with pytest.raises(ConfigError, match="--early-stopping-patience judges evaluations"):
        TrainConfig(early_stopping_patience=3)


def test_metric_for_best_defaults_to_the_tasks_and_unknown_names_are_refused(planted):
    with pytest.raises(ConfigError, match="'f2' is not an evaluation metric of this run; choose one of accuracy"):
        planted(CURVE, eval_every=2, metric_for_best="f2")


def test_a_checkpoint_folder_loads_like_the_model_folder(planted, sentiment_csv):
    from transformers import pipeline

    from leantrain.inference import evaluate, predict

    result = planted([0.5], eval_every=6, max_steps=6, save_every=6)
    ckpt = Path(result.output_dir / "checkpoints" / "step-000006")
    texts = ["a wonderful film", "the plot was dreadful"]
    from_checkpoint = predict(str(ckpt), texts=texts)
    assert from_checkpoint == predict(str(result.model_dir), texts=texts)  # the same weights, the same answers
    assert evaluate(str(ckpt), str(sentiment_csv))["examples"] == 240
    classify = pipeline("text-classification", model=str(ckpt))
    assert classify(texts[0])[0]["label"] == from_checkpoint[0]["label"]


def test_a_resumed_run_stops_where_the_uninterrupted_one_does(planted, tmp_path):
    # the counters live in the checkpoint: killed at step 7 (4 evaluations counted, one without improvement
    # by more than 0.02), resumed from step 6, it must still stop at step 10
    stop = dict(eval_every=2, early_stopping_patience=2, early_stopping_threshold=0.02, save_every=2)
    with pytest.raises(Killed):
        planted(CURVE, output_dir=str(tmp_path / "killed"), hooks=DieAt(7), **stop)
    PlantedCurve.curve, PlantedCurve.seen = list(CURVE), 3  # the evaluations at steps 2, 4 and 6 are behind it
    resumed = train(
        TrainConfig(**{**planted.base, **stop, "output_dir": str(tmp_path / "killed"), "resume": "auto"}),
        task=PlantedCurve,
    )
    assert resumed.metrics["resumed_from"].endswith("step-000006")
    assert resumed.metrics["optimizer_steps"] == 10 and resumed.metrics["early_stopped"]


def test_the_final_evaluation_counts_for_a_run_trained_further_but_stops_nothing(planted):
    # the end's evaluation (step 6, checkpointed) has not improved on 0.6: with patience 1 that is no early stop (the
    # run ends there anyway), but its count is in the checkpoint, so the longer run stops at its first evaluation
    stop = dict(eval_every=2, save_every=2, early_stopping_threshold=0.0)
    first = planted([0.5, 0.6, 0.55], max_steps=6, early_stopping_patience=1, **stop)
    assert first.metrics["optimizer_steps"] == 6 and first.metrics["early_stopped"] is False
    saved = json.loads((first.output_dir / "checkpoints" / "step-000006" / "checkpoint.json").read_text())["progress"]
    assert (saved["stopping_reference"], saved["evals_without_improvement"]) == (0.6, 1)
    longer = dict(max_steps=12, early_stopping_patience=2, resume="auto", overwrite=True)
    further = planted([0.58, 0.57, 0.56], **longer, **stop)
    assert further.metrics["optimizer_steps"] == 8 and "at step 8" in further.metrics["early_stopping_reason"]
