"""Words to sub-word tokens, and sentences to windows of at most --max-length tokens.

A fast tokenizer says which word each token comes from (`word_ids`). A word's tag is learnt on its first sub-word
(the rest are ignored, label -100), or with `label_all_tokens` on every sub-word (B- becoming I- after the first, as
transformers' run_ner.py does). A sentence longer than a window is cut into windows that overlap by `stride` tokens;
each token belongs to one window (the overlap is split at its middle), so every word is trained on and scored once,
in the window that holds its first sub-word, with context on both sides of it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from leantrain.data.tokenize import subset_positions
from leantrain.errors import ConfigError

#: the label of a position that counts for nothing (PyTorch's and transformers' convention)
IGNORE = -100
#: tokens consecutive windows share where --stride is left out (fewer where --max-length is under twice this)
DEFAULT_STRIDE = 32


@dataclass
class Aligned:
    """Sentences as sub-word tokens (no special tokens), with each token's word and character offsets."""

    #: per sentence: the content token ids, each token's word (its index in the sentence), each token's (start, end)
    #: characters in `texts`
    token_ids: list[np.ndarray]
    word_ids: list[np.ndarray]
    token_chars: list[np.ndarray]
    #: per sentence: the words and their (start, end) characters in `texts`
    words: list[list[str]]
    word_chars: list[np.ndarray]
    #: what each sentence's character offsets count in: the text, or the words joined by spaces
    texts: list[str]

    def __len__(self) -> int:
        return len(self.token_ids)

    def tokenless_words(self) -> int:
        """Words the tokenizer gives no token at all (control or zero-width characters): never scored but as O."""
        return sum(len(w) - len(np.unique(ids)) for w, ids in zip(self.words, self.word_ids))


def special_tokens(tokenizer: Any) -> tuple[list[int], list[int]]:
    """The ids a tokenizer puts before and after a sentence's own tokens ([CLS] and [SEP] for BERT)."""
    enc = tokenizer(["x"], is_split_into_words=True)
    ids, words = list(enc["input_ids"]), enc.word_ids(0)
    first = words.index(0)
    last = len(words) - 1 - words[::-1].index(0)
    return ids[:first], ids[last + 1 :]


def check_fast(tokenizer: Any, model: str) -> None:
    if not getattr(tokenizer, "is_fast", False):
        raise ConfigError(
            f"{model}: token classification needs a fast tokenizer (one that says which word each token comes from); "
            "this model's tokenizer is a slow one"
        )


def align_words(tokenizer: Any, sentences: list[list[str]], chunk: int = 1024) -> Aligned:
    """Sentences given as words: tokenized word by word; offsets count in the words joined by single spaces."""
    out = Aligned([], [], [], [], [], [])
    for start in range(0, len(sentences), chunk):
        part = sentences[start : start + chunk]
        enc = tokenizer(part, is_split_into_words=True, add_special_tokens=False, return_offsets_mapping=True)
        for i, words in enumerate(part):
            word_ids = np.asarray([w for w in enc.word_ids(i)], dtype=np.int32)
            lengths = np.array([len(w) for w in words], dtype=np.int64)
            starts = np.concatenate([[0], np.cumsum(lengths + 1)[:-1]]).astype(np.int64)
            chars = np.stack([starts, starts + lengths], axis=1)
            offsets = np.asarray(enc["offset_mapping"][i], dtype=np.int64).reshape(-1, 2)
            out.token_ids.append(np.asarray(enc["input_ids"][i], dtype=np.int32))
            out.word_ids.append(word_ids)
            out.token_chars.append(offsets + starts[word_ids][:, None] if len(word_ids) else offsets)
            out.words.append(list(words))
            out.word_chars.append(chars)
            out.texts.append(" ".join(words))
    return out


def align_texts(tokenizer: Any, texts: list[str], chunk: int = 1024) -> Aligned:
    """Sentences given as text: the tokenizer's words (what its pre-tokenizer splits: spaces and punctuation for
    BERT), each from its first token's first character to its last token's last."""
    out = Aligned([], [], [], [], [], [])
    for start in range(0, len(texts), chunk):
        part = texts[start : start + chunk]
        enc = tokenizer(part, add_special_tokens=False, return_offsets_mapping=True)
        for i, text in enumerate(part):
            raw = np.asarray([-1 if w is None else w for w in enc.word_ids(i)], dtype=np.int64)
            offsets = np.asarray(enc["offset_mapping"][i], dtype=np.int64).reshape(-1, 2)
            # renumber the words 0, 1, ... (a tokenizer may skip numbers); each word spans its tokens' characters
            present, word_ids = np.unique(raw, return_inverse=True)
            chars = np.stack(
                [
                    [offsets[word_ids == w, 0].min() for w in range(len(present))],
                    [offsets[word_ids == w, 1].max() for w in range(len(present))],
                ],
                axis=1,
            ).reshape(-1, 2)
            out.token_ids.append(np.asarray(enc["input_ids"][i], dtype=np.int32))
            out.word_ids.append(word_ids.astype(np.int32))
            out.token_chars.append(offsets)
            out.words.append([text[a:b] for a, b in chars])
            out.word_chars.append(chars)
            out.texts.append(text)
    return out


@dataclass
class TokenWindows:
    """Windows of tokens, stored flat (window i is `[offsets[i]:offsets[i+1]]`), special tokens included: each
    position's training label (IGNORE: none), the word of its sentence it scores (-1: none) and the sentence's token
    it owns (-1: context only, or a special token)."""

    input_ids: np.ndarray
    offsets: np.ndarray
    labels: np.ndarray
    word_index: np.ndarray
    token_index: np.ndarray
    #: each window's sentence
    sentence: np.ndarray

    def __len__(self) -> int:
        return len(self.offsets) - 1

    @property
    def lengths(self) -> np.ndarray:
        return np.diff(self.offsets)

    def row(self, i: int) -> dict[str, np.ndarray]:
        a, b = self.offsets[i], self.offsets[i + 1]
        return {
            "input_ids": self.input_ids[a:b],
            "token_labels": self.labels[a:b],
            "word_index": self.word_index[a:b],
            "token_index": self.token_index[a:b],
        }

    def subset(self, rows: np.ndarray) -> TokenWindows:
        offsets, take = subset_positions(self.offsets, rows)
        return TokenWindows(
            self.input_ids[take],
            offsets,
            self.labels[take],
            self.word_index[take],
            self.token_index[take],
            self.sentence[rows],
        )

    def counted_tokens(self) -> np.ndarray:
        """Each window's positions with a training label."""
        counted = (self.labels != IGNORE).astype(np.int64)
        return np.add.reduceat(counted, self.offsets[:-1]) if len(self) and len(counted) else np.zeros(len(self), int)


def window_starts(n: int, width: int, stride: int) -> list[int]:
    """Where each window of at most `width` tokens starts in a sentence of `n`, consecutive ones sharing `stride`."""
    step = width - stride
    return list(range(0, max(n - width, 0) + step, step))


def window_stride(stride: int | None, max_length: int, specials: tuple[list[int], list[int]]) -> int:
    """The tokens consecutive windows share: --stride, or where it is left out 32, at most half of --max-length
    (the overlap is split at its middle, so a word keeps a quarter window of context) and less than the window."""
    count = len(specials[0]) + len(specials[1])
    width = max_length - count
    if width < 1:
        raise ConfigError(f"--max-length {max_length} leaves no room beside the {count} special tokens; raise it")
    if stride is None:
        return min(DEFAULT_STRIDE, max_length // 2, width - 1)
    if not 0 <= stride < width:
        raise ConfigError(
            f"--stride {stride} must be at least 0 and below --max-length {max_length} less the {count} special "
            f"tokens ({width}); lower it, or leave it out for one that fits"
        )
    return stride


def make_windows(
    aligned: Aligned,
    tags: list[np.ndarray] | None,
    max_length: int,
    stride: int | None,
    specials: tuple[list[int], list[int]],
    continuation: np.ndarray | None,
) -> TokenWindows:
    """Every sentence's windows. `tags`: each word's label id (None: no labels, for prediction); `stride`: None where
    --stride is left out (`window_stride`); `continuation`: the label of a word's later sub-words for each label id
    (None: they are ignored, the first sub-word only)."""
    prefix, suffix = specials
    width = max_length - len(prefix) - len(suffix)
    stride = window_stride(stride, max_length, specials)
    columns: list[tuple[np.ndarray, ...]] = []
    sentence: list[int] = []
    for s in range(len(aligned)):
        word_tags = tags[s] if tags is not None else None
        for window in _sentence_windows(
            aligned.token_ids[s], aligned.word_ids[s], word_tags, width, stride, continuation
        ):
            columns.append(_with_specials(window, len(prefix), len(suffix), prefix, suffix))
            sentence.append(s)
    sizes = np.array([len(c[0]) for c in columns], dtype=np.int64)
    offsets = np.zeros(len(sizes) + 1, dtype=np.int64)
    np.cumsum(sizes, out=offsets[1:])
    flat = [np.concatenate([c[k] for c in columns]) if columns else np.zeros(0, np.int32) for k in range(4)]
    return TokenWindows(flat[0], offsets, flat[1], flat[2], flat[3], np.asarray(sentence, dtype=np.int64))


def _sentence_windows(
    ids: np.ndarray,
    words: np.ndarray,
    word_tags: np.ndarray | None,
    width: int,
    stride: int,
    continuation: np.ndarray | None,
) -> list[tuple[np.ndarray, ...]]:
    """One sentence's windows, each (token ids, labels, scored word, owned token) without special tokens."""
    n = len(ids)
    if n == 0:
        return []
    first = np.ones(n, dtype=bool)
    first[1:] = words[1:] != words[:-1]
    token_tags = word_tags[words] if word_tags is not None else np.full(n, IGNORE, dtype=np.int64)
    later = np.full(n, IGNORE) if continuation is None else _continue(token_tags, continuation)
    token_labels = np.where(first, token_tags, later)
    starts = window_starts(n, width, stride)
    owned_from = [0] + [start + stride // 2 for start in starts[1:]] + [n]
    out: list[tuple[np.ndarray, ...]] = []
    for k, start in enumerate(starts):
        positions = np.arange(start, min(start + width, n))
        owned = (positions >= owned_from[k]) & (positions < owned_from[k + 1])
        out.append(
            (
                ids[positions],
                np.where(owned, token_labels[positions], IGNORE).astype(np.int32),
                np.where(owned & first[positions], words[positions], -1).astype(np.int32),
                np.where(owned, positions, -1).astype(np.int32),
            )
        )
    return out


def _with_specials(window: tuple[np.ndarray, ...], before: int, after: int, prefix, suffix) -> tuple[np.ndarray, ...]:
    ids, labels, scored, owned = window
    pad = (np.full(before, IGNORE, np.int32), np.full(after, IGNORE, np.int32))
    none = (np.full(before, -1, np.int32), np.full(after, -1, np.int32))
    return (
        np.concatenate([np.asarray(prefix, np.int32), ids.astype(np.int32), np.asarray(suffix, np.int32)]),
        np.concatenate([pad[0], labels, pad[1]]),
        np.concatenate([none[0], scored, none[1]]),
        np.concatenate([none[0], owned, none[1]]),
    )


def _continue(word_tags: np.ndarray, continuation: np.ndarray) -> np.ndarray:
    return np.where(word_tags >= 0, continuation[np.maximum(word_tags, 0)], IGNORE)
