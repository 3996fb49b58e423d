"""Instruction data: which tokens the loss counts, and one line for bad input."""

from __future__ import annotations

import json

import numpy as np
import pytest

from leantrain.data.instructions import keep_completions
from leantrain.data.lm import IGNORE, load_documents, pack, train_bpe_tokenizer
from leantrain.data.tokenize import TokenizedText
from leantrain.errors import ConfigError, DataError

TEMPLATE = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
TEMPLATE += "{% if add_generation_prompt %}assistant:{% endif %}"


@pytest.fixture(scope="module")
def tokenizer():
    texts = ["Review: a great film\nSentiment: positive", "user: hi\nassistant: hello there", "negative"] * 20
    return train_bpe_tokenizer(texts, vocab_size=300)


def counted_text(tokenizer, docs: TokenizedText) -> list[str]:
    rows = pack(docs, max_length=256, packing=False)
    out = []
    for i in range(len(rows)):
        row = rows.row(i)
        out.append(tokenizer.decode(row["input_ids"][row["labels"] != IGNORE]))
    return out


def test_only_the_completion_and_eos_are_counted(tokenizer, tmp_path):
    path = tmp_path / "sft.jsonl"
    rows = [("Review: a great film\nSentiment:", " positive"), ("bad film?", " negative")]
    path.write_text("".join(json.dumps({"prompt": p, "completion": c}) + "\n" for p, c in rows))
    docs, _ = load_documents(str(path), tokenizer, tmp_path / "cache", "train")
    assert counted_text(tokenizer, docs) == [" positive<|endoftext|>", " negative<|endoftext|>"]
    everything, _ = load_documents(str(path), tokenizer, tmp_path / "cache", "train", train_on_prompt=True)
    # all but the first token (which nothing predicts)
    assert counted_text(tokenizer, everything)[0] == tokenizer.decode(everything.input_ids[1 : everything.offsets[1]])


def test_chats_count_the_assistant_messages_only(tokenizer, tmp_path):
    path = tmp_path / "chat.jsonl"
    chat = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "hello there"},
        {"role": "user", "content": "and?"},
        {"role": "assistant", "content": "negative"},
    ]
    path.write_text(json.dumps({"messages": chat}) + "\n")
    tokenizer.chat_template = TEMPLATE
    try:
        docs, _ = load_documents(str(path), tokenizer, tmp_path / "cache", "train")
    finally:
        tokenizer.chat_template = None
    assert counted_text(tokenizer, docs) == [" hello there\n negative\n<|endoftext|>"]


def test_an_answer_whose_first_token_holds_the_headers_space_is_counted_from_it(tokenizer, tmp_path):
    """A generation prompt ending in a space ("assistant: "): byte-level BPE merges that space into the answer's
    first word, a token that starts before the answer. It is the answer's first token and is counted."""
    path = tmp_path / "chat.jsonl"
    chat = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello there"}]
    path.write_text(json.dumps({"messages": chat}) + "\n")
    tokenizer.chat_template = TEMPLATE.replace("assistant:{% endif %}", "assistant: {% endif %}")
    try:
        docs, _ = load_documents(str(path), tokenizer, tmp_path / "cache", "train")
    finally:
        tokenizer.chat_template = None
    assert counted_text(tokenizer, docs) == [" hello there\n<|endoftext|>"]


def test_bad_chats_and_a_missing_template_get_one_line(tokenizer, tmp_path):
    path = tmp_path / "chat.jsonl"
    path.write_text(json.dumps({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant"}]}) + "\n")
    with pytest.raises(ConfigError, match="--chat-template"):
        load_documents(str(path), tokenizer, tmp_path / "cache", "train")
    tokenizer.chat_template = TEMPLATE
    try:
        with pytest.raises(DataError, match="row 1 of column 'messages' is not a list of"):
            load_documents(str(path), tokenizer, tmp_path / "cache", "train")
        path.write_text(json.dumps({"messages": "just text"}) + "\n")
        with pytest.raises(DataError, match="not a list of"):
            load_documents(str(path), tokenizer, tmp_path / "cache", "train")
    finally:
        tokenizer.chat_template = None


def test_rows_whose_completion_is_cut_away_are_skipped_and_counted():
    # three documents: the completion starts at token 2, 6 and 3
    mask = np.array([0, 0, 1, 1] + [0] * 6 + [1, 1] + [0, 0, 0, 1], dtype=np.int8)
    docs = TokenizedText(np.arange(16, dtype=np.int32), np.array([0, 4, 12, 16]), mask)
    kept, dropped = keep_completions(docs, max_length=5)
    assert dropped == 1 and len(kept) == 2
    assert kept.lengths.tolist() == [4, 4] and kept.input_ids.tolist() == [0, 1, 2, 3, 12, 13, 14, 15]


def test_prompts_of_chats_leave_the_last_answer_out_and_refuse_a_chat_that_asks_nothing():
    """`predict --data` reads a 'messages' column as chats without their last assistant message; a chat of an
    assistant's message alone would ask the model nothing (it rendered only the generation prompt)."""
    import pandas as pd

    from leantrain.data.instructions import chat_prompts

    user, answer = {"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}
    chats = pd.DataFrame({"messages": [[user, answer], [user]]})
    assert chat_prompts(chats, "ask.jsonl") == [[user], [user]]
    with pytest.raises(DataError, match=r"ask.jsonl: row 2 of column 'messages' holds only an assistant's message"):
        chat_prompts(pd.DataFrame({"messages": [[user], [answer]]}), "ask.jsonl")
