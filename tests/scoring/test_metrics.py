"""--metrics (issue #17): each score is scikit-learn's, f1 is binary on two classes (as GLUE scores MRPC) and
macro otherwise, --metric-for-best takes any of them, the Python API takes a compute_metrics callable, and
`evaluate` reports per class with a confusion matrix."""

from __future__ import annotations

import json

import numpy as np
import pytest
from sklearn import metrics as skm

from leantrain import TrainConfig, evaluate, train
from leantrain.errors import ConfigError
from leantrain.tasks.scoring import classification_report, format_report, metric_names, score


def probs_of(preds: np.ndarray, classes: int, rng: np.random.Generator) -> np.ndarray:
    """Probabilities whose argmax is `preds`, with varied confidence (for ROC AUC)."""
    p = rng.uniform(0, 0.4, size=(len(preds), classes))
    p[np.arange(len(preds)), preds] = 1.0 + rng.uniform(0, 1, len(preds))
    return p / p.sum(1, keepdims=True)


def test_f1_is_binary_on_two_classes_and_macro_otherwise():
    rng = np.random.default_rng(0)
    y = rng.integers(0, 2, 200)
    preds = np.where(rng.uniform(size=200) < 0.8, y, 1 - y)
    p = probs_of(preds, 2, rng)
    got = score("single-label", ("f1", "macro_f1", "precision", "recall", "mcc", "roc_auc", "accuracy"), p, y)
    assert got["f1"] == pytest.approx(skm.f1_score(y, preds))  # the positive class (id 1) only, as GLUE
    assert got["f1"] != pytest.approx(got["macro_f1"])
    assert got["precision"] == pytest.approx(skm.precision_score(y, preds))
    assert got["recall"] == pytest.approx(skm.recall_score(y, preds))
    assert got["mcc"] == pytest.approx(skm.matthews_corrcoef(y, preds))
    assert got["roc_auc"] == pytest.approx(skm.roc_auc_score(y, p[:, 1]))
    assert got["accuracy"] == pytest.approx((preds == y).mean())

    y3 = rng.integers(0, 3, 300)
    preds3 = np.where(rng.uniform(size=300) < 0.7, y3, rng.integers(0, 3, 300))
    p3 = probs_of(preds3, 3, rng)
    got3 = score("single-label", ("f1", "roc_auc", "weighted_f1"), p3, y3)
    assert got3["f1"] == pytest.approx(skm.f1_score(y3, preds3, average="macro"))
    assert got3["weighted_f1"] == pytest.approx(skm.f1_score(y3, preds3, average="weighted"))
    assert got3["roc_auc"] == pytest.approx(skm.roc_auc_score(y3, p3, multi_class="ovr"))


def test_metric_names_keep_loss_last_and_refuse_what_a_problem_lacks():
    assert metric_names("single-label", ["f1", "mcc"]) == ("f1", "mcc", "loss")
    assert metric_names("single-label") == ("accuracy", "macro_f1", "loss")
    with pytest.raises(ConfigError, match="pearson not available for single-label"):
        metric_names("single-label", ["pearson"])
    with pytest.raises(ConfigError, match="did you mean 'accuracy'"):
        TrainConfig(metrics="acuracy")


def test_the_report_and_confusion_matrix_match_scikit_learn():
    y = np.array([0, 0, 1, 1, 2, 2, 2])
    preds = np.array([0, 1, 1, 1, 2, 0, 2])
    report = classification_report(np.eye(3)[preds], y, ["a", "b", "c"])
    assert report["confusion_matrix"] == skm.confusion_matrix(y, preds).tolist()
    assert report["per_class"]["c"]["recall"] == pytest.approx(2 / 3)
    assert report["per_class"]["b"]["precision"] == pytest.approx(2 / 3) and report["per_class"]["a"]["support"] == 2
    text = format_report(report)
    assert "confusion matrix" in text and text.splitlines()[-1].split() == ["c", "1", "0", "2"]


@pytest.fixture()
def job(tiny_model_dir, sentiment_csv, cache_dir, tmp_path):
    def make(**changes):
        base = dict(
            model=str(tiny_model_dir),
            data=str(sentiment_csv),
            output_dir=str(tmp_path / "run"),
            cache_dir=str(cache_dir),
            batch_size=16,
            epochs=2,
            lr=3e-3,
            warmup_ratio=0.0,
            progress=False,
            precision="fp32",
            report=False,
        )
        return TrainConfig(**{**base, **changes})

    return make


def test_a_run_reports_the_metrics_asked_for_and_keeps_the_best_by_any_of_them(job):
    seen = []

    def compute_metrics(prediction):
        seen.append(prediction)
        preds = prediction.predictions.argmax(-1)
        return {"errors": float((preds != prediction.label_ids).sum())}

    result = train(
        job(metrics="f1,mcc,roc_auc", metric_for_best="mcc", epochs=4, eval_every=10, save_every=10),
        compute_metrics=compute_metrics,
    )
    m = result.metrics
    assert {"eval_f1", "eval_mcc", "eval_roc_auc", "eval_loss", "eval_errors"} <= set(m)
    assert "eval_accuracy" not in m  # only what was asked for (and the loss)
    last = seen[-1]
    assert last.predictions.shape == (24, 2) and last.label_ids.shape == (24,)  # logits of every held-out row
    assert m["eval_errors"] == pytest.approx(24 * (1 - skm.accuracy_score(last.label_ids, last.predictions.argmax(-1))))
    # the best checkpoint is the step of the highest eval mcc in the log
    rows = map(json.loads, (result.output_dir / "metrics.jsonl").read_text().splitlines())
    evals = [r for r in rows if "eval_mcc" in r]
    best = max(evals, key=lambda r: r["eval_mcc"])  # the final evaluation counts too (checkpointed when best)
    assert m["best_checkpoint"].endswith(f"step-{best['step']:06d}")
    saved = json.loads((result.output_dir / "checkpoints" / "step-000050" / "checkpoint.json").read_text())
    assert saved["progress"]["best_metric"] == "mcc" and saved["progress"]["best_value"] == best["eval_mcc"]
    assert saved["progress"]["best_step"] == best["step"]


def test_metric_for_best_must_be_reported(job):
    with pytest.raises(ConfigError, match=r"--metric-for-best 'f1' is not an evaluation metric.*--metrics"):
        train(job(metric_for_best="f1"))


def test_evaluate_prints_a_per_class_report_and_a_confusion_matrix(job, tmp_path, sentiment_csv, capsys):
    from leantrain.commands.cli import main

    result = train(job(epochs=4))
    scores = evaluate(str(result.output_dir), str(sentiment_csv), metrics="f1,accuracy")
    matrix = np.array(scores["confusion_matrix"])
    assert matrix.sum() == scores["examples"] == 240 and scores["labels"] == ["neg", "pos"]
    assert scores["accuracy"] == pytest.approx(np.trace(matrix) / 240)
    tp, fp, fn = matrix[1, 1], matrix[0, 1], matrix[1, 0]
    assert scores["f1"] == pytest.approx(2 * tp / (2 * tp + fp + fn))
    capsys.readouterr()
    assert main(["evaluate", str(result.output_dir), "--data", str(sentiment_csv), "--metrics", "mcc"]) == 0
    out, err = capsys.readouterr()
    (tn, fp), (fn, tp) = matrix
    mcc = (tp * tn - fp * fn) / np.sqrt(float((tp + fp) * (tp + fn) * (tn + fp) * (tn + fn)))
    assert "confusion matrix" in err and json.loads(out)["mcc"] == pytest.approx(mcc)


def test_the_cli_prints_the_metrics_asked_for(tiny_model_dir, sentiment_csv, tmp_path, capsys):
    from leantrain.commands.cli import main

    job = ["--model", str(tiny_model_dir), "--data", str(sentiment_csv), "--output-dir", str(tmp_path / "r")]
    job += ["--cache-dir", str(tmp_path / "c"), "--max-steps", "2", "--no-progress", "--no-report"]
    code = main(["train", *job, "--metrics", "f1,mcc", "--metric-for-best", "eval_mcc"])
    out = capsys.readouterr().out
    assert code == 0 and "f1 " in out and "mcc " in out and "accuracy" not in out
