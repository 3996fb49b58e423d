"""Training on a mixture: several sources, each read its own way (`data.spec`), drawn in the shares the user asked for.

An *epoch* of a mixture is as many examples as the sources hold together (after `limit`, times `repeat`), drawn in
the requested shares: by examples, or by tokens (`--mix-by tokens`: a source's share of examples is its weight over
its mean row length). Each source keeps its own stream of seeded permutations: when a small source is used up it
starts its next pass (its own epoch) without moving the others. Which examples form each optimizer step depends on
the seed, the epoch and the global batch alone (`MixtureSampler`), so micro-batches and processes see the same steps,
and a resumed run seeks to its step without replaying the ones before.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field

import numpy as np

from leantrain.data.batching import GlobalBatchSampler, Slot
from leantrain.data.prepare import Examples
from leantrain.data.spec import SourceSpec
from leantrain.errors import DataError

#: the most examples an epoch of a mixture holds (its shuffled order is built in memory: about 2 GB at this size)
MAX_EPOCH = 250_000_000


# -- the mixture -------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class SourceSpan:
    """Where a source's rows sit in a mixture's concatenated examples: `[start, stop)`."""

    name: str
    start: int
    stop: int

    def __len__(self) -> int:
        return self.stop - self.start


@dataclass
class MixedSource:
    """A source in the mixture: its rows' place, what was asked of it and what an epoch draws from it."""

    span: SourceSpan
    #: the requested weight, normalised over the sources (None: each source counts its rows)
    weight: float | None
    repeat: float
    #: examples an epoch draws from this source
    quota: int
    #: mean tokens of a row (its length; 1 for fixed-size inputs)
    mean_tokens: float

    @property
    def name(self) -> str:
        return self.span.name


@dataclass
class Mixture(Examples):
    """Examples of several sources, concatenated, that batch themselves in the requested shares (`MixtureSampler`)."""

    sources: list[MixedSource] = field(default_factory=list)
    mix_by: str = "examples"

    @property
    def epoch_size(self) -> int:
        return sum(s.quota for s in self.sources)

    def batches(
        self, micro_batch: int, accumulation: int, num_processes: int, seed: int, units=None, longest_first=False
    ):
        from leantrain.data.batching import ExamplesDataset

        sampler = MixtureSampler(
            self, micro_batch, accumulation, num_processes, seed, units=units, longest_first=longest_first
        )
        return sampler, ExamplesDataset(self)

    def requested(self) -> dict[str, float]:
        """Each source's requested share: its weight, else its rows times its repeat over the total."""
        if all(s.weight is not None for s in self.sources):
            return {s.name: float(s.weight) for s in self.sources}  # type: ignore[arg-type]
        total = sum(len(s.span) * s.repeat for s in self.sources)
        return {s.name: len(s.span) * s.repeat / total for s in self.sources}


def mix(
    parts: list[tuple[str, Examples]],
    specs: list[SourceSpec],
    mix_by: str = "examples",
) -> Mixture:
    """The training mixture of each source's examples (in `specs`' order), with each source's epoch quota."""
    lengths = [np.asarray(ex.lengths, dtype=np.float64) for _, ex in parts]
    sizes = np.array([len(ex) for _, ex in parts], dtype=np.int64)
    features, labels, spans = concatenate([ex for _, ex in parts], [name for name, _ in parts])
    weights = [s.weight for s in specs]
    repeats = np.array([s.repeat or 1.0 for s in specs])
    mean_tokens = np.array([ln.mean() if len(ln) else 0.0 for ln in lengths])
    if weights[0] is None:
        wanted = float(np.sum(sizes * repeats))
        if wanted > MAX_EPOCH:  # an epoch's order is built in memory: 8 bytes an example, a few times over
            raise DataError(
                f"--data: repeat asks for an epoch of {wanted:,.0f} examples, more than the {MAX_EPOCH:,} an epoch's "
                "order can hold in memory; lower repeat (--epochs reads the whole mixture again)"
            )
        quotas = np.maximum(1, np.round(sizes * repeats)).astype(np.int64)
        normalised: list[float | None] = [None] * len(parts)
    else:
        w = np.array(weights, dtype=np.float64)
        w = w / w.sum()
        normalised = [float(x) for x in w]
        per_example = w / mean_tokens if mix_by == "tokens" else w
        quotas = apportion(int(sizes.sum()), per_example / per_example.sum())
    sources = [
        MixedSource(span, wt, float(r), int(q), float(m))
        for span, wt, r, q, m in zip(spans, normalised, repeats, quotas, mean_tokens)
    ]
    return Mixture(features, labels, spans=tuple(spans), sources=sources, mix_by=mix_by)


def apportion(total: int, shares: np.ndarray) -> np.ndarray:
    """`total` items split in `shares` (summing to 1) as whole numbers that add up to `total`: each share's floor,
    then one more to the largest remainders (ties to the earlier source). Every share with weight gets at least one."""
    exact = np.asarray(shares, dtype=np.float64) * total
    counts = np.floor(exact).astype(np.int64)
    short = total - int(counts.sum())
    order = np.argsort(-(exact - counts), kind="stable")
    counts[order[:short]] += 1
    zero = (counts == 0) & (exact > 0)
    if zero.any():  # a share too small for one example an epoch still gets one, from the largest
        for i in np.flatnonzero(zero):
            counts[int(np.argmax(counts))] -= 1
            counts[i] = 1
    return counts


def concatenate(parts: list[Examples], names: list[str]):
    """The features and labels of `parts` end to end, and each part's span."""
    features = parts[0].features.concat([p.features for p in parts])
    labels = np.concatenate([np.asarray(p.labels) for p in parts])
    spans, start = [], 0
    for name, p in zip(names, parts):
        spans.append(SourceSpan(name, start, start + len(p)))
        start += len(p)
    return features, labels, spans


def source_seed(seed: int, name: str) -> int:
    """A source's own stream of permutations: from the run's seed and the source's name, so that adding or reordering
    other sources leaves it alone."""
    return int(np.random.SeedSequence([seed, zlib.crc32(name.encode())]).generate_state(1)[0])


class MixtureSampler(GlobalBatchSampler):
    """`GlobalBatchSampler` over a mixture: an epoch is each source's quota of its own stream, shuffled together, then
    grouped by length and cut into global batches exactly as one data set's epoch is."""

    def __init__(self, mixture: Mixture, micro_batch: int, accumulation: int = 1, num_processes: int = 1,
                 seed: int = 0, units: np.ndarray | None = None, group_by_length: bool = True,
                 chunk_batches: int = 50, longest_first: bool = False):  # fmt: skip
        super().__init__(mixture.lengths, micro_batch, accumulation, num_processes, seed, group_by_length,
                         chunk_batches, units, longest_first)  # fmt: skip
        self.mixture = mixture
        self._stops = np.array([s.span.stop for s in mixture.sources])
        self._streams = [source_seed(seed, s.name) for s in mixture.sources]

    @property
    def epoch_size(self) -> int:
        return self.mixture.epoch_size

    def stream(self, i: int, first: int, stop: int) -> np.ndarray:
        """Positions `[first, stop)` of source `i`'s stream: its pass k is a permutation seeded by (source, k)."""
        src = self.mixture.sources[i]
        n = len(src.span)
        out = []
        for k in range(first // n, (stop - 1) // n + 1):
            perm = np.random.default_rng([self._streams[i], k]).permutation(n)
            a, b = max(first - k * n, 0), min(stop - k * n, n)
            out.append(perm[a:b])
        return src.span.start + np.concatenate(out) if out else np.zeros(0, dtype=np.int64)

    def passes(self, epoch: int) -> dict[str, float]:
        """Each source's passes over its rows once `epoch` mixture epochs are done (its own epoch counter)."""
        return {s.name: epoch * s.quota / len(s.span) for s in self.mixture.sources}

    def epoch_order(self, rng: np.random.Generator) -> np.ndarray:
        drawn = [self.stream(i, self.epoch * s.quota, (self.epoch + 1) * s.quota) for i, s in enumerate(
            self.mixture.sources)]  # fmt: skip
        pooled = np.concatenate(drawn)
        return pooled[rng.permutation(len(pooled))]

    def slot(self, index: int, step_units: float, end: bool) -> Slot:
        source = int(np.searchsorted(self._stops, index, side="right"))
        return Slot(index, step_units, end, float(self.units[index]), source=source, tokens=int(self.lengths[index]))


def source_rows(train) -> dict[str, int] | None:
    """A mixture's sources and their training rows (0: a stream's, not known); None: one source."""
    sources = getattr(train, "sources", None)
    if not sources:
        return None
    return {s.name: len(s.span) if hasattr(s, "span") else 0 for s in sources}


def merged_names(specs: list[SourceSpec], per_source: list[list[str]], trained: list[list[str]]) -> list[str]:
    """The union of the sources' label names: explicit id maps first (they must agree id by id), then the others in
    the order a single source's would be (numbers numerically, else sorted). Refused when two maps clash."""
    from leantrain.data.columns import build_label_map

    explicit = [(s, list(s.labels)) for s in specs if s.labels is not None]
    base: list[str] = []
    for spec, names in explicit:
        for i, name in enumerate(names):
            if i < len(base) and base[i] != name:
                other = next(s for s, n in explicit if i < len(n) and n[i] == base[i])
                raise DataError(
                    f"--data: label id {i} is '{base[i]}' in {other.name} but '{name}' in {spec.name} (labels: "
                    f"{list(other.labels or ())} against {names}); one head cannot hold both: give the sources the "
                    "same label order"
                )
            if name in base and base.index(name) != i:
                raise DataError(
                    f"--data: label '{name}' is id {base.index(name)} in one source and id {i} in {spec.name}; give "
                    "the sources the same label order"
                )
        base = base + names[len(base) :]
    union = sorted({n for names in per_source for n in names} | set(base))
    import pandas as pd

    ordered = build_label_map(pd.Series(union), " and ".join(s.path for s in specs), "the sources' labels")
    return base + [n for n in ordered if n not in base]


def pooled_eval(parts: list[tuple[str, Examples]]) -> Examples:
    features, labels, spans = concatenate([e for _, e in parts], [n for n, _ in parts])
    return Examples(features, labels, spans=tuple(spans))
