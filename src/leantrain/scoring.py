"""Evaluation scores (issue #17), computed with scikit-learn and scipy: one table of named metrics per kind of
problem, chosen with `--metrics`, and the direction of each (`loss`, `mse`, `rmse` and `mae` are lower-is-better).

`f1`, `precision` and `recall` follow GLUE: binary (the positive class is label id 1) on two classes, as GLUE
scores MRPC and QQP, macro-averaged otherwise. `macro_f1`, `micro_f1` and `weighted_f1` name their averaging.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from leantrain.errors import ConfigError

#: metrics that improve downwards; every other metric is higher-is-better
LOWER_IS_BETTER = frozenset({"loss", "mse", "rmse", "mae", "hamming_loss"})

EPS = 1e-12


def lower_is_better(name: str) -> bool:
    return name in LOWER_IS_BETTER or name.endswith("_loss")


# -- single-label classification: probs (N, C), labels (N,) --------------------------------------------------


def _average(probs: np.ndarray) -> str:
    return "binary" if probs.shape[1] == 2 else "macro"


def _preds(probs: np.ndarray) -> np.ndarray:
    return probs.argmax(-1)


def _f1(average: str | None) -> Callable[[np.ndarray, np.ndarray], float]:
    from sklearn.metrics import f1_score

    return lambda p, y: f1_score(y, _preds(p), average=average or _average(p), zero_division=0)


def _precision(p: np.ndarray, y: np.ndarray) -> float:
    from sklearn.metrics import precision_score

    return precision_score(y, _preds(p), average=_average(p), zero_division=0)


def _recall(p: np.ndarray, y: np.ndarray) -> float:
    from sklearn.metrics import recall_score

    return recall_score(y, _preds(p), average=_average(p), zero_division=0)


def _roc_auc(p: np.ndarray, y: np.ndarray) -> float:
    """Binary: the positive class's probability; more classes: one-vs-rest, macro. NaN when a class is absent."""
    from sklearn.metrics import roc_auc_score

    present = np.unique(y)
    if len(present) < 2 or (p.shape[1] > 2 and len(present) < p.shape[1]):
        return float("nan")
    if p.shape[1] == 2:
        return roc_auc_score(y, p[:, 1])
    return roc_auc_score(y, p, multi_class="ovr", average="macro", labels=np.arange(p.shape[1]))


def _mcc(p: np.ndarray, y: np.ndarray) -> float:
    from sklearn.metrics import matthews_corrcoef

    return matthews_corrcoef(y, _preds(p))


def _accuracy(p: np.ndarray, y: np.ndarray) -> float:
    return float((_preds(p) == y).mean())


def _balanced_accuracy(p: np.ndarray, y: np.ndarray) -> float:
    from sklearn.metrics import balanced_accuracy_score

    return balanced_accuracy_score(y, _preds(p))


def _cross_entropy(p: np.ndarray, y: np.ndarray) -> float:
    return float(-np.log(np.clip(p[np.arange(len(y)), y], EPS, 1)).mean())


CLASSIFICATION: dict[str, Callable[[np.ndarray, np.ndarray], float]] = {
    "accuracy": _accuracy,
    "balanced_accuracy": _balanced_accuracy,
    "f1": _f1(None),
    "macro_f1": _f1("macro"),
    "micro_f1": _f1("micro"),
    "weighted_f1": _f1("weighted"),
    "precision": _precision,
    "recall": _recall,
    "mcc": _mcc,
    "roc_auc": _roc_auc,
    "loss": _cross_entropy,
}


# -- regression: preds (N,), labels (N,) ----------------------------------------------------------------------


def _pearson(p: np.ndarray, y: np.ndarray) -> float:
    from scipy.stats import pearsonr

    return float(pearsonr(p, y)[0]) if np.std(p) > 0 and np.std(y) > 0 else float("nan")


def _spearman(p: np.ndarray, y: np.ndarray) -> float:
    from scipy.stats import spearmanr

    return float(spearmanr(p, y)[0]) if np.std(p) > 0 and np.std(y) > 0 else float("nan")


def _r2(p: np.ndarray, y: np.ndarray) -> float:
    from sklearn.metrics import r2_score

    return r2_score(y, p)


REGRESSION: dict[str, Callable[[np.ndarray, np.ndarray], float]] = {
    "mse": lambda p, y: float(np.mean((p - y) ** 2)),
    "rmse": lambda p, y: float(np.sqrt(np.mean((p - y) ** 2))),
    "mae": lambda p, y: float(np.mean(np.abs(p - y))),
    "pearson": _pearson,
    "spearman": _spearman,
    "r2": _r2,
    "loss": lambda p, y: float(np.mean((p - y) ** 2)),
}


# -- multi-label: probs (N, C) of each label on its own, labels (N, C) in {0, 1}; predicted at a threshold -----


def _multi(fn: Callable[[np.ndarray, np.ndarray], float]) -> Callable[[np.ndarray, np.ndarray, float], float]:
    return lambda p, y, t: fn((p >= t).astype(np.int64), y.astype(np.int64))


def _ml_f1(average: str) -> Callable[[np.ndarray, np.ndarray, float], float]:
    from sklearn.metrics import f1_score

    return _multi(lambda p, y: f1_score(y, p, average=average, zero_division=0))


def _ml_precision(p: np.ndarray, y: np.ndarray) -> float:
    from sklearn.metrics import precision_score

    return precision_score(y, p, average="micro", zero_division=0)


def _ml_recall(p: np.ndarray, y: np.ndarray) -> float:
    from sklearn.metrics import recall_score

    return recall_score(y, p, average="micro", zero_division=0)


def _ml_roc_auc(p: np.ndarray, y: np.ndarray, t: float) -> float:
    from sklearn.metrics import roc_auc_score

    keep = [j for j in range(y.shape[1]) if 0 < y[:, j].sum() < len(y)]  # a label always on or off has no AUC
    return roc_auc_score(y[:, keep], p[:, keep], average="macro") if keep else float("nan")


def _binary_cross_entropy(p: np.ndarray, y: np.ndarray, t: float) -> float:
    q = np.clip(p, EPS, 1 - EPS)
    return float(-(y * np.log(q) + (1 - y) * np.log(1 - q)).mean())


MULTI_LABEL: dict[str, Callable[[np.ndarray, np.ndarray, float], float]] = {
    "micro_f1": _ml_f1("micro"),
    "macro_f1": _ml_f1("macro"),
    "f1": _ml_f1("micro"),
    "precision": _multi(_ml_precision),
    "recall": _multi(_ml_recall),
    "subset_accuracy": _multi(lambda p, y: float((p == y).all(axis=1).mean())),
    "accuracy": _multi(lambda p, y: float((p == y).mean())),  # per label and example: 1 - Hamming loss
    "hamming_loss": _multi(lambda p, y: float((p != y).mean())),
    "roc_auc": _ml_roc_auc,
    "loss": _binary_cross_entropy,
}

#: what each kind of problem reports without --metrics (loss always comes last)
DEFAULTS = {
    "single-label": ("accuracy", "macro_f1"),
    "regression": ("rmse", "pearson", "spearman"),
    "multi-label": ("micro_f1", "macro_f1", "subset_accuracy"),
}
TABLES: dict[str, dict[str, Any]] = {
    "single-label": CLASSIFICATION,
    "regression": REGRESSION,
    "multi-label": MULTI_LABEL,
}


def parse_metrics(text: str | None) -> list[str]:
    """`--metrics accuracy, f1` -> ['accuracy', 'f1'] (names as written; checked against a problem type later)."""
    if text is None:
        return []
    names = [n.strip().lower().removeprefix("eval_") for n in text.split(",")]
    if not all(names):
        raise ConfigError(f"--metrics '{text}' has an empty name; write e.g. accuracy,f1")
    return list(dict.fromkeys(names))


def all_metric_names() -> set[str]:
    return {name for table in TABLES.values() for name in table}


def metric_names(problem_type: str, requested: Sequence[str] = ()) -> tuple[str, ...]:
    """The metrics a run of `problem_type` reports: those asked for (else the defaults), then loss."""
    table = TABLES[problem_type]
    unknown = [n for n in requested if n not in table]
    if unknown:
        raise ConfigError(
            f"--metrics: {', '.join(unknown)} not available for {problem_type} problems; choose from "
            f"{', '.join(sorted(table))}"
        )
    names = list(requested or DEFAULTS[problem_type])
    return (*[n for n in names if n != "loss"], "loss")


def score(
    problem_type: str, names: Sequence[str], outputs: np.ndarray, labels: np.ndarray, threshold: float = 0.5
) -> dict[str, float]:
    """Each named metric of the evaluation's outputs (probabilities, or predicted values for regression)."""
    table = TABLES[problem_type]
    if problem_type == "multi-label":
        return {n: float(table[n](outputs, labels, threshold)) for n in names}
    return {n: float(table[n](outputs, labels)) for n in names}


def classification_report(probs: np.ndarray, labels: np.ndarray, names: Sequence[str]) -> dict[str, Any]:
    """Per-class precision, recall, F1 and support, and the confusion matrix (rows: true, columns: predicted)."""
    from sklearn.metrics import confusion_matrix, precision_recall_fscore_support

    ids = np.arange(len(names))
    preds = _preds(probs)
    precision, recall, f1, support = precision_recall_fscore_support(labels, preds, labels=ids, zero_division=0)
    per_class = {
        str(name): {"precision": float(p), "recall": float(r), "f1": float(f), "support": int(s)}
        for name, p, r, f, s in zip(names, precision, recall, f1, support)
    }
    matrix = confusion_matrix(labels, preds, labels=ids)
    return {"per_class": per_class, "confusion_matrix": matrix.tolist(), "labels": [str(n) for n in names]}


def format_report(report: dict[str, Any]) -> str:
    """The per-class table and the confusion matrix as plain text (what `leantrain evaluate` prints)."""
    names = report["labels"]
    width = max(12, *(len(n) for n in names))
    lines = [f"{'class':<{width}} {'precision':>9} {'recall':>9} {'f1':>9} {'support':>9}"]
    for name, row in report["per_class"].items():
        lines.append(
            f"{name:<{width}} {row['precision']:>9.4f} {row['recall']:>9.4f} {row['f1']:>9.4f} {row['support']:>9d}"
        )
    cell = max(7, *(len(n) for n in names))
    lines += ["", "confusion matrix (rows: true class, columns: predicted)"]
    lines.append(" " * width + " " + " ".join(f"{n:>{cell}}" for n in names))
    for name, row in zip(names, report["confusion_matrix"]):
        lines.append(f"{name:<{width}} " + " ".join(f"{v:>{cell}d}" for v in row))
    return "\n".join(lines)
