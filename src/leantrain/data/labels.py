"""How a label column becomes training targets: class ids, numbers (regression) or sets of classes
(multi-label). `prepare_data` asks a codec for the label names (fit on the training labels) and the target
array of each source; labels arrive as strings (`columns.normalise_labels`; lists as JSON)."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd

from leantrain.data.columns import build_label_map
from leantrain.errors import DataError


class ClassLabels:
    """One class per example: int64 ids into the sorted label names."""

    def fit(self, labels: list[str], source: str, column: str) -> list[str]:
        self.names = build_label_map(pd.Series(labels), source, column)
        return self.names

    def encode(self, labels: list[str], source: str, column: str, training: bool = True) -> np.ndarray:
        label_id = {name: i for i, name in enumerate(self.names)}
        unseen = sorted(set(labels) - set(label_id))
        if unseen:
            raise DataError(
                f"{source}: labels {unseen[:5]} in column '{column}' never occur in the training data "
                f"(which has {self.names}); fix or drop those rows"
            )
        return np.array([label_id[x] for x in labels], dtype=np.int64)


class NumberLabels:
    """Regression: one float32 target per example; the one output is named after the label column."""

    def fit(self, labels: list[str], source: str, column: str) -> list[str]:
        values = self.encode(labels, source, column)
        if np.std(values) == 0:
            raise DataError(f"{source}: label column '{column}' holds one value only ({values[0]}); nothing to learn")
        return [str(column)]

    def encode(self, labels: list[str], source: str, column: str, training: bool = True) -> np.ndarray:
        out = np.empty(len(labels), dtype=np.float32)
        for i, text in enumerate(labels):
            try:
                out[i] = value = float(text)
            except ValueError:
                value = math.nan
            if not math.isfinite(value):
                raise DataError(
                    f"{source}: label column '{column}' holds {text!r} (row {i + 1}), not a number; "
                    "--problem-type regression needs a number in every row"
                )
        return out


class MultiLabels:
    """Multi-label: a set of classes per example (a list column, or names joined by `separator`), as a
    multi-hot float32 row over the sorted class names."""

    def __init__(self, separator: str | None):
        self.separator = separator

    def split(self, text: str) -> list[str]:
        if text.startswith("["):
            try:
                items = json.loads(text)
            except json.JSONDecodeError:
                items = None
            if isinstance(items, list):
                return [str(x).strip() for x in items if str(x).strip()]
        if self.separator:
            return [x.strip() for x in text.split(self.separator) if x.strip()]
        return [text.strip()] if text.strip() else []

    def fit(self, labels: list[str], source: str, column: str) -> list[str]:
        sets = [self.split(x) for x in labels]
        if not any(len(s) > 1 for s in sets):
            raise DataError(
                f"{source}: label column '{column}' holds one label per row; for --problem-type multi-label give a "
                "list column (JSON, Parquet) or name the character that joins the labels with --label-separator"
            )
        self.names = sorted({x for s in sets for x in s})
        return self.names

    def encode(self, labels: list[str], source: str, column: str, training: bool = True) -> np.ndarray:
        index = {name: i for i, name in enumerate(self.names)}
        out = np.zeros((len(labels), len(self.names)), dtype=np.float32)
        for row, text in enumerate(labels):
            for name in self.split(text):
                if name not in index:
                    raise DataError(
                        f"{source}: label {name!r} in column '{column}' never occurs in the training data "
                        f"(which has {self.names[:10]}); fix or drop those rows"
                    )
                out[row, index[name]] = 1.0
        return out


class SourceClassLabels:
    """One source of a mixture, read for class ids: its own names and ids in the order a run of it alone would have
    (so its held-out rows are that run's), without the checks that hold for the whole head only (a source may hold
    one class; an evaluation row may hold a class only another source trains on). `rename`: the source's explicit id
    map, the class names in id order (a label column of ids 0..k-1 means these; names pass through)."""

    def __init__(self, rename: tuple[str, ...] | None = None, source: str = ""):
        self.rename, self.source = rename, source
        self.names: list[str] = []

    def _named(self, labels: list[str]) -> list[str]:
        if self.rename is None:
            return list(labels)
        known = set(self.rename)
        out = []
        for x in labels:
            if x in known:
                out.append(x)
            elif x.isdigit() and int(x) < len(self.rename):
                out.append(self.rename[int(x)])
            else:
                raise DataError(
                    f"{self.source}: label {x!r} is neither an id of its labels {list(self.rename)} nor one of them"
                )
        return out

    def fit(self, labels: list[str], source: str, column: str) -> list[str]:
        names = sorted(set(self._named(labels)))
        if names and all(n.lstrip("-").isdigit() for n in names):
            names = sorted(names, key=int)  # as `build_label_map` orders them
        self.names = names
        return list(names)

    def encode(self, labels: list[str], source: str, column: str, training: bool = True) -> np.ndarray:
        named = self._named(labels)
        for x in named:  # an evaluation row may hold a class this source does not train on
            if x not in self.names:
                self.names.append(x)
        label_id = {name: i for i, name in enumerate(self.names)}
        return np.array([label_id[x] for x in named], dtype=np.int64)
