"""Language-model data: reading documents, the tokenization cache, packing and the collator."""

from __future__ import annotations

import numpy as np
import pytest

from leantrain.data.batching import Slot
from leantrain.data.lm import IGNORE, LMCollator, load_documents, pack, read_documents, train_bpe_tokenizer
from leantrain.data.sources import ReadOptions
from leantrain.data.tokenize import TokenizedText
from leantrain.errors import DataError


def docs(*lengths: int, mask: list[list[int]] | None = None) -> TokenizedText:
    ids = np.arange(10, 10 + sum(lengths), dtype=np.int32)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    types = np.concatenate([np.asarray(m, dtype=np.int8) for m in mask]) if mask else None
    return TokenizedText(ids, offsets, types)


def test_packing_lays_documents_end_to_end_and_restarts_positions_at_each_segment():
    rows = pack(docs(3, 4, 6), max_length=5)
    assert rows.lengths.tolist() == [5, 5, 3]  # 13 tokens: two full rows and the rest
    assert rows.position_ids.tolist() == [0, 1, 2, 0, 1, 0, 1, 0, 1, 2, 0, 1, 2]
    # the first token of every segment predicts nothing from before it (document starts and row starts)
    starts = rows.position_ids == 0
    assert (rows.labels[starts] == IGNORE).all()
    assert (rows.labels[~starts] == rows.input_ids[~starts]).all()
    assert rows.counted.tolist() == [3, 3, 2]
    assert rows.counted.sum() == 13 - 5  # one segment start per document (3) and per row start inside one (2)


def test_without_packing_each_document_has_its_own_rows_cut_at_max_length():
    rows = pack(docs(3, 7, 5), max_length=5, packing=False)
    assert rows.lengths.tolist() == [3, 5, 2, 5]
    assert rows.position_ids.tolist() == [0, 1, 2, 0, 1, 2, 3, 4, 0, 1, 0, 1, 2, 3, 4]


def test_a_loss_mask_leaves_prompt_tokens_uncounted():
    rows = pack(docs(4, 3, mask=[[0, 0, 1, 1], [0, 1, 1]]), max_length=8)
    assert rows.labels.tolist() == [IGNORE, IGNORE, 12, 13, IGNORE, 15, 16]


def test_the_collator_pads_packed_rows_with_a_segment_of_their_own_and_no_attention_mask():
    rows = pack(docs(3, 4, 6), max_length=5)
    items = [{**rows.row(i), "slot": Slot(i, 8.0, i == 2, float(rows.counted[i]))} for i in (0, 2)]
    batch = LMCollator(pad_token_id=1, packing=True)(items)
    assert "attention_mask" not in batch
    assert batch["position_ids"][1].tolist() == [0, 1, 2, 0, 1]  # the padding restarts: a separate segment
    assert batch["labels"][1].tolist() == [IGNORE, 21, 22, IGNORE, IGNORE]
    assert batch["input_ids"][1, 3:].tolist() == [1, 1]
    assert float(batch["units"]) == 3 + 2 and float(batch["step_units"]) == 8
    assert int(batch["num_tokens"]) == 8 and int(batch["padded_tokens"]) == 10
    padded = LMCollator(pad_token_id=1, packing=False)(items)
    assert padded["attention_mask"].tolist() == [[1] * 5, [1, 1, 1, 0, 0]]


def test_pad_to_max_length_pads_every_batch_to_max_length():
    """--pad-to-max-length (what `plan --probe` runs with): a batch of short rows is as wide as --max-length, the
    shape the plan is for, with the padding a segment of its own that counts nothing."""
    from types import SimpleNamespace

    from leantrain import TrainConfig
    from leantrain.tasks.causal_lm import CausalLM

    rows = pack(docs(3, 2), max_length=5, packing=False)
    items = [{**rows.row(i), "slot": Slot(i, 4.0, i == 1, float(rows.counted[i]))} for i in (0, 1)]
    data = SimpleNamespace(processor=SimpleNamespace(pad_token_id=1))
    for packing in (True, False):
        cfg = TrainConfig(task="causal-lm", max_length=8, pad_to_max_length=True, packing=packing)
        batch = CausalLM(cfg).collator(data, train=True)(items)
        assert batch["input_ids"].shape == batch["labels"].shape == batch["position_ids"].shape == (2, 8)
        assert batch["labels"][1].tolist() == [IGNORE, 14] + [IGNORE] * 6 and int(batch["padded_tokens"]) == 16
    dynamic = CausalLM(TrainConfig(task="causal-lm", max_length=8)).collator(data, train=True)(items)
    assert dynamic["input_ids"].shape == (2, 3)  # without it: the batch's longest row


def test_documents_come_from_text_files_in_a_folder_searched_recursively(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "one.txt").write_text("first document\nstill the first\n\n\nsecond document\n")
    (tmp_path / "two.txt").write_text("third\n")
    (tmp_path / "notes.md").write_text("not text data\n")
    found, report, where = read_documents(str(tmp_path), "*.txt", None, ReadOptions(), "train")
    assert found == ["first document\nstill the first", "second document", "third"]
    assert where == "2 text file(s)" and report.rows_read == 3
    with pytest.raises(DataError, match="--text-glob"):
        read_documents(str(tmp_path), "*.rst", None, ReadOptions(), "train")


@pytest.mark.parametrize(
    ("documents", "expected"),
    [
        ("paragraphs", ["first line\nsecond line", "after a blank line"]),
        ("lines", ["first line", "second line", "after a blank line"]),
        ("files", ["first line\nsecond line\n\nafter a blank line"]),
    ],
)
def test_a_text_files_documents_are_its_paragraphs_lines_or_the_file(tmp_path, documents, expected):
    path = tmp_path / "t.txt"
    path.write_text("first line\nsecond line\n\nafter a blank line\n")
    found, report, _ = read_documents(str(path), "*.txt", None, ReadOptions(documents=documents), "train")
    assert found == expected and report.rows_dropped == (1 if documents == "lines" else 0)  # the blank line


def test_a_text_file_read_another_way_is_tokenized_anew(tmp_path):
    text = tmp_path / "c.txt"
    text.write_text("the cat sat\nthe dog ran\n")
    tokenizer = train_bpe_tokenizer(["the cat sat", "the dog ran"], vocab_size=300)
    whole, _ = load_documents(str(text), tokenizer, tmp_path / "cache", "train")
    lines, note = load_documents(
        str(text), tokenizer, tmp_path / "cache", "train", options=ReadOptions(documents="lines")
    )
    assert len(whole) == 1 and len(lines) == 2 and "tokenized and cached" in note


def test_documents_come_from_a_table_column(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text('text,label\nhello there,a\n"",b\nanother row,a\n')
    found, report, where = read_documents(str(path), "*.txt", None, ReadOptions(), "train")
    assert found == ["hello there", "another row"] and where == "column 'text'"
    assert report.rows_dropped == 1


def test_tokenized_documents_end_with_eos_and_are_cached(tmp_path):
    text = tmp_path / "c.txt"
    text.write_text("the cat sat\n\nthe dog ran far away\n")
    tokenizer = train_bpe_tokenizer(["the cat sat", "the dog ran far away"], vocab_size=300)
    first, note = load_documents(str(text), tokenizer, tmp_path / "cache", "train")
    assert "tokenized and cached" in note and len(first) == 2
    ends = first.input_ids[first.offsets[1:] - 1]
    assert (ends == tokenizer.eos_token_id).all()
    again, note = load_documents(str(text), tokenizer, tmp_path / "cache", "train")
    assert "loaded from cache" in note
    assert np.array_equal(again.input_ids, first.input_ids)


def test_the_task_is_inferred_from_a_causal_lm_config_and_text_generation_names_it():
    from transformers import BertConfig, GPT2Config, LlamaConfig

    from leantrain import TrainConfig, tasks

    assert tasks.infer(LlamaConfig(architectures=["LlamaForCausalLM"])) == "causal-lm"
    assert tasks.infer(GPT2Config(architectures=["GPT2LMHeadModel"])) == "causal-lm"
    assert tasks.infer(BertConfig()) == "text-classification"
    assert TrainConfig(task="text-generation").task == "causal-lm"
