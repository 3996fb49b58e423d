"""Instruction data: `prompt`/`completion` columns, or a `messages` column of role/content chats rendered with
the tokenizer's chat template. Each row becomes one document whose loss mask (`token_type_ids`) is 1 on the
completion's (the assistant's) tokens only, or on every token with --train-on-prompt."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from leantrain.data.dedupe import text_hashes
from leantrain.data.sources import ReadReport
from leantrain.data.tokenize import TokenizedText
from leantrain.errors import ConfigError, DataError


def kind_of(df: pd.DataFrame) -> str | None:
    """'prompt' (prompt and completion columns), 'messages' (a chat column) or None (plain text)."""
    columns = {str(c).lower() for c in df.columns}
    if {"prompt", "completion"} <= columns:
        return "prompt"
    if "messages" in columns:
        return "messages"
    return None


def row_texts(df: pd.DataFrame, kind: str, source: str) -> list[str]:
    """Each row's text as a tokenizer trained for this data must see it (a preset trained from scratch): prompt and
    completion, or every message's content, joined."""
    columns = {str(c).lower(): c for c in df.columns}
    if kind == "prompt":
        rows = zip(df[columns["prompt"]], df[columns["completion"]])
        return [f"{p}{c}".strip() for p, c in rows if pd.notna(p) and pd.notna(c)]
    chats = (_chat(v, source, i) for i, v in enumerate(df[columns["messages"]]))
    return ["\n".join(m["content"] for m in chat) for chat in chats]


def set_chat_template(tokenizer, template: str | None) -> None:
    """--chat-template: a Jinja template, or a file holding one; it replaces the tokenizer's own."""
    if template is None:
        return
    path = Path(template).expanduser()
    if "{" not in template and path.is_file():
        template = path.read_text(encoding="utf-8")
    elif "{" not in template:
        raise ConfigError(f"--chat-template '{template}': neither a Jinja template nor a file; give one of them")
    tokenizer.chat_template = template


def tokenize_table(
    df: pd.DataFrame, kind: str, tokenizer, source: str, train_on_prompt: bool, report: ReadReport
) -> TokenizedText:
    columns = {str(c).lower(): c for c in df.columns}
    if kind == "prompt":
        pairs = [
            (str(p), str(c))
            for p, c in zip(df[columns["prompt"]], df[columns["completion"]])
            if pd.notna(p) and pd.notna(c) and str(c).strip()
        ]
        report.drop("without a completion", len(df) - len(pairs))
        encoded = [_prompt_completion(tokenizer, p, c) for p, c in pairs]
        hashes = text_hashes((p for p, _ in pairs), (c for _, c in pairs))
    else:
        if not getattr(tokenizer, "chat_template", None):
            raise ConfigError(
                f"{source}: a 'messages' column needs a chat template, and the tokenizer of "
                f"{tokenizer.name_or_path!r} has none; give one with --chat-template (a Jinja template or a file)"
            )
        chats = [_chat(v, source, i) for i, v in enumerate(df[columns["messages"]])]
        encoded = [_chat_tokens(tokenizer, chat) for chat in chats]
        hashes = text_hashes("\x1e".join(f"{m['role']}\x1d{m['content']}" for m in chat) for chat in chats)
    ids, masks = [], []
    for tokens, mask in encoded:
        ids.append(np.asarray(tokens, dtype=np.int32))
        masks.append(np.ones(len(tokens), dtype=np.int8) if train_on_prompt else np.asarray(mask, dtype=np.int8))
    offsets = np.zeros(len(ids) + 1, dtype=np.int64)
    np.cumsum([len(x) for x in ids], out=offsets[1:])
    if not ids:
        raise DataError(f"{source}: no row has a non-empty completion")
    return TokenizedText(np.concatenate(ids), offsets, np.concatenate(masks), hashes)


def _prompt_completion(tokenizer, prompt: str, completion: str) -> tuple[list[int], list[int]]:
    """The prompt's tokens (with the tokenizer's special tokens), then the completion's and EOS: counted."""
    p = tokenizer(prompt, return_attention_mask=False)["input_ids"]
    c = tokenizer(completion, add_special_tokens=False, return_attention_mask=False)["input_ids"]
    c = [*c, tokenizer.eos_token_id]
    return [*p, *c], [0] * len(p) + [1] * len(c)


def chat_prompts(df: pd.DataFrame, source: str) -> list[list[dict[str, str]]]:
    """Each row's chat without its final assistant message (the answer a model is asked for)."""
    column = {str(c).lower(): c for c in df.columns}["messages"]
    prompts = []
    for i, value in enumerate(df[column]):
        chat = _chat(value, source, i, answered=False)
        prompt = chat[:-1] if chat[-1]["role"] == "assistant" else chat
        if not prompt:  # the model would be asked to answer nothing
            raise DataError(
                f"{source}: row {i + 1} of column 'messages' holds only an assistant's message, so nothing is asked; "
                "give the messages before the answer (a user's at least)"
            )
        prompts.append(prompt)
    return prompts


def _chat(value: Any, source: str, row: int, answered: bool = True, column: str = "messages") -> list[dict[str, str]]:
    """A chat as a list of {role, content} messages (a JSON string in a CSV cell), or one line saying why not."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            value = None
    if hasattr(value, "tolist"):
        value = value.tolist()  # Parquet and datasets give arrays
    ok = (
        isinstance(value, list)
        and value
        and all(
            isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str) for m in value
        )
    )
    if not ok:
        raise DataError(
            f'{source}: row {row + 1} of column \'{column}\' is not a list of {{"role": ..., "content": ...}} '
            "messages; write each chat as such a JSON list"
        )
    if answered and not any(m["role"] == "assistant" for m in value):
        raise DataError(f"{source}: row {row + 1} of column '{column}' has no assistant message to learn")
    return [{"role": m["role"], "content": m["content"]} for m in value]


def _chat_tokens(tokenizer, chat: list[dict[str, str]]) -> tuple[list[int], list[int]]:
    """The rendered chat's tokens, with 1 on those that overlap what each assistant message adds to the rendering
    (a token that merges the header's last space with the answer's first word is the answer's first token)."""
    render = lambda msgs, gen=False: tokenizer.apply_chat_template(  # noqa: E731
        msgs, tokenize=False, add_generation_prompt=gen
    )
    text = render(chat)
    spans = []
    for i, m in enumerate(chat):
        if m["role"] == "assistant":
            spans.append((len(render(chat[:i], True)), len(render(chat[: i + 1]))))
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True, return_attention_mask=False)
    mask = [int(any(start < b and end > a for a, b in spans)) for start, end in enc["offset_mapping"]]
    ids = list(enc["input_ids"])
    if ids[-1:] != [tokenizer.eos_token_id]:  # the end of the chat is learnt too
        ids, mask = [*ids, tokenizer.eos_token_id], [*mask, 1]
    return ids, mask


def keep_completions(docs: TokenizedText, max_length: int) -> tuple[TokenizedText, int]:
    """Documents cut to `max_length` tokens; those left without a counted token are dropped. Returns the kept
    documents and how many were dropped."""
    assert docs.token_type_ids is not None
    lengths = np.minimum(docs.lengths, max_length)
    keep_rows, take = [], []
    for i, (a, n) in enumerate(zip(docs.offsets[:-1].tolist(), lengths.tolist())):
        if docs.token_type_ids[a : a + n].any():
            keep_rows.append(i)
            take.append(np.arange(a, a + n))
    offsets = np.zeros(len(keep_rows) + 1, dtype=np.int64)
    np.cumsum([len(t) for t in take], out=offsets[1:])
    flat = np.concatenate(take) if take else np.zeros(0, dtype=np.int64)
    hashes = docs.hashes[keep_rows] if docs.hashes is not None else None
    kept = TokenizedText(docs.input_ids[flat], offsets, docs.token_type_ids[flat], hashes)
    return kept, len(docs) - len(keep_rows)


# -- a prompt and its completion, as a policy sees them (preference tuning, online RL) --------------------------
#: a prompt or a completion: plain text, or role/content messages
Turn = str | list[dict[str, str]]


def render_chat(tokenizer, messages: list[dict[str, str]], prompt: bool) -> str:
    """A chat rendered with the tokenizer's chat template; `prompt`: ending with its cue for the assistant's turn."""
    if not getattr(tokenizer, "chat_template", None):
        raise ConfigError(
            f"chat messages need a chat template, and the tokenizer of {tokenizer.name_or_path!r} has none; give one "
            "with --chat-template (a Jinja template or a file)"
        )
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=prompt)


def encode_prompt(tokenizer, prompt: Turn) -> list[int]:
    """A prompt's tokens as the model is to continue them: plain text with the tokenizer's special tokens (a BOS), or
    a chat rendered with its template and the cue for the assistant's turn (the template writes its own tokens)."""
    if isinstance(prompt, str):
        return list(tokenizer(prompt, return_attention_mask=False)["input_ids"])
    text = render_chat(tokenizer, prompt, prompt=True)
    return list(tokenizer(text, add_special_tokens=False, return_attention_mask=False)["input_ids"])


def encode_completion(tokenizer, prompt: Turn, completion: Turn) -> tuple[list[int], list[int]]:
    """(prompt tokens, completion tokens): the prompt's as `encode_prompt` gives them, then the completion's, ending
    with EOS, tokenized apart so that the prompt's tokens are exactly those a model generating from it continues.
    Plain text: the completion's text. A chat: what the template renders after the prompt's cue for the assistant
    (the completion's messages and the template's own tokens around them). An encoder's tokenizer has no EOS: its
    separator ends the completion, so a BERT reward model reads `[CLS] prompt [SEP] completion [SEP]`, its own
    sentence-pair form."""
    eos = tokenizer.eos_token_id if tokenizer.eos_token_id is not None else tokenizer.sep_token_id
    end = [] if eos is None else [eos]
    if isinstance(prompt, str) != isinstance(completion, str):
        raise DataError("a prompt and its completion must both be text or both be chat messages")
    if isinstance(completion, str):
        tokens = tokenizer(completion, add_special_tokens=False, return_attention_mask=False)["input_ids"]
        return encode_prompt(tokenizer, prompt), [*tokens, *end]
    assert not isinstance(prompt, str)
    cue = render_chat(tokenizer, prompt, prompt=True)
    whole = render_chat(tokenizer, [*prompt, *completion], prompt=False)
    if not whole.startswith(cue):  # a template that renders the prompt alone otherwise: split where they part
        cut = next((i for i, (a, b) in enumerate(zip(cue, whole)) if a != b), min(len(cue), len(whole)))
        cue = cue[:cut]
    encode = lambda text: list(tokenizer(text, add_special_tokens=False, return_attention_mask=False)["input_ids"])  # noqa: E731
    tokens = encode(whole[len(cue) :])
    return encode(cue), tokens if tokens[-1:] == end else [*tokens, *end]


def as_turn(value: Any, source: str, column: str, row: int) -> Turn:
    """A cell of a prompt or completion column: text, or a chat (a list of role/content messages, or its JSON)."""
    if isinstance(value, str) and value.lstrip().startswith("[") and _is_json(value):
        value = json.loads(value)
    if hasattr(value, "tolist"):
        value = value.tolist()
    if isinstance(value, list):
        return _chat(value, source, row, answered=False, column=column)
    if value is None or (isinstance(value, float) and np.isnan(value)):
        raise DataError(f"{source}: row {row + 1} has no '{column}'; give every row one (or drop the row)")
    return str(value)


def _is_json(text: str) -> bool:
    try:
        json.loads(text)
    except json.JSONDecodeError:
        return False
    return True


def shared_prompt(chosen: list[dict[str, str]], rejected: list[dict[str, str]]) -> int:
    """How many messages two chats share from the start, up to the last one before each chat's final answer: their
    prompt, when a table gives whole conversations and no prompt column."""
    shared = 0
    for a, b in zip(chosen[:-1], rejected[:-1]):
        if a != b:
            break
        shared += 1
    return shared
