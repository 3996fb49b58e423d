"""Evaluation scores: one table of named metrics per kind of problem, chosen with `--metrics`, and the
direction of each (`loss`, `mse`, `rmse`, `mae` and `perplexity` are lower-is-better, and so is a metric of
one's own named as an error or a loss: `error_rate`, `mean_absolute_error`, `val_loss`).

The classification scores are scikit-learn's, computed here from a confusion matrix with numpy: importing
scikit-learn took 2.4 s of a 40 s `leantrain train` on a 2-core machine (measured), paid at config validation by
every run. Only `roc_auc` and `r2` (scikit-learn) and `pearson`/`spearman` (scipy) import their library, when used.

`f1`, `precision` and `recall` follow GLUE: binary (the positive class is label id 1) on two classes, as GLUE
scores MRPC and QQP, macro-averaged otherwise. `macro_f1`, `micro_f1` and `weighted_f1` name their averaging.
A macro average is the mean over the classes that have examples in the evaluation set (scikit-learn's `labels=`
given those classes): a class without any has no recall, and counting its F1 as 0, as scikit-learn's default
does, would lower the score for a class the evaluation cannot judge (its false positives still lower the recall
of the classes they were taken from).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

from leantrain.errors import ConfigError

#: metrics that improve downwards; every other metric is higher-is-better
LOWER_IS_BETTER = frozenset({"loss", "mse", "rmse", "mae", "hamming_loss", "perplexity", "wer", "cer"})
#: how a `compute_metrics` name that no task knows says it improves downwards (the HF Trainer's users' names)
LOWER_SUFFIXES = ("_loss", "error", "error_rate", "perplexity")

EPS = 1e-12


def lower_is_better(name: str) -> bool:
    return name in LOWER_IS_BETTER or name.endswith(LOWER_SUFFIXES)


# -- single-label classification: probs (N, C), labels (N,) --------------------------------------------------


def _preds(probs: np.ndarray) -> np.ndarray:
    return probs.argmax(-1)


def _confusion(y: np.ndarray, preds: np.ndarray, ids: Any = ()) -> tuple[np.ndarray, np.ndarray]:
    """Counts of (true, predicted) pairs, rows true, over the sorted labels that either array holds or `ids` adds
    (scikit-learn's label set, where no `labels=` is passed), and those labels."""
    labels, codes = np.unique(np.concatenate([y, preds, np.asarray(ids, dtype=y.dtype)]), return_inverse=True)
    n, k = len(y), len(labels)
    return np.bincount(codes[:n] * k + codes[n : 2 * n], minlength=k * k).reshape(k, k), labels


def _divide(num: Any, den: Any) -> np.ndarray:
    """num / den, and 0.0 where den is 0: scikit-learn's zero_division=0, which every call replaced here passed."""
    num, den = np.asarray(num, dtype=np.float64), np.asarray(den, dtype=np.float64)
    return np.divide(num, den, out=np.zeros_like(num), where=den != 0)


def _prf(tp: np.ndarray, pred_sum: np.ndarray, true_sum: np.ndarray, average: str | None) -> tuple[Any, Any, Any]:
    """Precision, recall and F1 from each label's counts, as scikit-learn's precision_recall_fscore_support:
    `micro` pools the counts, `macro` is the mean over the labels given, `weighted` weighs them by support."""
    if average == "micro":
        tp, pred_sum, true_sum = tp.sum(keepdims=True), pred_sum.sum(keepdims=True), true_sum.sum(keepdims=True)
    scores = _divide(tp, pred_sum), _divide(tp, true_sum), _divide(2 * tp, true_sum + pred_sum)
    if average is None:
        return scores
    weights = true_sum if average == "weighted" else None
    if average == "macro" and true_sum.any():  # the classes with examples (see the module's docstring)
        has = true_sum > 0
        scores = scores[0][has], scores[1][has], scores[2][has]
    precision, recall, f1 = (float(np.average(s, weights=weights)) for s in scores)
    return precision, recall, f1


def _single(p: np.ndarray, y: np.ndarray, average: str | None) -> tuple[float, float, float]:
    """Precision, recall and F1 of the argmax class; average None: GLUE's, as the module's docstring says."""
    m, labels = _confusion(y, _preds(p))
    tp, pred_sum, true_sum = np.diag(m), m.sum(0), m.sum(1)
    if average is None and p.shape[1] == 2:
        # scikit-learn's average="binary" is label 1's counts alone (all 0, so scores 0.0, where 1 never occurs)
        one = labels == 1
        return _prf(tp[one], pred_sum[one], true_sum[one], "micro")
    return _prf(tp, pred_sum, true_sum, average or "macro")


def _f1(average: str | None) -> Callable[[np.ndarray, np.ndarray], float]:
    return lambda p, y: _single(p, y, average)[2]


def _precision(p: np.ndarray, y: np.ndarray) -> float:
    return _single(p, y, None)[0]


def _recall(p: np.ndarray, y: np.ndarray) -> float:
    return _single(p, y, None)[1]


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
    """Matthews' correlation over all classes (Gorodkin's R_K), 0.0 where it is undefined, as scikit-learn."""
    m, _ = _confusion(y, _preds(p))
    true_sum, pred_sum = m.sum(1, dtype=np.float64), m.sum(0, dtype=np.float64)
    n = pred_sum.sum()
    cov_tp = np.trace(m, dtype=np.float64) * n - true_sum @ pred_sum
    cov_pp_tt = (n**2 - pred_sum @ pred_sum) * (n**2 - true_sum @ true_sum)
    return 0.0 if cov_pp_tt == 0 else float(cov_tp / np.sqrt(cov_pp_tt))


def _accuracy(p: np.ndarray, y: np.ndarray) -> float:
    return float((_preds(p) == y).mean())


def _balanced_accuracy(p: np.ndarray, y: np.ndarray) -> float:
    """The mean recall of the classes in `y`; a class only predicted has none and is left out, as scikit-learn."""
    m, _ = _confusion(y, _preds(p))
    true_sum = m.sum(1)
    return float(np.mean(np.diag(m)[true_sum > 0] / true_sum[true_sum > 0]))


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


def _ml_counts(p: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each label's true positives, predictions and true count: every label column counts, even one never on."""
    return (p * y).sum(0), p.sum(0), y.sum(0)


def _ml_f1(average: str) -> Callable[[np.ndarray, np.ndarray, float], float]:
    return _multi(lambda p, y: _prf(*_ml_counts(p, y), average)[2])


def _ml_precision(p: np.ndarray, y: np.ndarray) -> float:
    return _prf(*_ml_counts(p, y), "micro")[0]


def _ml_recall(p: np.ndarray, y: np.ndarray) -> float:
    return _prf(*_ml_counts(p, y), "micro")[1]


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

# -- generated text: predictions and references, lists of strings (a sequence-to-sequence model's) --------------


def _rouge(kind: str) -> Callable[[Sequence[str], Sequence[str]], float]:
    return lambda preds, refs: generation_scores((kind,), preds, refs)[kind]


#: scores of generated text against references, 0-100 as they are published: ROUGE (rouge-score, Porter-stemmed,
#: the mean of each example's F-measure; rougeLsum splits summaries at newlines), BLEU and chrF (sacrebleu's corpus
#: scores, one reference each)
GENERATION: dict[str, Callable[[Sequence[str], Sequence[str]], float]] = {
    "rouge1": _rouge("rouge1"),
    "rouge2": _rouge("rouge2"),
    "rougeL": _rouge("rougeL"),
    "rougeLsum": _rouge("rougeLsum"),
    "bleu": lambda preds, refs: generation_scores(("bleu",), preds, refs)["bleu"],
    "chrf": lambda preds, refs: generation_scores(("chrf",), preds, refs)["chrf"],
}
ROUGE = ("rouge1", "rouge2", "rougeL", "rougeLsum")


@contextlib.contextmanager
def _root_logger_kept() -> Iterator[None]:
    """rouge_score logs through absl, which gives the root logger a handler when it has none (`basicConfig`): the
    caller's own `logging.basicConfig` would then do nothing. Its handlers are put back as they were."""
    handlers = list(logging.root.handlers)
    try:
        yield
    finally:
        for added in [h for h in logging.root.handlers if h not in handlers]:
            logging.root.removeHandler(added)


def generation_scores(names: Sequence[str], preds: Sequence[str], refs: Sequence[str]) -> dict[str, float]:
    """The named scores of `preds` against `refs` (one reference per prediction), every ROUGE kind in one pass."""
    out: dict[str, float] = {}
    rouge = [n for n in names if n in ROUGE]
    if rouge:
        from rouge_score import rouge_scorer

        with _root_logger_kept():
            scorer = rouge_scorer.RougeScorer(rouge, use_stemmer=True)
        totals = dict.fromkeys(rouge, 0.0)
        for pred, ref in zip(preds, refs):
            for kind, value in scorer.score(ref, pred).items():  # (target, prediction)
                totals[kind] += value.fmeasure
        out.update({k: 100 * v / max(len(preds), 1) for k, v in totals.items()})
    if "bleu" in names or "chrf" in names:
        import sacrebleu

        if "bleu" in names:
            out["bleu"] = float(sacrebleu.corpus_bleu(list(preds), [list(refs)]).score)
        if "chrf" in names:
            out["chrf"] = float(sacrebleu.corpus_chrf(list(preds), [list(refs)]).score)
    return {n: out[n] for n in names}


#: what each kind of problem reports without --metrics (loss always comes last)
DEFAULTS = {
    "single-label": ("accuracy", "macro_f1"),
    "regression": ("rmse", "pearson", "spearman"),
    "multi-label": ("micro_f1", "macro_f1", "subset_accuracy"),
    "generation": ROUGE,
}
TABLES: dict[str, dict[str, Any]] = {
    "single-label": CLASSIFICATION,
    "regression": REGRESSION,
    "multi-label": MULTI_LABEL,
    "generation": GENERATION,
}


def parse_metrics(text: str | None) -> list[str]:
    """`--metrics accuracy, f1` -> ['accuracy', 'f1'] (names as written, in lower case but for ROUGE's own
    spellings, rougeL and rougeLsum; checked against a problem type later)."""
    if text is None:
        return []
    spelled = {n.lower(): n for n in ROUGE}
    names = [spelled.get(n, n) for n in (n.strip().lower().removeprefix("eval_") for n in text.split(","))]
    if not all(names):
        raise ConfigError(f"--metrics '{text}' has an empty name; write e.g. accuracy,f1")
    return list(dict.fromkeys(names))


def all_metric_names() -> set[str]:
    return {name for table in TABLES.values() for name in table}


def metric_names(problem_type: str, requested: Sequence[str] = ()) -> tuple[str, ...]:
    """The metrics a run of `problem_type` reports: those asked for (else the defaults), then loss."""
    table = TABLES[problem_type]
    unknown = [n for n in requested if n not in table and n != "loss"]  # every problem reports its loss
    if unknown:
        raise ConfigError(
            f"--metrics: {', '.join(unknown)} not available for {problem_type} problems; choose from "
            f"{', '.join(sorted(table))}"
        )
    names = list(requested or DEFAULTS[problem_type])
    return (*[n for n in names if n != "loss"], "loss")


def score(
    problem_type: str, names: Sequence[str], outputs: Any, labels: Any, threshold: float = 0.5
) -> dict[str, float]:
    """Each named metric of the evaluation's outputs (probabilities, or predicted values for regression; generated
    texts, against reference texts)."""
    table = TABLES[problem_type]
    if problem_type == "generation":
        return generation_scores(names, outputs, labels)
    if problem_type == "multi-label":
        return {n: float(table[n](outputs, labels, threshold)) for n in names}
    return {n: float(table[n](outputs, labels)) for n in names}


def classification_report(probs: np.ndarray, labels: np.ndarray, names: Sequence[str]) -> dict[str, Any]:
    """Per-class precision, recall, F1 and support, and the confusion matrix (rows: true, columns: predicted)."""
    ids = np.arange(len(names))
    m, present = _confusion(labels, _preds(probs), ids)
    # scikit-learn's labels=ids: each class's counts over every row (a true label outside ids still counts as a
    # false positive), the matrix only over ids
    at = np.searchsorted(present, ids)
    tp, pred_sum, support = np.diag(m)[at], m.sum(0)[at], m.sum(1)[at]
    precision, recall, f1 = _prf(tp, pred_sum, support, None)
    per_class = {
        str(name): {"precision": float(p), "recall": float(r), "f1": float(f), "support": int(s)}
        for name, p, r, f, s in zip(names, precision, recall, f1, support)
    }
    matrix = m[np.ix_(at, at)]
    return {"per_class": per_class, "confusion_matrix": matrix.tolist(), "labels": [str(n) for n in names]}


def multi_label_report(probs: np.ndarray, labels: np.ndarray, names: Sequence[str], threshold: float) -> dict[str, Any]:
    """Per-class precision, recall, F1 and support of a multi-label evaluation, each class predicted at a
    probability of `threshold` or above (a confusion matrix does not apply: a row holds any number of classes)."""
    tp, pred_sum, support = _ml_counts((probs >= threshold).astype(np.int64), labels.astype(np.int64))
    precision, recall, f1 = _prf(tp, pred_sum, support, None)
    per_class = {
        str(name): {"precision": float(p), "recall": float(r), "f1": float(f), "support": int(n)}
        for name, p, r, f, n in zip(names, precision, recall, f1, support)
    }
    return {"per_class": per_class, "labels": [str(n) for n in names], "threshold": threshold}


def format_report(report: dict[str, Any]) -> str:
    """The per-class table and the confusion matrix (where there is one) as plain text (what `leantrain evaluate`
    prints)."""
    names = report["labels"]
    width = max(12, *(len(n) for n in names))
    lines = [f"{'class':<{width}} {'precision':>9} {'recall':>9} {'f1':>9} {'support':>9}"]
    for name, row in report["per_class"].items():
        lines.append(
            f"{name:<{width}} {row['precision']:>9.4f} {row['recall']:>9.4f} {row['f1']:>9.4f} {row['support']:>9d}"
        )
    if "confusion_matrix" not in report:  # multi-label
        return "\n".join(lines)
    cell = max(7, *(len(n) for n in names))
    lines += ["", "confusion matrix (rows: true class, columns: predicted)"]
    lines.append(" " * width + " " + " ".join(f"{n:>{cell}}" for n in names))
    for name, row in zip(names, report["confusion_matrix"]):
        lines.append(f"{name:<{width}} " + " ".join(f"{v:>{cell}d}" for v in row))
    return "\n".join(lines)
