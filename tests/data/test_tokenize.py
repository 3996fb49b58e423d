"""The tokenization cache: a damaged entry is rebuilt, never used (issue #20.13)."""

import logging

import numpy as np
import pytest

from leantrain.data.prepare import load_source
from leantrain.errors import DataError
from tests.conftest import make_sentiment_rows, write_csv


@pytest.fixture(scope="module")
def tokenizer(minilm_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(minilm_dir)


def _damage_offsets(z: dict) -> dict:
    z["offsets"] = z["offsets"][:-3]
    return z


def _damage_ids(z: dict) -> dict:
    z["input_ids"] = z["input_ids"] + 10_000_000
    return z


def _damage_labels(z: dict) -> dict:
    z["labels"] = z["labels"][::-1][:-1]
    return z


def _damage_meta(z: dict) -> dict:
    z["meta"] = np.asarray('{"columns": {"txt": "text"}, "report": {}}')
    return z


@pytest.mark.parametrize("damage", ["garbage", "truncated", _damage_offsets, _damage_ids, _damage_labels, _damage_meta])
def test_a_damaged_cache_entry_is_rebuilt_not_used(tmp_path, tokenizer, caplog, damage):
    path = write_csv(tmp_path / "d.csv", make_sentiment_rows(30))
    first = load_source(str(path), tokenizer, 32, tmp_path / "cache", "train")
    (entry,) = (tmp_path / "cache" / "tokenized").glob("*.npz")
    if damage == "garbage":
        entry.write_bytes(b"\x00" * 100)
    elif damage == "truncated":
        entry.write_bytes(entry.read_bytes()[: entry.stat().st_size // 2])
    else:  # valid .npz files whose arrays do not fit together: np.load accepts them
        with np.load(entry) as z:
            arrays = damage({k: z[k] for k in z.files})
        with entry.open("wb") as f:
            np.savez(f, **arrays)
    with caplog.at_level(logging.WARNING, logger="leantrain"):
        again = load_source(str(path), tokenizer, 32, tmp_path / "cache", "train")
    assert not again.cache_hit
    assert "is damaged" in caplog.text or "describes its columns wrongly" in caplog.text
    assert again.labels == first.labels
    np.testing.assert_array_equal(again.tokens.input_ids, first.tokens.input_ids)
    assert load_source(str(path), tokenizer, 32, tmp_path / "cache", "train").cache_hit  # rewritten whole


def test_the_tokenizer_fingerprint_does_not_change_when_the_tokenizer_is_used(tokenizer):
    """Tokenizing with truncation writes its settings into the backend; the cache key must not follow."""
    from leantrain.data.tokenize import tokenize, tokenizer_fingerprint

    before = tokenizer_fingerprint(tokenizer)
    tokenize(tokenizer, ["a fairly long sentence to cut"], None, max_length=4)
    assert tokenizer_fingerprint(tokenizer) == before


def test_the_tokenizer_fingerprint_is_the_tokenizers_and_only_its(minilm_dir):
    """The same tokenizer loaded twice hashes alike (a second run finds its cache); another vocabulary, another
    normaliser or another padding side does not."""
    from transformers import AutoTokenizer

    from leantrain.data.tokenize import tokenizer_fingerprint

    def load():
        return AutoTokenizer.from_pretrained(minilm_dir)

    base = tokenizer_fingerprint(load())
    assert tokenizer_fingerprint(load()) == base
    more = load()
    more.add_tokens(["leantrainword"])
    lower = load()
    lower.backend_tokenizer.normalizer = None
    left = load()
    left.padding_side = "left"
    assert len({base, *(tokenizer_fingerprint(t) for t in (more, lower, left))}) == 4


def test_a_cache_hit_names_the_file_read_now_not_the_one_that_cached_it(tmp_path, tokenizer):
    """Entries are found by content: the same rows under another path (a copy, another checkout's package) hit the
    cache, and the line that reports the file names the path given now."""
    import shutil

    (tmp_path / "a").mkdir()
    first = write_csv(tmp_path / "a" / "d.csv", make_sentiment_rows(30))
    load_source(str(first), tokenizer, 32, tmp_path / "cache", "train")
    copy = tmp_path / "b" / "d.csv"
    copy.parent.mkdir()
    shutil.copy(first, copy)
    again = load_source(str(copy), tokenizer, 32, tmp_path / "cache", "train")
    assert again.cache_hit and again.report.source == str(copy)
    assert again.report.summary().startswith(f"{copy}: 30 rows")


def test_a_cache_entry_that_pairs_the_text_with_itself_is_refused(tmp_path, tokenizer, monkeypatch):
    """An older leantrain cached `--text-pair-column text` without refusing it: the entry is refused on a hit too."""
    from leantrain.data import prepare

    path = write_csv(tmp_path / "d.csv", make_sentiment_rows(30))
    with monkeypatch.context() as older:  # resolve columns as the older leantrain did: no check that they differ
        older.setattr(prepare, "refuse_shared_columns", lambda columns, source: None)
        older.setattr("leantrain.data.columns.refuse_shared_columns", lambda columns, source: None)
        assert load_source(str(path), tokenizer, 32, tmp_path / "cache", "train", text_pair_column="text").columns == (
            prepare.Columns(text="text", label="label", text_pair="text")
        )
    with pytest.raises(DataError, match="the text column and --text-pair-column are both 'text'"):
        load_source(str(path), tokenizer, 32, tmp_path / "cache", "train", text_pair_column="text")
