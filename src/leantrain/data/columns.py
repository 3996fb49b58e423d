"""Find the text, text-pair and label columns of a table, and build the label map."""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass

import numpy as np
import pandas as pd

from leantrain.errors import DataError

TEXT_NAMES = ("text", "sentence", "content", "review", "document", "tweet", "message", "sms", "comment", "body")
PAIR_NAMES = (
    ("sentence1", "sentence2"),
    ("#1 String", "#2 String"),
    ("text_a", "text_b"),
    ("question1", "question2"),
    ("premise", "hypothesis"),
    ("question", "sentence"),
    ("text", "text_pair"),
)
LABEL_NAMES = ("label", "labels", "sentiment", "class", "category", "target", "quality", "score", "y")  # score: STS-B


@dataclass(frozen=True)
class Columns:
    text: str
    label: str | None
    text_pair: str | None = None


def resolve_columns(
    df: pd.DataFrame, source: str, text: str | None, pair: str | None, label: str | None, require_label: bool = True
) -> Columns:
    """Use the columns the user named; guess the others when exactly one choice is obvious."""
    cols = list(df.columns)
    lower = {str(c).lower(): c for c in cols}
    for flag, name in (("--text-column", text), ("--text-pair-column", pair), ("--label-column", label)):
        if name is not None and name not in df.columns:
            raise DataError(f"{source}: no column '{name}' (given by {flag}); columns are {_list(cols)}")
    if label is None:
        label = next((lower[n] for n in LABEL_NAMES if n in lower), None)
        if label is None and require_label:
            if not _no_header_hint(df) and _unlabelled(df):
                raise DataError(
                    f"{source}: no label column among {_list(cols)}, only text and row ids (an unlabelled split, "
                    f"such as GLUE's test.tsv?): train on labelled rows, or predict on these with "
                    f"leantrain predict RUN --data {source}"
                )
            raise DataError(
                f"{source}: cannot tell which column holds the label among {_list(cols)}; "
                + "name it with --label-column"
                + _no_header_hint(df, ", or")
            )
    if pair is not None and pair == label:
        raise DataError(f"{source}: --text-pair-column and the label column are both '{pair}'; name the second texts")
    if text is None:
        for a, b in PAIR_NAMES:
            if a.lower() in lower and b.lower() in lower and pair in (None, lower[b.lower()]):
                text, pair = lower[a.lower()], lower[b.lower()]
                break
    if text is None:
        named = [lower[n] for n in TEXT_NAMES if n in lower]
        if len(named) == 1:
            text = named[0]
        else:
            candidates = named or [c for c in cols if c not in (label, pair) and _is_string(df[c])]
            if len(candidates) != 1:
                what = "ambiguous" if candidates else "not found"
                hint = "name it with --text-column" + _no_header_hint(df, ", or")
                raise DataError(f"{source}: text column {what} among {_list(cols)}; {hint}")
            text = candidates[0]
    columns = Columns(text=text, label=label, text_pair=pair)
    refuse_shared_columns(columns, source)
    return columns


def refuse_shared_columns(columns: Columns, source: str) -> None:
    """Refuse one column read as two things: also for columns a tokenization cache entry recorded, which an older
    leantrain may have written without this check."""
    text, pair, label = columns.text, columns.text_pair, columns.label
    if text == label:
        raise DataError(f"{source}: --text-column and --label-column are both '{text}'")
    if pair is not None and pair == label:
        raise DataError(f"{source}: --text-pair-column and the label column are both '{pair}'; name the second texts")
    if text == pair:  # each text would be paired with itself
        raise DataError(f"{source}: the text column and --text-pair-column are both '{text}'; name each with its flag")


def _unlabelled(df: pd.DataFrame) -> bool:
    """Text and row ids only: one text column, and every other is named as an id (`index`, `id`, `guid`...)."""
    text = [c for c in df.columns if _is_string(df[c]) and str(c).lower() not in ID_NAMES]
    ids = [c for c in df.columns if c not in text]
    return len(text) == 1 and all(str(c).lower() in ID_NAMES or str(c).lower().endswith("_id") for c in ids)


ID_NAMES = ("index", "idx", "id", "guid", "row", "row_id", "#")


def _no_header_hint(df: pd.DataFrame, joint: str = "") -> str:
    """`joint` and a clause naming the columns, when the "header" the table was read with looks like a row of data
    (a number, a sentence); else "". The names are guessed from the values: the column of longest strings is the
    text."""

    def data_like(name: object) -> bool:
        text = str(name).strip()
        return _NUMBER.fullmatch(text) is not None or len(text) > 40 or len(text.split()) > 3

    if not any(data_like(c) for c in df.columns):
        return ""
    lengths = [df[c].astype(str).str.len().mean() if _is_string(df[c]) else 0.0 for c in df.columns]
    longest = int(np.argmax(lengths))
    other = "label" if len(df.columns) == 2 else "column{}"
    names = ["text" if i == longest else other.format(i + 1) for i in range(len(lengths))]
    return f"{joint} if the file has no header (its first line looks like data), --column-names {','.join(names)}"


_NUMBER = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?")


def _is_string(series: pd.Series) -> bool:
    sample = series.dropna().head(100)
    return len(sample) > 0 and all(isinstance(v, str) for v in sample)


def _list(cols: list) -> str:
    return ", ".join(repr(str(c)) for c in cols)


_WHOLE_NUMBER = re.compile(r"[+-]?\d+\.0*")

#: how tools write a missing value into a text cell (pandas' NaN and <NA>, Python's None, SQL's NULL, JSON's null):
#: a label cell holding one is missing, as an empty one is, never a class. "NONE" or "N/A", which label schemes use
#: as classes (stance: FAVOR/AGAINST/NONE), stay labels.
MISSING_LABEL_TEXTS = frozenset({"nan", "NaN", "NAN", "null", "NULL", "Null", "None", "<NA>"})


def missing_label(value) -> bool:
    """Whether a label cell holds no label: None, NaN, empty text or a spelling of a missing value."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return True
    if isinstance(value, (list, tuple, np.ndarray)):
        return False  # a set of classes (multi-label): an empty one is a row without a class, not a missing label
    text = str(value).strip()
    return text == "" or text in MISSING_LABEL_TEXTS


def missing_labels(values: pd.Series) -> tuple[np.ndarray, str]:
    """Which cells of a label column hold no label, and the drop reason naming what they held, e.g.
    "without a label (12 'NaN', 3 empty)"."""
    missing = np.fromiter((missing_label(v) for v in values), dtype=bool, count=len(values))
    kinds: dict[str, int] = {}
    for v in values[missing]:
        name = "empty" if v is None or (isinstance(v, float) and math.isnan(v)) or not str(v).strip() else repr(str(v))
        kinds[name] = kinds.get(name, 0) + 1
    what = ", ".join(f"{n:,} {k}" for k, n in sorted(kinds.items(), key=lambda kv: -kv[1]))
    return missing, f"without a label ({what})" if what else "without a label"


def normalise_labels(values: pd.Series) -> pd.Series:
    """Labels as strings, so '1' in a CSV, '1.0' from a float column and 1 in a JSON file are the same label."""

    def one(v):
        if isinstance(v, (list, tuple, np.ndarray)):  # a list column (multi-label): one JSON string
            return json.dumps([str(x) for x in list(v)], ensure_ascii=False)
        if isinstance(v, float) and v.is_integer():
            v = int(v)
        text = str(v).strip()
        return str(int(float(text))) if _WHOLE_NUMBER.fullmatch(text) else text

    return values.map(one)


def _fractional_numbers(names: list[str]) -> list[str]:
    """The labels that are numbers with a fraction, when every label is a number (else none: class names)."""
    fractional = []
    for name in names:
        try:
            value = float(name)
        except ValueError:
            return []
        if not math.isfinite(value):  # 'nan', 'inf' and the like are names here
            return []
        if not value.is_integer():
            fractional.append(name)
    return fractional


def _is_json_list(name: str) -> bool:
    """A label `normalise_labels` made from a list value (or text written as one)."""
    if not (name.startswith("[") and name.endswith("]")):
        return False
    try:
        return isinstance(json.loads(name), list)
    except json.JSONDecodeError:
        return False


def build_label_map(labels: pd.Series, source: str, column: str) -> list[str]:
    """Sorted label names (numerically when all are integers); index = class id."""
    names = sorted(set(labels))
    if names and all(_is_json_list(n) for n in names):  # a list column, read as one class per set of classes
        raise DataError(
            f"{source}: label column '{column}' holds lists of classes (e.g. {max(names, key=len)}), one set per row; "
            "a single-label classifier needs one class per row: for sets of classes use --problem-type multi-label"
        )
    fractional = _fractional_numbers(names)
    if fractional:
        raise DataError(
            f"{source}: label column '{column}' holds numbers that are not whole ({', '.join(fractional[:3])}, ...: "
            f"{len(names):,} distinct values); leantrain trains classifiers, one class per label value; "
            "for a numeric target use --problem-type regression"
        )
    if len(names) < 2:
        only = names[0] if names else "nothing"
        raise DataError(
            f"{source}: label column '{column}' holds a single class ({only!r}); a classifier needs at least two"
        )
    if all(n.lstrip("-").isdigit() for n in names):
        names = sorted(names, key=int)
    return names
