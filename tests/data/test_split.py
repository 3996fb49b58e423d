"""data.split: the same rows as scikit-learn's `train_test_split`, without importing scikit-learn."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from leantrain.data.split import stratified_split


def sklearn_split(labels, test_fraction, seed, exact_first=None):
    """What leantrain ran before data.split: scikit-learn, stratified, a random split when that raises."""
    from sklearn.model_selection import train_test_split

    idx = np.arange(len(labels))
    kwargs = {"train_size": exact_first} if exact_first is not None else {"test_size": test_fraction}
    try:
        a, b = train_test_split(idx, stratify=labels, random_state=seed, **kwargs)
    except ValueError:
        a, b = train_test_split(idx, random_state=seed, **kwargs)
    return np.sort(a), np.sort(b)


def label_sets(rng: np.random.Generator):
    """Balanced and skewed classes, ties in the rounding, a class of one row (no stratifying), strings, floats,
    multi-hot rows."""
    yield "two balanced", rng.integers(0, 2, 200)
    yield "skewed", rng.choice(3, 157, p=[0.8, 0.15, 0.05])
    yield "equal counts (ties)", np.repeat(np.arange(7), 9)
    yield "one singleton class", np.array([0] * 30 + [1] * 29 + [2])
    yield "strings", rng.choice(np.array(["neg", "pos", "neutral"]), 91)
    yield "regression", rng.normal(size=50)
    yield "few of many classes", rng.integers(0, 12, 40)
    yield "multi-hot", (rng.random((120, 4)) < 0.3).astype(np.float32)


@pytest.mark.parametrize("seed", [0, 1, 42, 1234])
def test_the_rows_are_scikit_learns(seed):
    rng = np.random.default_rng(seed)
    checked = 0
    for name, labels in label_sets(rng):
        n = len(labels)
        for fraction in (0.1, 0.25, 0.33, 0.5):
            ours, theirs = stratified_split(labels, fraction, seed), sklearn_split(labels, fraction, seed)
            for a, b in zip(ours, theirs, strict=True):
                np.testing.assert_array_equal(a, b, err_msg=f"{name}, test fraction {fraction}")
            checked += 1
        for first in (1, n // 3, n - 1):  # --limit: exactly `first` rows kept
            ours = stratified_split(labels, 1 - first / n, seed + 1, exact_first=first)
            theirs = sklearn_split(labels, 1 - first / n, seed + 1, exact_first=first)
            for a, b in zip(ours, theirs, strict=True):
                np.testing.assert_array_equal(a, b, err_msg=f"{name}, exactly {first} kept")
            checked += 1
    assert checked == 8 * 7


def test_a_split_is_stratified_and_a_partition():
    labels = np.array([0] * 90 + [1] * 10)
    first, second = stratified_split(labels, 0.2, 0)
    assert len(second) == 20 and np.bincount(labels[second]).tolist() == [18, 2]
    assert sorted([*first, *second]) == list(range(100))


@pytest.mark.parametrize(("fraction", "first"), [(0.0, None), (1.0, None), (0.5, 0), (0.5, 4)])
def test_sizes_that_leave_a_side_empty_are_refused(fraction, first):
    with pytest.raises(ValueError):
        stratified_split(np.array([0, 1, 0, 1]), fraction, 0, exact_first=first)


def test_splitting_imports_no_scikit_learn():
    code = (
        "import sys, numpy as np\n"
        "from leantrain.data.prepare import stratified_split\n"
        "stratified_split(np.array([0, 1] * 50), 0.1, 42)\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'sklearn'))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
