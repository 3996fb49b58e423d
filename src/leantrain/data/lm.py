"""Language-model data: documents read, tokenized once (cached), then packed into rows of --max-length tokens.

A *document* is one text: a blank-line-separated block of a text file (or a line, or the file: --text-documents), or
one row of a table's text column.
Each ends with the tokenizer's EOS token. Packing lays the documents of a split one after another into rows of
`max_length` tokens; a document that reaches the end of a row continues in the next one as a new *segment*.
Position ids restart at every segment, which is what tells the model's attention (transformers' packed-sequence
detection: `masking_utils.find_packed_sequence_indices`) to keep segments apart. Without packing, each document
is its own row (cut into chunks of `max_length` when longer) and the collator pads.

Labels follow the Hugging Face convention (`labels[t]` is the token that position t-1 predicts, -100 where nothing
is counted): the first token of every segment is -100, since no earlier token of its document is in view.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from leantrain.data.batching import length_mask, padded, slot_fields
from leantrain.data.dedupe import text_hashes
from leantrain.data.sources import ReadOptions, ReadReport, read_table
from leantrain.data.tokenize import (
    TokenizedText,
    cache_key,
    load_cached,
    save_cached,
    source_fingerprint,
    tokenizer_fingerprint,
)
from leantrain.errors import DataError

log = logging.getLogger("leantrain")

IGNORE = -100  # the label of a token whose prediction the loss does not count
_BLANK_LINES = re.compile(r"\n\s*\n")


@dataclass
class TokenRows:
    """Rows of a language model's batches, stored flat: row i is `[offsets[i]:offsets[i+1]]` of each array."""

    input_ids: np.ndarray  # int32
    labels: np.ndarray  # int32, IGNORE where not counted
    position_ids: np.ndarray  # int32, restarting at every segment
    offsets: np.ndarray  # int64

    def __len__(self) -> int:
        return len(self.offsets) - 1

    @property
    def lengths(self) -> np.ndarray:
        return np.diff(self.offsets)

    @property
    def counted(self) -> np.ndarray:
        """Tokens each row's loss counts (its loss units)."""
        flags = np.concatenate([[0], np.cumsum(self.labels != IGNORE)])
        return flags[self.offsets[1:]] - flags[self.offsets[:-1]]

    def row(self, i: int) -> dict[str, np.ndarray]:
        a, b = self.offsets[i], self.offsets[i + 1]
        return {"input_ids": self.input_ids[a:b], "labels": self.labels[a:b], "position_ids": self.position_ids[a:b]}

    def subset(self, rows: np.ndarray) -> TokenRows:
        from leantrain.data.tokenize import subset_positions

        offsets, take = subset_positions(self.offsets, rows)
        return TokenRows(self.input_ids[take], self.labels[take], self.position_ids[take], offsets)

    @staticmethod
    def concat(parts: list[TokenRows]) -> TokenRows:
        """The rows of `parts`, end to end (a mixture's sources)."""
        from leantrain.data.tokenize import concat_offsets

        return TokenRows(
            np.concatenate([p.input_ids for p in parts]),
            np.concatenate([p.labels for p in parts]),
            np.concatenate([p.position_ids for p in parts]),
            concat_offsets([p.offsets for p in parts]),
        )


# -- reading -----------------------------------------------------------------------------------------------------
def is_text_source(source: str) -> bool:
    """A .txt file or a folder of text files (not a `datasets` folder saved with save_to_disk)."""
    path = Path(source)
    if path.is_file():
        return path.suffix.lower() == ".txt"
    saved = ("dataset_dict.json", "state.json", "dataset_info.json")
    return path.is_dir() and not any((path / name).is_file() for name in saved)


def split_documents(text: str, documents: str) -> list[str]:
    """A text file's documents (--text-documents): its paragraphs (blocks between blank lines), its lines, or the
    file whole. Not yet stripped."""
    if documents == "lines":
        return text.splitlines()  # as datasets' text loader splits (a trailing newline ends the last line)
    return [text] if documents == "files" else _BLANK_LINES.split(text)


def read_documents(
    source: str, glob: str, text_column: str | None, options: ReadOptions, split: str
) -> tuple[list[str], ReadReport, str]:
    """The documents of `source` (stripped, empty ones dropped), what reading did, and where the text was."""
    if is_text_source(source):
        path = Path(source)
        files = [path] if path.is_file() else sorted(p for p in path.rglob(glob) if p.is_file())
        if not files:
            raise DataError(f"{source}: no files match --text-glob '{glob}' in this folder (searched recursively)")
        report = ReadReport(source)
        docs = []
        for f in files:
            try:
                text = f.read_bytes().decode("utf-8-sig", errors="replace").replace("\r\n", "\n")
            except OSError as exc:
                raise DataError(f"{f}: cannot read ({exc.strerror or exc})") from None
            docs += split_documents(text, options.documents)
        report.rows_read = len(docs)
        kept = [d.strip() for d in docs if d.strip()]
        report.drop("empty", len(docs) - len(kept))
        return kept, report, f"{len(files)} text file(s)"
    from leantrain.data import instructions

    df, report = read_table(source, split=split, options=options)
    kind = instructions.kind_of(df) if text_column is None else None
    if kind is not None:  # instruction rows: their prompts and completions
        kept = [t for t in instructions.row_texts(df, kind, source) if t]
        report.drop("with empty text", len(df) - len(kept))
        return kept, report, "columns 'prompt', 'completion'" if kind == "prompt" else "column 'messages'"
    kept, where = _table_texts(df, source, text_column, report)
    return kept, report, where


def _table_texts(df, source: str, text_column: str | None, report: ReadReport) -> tuple[list[str], str]:
    from leantrain.data.columns import resolve_columns

    cols = resolve_columns(df, source, text_column, None, None, require_label=False)
    values = df[cols.text]
    texts = [str(v).strip() for v in values[values.notna()]]
    kept = [t for t in texts if t]
    report.drop("with empty text", len(df) - len(kept))
    return kept, f"column '{cols.text}'"


# -- tokenizing --------------------------------------------------------------------------------------------------
def tokenize_documents(tokenizer, docs: list[str], chunk: int = 2048) -> TokenizedText:
    """Each document's token ids, ending with EOS (no truncation: packing cuts rows)."""
    from transformers.utils import logging as hf_logging

    eos = tokenizer.eos_token_id
    if eos is None:
        encoder = tokenizer.mask_token is not None and tokenizer.cls_token is not None
        raise DataError(
            f"the tokenizer of {tokenizer.name_or_path!r} has no EOS token to end documents with"
            + (
                "; it is an encoder's ([CLS], [MASK]): a language model is a decoder (--model preset:tiny-llama, "
                "or a GPT-2, Llama or Qwen name or folder)"
                if encoder
                else ""
            )
        )
    ids: list[np.ndarray] = []
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # "longer than the model's maximum": packing cuts rows, nothing is lost
    try:
        for start in range(0, len(docs), chunk):
            enc = tokenizer(docs[start : start + chunk], return_attention_mask=False)["input_ids"]
            ids.extend(np.asarray(x if x[-1:] == [eos] else [*x, eos], dtype=np.int32) for x in enc)
    finally:
        hf_logging.set_verbosity(verbosity)
    offsets = np.zeros(len(ids) + 1, dtype=np.int64)
    np.cumsum([len(x) for x in ids], out=offsets[1:])
    return TokenizedText(np.concatenate(ids) if ids else np.zeros(0, dtype=np.int32), offsets)


def load_documents(
    source: str,
    tokenizer,
    cache_dir: Path,
    split: str,
    glob: str = "*.txt",
    text_column: str | None = None,
    options: ReadOptions | None = None,
    train_on_prompt: bool = False,
) -> tuple[TokenizedText, str]:
    """Tokenized documents of `source`, from the cache when this job has tokenized them before; and a note.

    A table with `prompt` and `completion` columns, or a `messages` column, is instruction data: its documents
    carry a loss mask (`token_type_ids`: 1 on completion tokens, all 1 with `train_on_prompt`)."""
    options = options or ReadOptions()
    key = cache_key(
        kind="causal-lm",
        read=options.key(),
        source=source_fingerprint(source),
        split=split,
        text=text_column,
        glob=glob,
        tokenizer=tokenizer_fingerprint(tokenizer),
        chat_template=getattr(tokenizer, "chat_template", None),
        train_on_prompt=train_on_prompt,
        answer_tokens="overlap",  # (before: tokens starting inside the answer; `instructions._chat_tokens`)
    )
    path = cache_dir / "tokenized" / f"{key}.npz"
    cached = load_cached(path, vocab_size=len(tokenizer))
    if cached is not None:
        tokens, _, meta = cached
        return tokens, f"{meta['report']['source']}: {len(tokens):,} documents; tokenized data loaded from cache"
    if is_text_source(source):
        docs, report, where = read_documents(source, glob, text_column, options, split)
        if not docs:
            raise DataError(f"{source}: no non-empty text in {where}")
        tokens = tokenize_documents(tokenizer, docs)
        tokens.hashes = text_hashes(docs)
    else:
        tokens, report, where = _read_table_documents(source, tokenizer, text_column, options, split, train_on_prompt)
    meta = {"columns": {"text": where}, "report": report.__dict__}
    try:
        save_cached(path, tokens, [""] * len(tokens), meta)
    except OSError as exc:  # a read-only cache slows the next run down; it does not stop this one
        log.warning("could not write the tokenization cache at %s (%s)", path, exc)
    return tokens, f"{report.summary()}; {len(tokens):,} documents from {where}; tokenized and cached"


def _read_table_documents(
    source: str, tokenizer, text_column: str | None, options: ReadOptions, split: str, train_on_prompt: bool
) -> tuple[TokenizedText, ReadReport, str]:
    from leantrain.data import instructions

    df, report = read_table(source, split=split, options=options)
    kind = instructions.kind_of(df) if text_column is None else None
    if kind is None:
        docs, where = _table_texts(df, source, text_column, report)
        if not docs:
            raise DataError(f"{source}: no non-empty text in {where}")
        tokens = tokenize_documents(tokenizer, docs)
        tokens.hashes = text_hashes(docs)
        return tokens, report, where
    tokens = instructions.tokenize_table(df, kind, tokenizer, source, train_on_prompt, report)
    return tokens, report, "columns 'prompt', 'completion'" if kind == "prompt" else "column 'messages'"


# -- packing -----------------------------------------------------------------------------------------------------
def pack(docs: TokenizedText, max_length: int, packing: bool = True, whole: bool = False) -> TokenRows:
    """Rows of at most `max_length` tokens: documents laid end to end (packing), or one document per row.

    Either way a document longer than a row is cut into chunks, each a segment of its own. `whole` (instruction
    data, each document at most `max_length`): a document that does not fit in the rest of a row starts the next
    one, so that a completion is never cut from its prompt. `docs.token_type_ids`,
    when present, marks the tokens the loss counts (1) beside those it does not (0: a prompt)."""
    ids = docs.input_ids
    n = len(ids)
    index = np.arange(n, dtype=np.int64)
    doc_start = np.zeros(n, dtype=bool)
    doc_start[docs.offsets[:-1][docs.lengths > 0]] = True
    if packing and whole:
        row_start = np.zeros(n, dtype=bool)
        row_start[_whole_document_rows(docs.offsets, max_length)] = True
        row_offsets = np.append(index[row_start], n)
    elif packing:
        row_start = index % max_length == 0
        row_offsets = np.append(index[row_start], n)
    else:
        # each document from its own row, then every max_length tokens of it
        start_of = np.repeat(docs.offsets[:-1], docs.lengths)
        row_start = (index - start_of) % max_length == 0
        row_offsets = np.append(index[row_start], n)
    segment_start = doc_start | row_start
    last_start = np.maximum.accumulate(np.where(segment_start, index, 0))
    positions = (index - last_start).astype(np.int32)
    labels = np.where(segment_start, IGNORE, ids).astype(np.int32)
    if docs.token_type_ids is not None:
        labels[docs.token_type_ids == 0] = IGNORE
    return TokenRows(ids.astype(np.int32), labels, positions, row_offsets.astype(np.int64))


def _whole_document_rows(offsets: np.ndarray, max_length: int) -> list[int]:
    """The token index where each row begins when documents are kept whole (first fit, in order)."""
    starts, fill = [], max_length
    for a, b in zip(offsets[:-1].tolist(), offsets[1:].tolist()):
        if fill + (b - a) > max_length:
            starts.append(a)
            fill = 0
        fill += b - a
    return starts


# -- batching ----------------------------------------------------------------------------------------------------
class LMCollator:
    """Stacks rows, padding each micro-batch to its longest (or to `fixed_length`: --pad-to-max-length). Packed rows
    get no attention mask: their padding is one more segment (positions from 0, nothing counted), so position ids
    alone keep everything apart."""

    def __init__(self, pad_token_id: int, packing: bool, fixed_length: int | None = None):
        self.pad_token_id, self.packing, self.fixed_length = pad_token_id, packing, fixed_length

    def __call__(self, items: list[dict]) -> dict[str, Any]:
        lengths = [len(x["input_ids"]) for x in items]
        width = self.fixed_length or max(lengths)
        ids = padded([x["input_ids"] for x in items], width, self.pad_token_id)
        labels = padded([x["labels"] for x in items], width, IGNORE)
        positions = np.tile(np.arange(width, dtype=np.int64), (len(items), 1))  # padding: a segment from 0
        for r, (x, n) in enumerate(zip(items, lengths)):
            positions[r, :n] = x["position_ids"]
            positions[r, n:] = np.arange(width - n)
        batch = {
            "input_ids": torch.from_numpy(ids),
            "position_ids": torch.from_numpy(positions),
            "labels": torch.from_numpy(labels),
            **slot_fields(items),
            "num_tokens": torch.tensor(sum(lengths), dtype=torch.long),
            "padded_tokens": torch.tensor(ids.size, dtype=torch.long),
        }
        if not self.packing:
            batch["attention_mask"] = torch.from_numpy(length_mask(lengths, width))
        return batch


# -- a tokenizer made for the run ----------------------------------------------------------------------------------
EOS_TOKEN, PAD_TOKEN = "<|endoftext|>", "<|pad|>"

#: the chat template of a tokenizer a run trains (a preset's): "role: content" lines, each assistant turn ending
#: with EOS, so that a model tuned on chats learns where its answer stops; the answer starts on a new line, so
#: its first word is tokenized alike after the generation prompt and in training (no trailing space to merge)
CHAT_TEMPLATE = (
    "{% for m in messages %}{% if m['role'] == 'assistant' %}assistant:\n{{ m['content'] }}{{ eos_token }}"
    "{% else %}{{ m['role'] }}: {{ m['content'] }}\n{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}assistant:\n{% endif %}"
)


def train_bpe_tokenizer(docs: list[str], vocab_size: int):
    """A byte-level BPE tokenizer trained on `docs` (seconds for millions of words), as a transformers tokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOS_TOKEN, PAD_TOKEN],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(docs, trainer=trainer, length=len(docs))
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token=EOS_TOKEN, bos_token=EOS_TOKEN, pad_token=PAD_TOKEN, model_max_length=1 << 30
    )


def run_tokenizer(
    source: str, glob: str, text_column: str | None, options: ReadOptions, vocab_size: int, cache_dir: Path
):
    """The BPE tokenizer trained on `source`'s documents, cached: a resumed run gets the very same one."""
    return mixture_tokenizer([(source, glob, text_column, options)], vocab_size, cache_dir)


def mixture_tokenizer(sources: list[tuple[str, str, str | None, ReadOptions]], vocab_size: int, cache_dir: Path):
    """The BPE tokenizer trained on the documents of every source (source, glob, text column, read options), in
    order, cached: a resumed run gets the very same one."""
    from transformers import PreTrainedTokenizerFast

    parts = [
        dict(read=options.key(), source=source_fingerprint(source), text=text_column, glob=glob)
        for source, glob, text_column, options in sources
    ]
    key = cache_key(kind="bpe", **parts[0], vocab=vocab_size) if len(parts) == 1 else cache_key(
        kind="bpe", sources=parts, vocab=vocab_size
    )  # fmt: skip
    folder = cache_dir / "tokenizers" / key
    tokenizer = None
    if (folder / "tokenizer.json").is_file():
        try:
            tokenizer = PreTrainedTokenizerFast.from_pretrained(str(folder))
        except (OSError, ValueError) as exc:
            log.warning("cached tokenizer %s is damaged (%s); training it again", folder, exc)
    if tokenizer is None:
        docs = [d for source, glob, column, options in sources for d in read_documents(
            source, glob, column, options, "train")[0]]  # fmt: skip
        tokenizer = train_bpe_tokenizer(docs, vocab_size)
        try:
            tokenizer.save_pretrained(str(folder))
        except OSError as exc:
            log.warning("could not cache the tokenizer at %s (%s)", folder, exc)
    tokenizer.chat_template = tokenizer.chat_template or CHAT_TEMPLATE  # (one cached before it had none)
    return tokenizer
