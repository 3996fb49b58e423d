"""Preference data: pairs (`prompt`/`chosen`/`rejected`) and unpaired judgements (`prompt`/`completion`/`label`),
read, checked, tokenized once (cached like the tokenization cache) and cut to --max-length.

A pair's columns hold plain text, or chats: `chosen`/`rejected` as lists of role/content messages (the whole
conversations, their shared first messages the prompt, or the answers alone beside a `prompt` chat). Text without
a `prompt` column is a whole text each (an empty prompt). Every sequence is the prompt's tokens then the
completion's, ending with EOS (`instructions.encode_completion`), so that the prompt's tokens are what a model
generating from it continues.

What a run cannot learn from is counted and skipped, said in one line each: a pair whose chosen and rejected are
the same (within --max-length), and a row whose completion lies wholly beyond --max-length (its prompt fills it).
What is malformed is refused in one line (exit 2): a missing column or cell, a label that is not boolean, data
in which nothing is left to learn.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch

from leantrain.data.batching import slot_fields
from leantrain.data.columns import missing_label
from leantrain.data.instructions import Turn, as_turn, encode_completion, shared_prompt
from leantrain.data.lm import IGNORE
from leantrain.data.sources import ReadOptions, ReadReport, read_table
from leantrain.data.tokenize import (
    TokenizedText,
    cache_key,
    source_fingerprint,
    subset_positions,
    tokenizer_fingerprint,
)
from leantrain.errors import DataError

log = logging.getLogger("leantrain")

#: the format of the cached arrays; bump when what is stored changes
PREFERENCE_CACHE_VERSION = 1


@dataclass
class SequenceSet:
    """Examples of `parts` token sequences each, stored flat: example i's part k is row `parts * i + k` of `tokens`
    (a pair: prompt, chosen, rejected; an unpaired judgement: prompt, completion). `values` holds per-example
    numbers (a margin, a label, the reference's log-probabilities), each an array whose first dimension is the
    examples."""

    tokens: TokenizedText
    parts: int
    values: dict[str, np.ndarray] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.tokens) // self.parts

    def part_lengths(self) -> np.ndarray:
        """(examples, parts): each sequence part's tokens."""
        return self.tokens.lengths.reshape(-1, self.parts)

    @property
    def lengths(self) -> np.ndarray:
        """Tokens an example puts through the model: the prompt once per completion, and each completion."""
        parts = self.part_lengths()
        return parts[:, 0] * (self.parts - 1) + parts[:, 1:].sum(1)

    @property
    def counted(self) -> np.ndarray:
        """Completion tokens of each example: what its log-probabilities sum over."""
        return self.part_lengths()[:, 1:].sum(1)

    def row(self, i: int) -> dict[str, Any]:
        ids, offsets = self.tokens.input_ids, self.tokens.offsets
        out: dict[str, Any] = {
            "parts": [ids[offsets[self.parts * i + k] : offsets[self.parts * i + k + 1]] for k in range(self.parts)]
        }
        for name, value in self.values.items():
            out[name] = value[i]
        return out

    def subset(self, rows: np.ndarray) -> SequenceSet:
        rows = np.asarray(rows, dtype=np.int64)
        flat_rows = (rows[:, None] * self.parts + np.arange(self.parts)).reshape(-1)
        offsets, take = subset_positions(self.tokens.offsets, flat_rows)
        tokens = TokenizedText(self.tokens.input_ids[take], offsets)
        return SequenceSet(tokens, self.parts, {k: v[rows] for k, v in self.values.items()})

    def fingerprint(self) -> int:
        """A checksum of the token ids and their layout (what a cache of values computed from them is keyed by)."""
        crc = zlib.crc32(np.ascontiguousarray(self.tokens.input_ids, dtype=np.int64).tobytes())
        return zlib.crc32(np.ascontiguousarray(self.tokens.offsets, dtype=np.int64).tobytes(), crc)


def from_sequences(examples: list[list[list[int]]], values: dict[str, np.ndarray]) -> SequenceSet:
    parts = len(examples[0]) if examples else 1
    flat = [np.asarray(s, dtype=np.int32) for example in examples for s in example]
    offsets = np.zeros(len(flat) + 1, dtype=np.int64)
    np.cumsum([len(s) for s in flat], out=offsets[1:])
    ids = np.concatenate(flat) if flat else np.zeros(0, dtype=np.int32)
    return SequenceSet(TokenizedText(ids, offsets), parts, values)


# -- reading ---------------------------------------------------------------------------------------------------
def _columns(df: pd.DataFrame) -> dict[str, Any]:
    return {str(c).strip().lower(): c for c in df.columns}


def _require(df: pd.DataFrame, source: str, needed: tuple[str, ...], what: str) -> dict[str, Any]:
    columns = _columns(df)
    missing = [c for c in needed if c not in columns]
    if missing:
        named = f"{', '.join(repr(m) for m in missing)} column{'s' if len(missing) > 1 else ''}"
        raise DataError(f"{source}: no {named}; {what} (columns found: {', '.join(map(str, df.columns))})")
    return columns


def pair_turns(df: pd.DataFrame, source: str) -> list[tuple[Turn, Turn, Turn]]:
    """(prompt, chosen, rejected) of every row: text, or chats with the prompt taken from the conversations when
    there is no prompt column."""
    what = "preference pairs need 'chosen' and 'rejected' columns (and 'prompt', unless they are whole chats)"
    columns = _require(df, source, ("chosen", "rejected"), what)
    prompts = df[columns["prompt"]].tolist() if "prompt" in columns else [None] * len(df)
    out = []
    for i, (p, c, r) in enumerate(zip(prompts, df[columns["chosen"]], df[columns["rejected"]])):
        chosen, rejected = as_turn(c, source, "chosen", i), as_turn(r, source, "rejected", i)
        if p is None:
            prompt: Turn = ""
            if isinstance(chosen, list) and isinstance(rejected, list):
                shared = shared_prompt(chosen, rejected)
                prompt, chosen, rejected = chosen[:shared], chosen[shared:], rejected[shared:]
        else:
            prompt = as_turn(p, source, "prompt", i)
        if isinstance(prompt, str) and isinstance(chosen, list):
            prompt = [{"role": "user", "content": prompt}] if prompt else []
        out.append((prompt, chosen, rejected))
    return out


def judgement_turns(df: pd.DataFrame, source: str) -> tuple[list[tuple[Turn, Turn]], np.ndarray]:
    """(prompt, completion) of every row and its label as booleans; a label that is not one is refused."""
    what = "unpaired preference data (KTO) needs 'prompt', 'completion' and 'label' (true/false) columns"
    columns = _require(df, source, ("prompt", "completion", "label"), what)
    labels = np.array([_boolean(v, source, i) for i, v in enumerate(df[columns["label"]])], dtype=bool)
    rows = [
        (as_turn(p, source, "prompt", i), as_turn(c, source, "completion", i))
        for i, (p, c) in enumerate(zip(df[columns["prompt"]], df[columns["completion"]]))
    ]
    return rows, labels


def _boolean(value: Any, source: str, row: int) -> bool:
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, (int, np.integer)) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in ("true", "false"):
        return value.strip().lower() == "true"
    if missing_label(value):  # an empty cell, a row without the key (NaN once read), null
        raise DataError(
            f"{source}: row {row + 1} has no label; a KTO label says whether the completion is desirable: give true "
            "or false on every row"
        )
    raise DataError(
        f"{source}: row {row + 1} has label {value!r}; a KTO label says whether the completion is desirable: give "
        "true or false"
    )


# -- tokenizing, cached ----------------------------------------------------------------------------------------
def load_sequences(
    source: str, tokenizer, cache_dir: Path, split: str, options: ReadOptions, kind: str
) -> tuple[SequenceSet, ReadReport, bool]:
    """The tokenized examples of `source` (`kind` "pairs" or "judgements"), from the cache when this job has
    tokenized them before; the read report, and whether the cache had them."""
    key = cache_key(
        kind=f"preference-{kind}",
        read=options.key(),
        source=source_fingerprint(source),
        split=split,
        tokenizer=tokenizer_fingerprint(tokenizer),
        chat_template=getattr(tokenizer, "chat_template", None),
        version=PREFERENCE_CACHE_VERSION,
    )
    path = cache_dir / "tokenized" / f"{key}.npz"
    cached = load_arrays(path)
    if cached is not None:
        arrays, meta = cached
        values = {k.removeprefix("value_"): v for k, v in arrays.items() if k.startswith("value_")}
        tokens = TokenizedText(arrays["input_ids"], arrays["offsets"])
        return SequenceSet(tokens, int(meta["parts"]), values), ReadReport.of_cached(meta["report"], source), True
    df, report = read_table(source, split=split, options=options)
    if kind == "pairs":
        sequences = _tokenize_pairs(df, source, tokenizer)
    else:
        sequences = _tokenize_judgements(df, source, tokenizer)
    arrays = {"input_ids": sequences.tokens.input_ids, "offsets": sequences.tokens.offsets}
    arrays.update({f"value_{k}": v for k, v in sequences.values.items()})
    store_arrays(path, arrays, {"parts": sequences.parts, "report": report.__dict__})
    return sequences, report, False


def _tokenize_pairs(df: pd.DataFrame, source: str, tokenizer) -> SequenceSet:
    examples = []
    for prompt, chosen, rejected in pair_turns(df, source):
        prompt_ids, chosen_ids = encode_completion(tokenizer, prompt, chosen)
        prompt_rejected, rejected_ids = encode_completion(tokenizer, prompt, rejected)
        if prompt_rejected != prompt_ids:  # a template that renders the prompt differently before each answer
            cut = next(i for i, (a, b) in enumerate([*zip(prompt_ids, prompt_rejected), (0, 1)]) if a != b)
            chosen_ids, rejected_ids = prompt_ids[cut:] + chosen_ids, prompt_rejected[cut:] + rejected_ids
            prompt_ids = prompt_ids[:cut]
        examples.append([prompt_ids, chosen_ids, rejected_ids])
    columns = _columns(df)
    values = {}
    if "margin" in columns:  # a reward model's margin: how much more the chosen is preferred
        margin = pd.to_numeric(df[columns["margin"]], errors="coerce").to_numpy(dtype=np.float64)
        if not np.isfinite(margin).all():
            bad = int(np.flatnonzero(~np.isfinite(margin))[0])
            raise DataError(f"{source}: row {bad + 1} has margin {df[columns['margin']].iloc[bad]!r}; give a number")
        values["margin"] = margin
    return from_sequences(examples, values)


def _tokenize_judgements(df: pd.DataFrame, source: str, tokenizer) -> SequenceSet:
    rows, labels = judgement_turns(df, source)
    examples = [list(encode_completion(tokenizer, prompt, completion)) for prompt, completion in rows]
    return from_sequences(examples, {"label": labels})


def store_arrays(path: Path, arrays: dict[str, np.ndarray], meta: dict[str, Any]) -> None:
    """Atomically (a crash mid-write never leaves an entry that loads as garbage); a failed write only warns."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        with tmp.open("wb") as f:
            everything: dict[str, Any] = {**arrays, "meta": np.asarray(json.dumps(meta))}
            np.savez(f, **everything)
        os.replace(tmp, path)
    except OSError as exc:  # a read-only cache slows the next run down; it does not stop this one
        log.warning("could not write the cache entry %s (%s)", path, exc)


def load_arrays(path: Path) -> tuple[dict[str, np.ndarray], dict[str, Any]] | None:
    """A cache entry written by `store_arrays`, or None when absent or damaged (then rebuilt, never trusted)."""
    if not path.is_file():
        return None
    try:
        with np.load(path, allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files if k != "meta"}
            meta = json.loads(str(z["meta"]))
        if "offsets" in arrays and (arrays["offsets"][-1] != len(arrays["input_ids"])):
            raise ValueError("offsets do not fit the token ids")
    except Exception as exc:  # truncated, bad zip, bad JSON, missing arrays
        log.warning("cache entry %s is damaged (%s); computing it again", path, type(exc).__name__)
        return None
    return arrays, meta


def digest(*parts: Any) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:24]


# -- cutting to --max-length -----------------------------------------------------------------------------------
def cut_to_length(examples: SequenceSet, max_length: int, pairs: bool) -> tuple[SequenceSet, dict[str, int]]:
    """Every sequence (prompt + a completion) cut to `max_length` tokens, the prompt first. Examples left with a
    completion of no token are skipped, and so are `pairs` whose two completions are the same; returns the kept
    examples and how many were skipped, by reason."""
    lengths = examples.part_lengths()
    ids, offsets, parts = examples.tokens.input_ids, examples.tokens.offsets, examples.parts
    room = np.maximum(max_length - lengths[:, 0], 0)
    kept_lengths = lengths.copy()
    kept_lengths[:, 0] = np.minimum(lengths[:, 0], max_length)
    kept_lengths[:, 1:] = np.minimum(lengths[:, 1:], room[:, None])
    cut_away = (kept_lengths[:, 1:] == 0).any(1)
    same = np.zeros(len(examples), dtype=bool)
    if pairs:
        for i in np.flatnonzero(~cut_away):
            c, r = (offsets[3 * i + k] for k in (1, 2))
            n = kept_lengths[i, 1]
            same[i] = n == kept_lengths[i, 2] and np.array_equal(ids[c : c + n], ids[r : r + n])
    keep = np.flatnonzero(~(cut_away | same))
    starts = offsets[:-1].reshape(-1, parts)
    take = [np.arange(starts[i, k], starts[i, k] + kept_lengths[i, k]) for i in keep for k in range(parts)]
    new_offsets = np.zeros(len(take) + 1, dtype=np.int64)
    np.cumsum([len(t) for t in take], out=new_offsets[1:])
    flat = np.concatenate(take) if take else np.zeros(0, dtype=np.int64)
    tokens = TokenizedText(ids[flat], new_offsets)
    kept = SequenceSet(tokens, parts, {k: v[keep] for k, v in examples.values.items()})
    return kept, {"cut away": int(cut_away.sum()), "same": int(same.sum())}


# -- one batch of sequences ------------------------------------------------------------------------------------
def sequence_batch(
    sequences: Sequence[tuple[np.ndarray, np.ndarray]],
    pad_token_id: int,
    rows: Sequence[Sequence[int]] | None = None,
    buckets: Sequence[int] = (),
) -> dict[str, torch.Tensor]:
    """One batch of (prompt tokens, completion tokens) sequences. `rows`: which sequences share each row, in order
    (packed); None: one sequence a row, padded, with an attention mask. `buckets`: widths the batch is padded up to
    (--static-shapes), else its longest row's. Returns `input_ids`, `position_ids`, `labels` (the completion's
    tokens; IGNORE elsewhere), `sequence_ids` (each token's sequence, -1 on padding) and, padded, `attention_mask`."""
    packed = rows is not None
    layout = [list(r) for r in rows] if rows is not None else [[i] for i in range(len(sequences))]
    lengths = [sum(len(sequences[i][0]) + len(sequences[i][1]) for i in r) for r in layout]
    width = next((b for b in buckets if b >= max(lengths)), max(lengths))
    shape = (len(layout), width)
    ids = torch.full(shape, pad_token_id, dtype=torch.long)
    labels = torch.full(shape, IGNORE, dtype=torch.long)
    owner = torch.full(shape, -1, dtype=torch.long)
    positions = torch.arange(width, dtype=torch.long).repeat(len(layout), 1)
    for r, members in enumerate(layout):
        at = 0
        for i in members:
            prompt, completion = (torch.from_numpy(np.asarray(x, dtype=np.int64)) for x in sequences[i])
            n = len(prompt) + len(completion)
            ids[r, at : at + n] = torch.cat([prompt, completion])
            # a sequence's first token has nothing before it to predict it from (an empty prompt's completion)
            first = max(len(prompt), 1)
            labels[r, at + first : at + n] = torch.cat([prompt, completion])[first:]
            owner[r, at : at + n] = i
            positions[r, at : at + n] = torch.arange(n)
            at += n
        positions[r, at:] = torch.arange(width - at)  # padding: one more segment, counted nowhere
    batch = {"input_ids": ids, "position_ids": positions, "labels": labels, "sequence_ids": owner}
    if not packed:
        batch["attention_mask"] = (owner >= 0).long()
    return batch


# -- batching --------------------------------------------------------------------------------------------------
class SequencesCollator:
    """Batches examples of prompt + completion sequences for one forward (`tasks.policy.sequence_batch`): sequence
    `n * i + k` is example i's k-th of its n completions after its prompt (a pair: 0 chosen, 1 rejected). Packed:
    an example's sequences share a row (position ids restart at each); else each its own row, padded. Carries
    `sequence_index` (each sequence's index in the whole data), `reference_logps` (per sequence) when the data
    holds the reference's, and each example's other values (a margin, a label) under their names.

    `aside`: completions batched apart, under the key "aside" (KTO's mismatched completions, which its loss needs
    without gradients before the step). `buckets`: the widths rows are padded up to (--static-shapes: a compiled
    step meets a few shapes); the padding is counted nowhere, so training is unchanged."""

    def __init__(self, pad_token_id: int, packing: bool, aside: int = 0, buckets: Sequence[int] = ()):
        self.pad_token_id, self.packing, self.aside, self.buckets = pad_token_id, packing, aside, tuple(buckets)

    def sequences(self, items: list[dict], first: int, count: int) -> dict[str, Any]:
        sequences = [(x["parts"][0], x["parts"][1 + first + k]) for x in items for k in range(count)]
        rows = [list(range(count * i, count * (i + 1))) for i in range(len(items))] if self.packing else None
        batch: dict[str, Any] = sequence_batch(sequences, self.pad_token_id, rows, self.buckets)
        index = torch.tensor([x["slot"].index for x in items], dtype=torch.long)
        batch["sequence_index"] = (index[:, None] * count + torch.arange(count)).reshape(-1)
        if "reference" in items[0]:  # (examples, completions): the main ones first, then those aside
            reference = np.stack([np.asarray(x["reference"], dtype=np.float64) for x in items])
            batch["reference_logps"] = torch.from_numpy(reference[:, first : first + count].reshape(-1))
        batch["num_tokens"] = torch.tensor(sum(len(p) + len(c) for p, c in sequences), dtype=torch.long)
        batch["padded_tokens"] = torch.tensor(batch["input_ids"].numel(), dtype=torch.long)
        return batch

    def __call__(self, items: list[dict]) -> dict[str, Any]:
        completions = len(items[0]["parts"]) - 1 - self.aside
        batch = self.sequences(items, 0, completions)
        if self.aside:
            batch["aside"] = self.sequences(items, completions, self.aside)
        for name in items[0]:
            if name not in ("parts", "slot", "label", "reference"):
                batch[name] = torch.tensor(np.stack([np.asarray(x[name]) for x in items]))
        return {**batch, **slot_fields(items)}
