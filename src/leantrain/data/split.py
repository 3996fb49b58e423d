"""Holding rows out: scikit-learn's `train_test_split` in numpy, row for row.

Every split leantrain makes (the evaluation rows carved from the training data, a `--limit` sample) has always
been scikit-learn's, stratified where the labels allow; runs made before must keep their rows. Importing
`sklearn.model_selection` costs about 2 s of every such run's start, so the two algorithms it runs here
(`StratifiedShuffleSplit` and `ShuffleSplit`, one split, NumPy's legacy `RandomState` from the seed) are
written out below with the same random draws in the same order; tests/data/test_split.py holds them to
scikit-learn's rows.
"""

from __future__ import annotations

import math

import numpy as np


def beyond_limit(limit: int | None, count: int, what: str, flag: str = "--limit") -> str | None:
    """The note for a limit over what the data holds (all of it is used, as a limit that cuts says its sample);
    None where there is no limit or it cuts."""
    if limit is None or limit <= count:
        return None
    return f"{flag} {limit:,} is more than the {count:,} {what} there are: all of them are used"


def stratified_split(
    labels: np.ndarray, test_fraction: float, seed: int, exact_first: int | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Indices (sorted) of a stratified split: `test_fraction` of the rows held out, or exactly `exact_first` rows
    kept first; a random split when a class is too rare to stratify (under two rows, or fewer rows to draw than
    classes). The rows of `sklearn.model_selection.train_test_split(..., stratify=labels, random_state=seed)`."""
    n = len(labels)
    n_first, n_second = _sizes(n, test_fraction, exact_first)
    try:
        first, second = _stratified(np.asarray(labels), n_first, n_second, np.random.RandomState(seed))
    except _TooRare:
        permutation = np.random.RandomState(seed).permutation(n)
        second, first = permutation[:n_second], permutation[n_second : n_second + n_first]
    return np.sort(first), np.sort(second)


class _TooRare(ValueError):
    """A class too rare to stratify: scikit-learn's ValueError, on which the split falls back to a random one."""


def _sizes(n: int, test_fraction: float, exact_first: int | None) -> tuple[int, int]:
    """(rows kept, rows held out), as scikit-learn's `_validate_shuffle_split` counts them."""
    if exact_first is not None:
        if not 0 < exact_first < n:
            raise ValueError(f"exact_first={exact_first} must be between 1 and {n - 1}")
        return exact_first, n - exact_first
    if not 0 < test_fraction < 1:
        raise ValueError(f"test_fraction={test_fraction} must lie in (0, 1)")
    n_second = math.ceil(test_fraction * n)
    if n - n_second <= 0:
        raise ValueError(f"with {n} rows, test_fraction={test_fraction} leaves none to keep")
    return n - n_second, n_second


def _stratified(labels: np.ndarray, n_first: int, n_second: int, rng: np.random.RandomState):
    """`StratifiedShuffleSplit._iter_indices`, one split, without its final shuffle of each side (the caller
    sorts them; it draws nothing that the rows depend on)."""
    if labels.dtype.kind in "fc" and not np.isfinite(labels).all():
        raise _TooRare  # scikit-learn refuses NaN or infinite labels to stratify on
    if labels.ndim == 2:  # multi-label: each distinct row of labels is a class
        labels = np.array([" ".join(row.astype("str")) for row in labels])
    _, y = np.unique(labels, return_inverse=True)
    y = y.reshape(-1)
    counts = np.bincount(y)
    if counts.min() < 2 or n_first < len(counts) or n_second < len(counts):
        raise _TooRare
    rows_of_class = np.split(np.argsort(y, kind="mergesort"), np.cumsum(counts)[:-1])
    first_per_class = _approximate_mode(counts, n_first, rng)
    second_per_class = _approximate_mode(counts - first_per_class, n_second, rng)
    first: list[int] = []
    second: list[int] = []
    for rows, n_i, t_i in zip(rows_of_class, first_per_class, second_per_class):
        shuffled = rows.take(rng.permutation(len(rows)), mode="clip")
        first.extend(shuffled[:n_i])
        second.extend(shuffled[n_i : n_i + t_i])
    return np.asarray(first, dtype=np.int64), np.asarray(second, dtype=np.int64)


def _approximate_mode(counts: np.ndarray, n_draws: int, rng: np.random.RandomState) -> np.ndarray:
    """scikit-learn's `_approximate_mode`: draws per class in proportion to `counts`, the rounding's left-over
    draws going to the largest remainders, ties broken at random."""
    continuous = counts / counts.sum() * n_draws
    floored = np.floor(continuous)
    need = int(n_draws - floored.sum())
    if need > 0:
        remainder = continuous - floored
        for value in np.sort(np.unique(remainder))[::-1]:
            (tied,) = np.where(remainder == value)
            take = min(len(tied), need)
            floored[rng.choice(tied, size=take, replace=False)] += 1
            need -= take
            if need == 0:
                break
    return floored.astype(int)
