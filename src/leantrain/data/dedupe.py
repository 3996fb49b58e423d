"""Exact duplicates and contamination, by a hash of each row's normalised text.

Normalised: Unicode NFKC, case folded, every run of white space one space, stripped; so "Free  entry!" and
"free entry!" are the same row. A row's hash is the first 8 bytes of its BLAKE2b digest (a text pair hashes both
texts, a prompt its completion too). Duplicates are counted within each source (a row seen before in the same
source) and across sources (seen in an earlier source); `--dedupe` keeps each text's first row only. An evaluation
row whose text is also a training row is contamination: counted and named per pair of sources; `--decontaminate`
drops those rows from training.
"""

from __future__ import annotations

import hashlib
import re
import unicodedata
from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np

from leantrain.telemetry.console import counted

_SPACE = re.compile(r"\s+")


def normalise(text: str) -> str:
    return _SPACE.sub(" ", unicodedata.normalize("NFKC", text).casefold()).strip()


def text_hashes(texts: Iterable[str], pairs: Iterable[str] | None = None) -> np.ndarray:
    """uint64 hashes of each text's normalised form (with its pair's, joined by a separator no text holds)."""
    joined = texts if pairs is None else (f"{a}\x1f{b}" for a, b in zip(texts, pairs))
    out = [
        int.from_bytes(hashlib.blake2b(normalise(str(t)).encode("utf-8"), digest_size=8).digest(), "little")
        for t in joined
    ]
    return np.array(out, dtype=np.uint64)


@dataclass
class Overlap:
    """What the hashes of a mixture's training and evaluation rows show, per source (by name)."""

    #: training rows that repeat an earlier row of the same source
    within: dict[str, int] = field(default_factory=dict)
    #: training rows whose text an earlier source already holds
    across: dict[str, int] = field(default_factory=dict)
    #: (evaluation source, training source) -> evaluation rows whose text is a training row of that source
    contaminated: dict[tuple[str, str], int] = field(default_factory=dict)
    #: per source: the training rows --dedupe drops (later copies) and those --decontaminate drops
    duplicate_rows: dict[str, np.ndarray] = field(default_factory=dict)
    contaminated_rows: dict[str, np.ndarray] = field(default_factory=dict)
    #: per evaluation source: its rows that occur in any source's training rows (each row once)
    eval_hits: dict[str, int] = field(default_factory=dict)

    def notes(self, dedupe: bool, decontaminate: bool) -> list[str]:
        out = []
        dup = {n: self.within.get(n, 0) + self.across.get(n, 0) for n in self.within}
        if any(dup.values()):
            what = "; ".join(f"{n}: {self.within[n]:,} within, {self.across[n]:,} across" for n in dup if dup[n])
            act = "dropped (--dedupe)" if dedupe else "kept (--dedupe drops them)"
            out.append(f"exact duplicate training rows ({what}); {act}")
        if self.contaminated:
            # by pair of sources, but for a single source (`within` has every training source): no other to tell apart
            pairs = ", ".join(f"{n:,} of {e} in {t}" for (e, t), n in self.contaminated.items())
            alone = len(self.within) == 1
            total = sum(self.eval_hits.values())
            act = "dropped from training (--decontaminate)" if decontaminate else "kept (--decontaminate drops them)"
            where = "" if alone else f" ({pairs})"
            rows = f"{counted(total, 'evaluation row')} also occur{'s' if total == 1 else ''}"
            out.append(f"contamination: {rows} in training{where}; {act}")
        return out


def overlap(train: list[tuple[str, np.ndarray]], evaluation: list[tuple[str, np.ndarray]]) -> Overlap:
    """Duplicates among the sources' training rows (in source order) and evaluation rows found in training."""
    out = Overlap()
    seen: dict[int, str] = {}  # hash -> the source that first holds it
    for name, hashes in train:
        _, first = np.unique(hashes, return_index=True)
        repeat = np.ones(len(hashes), dtype=bool)
        repeat[first] = False  # a row repeating an earlier one of this source
        earlier = np.array([seen.get(int(h), name) != name for h in hashes], dtype=bool)
        out.within[name] = int((repeat & ~earlier).sum())
        out.across[name] = int(earlier.sum())
        out.duplicate_rows[name] = np.flatnonzero(repeat | earlier)
        for h in hashes[first].tolist():
            seen.setdefault(int(h), name)
    every_eval = np.concatenate([h for _, h in evaluation]) if evaluation else np.zeros(0, np.uint64)
    for name, hashes in train:
        out.contaminated_rows[name] = np.flatnonzero(np.isin(hashes, every_eval))
    for eval_name, eval_hashes in evaluation:
        hit = np.zeros(len(eval_hashes), dtype=bool)
        for train_name, hashes in train:
            found = np.isin(eval_hashes, hashes)
            if found.any():
                out.contaminated[(eval_name, train_name)] = int(found.sum())
            hit |= found
        out.eval_hits[eval_name] = int(hit.sum())
    return out
