"""Batches with little padding, whose contents do not depend on how the global batch is split.

The sampler thinks in *global batches* (micro-batch x accumulation steps x processes = one optimizer
step). Which examples form each global batch depends only on the seed, the epoch and the global batch
size; the global batch is then cut into micro-batches for each accumulation step and process. So one
process with batch 64, four accumulation steps of 16, and two processes of 32 all see the same
examples per optimizer step, which is what makes their equivalence testable.

Micro-batches are yielded in the order Accelerate's batch-sampler sharding expects: for each
accumulation step, one micro-batch per process in turn (process p takes every N-th batch).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch


@dataclass(frozen=True)
class Slot:
    """One example's place in an optimizer step: what the loss normalisation needs to know."""

    index: int
    step_units: float  # loss units (examples, or counted tokens) in the whole optimizer step, all processes
    step_end: bool  # the last micro-batch of the step on this process: step the optimizer after it
    units: float = 1.0  # this example's loss units
    example: dict | None = field(default=None, compare=False, repr=False)  # a streamed example travels here
    source: int = -1  # a mixture's source of the example (data.mixture); -1: not a mixture
    tokens: int = 0  # the example's tokens, for a mixture's realised shares


class GlobalBatchSampler:
    """Yields micro-batches (lists of `Slot`) for every process, grouped by global batch."""

    def __init__(
        self,
        lengths: np.ndarray,
        micro_batch: int,
        accumulation: int = 1,
        num_processes: int = 1,
        seed: int = 0,
        group_by_length: bool = True,
        chunk_batches: int = 50,
        units: np.ndarray | None = None,
        longest_first: bool = False,
    ):
        self.lengths = np.asarray(lengths)
        # What each example's summed loss counts (`Task.loss_units`): 1 per example unless the task says.
        self.units = np.ones(len(self.lengths)) if units is None else np.asarray(units, dtype=np.float64)
        self.micro_batch, self.accumulation, self.num_processes = micro_batch, accumulation, num_processes
        self.global_batch = micro_batch * accumulation * num_processes
        self.seed, self.group_by_length, self.chunk_batches = seed, group_by_length, chunk_batches
        # --batch-order longest-first: each chunk's batches longest to shortest, as the HF Trainer's group_by_length
        self.longest_first = longest_first
        self.epoch = 0
        self.start = (0, 0)  # (epoch, global batch): where iteration of that epoch begins

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def start_at(self, epoch: int, global_batch: int) -> None:
        """Make epoch `epoch` begin at its global batch `global_batch` (resuming a checkpoint).

        A seek, not a replay: the skipped batches are never built. Other epochs are unaffected.
        """
        self.start = (epoch, global_batch)

    def _first_batch(self) -> int:
        return self.start[1] if self.start[0] == self.epoch else 0

    @property
    def epoch_size(self) -> int:
        """Examples an epoch draws: every example once (a mixture draws its sources' shares)."""
        return len(self.lengths)

    def epoch_order(self, rng: np.random.Generator) -> np.ndarray:
        """The epoch's examples in their shuffled order, before length grouping."""
        return rng.permutation(len(self.lengths))

    def slot(self, index: int, step_units: float, end: bool) -> Slot:
        return Slot(index, step_units, end, float(self.units[index]))

    def global_batches(self) -> list[np.ndarray]:
        """This epoch's global batches, as example indices (each sorted longest first when grouping)."""
        rng = np.random.default_rng([self.seed, self.epoch])
        order = self.epoch_order(rng)
        if self.group_by_length:
            # Sort within large random chunks, so a batch holds similar lengths while the epoch stays random.
            chunk = self.global_batch * self._chunk_batches(len(order))
            chunks = [
                c[np.argsort(-self.lengths[c], kind="stable")] for c in np.split(order, range(chunk, len(order), chunk))
            ]
            if self.longest_first:  # as the Trainer: the longest example first, so that memory runs out at once
                top = int(np.argmax([self.lengths[c[0]] for c in chunks]))
                chunks[0][0], chunks[top][0] = chunks[top][0], chunks[0][0]
            order = np.concatenate(chunks)
        batches = np.split(order, range(self.global_batch, len(order), self.global_batch))
        if self.group_by_length and not self.longest_first and len(batches) > 1:
            # Shuffle full batches; keep the short remainder last so every other step is full-size.
            full, last = batches[:-1], batches[-1]
            batches = [full[i] for i in rng.permutation(len(full))] + [last]
        return batches

    def _chunk_batches(self, examples: int) -> int:
        """Global batches a length-sorted chunk holds; longest-first takes the Trainer's rule (at most 50, and at
        least four chunks an epoch), which its order depends on."""
        if not self.longest_first:
            return self.chunk_batches
        return max(1, min(examples // (4 * self.global_batch), self.chunk_batches))

    def steps_per_epoch(self) -> int:
        """Optimizer steps in an epoch: its global batches but a last one too small to give each process an example
        (iteration skips it)."""
        return sum(size >= self.num_processes for size in _batch_sizes(self.epoch_size, self.global_batch))

    def micro_steps(self, batch: np.ndarray) -> int:
        """Accumulation steps that `batch` takes: fewer for the last, shorter batch of an epoch."""
        return min(self.accumulation, math.ceil(len(batch) / (self.micro_batch * self.num_processes)))

    def __iter__(self):
        n = self.num_processes
        for batch in self.global_batches()[self._first_batch() :]:
            if len(batch) < n:
                continue  # fewer examples than processes: cannot give each one a micro-batch
            k = self.micro_steps(batch)
            step_units = float(self.units[batch].sum())
            # Contiguous slices of a length-sorted batch keep each micro-batch's lengths alike.
            parts = np.array_split(batch, k * n)
            for a in range(k):
                for p in range(n):
                    yield [self.slot(int(i), step_units, a == k - 1) for i in parts[a * n + p]]

    def __len__(self) -> int:
        total = 0
        for size in _batch_sizes(self.epoch_size, self.global_batch)[self._first_batch() :]:
            if size >= self.num_processes:
                total += min(self.accumulation, math.ceil(size / (self.micro_batch * self.num_processes)))
        return total * self.num_processes


def _batch_sizes(n: int, global_batch: int) -> list[int]:
    sizes = [global_batch] * (n // global_batch)
    return sizes + ([n % global_batch] if n % global_batch else [])


class ExamplesDataset(torch.utils.data.Dataset):
    """Map-style dataset over `data.prepare.Examples`; accepts an int or a `Slot` as key."""

    def __init__(self, data):
        self.data = data

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, key):
        slot = key if isinstance(key, Slot) else Slot(int(key), 0.0, True)
        item = self.data.features.row(slot.index)
        item["label"] = self.data.labels[slot.index]
        item["slot"] = slot
        return item


def slot_fields(items: list[dict]) -> dict[str, torch.Tensor]:
    """The batch keys every collator adds from its items' slots: example ids and what loss normalisation
    needs (the step's units, this micro-batch's units, whether the step ends here)."""
    slots = [x["slot"] for x in items]
    out = {
        "index": torch.tensor([s.index for s in slots], dtype=torch.long),
        # float32: some devices (MPS) have no float64; exact for counts below 2**24
        "step_units": torch.tensor(slots[0].step_units, dtype=torch.float32),
        "units": torch.tensor(sum(s.units for s in slots), dtype=torch.float32),
        "step_end": torch.tensor(bool(slots[-1].step_end)),
    }
    if slots[0].source >= 0:  # a mixture's batch: each row's source, loss units and tokens, for per-source figures
        out["source"] = torch.tensor([s.source for s in slots], dtype=torch.long)
        out["row_units"] = torch.tensor([s.units for s in slots], dtype=torch.float32)
        out["row_tokens"] = torch.tensor([s.tokens for s in slots], dtype=torch.long)
    return out


def padded(rows: list, width: int, pad: int, start: int = 0) -> np.ndarray:
    """`rows` (int arrays) right-padded with `pad` to `width`, each from column `start`, as one int64 array: filled in
    NumPy and made a tensor once, since a torch operator per row and field costs the host more than the copying."""
    out = np.full((len(rows), width), pad, dtype=np.int64)
    for r, x in enumerate(rows):
        out[r, start : start + len(x)] = x
    return out


def length_mask(lengths: list[int], width: int) -> np.ndarray:
    """The attention mask of right-padded rows of these lengths: 1 on each row's first `length` columns (int64)."""
    return (np.arange(width) < np.asarray(lengths, dtype=np.int64)[:, None]).astype(np.int64)


class Collator:
    """Pads each micro-batch to its own longest row (dynamic padding)."""

    def __init__(self, pad_token_id: int, fixed_length: int | None = None):
        self.pad_token_id = pad_token_id
        self.fixed_length = fixed_length

    def __call__(self, items: list[dict]) -> dict[str, torch.Tensor]:
        lengths = [len(x["input_ids"]) for x in items]
        width = self.fixed_length or max(lengths)
        ids = torch.from_numpy(padded([x["input_ids"] for x in items], width, self.pad_token_id))
        batch = {
            "input_ids": ids,
            "attention_mask": torch.from_numpy(length_mask(lengths, width)),
            "labels": torch.tensor([x["label"] for x in items], dtype=torch.long),
            **slot_fields(items),
            "num_tokens": torch.tensor(sum(lengths), dtype=torch.long),  # real tokens
            "padded_tokens": torch.tensor(ids.numel(), dtype=torch.long),  # what the model computes on
        }
        if "token_type_ids" in items[0]:
            batch["token_type_ids"] = torch.from_numpy(padded([x["token_type_ids"] for x in items], width, 0))
        return batch


def eval_batches(lengths: np.ndarray, batch_size: int) -> list[list[int]]:
    """Length-sorted, fixed-order batches for evaluation and prediction (least padding, no shuffling)."""
    order = np.argsort(-np.asarray(lengths), kind="stable")
    return [order[i : i + batch_size].tolist() for i in range(0, len(order), batch_size)]


@dataclass(frozen=True)
class BatchFacts:
    """What the training loop reads of a micro-batch on the host, read from its CPU tensors while collating: a
    dataclass, so the loader's move to the device leaves it where it is, and the loop never waits on the device
    for a count it knew before the batch left the CPU."""

    rows: int
    units: float
    step_end: bool
    num_tokens: int
    padded_tokens: int
    tail_rows: int | None = None  # `Task.tail_rows`: where the model's tail ran, for counting FLOPs
    #: whether the 2D attention mask hides any position (None: the batch has none), for `model.masks`
    padded: bool | None = None
    #: whether any row's positions restart: it holds several documents (`_packed`), for `model.masks`
    packed: bool | None = None
    #: (padded, packed) of each sub-batch the batch carries (KTO's mismatched completions, "aside")
    parts: dict[str, tuple[bool | None, bool | None]] = field(default_factory=dict)

    @classmethod
    def of(cls, batch: dict, tail_rows=None) -> BatchFacts:
        """Read from the batch's tensors: on the host while collating; a sync for a batch already on a device."""
        return cls(
            rows=len(batch["index"]),
            units=float(batch["units"]),
            step_end=bool(batch["step_end"]),
            num_tokens=int(batch["num_tokens"]),
            padded_tokens=int(batch["padded_tokens"]),
            tail_rows=tail_rows(batch) if tail_rows is not None else None,
            padded=_padded(batch.get("attention_mask")),
            packed=_packed(batch.get("position_ids")),
            parts={
                k: (_padded(v.get("attention_mask")), _packed(v.get("position_ids")))
                for k, v in batch.items()
                if isinstance(v, dict) and ("attention_mask" in v or "position_ids" in v)
            },
        )


def _padded(mask: Any) -> bool | None:
    return None if not isinstance(mask, torch.Tensor) or mask.dim() != 2 else not bool(mask.all())


def _packed(positions: Any) -> bool | None:
    """True: some row's positions restart (several documents); False: every row counts 0, 1, 2, ...; None: neither
    (no positions, or a row that starts past 0)."""
    if not isinstance(positions, torch.Tensor) or positions.dim() != 2:
        return None
    if bool((positions[:, 1:] != positions[:, :-1] + 1).any()):
        return True
    return False if bool((positions[:, 0] == 0).all()) else None


class WithFacts:
    """A collator whose batches also carry their `BatchFacts` under "host"."""

    def __init__(self, collate, tail_rows=None):
        self.collate, self.tail_rows = collate, tail_rows

    def __call__(self, items: list[dict]) -> dict:
        batch = self.collate(items)
        batch["host"] = BatchFacts.of(batch, self.tail_rows)
        return batch


def facts(batch: dict, tail_rows=None) -> BatchFacts:
    """The batch's facts: as collated, or read now (a task's own batches, made on the device: a sync)."""
    known = batch.get("host")
    return known if isinstance(known, BatchFacts) else BatchFacts.of(batch, tail_rows)


IGNORE_LABEL = -100
#: what padding puts in each key a static-shape batch may hold; `index`, the slot fields and the counts stay
#: the real rows' (a padded row is in no step's units: its loss and units are zero, no example counted twice)
_PAD_VALUES = {"input_ids": None, "attention_mask": 0, "token_type_ids": 0, "labels": IGNORE_LABEL, "position_ids": 0}
_LEFT_ALONE = {"index", "step_units", "units", "step_end", "num_tokens", "padded_tokens"}


def static_shapes_on(cfg: Any) -> bool:
    """--static-shapes: on, or auto with --compile."""
    return cfg.static_shapes == "on" or (cfg.static_shapes == "auto" and bool(cfg.compile))


def length_buckets(max_length: int, smallest: int = 16) -> list[int]:
    """The lengths a batch is padded up to under static shapes: 16, 24, 32, 48, 64, 96, 128, ... (each step half a
    power of two, so a row gains at most a third of padding; a power-of-two ladder would allow a half), and
    `max_length`. Few enough that a compiled model meets each once."""
    out, size = [], smallest
    while size < max_length:
        out.append(size)
        half = size // 2 if size & (size - 1) == 0 else size // 3  # 16 -> 24 -> 32 -> 48 -> 64
        size += half
    return [*out, max_length]


class StaticShapes:
    """A collator whose batches have few shapes, for a compiled model: lengths padded up to `length_buckets`, and a
    short micro-batch (the ragged last of an epoch) filled to `rows` with padding rows that attend to one token and
    whose labels are ignored, so that their loss, gradient and units are zero. A collator's `pad_values` name its
    own fields' padding (a token classifier's word and token indexes); batches holding keys it does not know how to
    pad (a mixture's per-row sources) are left as collated."""

    def __init__(self, collate, pad_token_id: int, max_length: int, sampler):
        """`sampler`: whose `micro_batch` is the rows to fill to (read each batch: --auto may halve it)."""
        self.collate, self.pad_token_id, self.sampler = collate, pad_token_id, sampler
        self.buckets = length_buckets(max_length)
        self.pad_values = {**_PAD_VALUES, **getattr(collate, "pad_values", {})}

    def __call__(self, items: list[dict]) -> dict:
        batch = self.collate(items)
        if not set(batch) <= set(self.pad_values) | _LEFT_ALONE or "input_ids" not in batch:
            return batch
        rows = max(len(batch["input_ids"]), self.sampler.micro_batch)
        for key, value in self.pad_values.items():
            if key in batch:  # each its own width's bucket: an encoder-decoder's sources and targets differ
                width = batch[key].shape[1] if batch[key].dim() > 1 else 0
                to = next((b for b in self.buckets if b >= width), width)
                batch[key] = self._pad(key, batch[key], rows, width, to, value)
        padded = getattr(self.collate, "padded_keys", ("input_ids",))  # what the model computes on
        batch["padded_tokens"] = torch.tensor(sum(batch[k].numel() for k in padded), dtype=torch.long)
        return batch

    def _pad(self, key: str, t: torch.Tensor, rows: int, width: int, to: int, value) -> torch.Tensor:
        value = self.pad_token_id if value is None else value
        if t.dim() == 1:  # one label a row
            return torch.cat([t, t.new_full((rows - len(t),), value)])
        out = t.new_full((rows, to), value)
        out[: len(t), :width] = t
        if key == "position_ids":  # padding: one more segment from 0, as the collators make it
            out[: len(t), width:] = torch.arange(to - width)
            out[len(t) :] = torch.arange(to)
        elif key == "attention_mask":
            out[len(t) :, 0] = 1  # a padding row attends to one token: a row of nothing would give NaN
        return out
