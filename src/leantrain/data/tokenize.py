"""Tokenize once, cache on disk, reuse: token ids stored flat (no padding) in one .npz per job.

The cache key covers everything that changes the result: the source's bytes, the column choice,
the tokenizer's full definition and the max length. A second run of the same job skips reading,
repairing and tokenizing altogether.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

CACHE_VERSION = 1  # bump when what is stored, or how text is repaired, changes


@dataclass
class TokenizedText:
    """Variable-length token sequences stored flat: row i is `input_ids[offsets[i]:offsets[i+1]]`."""

    input_ids: np.ndarray
    offsets: np.ndarray
    token_type_ids: np.ndarray | None = None

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
        lengths = self.lengths[rows]
        offsets = np.zeros(len(rows) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        take = (
            np.concatenate([np.arange(self.offsets[i], self.offsets[i + 1]) for i in rows])
            if len(rows)
            else np.zeros(0, dtype=np.int64)
        )
        tt = self.token_type_ids[take] if self.token_type_ids is not None else None
        return TokenizedText(self.input_ids[take], offsets, tt)


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
        h.update(backend.to_str().encode())
    else:
        h.update(json.dumps(sorted(tokenizer.get_vocab().items())).encode())
    h.update(json.dumps([tokenizer.padding_side, tokenizer.truncation_side]).encode())
    return h.hexdigest()


def default_cache_dir() -> Path:
    return Path(os.environ.get("LEANTRAIN_CACHE") or Path.home() / ".cache" / "leantrain")


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
    with tmp.open("wb") as f:
        np.savez(f, **arrays)
    os.replace(tmp, path)


def load_cached(path: Path) -> tuple[TokenizedText, list[str], dict] | None:
    if not path.is_file():
        return None
    try:
        with np.load(path, allow_pickle=False) as z:
            tokens = TokenizedText(z["input_ids"], z["offsets"], z.get("token_type_ids"))
            return tokens, z["labels"].tolist(), json.loads(str(z["meta"]))
    except Exception:  # a damaged cache entry is rebuilt, never trusted
        return None
