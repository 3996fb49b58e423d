"""Tokenize once, cache on disk, reuse: token ids stored flat (no padding) in one .npz per job.

The cache key covers everything that changes the result: the source's bytes, the column choice,
the tokenizer's full definition and the max length. A second run of the same job skips reading,
repairing and tokenizing altogether.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

CACHE_VERSION = 3  # bump when what is stored, or how text is repaired, changes (2: labels 1.0 -> 1, UTF-16; 3: hashes)

log = logging.getLogger("leantrain")


@dataclass
class TokenizedText:
    """Variable-length token sequences stored flat: row i is `input_ids[offsets[i]:offsets[i+1]]`."""

    input_ids: np.ndarray
    offsets: np.ndarray
    token_type_ids: np.ndarray | None = None
    #: each row's hash of its normalised text (`data.dedupe.text_hashes`), for duplicates and contamination
    hashes: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.offsets) - 1

    @property
    def lengths(self) -> np.ndarray:
        return np.diff(self.offsets)

    def row(self, i: int) -> dict[str, np.ndarray]:
        a, b = self.offsets[i], self.offsets[i + 1]
        out = {"input_ids": self.input_ids[a:b]}
        if self.token_type_ids is not None:
            out["token_type_ids"] = self.token_type_ids[a:b]
        return out

    def subset(self, rows: np.ndarray) -> TokenizedText:
        offsets, take = subset_positions(self.offsets, rows)
        tt = self.token_type_ids[take] if self.token_type_ids is not None else None
        hashes = self.hashes[rows] if self.hashes is not None else None
        return TokenizedText(self.input_ids[take], offsets, tt, hashes)

    @staticmethod
    def concat(parts: list[TokenizedText]) -> TokenizedText:
        """The rows of `parts`, end to end (a mixture's sources)."""
        types = [p.token_type_ids for p in parts]
        hashes = [p.hashes for p in parts]
        return TokenizedText(
            np.concatenate([p.input_ids for p in parts]),
            concat_offsets([p.offsets for p in parts]),
            np.concatenate(types) if all(t is not None for t in types) else None,  # type: ignore[arg-type]
            np.concatenate(hashes) if all(h is not None for h in hashes) else None,  # type: ignore[arg-type]
        )


def concat_offsets(offsets: list[np.ndarray]) -> np.ndarray:
    """The offsets of rows stored flat, for several such arrays laid end to end."""
    out, base = [np.zeros(1, dtype=np.int64)], 0
    for o in offsets:
        out.append(np.asarray(o[1:], dtype=np.int64) + base)
        base += int(o[-1])
    return np.concatenate(out)


def subset_positions(offsets: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For rows stored flat (row i is `[offsets[i]:offsets[i+1]]`): the offsets of `rows` alone, and the flat
    positions to take."""
    lengths = np.diff(offsets)[rows]
    new = np.zeros(len(rows) + 1, dtype=np.int64)
    np.cumsum(lengths, out=new[1:])
    take = np.concatenate([np.arange(offsets[i], offsets[i + 1]) for i in rows]) if len(rows) else np.zeros(0, np.int64)
    return new, take


def tokenize(tokenizer, texts: list[str], pairs: list[str] | None, max_length: int, chunk: int = 2048) -> TokenizedText:
    ids: list[np.ndarray] = []
    types: list[np.ndarray] = []
    keep_types = pairs is not None
    for start in range(0, len(texts), chunk):
        a = texts[start : start + chunk]
        b = pairs[start : start + chunk] if pairs is not None else None
        enc = tokenizer(a, b, truncation=True, max_length=max_length, return_attention_mask=False)
        ids.extend(np.asarray(x, dtype=np.int32) for x in enc["input_ids"])
        if keep_types and "token_type_ids" in enc:
            types.extend(np.asarray(x, dtype=np.int8) for x in enc["token_type_ids"])
    offsets = np.zeros(len(ids) + 1, dtype=np.int64)
    np.cumsum([len(x) for x in ids], out=offsets[1:])
    flat = np.concatenate(ids) if ids else np.zeros(0, dtype=np.int32)
    tt = np.concatenate(types) if types else None
    return TokenizedText(flat, offsets, tt)


def source_fingerprint(source: str) -> str:
    """Content hash of a file; names, sizes and times of a folder's files; the name of a hub data set."""
    path = Path(source)
    h = hashlib.sha256()
    if path.is_file():
        with path.open("rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
    elif path.is_dir():
        for p in sorted(path.rglob("*")):
            if p.is_file():
                st = p.stat()
                h.update(f"{p.relative_to(path)}:{st.st_size}:{st.st_mtime_ns}".encode())
    else:
        h.update(f"hub:{source}".encode())
    return h.hexdigest()


def tokenizer_fingerprint(tokenizer) -> str:
    h = hashlib.sha256(type(tokenizer).__name__.encode())
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        # Tokenizing with truncation stores the truncation settings in the backend: left in, the same
        # tokenizer would hash differently before and after its first use (max_length is in the key anyway), so a
        # copy without them is hashed. (tokenizers serializes in a fixed order: parsing the JSON in Python and
        # sorting it took 0.2-0.7 s a call for a 30k vocabulary, the copy 0.07-0.13 s.)
        from tokenizers import Tokenizer

        copy = Tokenizer.from_str(backend.to_str())
        copy.no_truncation()
        copy.no_padding()
        h.update(copy.to_str().encode())
    else:
        h.update(json.dumps(sorted(tokenizer.get_vocab().items())).encode())
    h.update(json.dumps([tokenizer.padding_side, tokenizer.truncation_side]).encode())
    return h.hexdigest()


def default_cache_dir() -> Path:
    from leantrain.paths import leantrain_cache

    return leantrain_cache()


def cache_key(**parts) -> str:
    return hashlib.sha256(json.dumps({**parts, "v": CACHE_VERSION}, sort_keys=True).encode()).hexdigest()[:24]


def save_cached(path: Path, tokens: TokenizedText, labels: list[str], meta: dict) -> None:
    """Write atomically: a crash mid-write never leaves a cache entry that later loads as garbage."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    arrays: dict[str, Any] = {
        "input_ids": tokens.input_ids,
        "offsets": tokens.offsets,
        "labels": np.asarray(labels, dtype=object).astype(str),
        "meta": np.asarray(json.dumps(meta)),
    }
    if tokens.token_type_ids is not None:
        arrays["token_type_ids"] = tokens.token_type_ids
    if tokens.hashes is not None:
        arrays["hashes"] = tokens.hashes
    with tmp.open("wb") as f:
        np.savez(f, **arrays)
    os.replace(tmp, path)


def load_cached(path: Path, vocab_size: int | None = None) -> tuple[TokenizedText, list[str], dict] | None:
    """A cache entry, or None when there is none or it is damaged (then it is rebuilt, never trusted)."""
    if not path.is_file():
        return None
    try:
        with np.load(path, allow_pickle=False) as z:
            tokens = TokenizedText(z["input_ids"], z["offsets"], z.get("token_type_ids"), z.get("hashes"))
            labels, meta = z["labels"].tolist(), json.loads(str(z["meta"]))
        problem = _inconsistency(tokens, labels, meta, vocab_size)
    except Exception as exc:  # unreadable: truncated, bad zip, bad JSON, missing arrays
        problem = f"unreadable ({type(exc).__name__})"
    if problem is None:
        return tokens, labels, meta
    log.warning("tokenization cache entry %s is damaged (%s); tokenizing again", path, problem)
    return None


def _inconsistency(tokens: TokenizedText, labels: list, meta: Any, vocab_size: int | None) -> str | None:
    """What is wrong with arrays that loaded but may not fit together (garbage that np.load accepts)."""
    ids, offsets = tokens.input_ids, tokens.offsets
    if ids.ndim != 1 or offsets.ndim != 1 or len(offsets) == 0:
        return "arrays of the wrong shape"
    if not (np.issubdtype(ids.dtype, np.integer) and np.issubdtype(offsets.dtype, np.integer)):
        return "arrays of the wrong type"
    if offsets[0] != 0 or offsets[-1] != len(ids) or (np.diff(offsets) < 0).any():
        return "offsets do not fit the token ids"
    if tokens.token_type_ids is not None and tokens.token_type_ids.shape != ids.shape:
        return "token type ids do not fit the token ids"
    if tokens.hashes is not None and tokens.hashes.shape != (len(offsets) - 1,):
        return "text hashes do not fit the rows"
    if len(labels) != len(offsets) - 1:
        return f"{len(labels)} labels for {len(offsets) - 1} rows"
    if len(ids) and (ids.min() < 0 or (vocab_size is not None and ids.max() >= vocab_size)):
        return "token ids outside the tokenizer's vocabulary"
    if not (isinstance(meta, dict) and {"columns", "report"} <= meta.keys()):
        return "no description of its columns"
    return None
