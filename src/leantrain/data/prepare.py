"""From a config to tokenized train/eval sets: read, repair, pick columns, map labels, split, cache."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from leantrain.data.columns import Columns, missing_labels, normalise_labels, refuse_shared_columns, resolve_columns
from leantrain.data.dedupe import text_hashes
from leantrain.data.sources import ReadOptions, ReadReport, read_options, read_table, resolve_data_path
from leantrain.data.split import beyond_limit, stratified_split
from leantrain.data.tokenize import (
    TokenizedText,
    cache_key,
    load_cached,
    save_cached,
    source_fingerprint,
    tokenize,
    tokenizer_fingerprint,
    unknown_share,
)
from leantrain.errors import DataError
from leantrain.telemetry.console import counted

if TYPE_CHECKING:  # the config sits above the data layer: its sections are only named here
    from leantrain.config.sections import DataConfig

log = logging.getLogger("leantrain")


@dataclass
class Examples:
    """Examples ready to batch: their features and label ids. The features are tokenized text
    (`TokenizedText`) or processed images or audio (`data.media.MediaFeatures`): both have `row(i)`,
    `subset(rows)` and `lengths`, which is all batching needs."""

    features: Any
    labels: np.ndarray  # int64 class ids (a task of one's own may hold other labels)
    #: a mixture's sources, where each one's rows sit (`data.mixture`); empty: one source
    spans: tuple[Any, ...] = ()

    def __len__(self) -> int:
        return len(self.labels)

    @property
    def lengths(self) -> np.ndarray:
        return self.features.lengths

    @property
    def hashes(self) -> np.ndarray | None:
        """Each row's hash of its normalised text (`data.dedupe`); None for inputs without text."""
        return getattr(self.features, "hashes", None)

    def subset(self, rows: np.ndarray) -> Examples:
        return Examples(self.features.subset(rows), self.labels[rows])

    def batches(
        self, micro_batch: int, accumulation: int, num_processes: int, seed: int, units=None, longest_first=False
    ):
        """The batch sampler and dataset that train on these examples (`data.batching`)."""
        from leantrain.data.batching import ExamplesDataset, GlobalBatchSampler

        sampler = GlobalBatchSampler(
            self.lengths, micro_batch, accumulation, num_processes, seed, units=units, longest_first=longest_first
        )
        return sampler, ExamplesDataset(self)


@dataclass
class Source:
    """One data source after reading and tokenizing (or loading both from the cache)."""

    path: str
    columns: Columns
    tokens: TokenizedText
    labels: list[str]  # label names as strings, one per row
    report: ReadReport
    cache_hit: bool


@dataclass
class PreparedData:
    train: Examples
    eval: Examples
    label_names: list[str]
    columns: Columns
    notes: list[str] = field(default_factory=list)  # what the user should hear about the data


def load_source(
    source: str,
    tokenizer,
    max_length: int,
    cache_dir: Path,
    split: str,
    text_column: str | None = None,
    text_pair_column: str | None = None,
    label_column: str | None = None,
    options: ReadOptions | None = None,
) -> Source:
    options = options or ReadOptions()
    key = cache_key(
        read=options.key(),
        source=source_fingerprint(source),
        split=split,
        text=text_column,
        pair=text_pair_column,
        label=label_column,
        tokenizer=tokenizer_fingerprint(tokenizer),
        max_length=max_length,
        labels="class names",  # a ClassLabel column's ids read as its names (ids before)
    )
    path = cache_dir / "tokenized" / f"{key}.npz"
    cached = load_cached(path, vocab_size=len(tokenizer))
    if cached is not None:
        tokens, labels, meta = cached
        try:
            columns, report = Columns(**meta["columns"]), ReadReport.of_cached(meta["report"], source)
        except TypeError:
            log.warning("tokenization cache entry %s describes its columns wrongly; tokenizing again", path)
        else:
            refuse_shared_columns(columns, source)
            refuse_unreadable_text(source, tokens, tokenizer)
            return Source(source, columns, tokens, labels, report, True)

    df, report = read_table(source, split=split, options=options)
    cols = resolve_columns(df, source, text_column, text_pair_column, label_column)
    df = _class_names(df, cols.label)
    df = _drop_unusable(df, cols, report, options.empty_label_is_no_class)
    labels = normalise_labels(df[cols.label]).tolist()
    texts = df[cols.text].astype(str).tolist()
    pairs = df[cols.text_pair].astype(str).tolist() if cols.text_pair else None
    tokens = tokenize(tokenizer, texts, pairs, max_length)
    refuse_unreadable_text(source, tokens, tokenizer)
    tokens.hashes = text_hashes(texts, pairs)
    meta = {"columns": cols.__dict__, "report": report.__dict__}
    try:
        save_cached(path, tokens, labels, meta)
    except OSError as exc:  # a read-only cache slows the next run down; it does not stop this one
        log.warning("could not write the tokenization cache at %s (%s)", path, exc)
    return Source(source, cols, tokens, labels, report, False)


#: above this share of unknown tokens the model reads too little of the text to learn from it
MAX_UNKNOWN_SHARE = 0.5


def refuse_unreadable_text(source: str, tokens: TokenizedText, tokenizer, rows: int = 2000) -> None:
    """Refuse data that the tokenizer turns mostly into its unknown token (another alphabet, or a tokenizer that
    is not the model's): a model trained on it learns from [UNK]s."""
    share = unknown_share(tokens, tokenizer, rows)
    if share is not None and share > MAX_UNKNOWN_SHARE:
        raise DataError(
            f"{source}: the tokenizer maps {share:.0%} of the tokens of its first {min(rows, len(tokens)):,} rows to "
            f"its unknown token {tokenizer.unk_token!r}: it cannot read this text (another language or alphabet, "
            "or not the model's tokenizer); give a model whose tokenizer covers it"
        )


def _class_names(df: pd.DataFrame, column: str | None) -> pd.DataFrame:
    """A `datasets` ClassLabel column's ids as its class names (a `save_to_disk` folder's, a hub data set's), as
    the streaming reader and transformers' pipelines name them; other columns pass through."""
    names = df.attrs.get("class_names", {}).get(column) if column is not None else None
    if not names:
        return df
    df = df.copy()

    def name(value):
        ok = isinstance(value, (int, np.integer)) and not isinstance(value, bool) and 0 <= value < len(names)
        return names[int(value)] if ok else value  # (-1 is datasets' "no label": missing, as an empty cell)

    df[column] = df[column].map(name).astype(object)
    return df


def _drop_unusable(
    df: pd.DataFrame, cols: Columns, report: ReadReport, empty_label_is_no_class: bool = False
) -> pd.DataFrame:
    text_cols = [c for c in (cols.text, cols.text_pair) if c]
    empty_text = np.zeros(len(df), dtype=bool)
    for c in text_cols:
        empty_text |= df[c].isna().to_numpy() | (df[c].astype(str).str.strip() == "").to_numpy()
    no_label, why = missing_labels(df[cols.label])
    if empty_label_is_no_class:  # a multi-label row with no class: its empty set, kept
        df = df.copy()
        df.loc[no_label, cols.label] = ""
        report.rows_without_class = int((no_label & ~empty_text).sum())
        no_label = np.zeros(len(df), dtype=bool)
    report.drop("with empty text", int((empty_text & ~no_label).sum()))
    report.drop(why, int(no_label.sum()))
    return df[~(empty_text | no_label)].reset_index(drop=True)


def prepare_data(data: DataConfig, tokenizer, cache_dir: Path, codec=None, *, seed: int) -> PreparedData:
    """Load (or reuse) the tokenized training and evaluation data that the data section describes; `codec` turns
    labels into targets (`data.labels`: class ids by default, numbers or sets of classes); `seed` draws the held-out
    rows and the --limit sample."""
    from leantrain.data.labels import ClassLabels

    codec = codec or ClassLabels()
    common = dict(
        tokenizer=tokenizer,
        max_length=data.max_length,
        cache_dir=cache_dir,
        text_column=data.text_column,
        text_pair_column=data.text_pair_column,
        label_column=data.label_column,
    )
    assert not isinstance(data.data, list), "one source: data.combine reads a mixture's sources one at a time"
    if data.streaming:
        return _prepare_streamed(data, common, seed)
    train_src = load_source(resolve_data_path(data.data), split="train", options=read_options(data, "train"), **common)
    notes = [_describe(train_src)]
    assert train_src.columns.label is not None  # resolve_columns requires a label column by default
    label_names = codec.fit(train_src.labels, train_src.path, train_src.columns.label)
    all_train = Examples(train_src.tokens, codec.encode(train_src.labels, train_src.path, train_src.columns.label))
    if len(all_train) < 2:
        raise DataError(f"{train_src.path}: only {len(all_train)} usable rows; need at least two")

    if data.eval_data:
        eval_src = load_source(data.eval_data, split="eval", options=read_options(data, "eval"), **common)
        notes.append(_describe(eval_src))
        check_same_inputs(train_src, eval_src)
        assert eval_src.columns.label is not None
        eval_set = Examples(
            eval_src.tokens, codec.encode(eval_src.labels, eval_src.path, eval_src.columns.label, training=False)
        )
        train_rows = np.arange(len(all_train))
    else:
        train_rows, eval_rows = stratified_split(all_train.labels, data.eval_fraction, seed)
        eval_set = all_train.subset(eval_rows)
        notes.append(
            f"held out {counted(len(eval_rows), 'row')} ({data.eval_fraction:.0%}, stratified, seed {seed}) "
            "for evaluation"
        )
    if data.limit is not None and data.limit < len(train_rows):
        keep, _ = stratified_split(
            all_train.labels[train_rows], 1 - data.limit / len(train_rows), seed + 1, exact_first=data.limit
        )
        train_rows = np.sort(train_rows[keep])
        notes.append(f"training on a stratified sample of {len(train_rows):,} rows (--limit)")
    elif over := beyond_limit(data.limit, len(train_rows), "training rows"):
        notes.append(over)
    return PreparedData(all_train.subset(train_rows), eval_set, label_names, train_src.columns, notes)


def _prepare_streamed(data: DataConfig, common: dict[str, Any], seed: int) -> PreparedData:
    """--streaming: the training rows stay a stream (`data.streaming`); evaluation data is read whole."""
    from leantrain.data.streaming import prepare_stream

    assert not isinstance(data.data, list)
    stream, held_out, label_names, columns, notes = prepare_stream(
        data, common["tokenizer"], resolve_data_path(data.data), read_options(data, "train"), seed=seed
    )
    if held_out is not None:
        evaluation = Examples(*held_out)
    else:
        assert data.eval_data is not None  # prepare_stream holds rows out unless --eval-data is given
        eval_src = load_source(data.eval_data, split="eval", options=read_options(data, "eval"), **common)
        notes.append(_describe(eval_src))
        unseen = sorted(set(eval_src.labels) - set(label_names))
        if unseen:
            raise DataError(
                f"{eval_src.path}: labels {unseen[:5]} never occur in the head of the training stream "
                f"(which has {label_names}); fix or drop those rows"
            )
        label_id = {name: i for i, name in enumerate(label_names)}
        evaluation = Examples(eval_src.tokens, np.array([label_id[x] for x in eval_src.labels], dtype=np.int64))
    if data.limit is not None:
        stream.dataset = stream.dataset.take(data.limit)
        notes.append(f"training on the stream's first {data.limit:,} rows (--limit)")
    return PreparedData(stream, evaluation, label_names, columns, notes)


def check_same_inputs(train: Source, evaluation: Source) -> None:
    """An evaluation file must feed the model what training did: a text pair in both, or in neither."""
    if (train.columns.text_pair is None) != (evaluation.columns.text_pair is None):

        def shape(src: Source) -> str:
            pair = f" and '{src.columns.text_pair}'" if src.columns.text_pair else ""
            return f"'{src.columns.text}'{pair}"

        raise DataError(
            f"{evaluation.path}: evaluation text is column(s) {shape(evaluation)} but training used "
            f"{shape(train)} from {train.path}; give an evaluation file with the same kind of text columns"
        )


def _describe(src: Source) -> str:
    cols = f"text='{src.columns.text}'" + (f", pair='{src.columns.text_pair}'" if src.columns.text_pair else "")
    cols += f", label='{src.columns.label}'"
    cached = "tokenized data loaded from cache" if src.cache_hit else "tokenized and cached"
    return f"{src.report.summary()}; columns {cols}; {cached}"
