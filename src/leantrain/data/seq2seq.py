"""Sequence-to-sequence data: (source, target) text pairs from a table, tokenized once and cached, and batched with
the target shifted right as the decoder's input.

Columns are named (`--source-column`/`--target-column`) or guessed from the usual pairs (source/target,
document/summary, ...); a `translation` column of {language: text} mappings (as WMT data sets hold them) is read
with the two columns naming the languages. A batch's labels are the targets, padded with IGNORE; what counts in the
loss is `target_mask` (each target's own tokens), never the value a label holds at a padded position.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pandas as pd
import torch

from leantrain.data.batching import length_mask, padded, slot_fields
from leantrain.data.sources import ReadOptions, ReadReport, read_table
from leantrain.data.tokenize import (
    TokenizedText,
    cache_key,
    load_cached,
    save_cached,
    source_fingerprint,
    tokenize,
    tokenizer_fingerprint,
)
from leantrain.errors import DataError

log = logging.getLogger("leantrain")

#: (source, target) column names guessed, in this order (lower case)
PAIR_NAMES = (
    ("source", "target"),
    ("document", "summary"),
    ("text", "summary"),
    ("article", "highlights"),
    ("dialogue", "summary"),
    ("input", "output"),
    ("inputs", "targets"),
    ("src", "tgt"),
    ("text", "target"),
)
#: the column of {language: text} mappings that translation data sets hold
TRANSLATION = "translation"
#: the label of a position that counts for nothing (PyTorch's and transformers' convention)
IGNORE = -100


@dataclass(frozen=True)
class PairColumns:
    """Where a table holds its pairs: two columns, or two languages of its `translation` column."""

    source: str
    target: str
    #: the column of {language: text} mappings `source` and `target` are languages of; None: plain columns
    translation: str | None = None

    def describe(self) -> str:
        where = f" of '{self.translation}'" if self.translation else ""
        return f"source '{self.source}', target '{self.target}'{where}"


def _languages(df: pd.DataFrame) -> list[str] | None:
    """The languages of a `translation` column of mappings (None: the table has no such column)."""
    if TRANSLATION not in df.columns:
        return None
    sample = df[TRANSLATION].dropna().head(100)
    if len(sample) == 0 or not all(isinstance(v, dict) for v in sample):
        return None
    return sorted({str(k) for v in sample for k in v})


def resolve_pair_columns(
    df: pd.DataFrame,
    source: str,
    source_column: str | None,
    target_column: str | None,
    require_target: bool = True,
    purpose: str = "to learn from",
) -> PairColumns:
    """The columns the user named, else the first of PAIR_NAMES the table has; a missing or unguessable column is
    refused in one line naming the flag. Without `require_target` (predict) the target may be absent; `purpose` says
    what a missing target was for (evaluation data's is "to score against")."""
    columns = [str(c) for c in df.columns]
    shown = ", ".join(repr(c) for c in columns)
    languages = _languages(df)
    if languages is not None and not ({source_column, target_column} & set(columns)):
        return _translation_columns(source, languages, source_column, target_column, require_target)
    lower = {c.lower(): c for c in columns}
    for flag, name in (("--source-column", source_column), ("--target-column", target_column)):
        if name is not None and name not in columns:
            raise DataError(f"{source}: no column '{name}' (given by {flag}); columns are {shown}")
    for a, b in PAIR_NAMES:
        if source_column is None and target_column is None and a in lower and b in lower:
            source_column, target_column = lower[a], lower[b]
        elif source_column is None and target_column is not None and target_column.lower() == b and a in lower:
            source_column = lower[a]
        elif target_column is None and source_column is not None and source_column.lower() == a and b in lower:
            target_column = lower[b]
    if source_column is None and target_column is None:  # a table with a source but no target, say
        named = [lower[a] for a, _ in PAIR_NAMES if a in lower]
        source_column = named[0] if named else (columns[0] if len(columns) == 1 else None)
    if source_column is None:
        raise DataError(
            f"{source}: cannot tell which column holds the source text among {shown}; name it with --source-column"
        )
    if target_column is None and require_target:
        raise DataError(
            f"{source}: no target column {purpose} among {shown}; name it with --target-column (the text the "
            "model is to generate)"
        )
    if source_column == target_column:
        raise DataError(f"{source}: --source-column and --target-column are both '{source_column}'")
    return PairColumns(source_column, target_column or "")


def _translation_columns(
    source: str, languages: list[str], src: str | None, tgt: str | None, require_target: bool
) -> PairColumns:
    if src is None or (tgt is None and require_target):
        raise DataError(
            f"{source}: its '{TRANSLATION}' column holds translations between {', '.join(languages)}; say which way "
            f"with {_directions(languages, src, tgt)}"
        )
    for flag, lang in (("--source-column", src), ("--target-column", tgt)):
        if lang is not None and lang not in languages:
            raise DataError(
                f"{source}: no language '{lang}' (given by {flag}) in its '{TRANSLATION}' column, which holds "
                f"{', '.join(languages)}"
            )
    return PairColumns(src, tgt or "", TRANSLATION)


def _directions(languages: list[str], src: str | None, tgt: str | None) -> str:
    """The flags of each way the languages can go (the one given kept): both ways shown, so that the run's own is
    chosen, not whichever came first in the alphabet."""
    ways = [(a, b) for a in languages for b in languages if a != b and src in (None, a) and tgt in (None, b)]
    if not ways or len(ways) > 2:
        return f"--source-column and --target-column (two of {', '.join(languages)})"
    return ", or ".join(f"--source-column {a} --target-column {b}" for a, b in ways)


def pair_texts(df: pd.DataFrame, cols: PairColumns, report: ReadReport | None = None) -> tuple[list[str], list[str]]:
    """The sources and targets of the rows that have both (rows without one are dropped and counted in `report`);
    without a target column, the targets are empty."""
    if cols.translation is not None:
        rows = df[cols.translation]
        sources = rows.map(lambda v: v.get(cols.source) if isinstance(v, dict) else None)
        targets = rows.map(lambda v: v.get(cols.target) if isinstance(v, dict) else None)
    else:
        sources = df[cols.source]
        targets = df[cols.target] if cols.target else pd.Series([""] * len(df), index=df.index)

    def empty(values: pd.Series) -> np.ndarray:
        return (values.isna() | (values.astype(str).str.strip() == "")).to_numpy()

    no_source = empty(sources)
    no_target = empty(targets) if cols.target else np.zeros(len(df), dtype=bool)
    if report is not None:
        report.drop("without a source text", int(no_source.sum()))
        report.drop("without a target text", int((no_target & ~no_source).sum()))
    keep = ~(no_source | no_target)
    return sources[keep].astype(str).tolist(), targets[keep].astype(str).tolist()


def tokenize_targets(tokenizer: Any, texts: list[str], max_length: int, chunk: int = 2048) -> TokenizedText:
    """Targets as the tokenizer encodes text to generate (`text_target=`: Marian's target vocabulary, for one)."""
    ids: list[np.ndarray] = []
    for start in range(0, len(texts), chunk):
        enc = tokenizer(
            text_target=texts[start : start + chunk],
            truncation=True,
            max_length=max_length,
            return_attention_mask=False,
            return_token_type_ids=False,
        )
        ids.extend(np.asarray(x, dtype=np.int32) for x in enc["input_ids"])
    offsets = np.zeros(len(ids) + 1, dtype=np.int64)
    np.cumsum([len(x) for x in ids], out=offsets[1:])
    return TokenizedText(np.concatenate(ids) if ids else np.zeros(0, dtype=np.int32), offsets)


def cut_targets(tokenizer: Any, rows: PairRows, max_length: int, chunk: int = 2048) -> tuple[int, int]:
    """How many of `rows`' targets `tokenize_targets` cut at `max_length` tokens, and the longest one's tokens
    whole: only the targets that reach the limit (less a start token `drop_leading` left out) are tokenized again."""
    near = np.flatnonzero(rows.target_lengths >= max_length - 1)
    whole: list[int] = []
    for start in range(0, len(near), chunk):
        texts = [rows.references[i] for i in near[start : start + chunk]]
        enc = tokenizer(text_target=texts, return_attention_mask=False, return_token_type_ids=False, verbose=False)
        whole.extend(len(x) for x in enc["input_ids"])
    longest = max(whole, default=int(rows.target_lengths.max(initial=0)))
    return sum(n > max_length for n in whole), longest


def drop_leading(tokens: TokenizedText, token_id: int | None) -> TokenizedText:
    """Each row without its first token where that is `token_id` (a decoder's start token that the tokenizer also
    puts first, as BERT's [CLS] in a bert2bert model: the decoder starts from it, so it is not a target)."""
    lengths = tokens.lengths
    if token_id is None or len(tokens) == 0:
        return tokens
    starts = tokens.offsets[:-1]
    first = np.zeros(len(tokens.input_ids), dtype=bool)
    has = lengths > 1
    first[starts[has]] = tokens.input_ids[starts[has]] == token_id
    if not first.any():
        return tokens
    dropped = np.zeros(len(tokens), dtype=np.int64)
    dropped[has] = first[starts[has]]
    offsets = np.zeros(len(tokens) + 1, dtype=np.int64)
    np.cumsum(lengths - dropped, out=offsets[1:])
    return TokenizedText(tokens.input_ids[~first], offsets)


@dataclass
class PairRows:
    """Tokenized pairs, batched by `PairCollator`: each row's source and target ids, and the texts they came from
    (the references that generated text is scored against)."""

    source: TokenizedText
    target: TokenizedText
    sources: list[str]
    references: list[str]

    def __len__(self) -> int:
        return len(self.source)

    @property
    def lengths(self) -> np.ndarray:
        """Source lengths: what batches are grouped by (and evaluation sorted by)."""
        return self.source.lengths

    @property
    def target_lengths(self) -> np.ndarray:
        return self.target.lengths

    def row(self, i: int) -> dict[str, np.ndarray]:
        return {"input_ids": self.source.row(i)["input_ids"], "target_ids": self.target.row(i)["input_ids"]}

    def subset(self, rows: np.ndarray) -> PairRows:
        rows = np.asarray(rows, dtype=np.int64)
        return PairRows(
            self.source.subset(rows),
            self.target.subset(rows),
            [self.sources[i] for i in rows],
            [self.references[i] for i in rows],
        )


@dataclass
class PairSource:
    """One table's pairs after reading and tokenizing (or loading both from the cache)."""

    path: str
    columns: PairColumns
    rows: PairRows
    report: ReadReport
    cache_hit: bool

    def describe(self) -> str:
        cached = "tokenized data loaded from cache" if self.cache_hit else "tokenized and cached"
        return f"{self.report.summary()}; {self.columns.describe()}; {cached}"


@dataclass(frozen=True)
class PairSettings:
    """How pairs are read and tokenized: every field is in the cache key."""

    source_column: str | None = None
    target_column: str | None = None
    prefix: str = ""
    max_source_length: int = 128
    max_target_length: int = 128


def load_pairs(
    source: str, tokenizer: Any, cache_dir: Path, split: str, settings: PairSettings, options: ReadOptions | None
) -> PairSource:
    """`source`'s pairs, tokenized (the prefix before each source), from the cache when it holds them."""
    options = options or ReadOptions()
    key = cache_key(
        kind="seq2seq",
        read=options.key(),
        source=source_fingerprint(source),
        split=split,
        settings=settings.__dict__,
        tokenizer=tokenizer_fingerprint(tokenizer),
    )
    paths = [cache_dir / "tokenized" / f"{key}-{part}.npz" for part in ("source", "target")]
    source_entry, target_entry = (load_cached(p, vocab_size=len(tokenizer)) for p in paths)
    if source_entry is not None and target_entry is not None:
        (src, references, meta), (tgt, sources, _) = source_entry, target_entry
        try:
            columns, report = PairColumns(**meta["columns"]), ReadReport.of_cached(meta["report"], source)
        except TypeError:
            log.warning("tokenization cache entry %s describes its columns wrongly; tokenizing again", paths[0])
        else:
            if len(src) == len(tgt):
                return PairSource(source, columns, PairRows(src, tgt, sources, references), report, True)
    df, report = read_table(source, split=split, options=options)
    purpose = "to learn from" if split == "train" else "to score against"
    columns = resolve_pair_columns(df, source, settings.source_column, settings.target_column, purpose=purpose)
    sources, targets = pair_texts(df, columns, report)
    if not sources:
        raise DataError(f"{source}: no row holds both a source and a target text ({columns.describe()})")
    src = tokenize(tokenizer, [settings.prefix + s for s in sources], None, settings.max_source_length)
    tgt = tokenize_targets(tokenizer, targets, settings.max_target_length)
    meta = {"columns": columns.__dict__, "report": report.__dict__}
    try:
        save_cached(paths[0], src, targets, meta)
        save_cached(paths[1], tgt, sources, meta)
    except OSError as exc:  # a read-only cache slows the next run down; it does not stop this one
        log.warning("could not write the tokenization cache at %s (%s)", paths[0], exc)
    return PairSource(source, columns, PairRows(src, tgt, sources, targets), report, False)


class PairCollator:
    """Pads each micro-batch's sources and targets to their own longest (dynamic padding), or to `fixed_length`'s
    (source, target) lengths (--pad-to-max-length); the decoder's input is the target shifted right behind the
    start token, as transformers' models shift labels themselves."""

    #: static shapes' padding of the decoder's fields (a filled row's labels are ignored, its targets masked)
    pad_values: ClassVar[dict[str, Any]] = {"decoder_input_ids": None, "target_mask": False}
    #: the tokens the model computes on: the sources' and the targets'
    padded_keys = ("input_ids", "labels")

    def __init__(self, pad_token_id: int, decoder_start_token_id: int, fixed_length: tuple[int, int] | None = None):
        self.pad, self.start = pad_token_id, decoder_start_token_id
        self.pad_token_id = pad_token_id
        self.fixed_length = fixed_length

    def __call__(self, items: list[dict]) -> dict[str, torch.Tensor]:
        sources = [x["input_ids"] for x in items]
        targets = [x["target_ids"] for x in items]
        width, depth = self.fixed_length or (max(map(len, sources)), max(max(map(len, targets)), 1))
        decoder_ids = padded([t[:-1] for t in targets], depth, self.pad, start=1)
        decoder_ids[:, 0] = self.start  # the target shifted right behind the start token
        ids = torch.from_numpy(padded(sources, width, self.pad))
        labels = torch.from_numpy(padded(targets, depth, IGNORE))
        target_lengths = [len(t) for t in targets]
        real = sum(map(len, sources)) + sum(map(len, targets))
        return {
            "input_ids": ids,
            "attention_mask": torch.from_numpy(length_mask([len(s) for s in sources], width)),
            "decoder_input_ids": torch.from_numpy(decoder_ids),
            "labels": labels,
            "target_mask": torch.from_numpy(length_mask(target_lengths, depth).astype(bool)),
            **slot_fields(items),
            "num_tokens": torch.tensor(real, dtype=torch.long),  # source and target tokens
            "padded_tokens": torch.tensor(ids.numel() + labels.numel(), dtype=torch.long),
        }
