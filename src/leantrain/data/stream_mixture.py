"""`--streaming` with several sources: streams mixed window by window in the requested shares.

Each window of `window_batches` global batches takes its quota of rows from every source (the window's rows split in
the sources' shares, the same split every window), each source read from where it stopped; a source whose stream
ends starts its next pass (reshuffled with its own epoch) without moving the others. The window is then tokenized and
batched exactly as `StreamingBatchSampler` batches one stream, so which examples form a step depends on the seed and
the step alone, however the global batch is split. By tokens, a source's share of rows is its weight over the mean
length of its held-out rows. A mixture of streams has no end: `--max-steps` says how long to train (as for one stream).
"""

from __future__ import annotations

import itertools
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from leantrain.data.batching import GlobalBatchSampler
from leantrain.data.mixture import SourceSpan, apportion, merged_names, pooled_eval
from leantrain.data.prepare import Examples
from leantrain.data.streaming import StreamingDataset, StreamingExamples
from leantrain.errors import DataError


@dataclass
class StreamSource:
    """A stream in the mixture: its name, the share of each window's rows it gives, what was asked of it."""

    name: str
    stream: StreamingExamples
    share: float
    weight: float | None


@dataclass
class StreamingMixture:
    sources: list[StreamSource]
    mix_by: str = "examples"
    streaming: bool = field(default=True, init=False)

    def batches(
        self, micro_batch: int, accumulation: int, num_processes: int, seed: int, units=None, longest_first=False
    ):
        if units is not None:
            raise ValueError("streamed examples count one loss unit each")
        sampler = StreamingMixtureSampler(
            self, micro_batch, accumulation, num_processes, seed, longest_first=longest_first
        )
        return sampler, StreamingDataset()

    def fingerprint(self) -> str:
        parts = [f"{s.name}:{s.stream.fingerprint()}:{s.share!r}" for s in self.sources]
        return f"mixture-{zlib.crc32(';'.join(parts).encode()):08x}"

    def requested(self) -> dict[str, float]:
        return {s.name: float(s.weight if s.weight is not None else s.share) for s in self.sources}


class _Reader:
    """One source's rows, pass after pass (each pass its stream's epoch, reshuffled)."""

    def __init__(self, source: StreamSource):
        self.source, self.passes = source, 0
        self.rows: Iterator[tuple[str, str | None, int]] = source.stream.rows(0)

    def take(self, count: int) -> list[tuple[str, str | None, int]]:
        out: list[tuple[str, str | None, int]] = []
        empty_passes = 0
        while len(out) < count:
            got = list(itertools.islice(self.rows, count - len(out)))
            out += got
            if len(out) < count:  # this pass is over: the next one, reshuffled
                empty_passes = empty_passes + 1 if not got else 0
                if empty_passes > 1:
                    raise DataError(f"{self.source.stream.source}: source '{self.source.name}' yields no rows")
                self.passes += 1
                self.rows = self.source.stream.rows(self.passes)
        return out


class StreamingMixtureSampler:
    """Yields micro-batches of `Slot`s carrying their tokenized example and its source, window by window."""

    def __init__(self, mixture: StreamingMixture, micro_batch: int, accumulation: int = 1, num_processes: int = 1,
                 seed: int = 0, window_batches: int = 50, longest_first: bool = False):  # fmt: skip
        self.mixture = mixture
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
        return None  # a mixture of streams never ends

    def quotas(self) -> np.ndarray:
        window = self.global_batch * self.window_batches
        return apportion(window, np.array([s.share for s in self.mixture.sources]))

    def __iter__(self):
        first = self.start[1] if self.start[0] == self.epoch else 0
        readers = [_Reader(s) for s in self.mixture.sources]
        quotas = self.quotas().tolist()
        for w in itertools.count():
            raw = [reader.take(q) for reader, q in zip(readers, quotas)]
            if first >= (w + 1) * self.window_batches:
                continue  # a window before the resumed step: read, never tokenized
            examples, sources = [], []
            for i, (source, rows) in enumerate(zip(self.mixture.sources, raw)):
                examples += source.stream.tokenized(rows)
                sources += [i] * len(rows)
            yield from self._window(w, examples, sources, first)

    def _window(self, w: int, examples: list[dict[str, Any]], sources: list[int], first: int):
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
        offset = w * len(examples)
        for micro in window:
            yield [
                replace(
                    s,
                    index=offset + s.index,
                    example=examples[s.index],
                    source=sources[s.index],
                    tokens=int(lengths[s.index]),
                )
                for s in micro
            ]


def mix_streams(cfg, specs, loaded) -> tuple[StreamingMixture, Examples, list[str], list[str]]:
    """A mixture of streams: the streams' labels merged into one head, each source's held-out rows pooled (with their
    spans) for evaluation; (the mixture, the evaluation examples, the head's labels, the notes)."""
    streams = [d.train for d in loaded]
    own = [list(s.label_names) for s in streams]
    merged = merged_names(specs, own, own)
    index = {name: i for i, name in enumerate(merged)}
    evaluation = []
    for spec, data, names in zip(specs, loaded, own):
        remap = np.array([index[n] for n in names], dtype=np.int64)
        data.train.remap = remap
        evaluation.append((spec.name, Examples(data.eval.features, remap[data.eval.labels])))
    weights = [s.weight for s in specs]
    if weights[0] is None:  # without weights each stream gives the same share (a stream's size is unknown)
        shares = np.full(len(specs), 1 / len(specs))
    else:
        w = np.array(weights, dtype=np.float64) / sum(weights)
        if getattr(cfg, "mix_by", "examples") == "tokens":
            mean = np.array([max(float(np.mean(d.eval.lengths)), 1.0) for d in loaded])
            w = w / mean
        shares = w / w.sum()
    normalised = [None if x is None else x / sum(weights) for x in weights]
    mixture = StreamingMixture(
        [StreamSource(s.name, d.train, float(sh), wt) for s, d, sh, wt in zip(specs, loaded, shares, normalised)],
        getattr(cfg, "mix_by", "examples"),
    )
    notes = [n for d in loaded for n in d.notes]
    notes.append(
        f"mixture of {len(specs)} streams: "
        + "; ".join(f"{s.name} {sh:.0%} of each window's rows" for s, sh in zip(specs, shares))
    )
    return mixture, pooled_eval(evaluation), merged, notes


__all__ = ["SourceSpan", "StreamingMixture", "StreamingMixtureSampler", "mix_streams"]
