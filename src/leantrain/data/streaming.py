"""--streaming: train on data too large to read whole, with the same examples in each optimizer step
however the global batch is split.

The training rows are read through `datasets`' streaming reader (local CSV/TSV/JSON/Parquet files, a
`save_to_disk` folder, a `datasets` folder or a hub data set) and shuffled there with a buffer that the
epoch reseeds. They are taken in *windows* of `window_batches` global batches; each window is tokenized and
then batched exactly as `GlobalBatchSampler` batches a whole data set (length grouping within the window,
full batches shuffled), so what each optimizer step holds depends on the seed, the epoch and the global
batch size alone. Every process reads the whole stream and takes its own micro-batches, as Accelerate's
batch-sampler sharding expects. The tokenized rows travel inside the sampler's `Slot`s, so data-loader
workers need no shared state.

What streaming gives up: the tokenization cache (each epoch tokenizes again), text repair (rows are read as
the file holds them), the number of steps per epoch (so `--max-steps` is required) and, for a resumed
run, a seek: the rows before the checkpoint are read again (not tokenized).
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from leantrain.data.batching import GlobalBatchSampler, Slot
from leantrain.data.columns import (
    Columns,
    build_label_map,
    missing_label,
    missing_labels,
    normalise_labels,
    resolve_columns,
)
from leantrain.data.sources import TABLE_SUFFIXES, ReadOptions, split_config
from leantrain.data.tokenize import source_fingerprint, tokenize
from leantrain.errors import DataError

if TYPE_CHECKING:  # the config sits above the data layer: its sections are only named here
    from leantrain.config.sections import DataConfig

log = logging.getLogger("leantrain")

#: rows read ahead to name the columns and the classes (when the data set does not declare them)
HEAD_ROWS = 5000
#: `datasets`' shuffle buffer, in rows
SHUFFLE_BUFFER = 10_000

_BUILDERS = {"csv": "csv", "tsv": "csv", "json": "json", "jsonl": "json", "parquet": "parquet"}


def open_stream(source: str, role: str, options: ReadOptions):
    """A `datasets.IterableDataset` over `source`'s rows (role: train or eval picks the split)."""
    import datasets

    from leantrain.data.sources import _looks_like_hub_name, _pick_split, _short, refuse_header_as_data

    path = Path(source)
    name, config = split_config(source)
    config = config or options.config
    try:
        if path.is_file():
            fmt = options.format or TABLE_SUFFIXES.get(path.suffix.lower())
            if fmt not in _BUILDERS:
                raise DataError(
                    f"{source}: --streaming reads CSV, TSV, JSON lines and Parquet files; say which with --format"
                )
            kwargs: dict[str, Any] = {"delimiter": "\t"} if fmt == "tsv" else {}
            if options.column_names:
                refuse_header_as_data(path, fmt, options.column_names)
                kwargs["column_names"] = list(options.column_names)
            return datasets.load_dataset(_BUILDERS[fmt], data_files=str(path), split="train", streaming=True, **kwargs)
        if path.is_dir() and ((path / "dataset_info.json").exists() or (path / "dataset_dict.json").exists()):
            ds = datasets.load_from_disk(str(path))
        elif Path(name).is_dir() or _looks_like_hub_name(name):
            ds = datasets.load_dataset(name, config, streaming=True)
        else:
            raise DataError(f"{source}: no such file or folder; check the path given to --data")
    except DataError:
        raise
    except Exception as exc:  # offline, unknown name, damaged files: the user can only fix the source
        raise DataError(f"{source}: cannot stream it ({_short(exc)}); check --data, or drop --streaming") from None
    if isinstance(ds, (datasets.DatasetDict, datasets.IterableDatasetDict)):
        ds = _pick_split(ds, role, source, options.split)
    return ds.to_iterable_dataset() if isinstance(ds, datasets.Dataset) else ds


@dataclass
class StreamingExamples:
    """Training examples that are read, labelled and tokenized window by window while training."""

    source: str
    dataset: Any  # datasets.IterableDataset of raw rows (the held-out rows already skipped)
    columns: Columns
    label_names: list[str]
    tokenizer: Any
    max_length: int
    seed: int
    #: the label column holds class ids (a `datasets` ClassLabel), not names
    class_ids: bool = False
    #: a mixture's head: this stream's label id i is the head's remap[i] (None: the stream's own ids)
    remap: np.ndarray | None = None
    streaming: bool = field(default=True, init=False)

    def batches(
        self, micro_batch: int, accumulation: int, num_processes: int, seed: int, units=None, longest_first=False
    ):
        """The batch sampler and dataset that train on this stream (one loss unit per example)."""
        if units is not None:
            raise ValueError("streamed examples count one loss unit each")
        sampler = StreamingBatchSampler(
            self, micro_batch, accumulation, num_processes, seed, longest_first=longest_first
        )
        return sampler, StreamingDataset()

    def fingerprint(self) -> str:
        return source_fingerprint(self.source)

    def rows(self, epoch: int) -> Iterator[tuple[str, str | None, int]]:
        """(text, pair, label id) of every usable row, in this epoch's shuffled order."""
        ds = self.dataset.shuffle(seed=self.seed, buffer_size=SHUFFLE_BUFFER)
        ds.set_epoch(epoch)
        return self.usable(ds)

    def usable(self, raw: Iterable[dict[str, Any]]) -> Iterator[tuple[str, str | None, int]]:
        """Rows with text and a label, as (text, pair, label id); the others are dropped, as the whole-file
        reader drops them."""
        if self.remap is None:
            yield from self._usable(raw)
            return
        remap = self.remap.tolist()
        for text, pair, label in self._usable(raw):
            yield text, pair, remap[label]

    def _usable(self, raw: Iterable[dict[str, Any]]) -> Iterator[tuple[str, str | None, int]]:
        label_id = {name: i for i, name in enumerate(self.label_names)}
        cols = self.columns
        named: dict[Any, str] = {}  # raw label -> normalised name: a data set holds few distinct labels
        for row in raw:
            text = row.get(cols.text)
            pair = row.get(cols.text_pair) if cols.text_pair else None
            label = row.get(cols.label) if cols.label else None
            if _blank(text) or (cols.text_pair and _blank(pair)) or missing_label(label):
                continue
            if self.class_ids and isinstance(label, int) and 0 <= label < len(self.label_names):
                yield str(text), (str(pair) if cols.text_pair else None), label
                continue
            if label not in named:
                named[label] = normalise_labels(pd.Series([label])).iloc[0]
            name = named[label]
            if name not in label_id:
                raise DataError(
                    f"{self.source}: label '{name}' (column '{cols.label}') is not among "
                    f"the classes of its first {HEAD_ROWS:,} rows ({', '.join(self.label_names)}); streaming fixes "
                    "the classes from the head of the data: shuffle the file, or drop --streaming"
                )
            yield str(text), (str(pair) if cols.text_pair else None), label_id[name]

    def tokenized(self, rows: list[tuple[str, str | None, int]]) -> list[dict[str, Any]]:
        texts = [r[0] for r in rows]
        pairs = [r[1] or "" for r in rows] if self.columns.text_pair else None
        tokens = tokenize(self.tokenizer, texts, pairs, self.max_length)
        return [{**tokens.row(i), "label": rows[i][2]} for i in range(len(rows))]


def _blank(value: Any) -> bool:
    return value is None or (isinstance(value, float) and np.isnan(value)) or str(value).strip() == ""


class StreamingBatchSampler:
    """`GlobalBatchSampler`'s batches, built window by window from a stream. Yields lists of `Slot`s that
    carry their tokenized example (`Slot.example`)."""

    def __init__(
        self,
        stream: StreamingExamples,
        micro_batch: int,
        accumulation: int = 1,
        num_processes: int = 1,
        seed: int = 0,
        window_batches: int = 50,
        longest_first: bool = False,
    ):
        self.stream = stream
        self.micro_batch, self.accumulation, self.num_processes = micro_batch, accumulation, num_processes
        self.seed, self.window_batches, self.longest_first = seed, window_batches, longest_first
        self.epoch = 0
        self.start = (0, 0)

    @property
    def global_batch(self) -> int:
        return self.micro_batch * self.accumulation * self.num_processes

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def start_at(self, epoch: int, global_batch: int) -> None:
        self.start = (epoch, global_batch)

    def steps_per_epoch(self) -> None:
        return None  # unknown until the stream ends

    def __iter__(self):
        first = self.start[1] if self.start[0] == self.epoch else 0
        window_rows = self.global_batch * self.window_batches
        rows = self.stream.rows(self.epoch)
        for w in itertools.count():
            raw = list(itertools.islice(rows, window_rows))
            if not raw:
                if w == 0:  # an epoch of nothing would start the next one at once, for ever
                    raise DataError(f"{self.stream.source}: the stream holds no usable training rows")
                return
            if first >= (w + 1) * self.window_batches:
                continue  # a window before the resumed step: read, never tokenized
            examples = self.stream.tokenized(raw)
            lengths = np.array([len(x["input_ids"]) for x in examples])
            window = GlobalBatchSampler(
                lengths,
                self.micro_batch,
                self.accumulation,
                self.num_processes,
                seed=int(np.random.SeedSequence([self.seed, self.epoch, w]).generate_state(1)[0]),
                chunk_batches=self.window_batches,
                longest_first=self.longest_first,
            )
            window.start_at(0, max(0, first - w * self.window_batches))
            offset = w * window_rows
            for micro in window:
                yield [replace(s, index=offset + s.index, example=examples[s.index]) for s in micro]


class StreamingDataset:
    """The map-style dataset beside `StreamingBatchSampler`: a key is a `Slot` holding its example."""

    def __getitem__(self, slot: Slot) -> dict[str, Any]:
        assert slot.example is not None, "a streamed example travels in its Slot"
        return {**slot.example, "slot": slot}


def prepare_stream(data: DataConfig, tokenizer, source: str, options: ReadOptions, *, seed: int):
    """The training stream (shuffled from `seed`), and the evaluation set when `--eval-data` gives none: the
    stream's first `--streaming-eval-rows` rows, held out before shuffling, as (tokens, label ids)."""
    ds = open_stream(source, "train", options)
    head = pd.DataFrame(list(itertools.islice(iter(ds), max(HEAD_ROWS, data.streaming_eval_rows))))
    if head.empty:
        raise DataError(f"{source}: the stream holds no rows")
    cols = resolve_columns(head, source, data.text_column, data.text_pair_column, data.label_column)
    assert cols.label is not None
    declared = getattr((ds.features or {}).get(cols.label), "names", None)
    usable = head[~missing_labels(head[cols.label])[0]]
    label_names = (
        list(declared) if declared else build_label_map(normalise_labels(usable[cols.label]), source, cols.label)
    )
    stream = StreamingExamples(source, ds, cols, label_names, tokenizer, data.max_length, seed, bool(declared))
    notes = [f"{source}: streamed (--streaming), columns text='{cols.text}', label='{cols.label}'"]
    if data.eval_data:
        return stream, None, label_names, cols, notes
    held = head.iloc[: data.streaming_eval_rows]
    stream.dataset = ds.skip(len(held))
    if next(stream.usable(iter(stream.dataset)), None) is None:  # (else each epoch of nothing starts the next)
        if len(head) <= data.streaming_eval_rows:
            raise DataError(
                f"{source}: all {len(held):,} rows of the stream would be held out for evaluation "
                f"(--streaming-eval-rows {data.streaming_eval_rows:,}), leaving none to train on; lower "
                "--streaming-eval-rows, give --eval-data, or read a file this small whole (without --streaming)"
            )
        raise DataError(f"{source}: the stream holds no usable training rows (a text and a label each)")
    rows = list(stream.usable(held.to_dict("records")))
    if not rows:
        raise DataError(f"{source}: the first {len(held):,} rows hold no usable example to evaluate on")
    pairs = [r[1] or "" for r in rows] if cols.text_pair else None
    tokens = tokenize(tokenizer, [r[0] for r in rows], pairs, data.max_length)
    notes.append(f"held out the stream's first {len(held):,} rows for evaluation (--streaming-eval-rows)")
    return stream, (tokens, np.array([r[2] for r in rows], dtype=np.int64)), label_names, cols, notes
