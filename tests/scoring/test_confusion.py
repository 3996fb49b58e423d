"""The classification scores leantrain computes from a confusion matrix with numpy (to spare every run scikit-learn's
import) equal scikit-learn's own, to 1e-12, on many small random cases: classes missing from the predictions, the
labels or both, a multi-label column never on; and scoring the defaults does not import scikit-learn."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
from sklearn import metrics as skm

from leantrain.tasks.scoring import classification_report, metric_names, score

SIZES = (1, 2, 3, 4, 6, 10, 40)
SEEDS = range(6)

# scikit-learn's own warnings on these degenerate cases ("A single label was found", "y_pred contains classes not in
# y_true") are what the cases are for
pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def some_of(rng: np.random.Generator, classes: int, n: int) -> np.ndarray:
    """n draws from a random subset of the classes (so a class is often missing)."""
    subset = rng.choice(classes, size=rng.integers(1, classes + 1), replace=False)
    return rng.choice(subset, size=n)


def cases(classes: int):
    seen = set()
    for seed in SEEDS:
        rng = np.random.default_rng([classes, seed])
        for n in SIZES:
            y, preds = some_of(rng, classes, n), some_of(rng, classes, n)
            for c in range(classes):
                seen.add((c in y, c in preds))
            yield y, preds
    # every way a class can be missing occurred: from labels only, from predictions only, from both
    assert seen >= {(False, True), (True, False), (False, False)}, seen


def one_hot_probs(preds: np.ndarray, classes: int) -> np.ndarray:
    return (np.eye(classes)[preds] + 0.1) / (1 + 0.1 * classes)


def sklearn_single(y: np.ndarray, preds: np.ndarray, classes: int) -> dict[str, float]:
    glue = "binary" if classes == 2 else "macro"
    # a macro average is over the classes with examples: scikit-learn's labels= given those
    present = {"labels": np.unique(y)}
    on_glue = {} if classes == 2 else present
    return {
        "accuracy": skm.accuracy_score(y, preds),
        "f1": skm.f1_score(y, preds, average=glue, zero_division=0, **on_glue),
        "macro_f1": skm.f1_score(y, preds, average="macro", zero_division=0, **present),
        "micro_f1": skm.f1_score(y, preds, average="micro", zero_division=0),
        "weighted_f1": skm.f1_score(y, preds, average="weighted", zero_division=0),
        "precision": skm.precision_score(y, preds, average=glue, zero_division=0, **on_glue),
        "recall": skm.recall_score(y, preds, average=glue, zero_division=0, **on_glue),
        "balanced_accuracy": skm.balanced_accuracy_score(y, preds),
        "mcc": skm.matthews_corrcoef(y, preds),
    }


@pytest.mark.parametrize("classes", [2, 3, 5])
def test_single_label_scores_equal_scikit_learns(classes):
    names = ("accuracy", "f1", "macro_f1", "micro_f1", "weighted_f1", "precision", "recall", "balanced_accuracy", "mcc")
    for y, preds in cases(classes):
        got = score("single-label", names, one_hot_probs(preds, classes), y)
        want = sklearn_single(y, preds, classes)
        for name in names:
            assert got[name] == pytest.approx(want[name], abs=1e-12, rel=0), (name, y.tolist(), preds.tolist())


def test_binary_f1_is_zero_where_the_positive_class_never_occurs_and_differs_from_macro():
    y, preds = np.zeros(5, dtype=np.int64), np.array([0, 0, 0, 0, 0])
    got = score("single-label", ("f1", "precision", "recall", "macro_f1"), one_hot_probs(preds, 2), y)
    assert got == {"f1": 0.0, "precision": 0.0, "recall": 0.0, "macro_f1": 1.0}
    assert skm.f1_score(y, preds, zero_division=0) == 0.0 and skm.f1_score(y, preds, average="macro") == 1.0


@pytest.mark.parametrize("classes", [2, 3, 5])
def test_the_report_equals_scikit_learns_even_with_labels_outside_the_names(classes):
    for y, preds in cases(classes):
        for named in {classes, max(classes - 1, 1)}:  # fewer names than classes: rows outside `labels=`
            if not np.isin(y, np.arange(named)).any():
                continue  # scikit-learn's confusion_matrix refuses labels none of which is in y_true
            report = classification_report(one_hot_probs(preds, classes), y, [f"c{i}" for i in range(named)])
            ids = np.arange(named)
            p, r, f, s = skm.precision_recall_fscore_support(y, preds, labels=ids, zero_division=0)
            assert report["confusion_matrix"] == skm.confusion_matrix(y, preds, labels=ids).tolist()
            got = np.array(
                [[row[k] for k in ("precision", "recall", "f1", "support")] for row in report["per_class"].values()]
            )
            np.testing.assert_allclose(got, np.stack([p, r, f, s], 1), rtol=0, atol=1e-12)


def with_examples(y: np.ndarray) -> list[int] | None:
    """The label columns on in some row (every one, where none is): what a macro average is over."""
    on = [j for j in range(y.shape[1]) if y[:, j].any()]
    return on or None


@pytest.mark.parametrize("labels", [2, 3, 5])
def test_multi_label_scores_equal_scikit_learns(labels):
    names = ("micro_f1", "macro_f1", "f1", "precision", "recall")
    seen_off = set()
    for seed in SEEDS:
        rng = np.random.default_rng([labels, seed, 1])
        for n in SIZES:
            y = (rng.uniform(size=(n, labels)) < rng.uniform(0.1, 0.9)).astype(np.float32)
            probs = rng.uniform(size=(n, labels))
            off = int(rng.integers(4))  # a column never on: in the labels, the predictions, both, neither
            if off & 1:
                y[:, seed % labels] = 0
            if off & 2:
                probs[:, seed % labels] = 0.1
            preds = (probs >= 0.5).astype(np.int64)
            seen_off.add(off)
            got = score("multi-label", names, probs, y, 0.5)
            yi = y.astype(np.int64)
            want = {
                "micro_f1": skm.f1_score(yi, preds, average="micro", zero_division=0),
                "macro_f1": skm.f1_score(yi, preds, average="macro", zero_division=0, labels=with_examples(yi)),
                "f1": skm.f1_score(yi, preds, average="micro", zero_division=0),
                "precision": skm.precision_score(yi, preds, average="micro", zero_division=0),
                "recall": skm.recall_score(yi, preds, average="micro", zero_division=0),
            }
            for name in names:
                assert got[name] == pytest.approx(want[name], abs=1e-12, rel=0), (name, yi.tolist(), preds.tolist())
    assert seen_off == {0, 1, 2, 3}


def test_scoring_the_defaults_does_not_import_scikit_learn():
    code = """
import sys
import numpy as np
from leantrain.tasks.scoring import metric_names, score
probs, labels = np.array([[0.9, 0.1], [0.2, 0.8], [0.6, 0.4]]), np.array([0, 1, 1])
print(score("single-label", metric_names("single-label"), probs, labels))
print(score("multi-label", metric_names("multi-label"), probs, np.array([[1, 0], [0, 1], [1, 1]])))
assert "sklearn" not in sys.modules, sorted(m for m in sys.modules if m.startswith("sklearn"))[:5]
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "macro_f1" in done.stdout and "subset_accuracy" in done.stdout
    assert metric_names("single-label") == ("accuracy", "macro_f1", "loss")  # the defaults the child scored


def test_a_macro_average_leaves_out_a_class_without_examples_as_scikit_learns_labels_would():
    y = np.array([0, 0, 1, 1, 1, 0])
    preds = np.array([0, 2, 1, 1, 0, 0])  # class 2 is predicted once and has no example
    got = score("single-label", ("macro_f1", "precision", "recall"), one_hot_probs(preds, 3), y)
    present = np.unique(y)
    assert got["macro_f1"] == pytest.approx(skm.f1_score(y, preds, labels=present, average="macro"))
    assert got["precision"] == pytest.approx(skm.precision_score(y, preds, labels=present, average="macro"))
    assert got["macro_f1"] > skm.f1_score(y, preds, average="macro", zero_division=0)  # which counted class 2 as 0
    # multi-label: a label never on in the evaluation set (and never predicted) is left out too
    truth = np.array([[1, 0, 0], [0, 1, 0], [1, 1, 0]])
    probs = np.array([[0.9, 0.1, 0.1], [0.2, 0.8, 0.1], [0.7, 0.3, 0.2]])
    got = score("multi-label", ("macro_f1",), probs, truth)["macro_f1"]
    expected = skm.f1_score(truth, (probs >= 0.5).astype(int), labels=[0, 1], average="macro")
    assert got == pytest.approx(expected) and got > 0.7
