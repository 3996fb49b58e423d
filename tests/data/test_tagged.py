"""Reading token-labelled tables (data/tagged.py): what a newcomer's table in other column names is told."""

from __future__ import annotations

import csv
import json

import pytest

from leantrain.data.sources import ReadOptions
from leantrain.data.tagged import TaggedColumns, read_tagged
from leantrain.errors import DataError


@pytest.mark.parametrize("suffix", [".jsonl", ".csv"])
def test_lists_of_words_and_tags_in_unguessed_columns_are_told_to_name_them(tmp_path, suffix):
    """'sentence' and 'labels' lists (or a CSV's cells holding JSON lists) are not span rows: the one line says which
    flags name them, not how a span is written; named so, they read."""
    rows = [{"sentence": ["Anna", "met", "Bo"], "labels": ["B-PER", "O", "B-PER"]}]
    path = tmp_path / f"ner{suffix}"
    if suffix == ".csv":  # "[""Anna"", ...]","[""B-PER"", ...]"
        with path.open("w", newline="") as f:
            csv.writer(f).writerows([["sentence", "labels"], *([json.dumps(v) for v in r.values()] for r in rows)])
    else:
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(DataError) as caught:
        read_tagged(str(path), "train", ReadOptions(), TaggedColumns())
    said = str(caught.value)
    assert "row 1 of column 'sentence' holds a list of words" in said, said
    assert "--tokens-column sentence and the tags' with --tags-column labels" in said and "span" not in said, said
    read = read_tagged(str(path), "train", ReadOptions(), TaggedColumns(tokens="sentence", tags="labels"))
    assert read.words == [rows[0]["sentence"]] and read.tags == [rows[0]["labels"]]
    with pytest.raises(DataError, match=r"name it with --tokens-column sentence$"):  # predict: no tags needed
        read_tagged(str(path), "eval", ReadOptions(), TaggedColumns(), require_tags=False)


@pytest.mark.parametrize(("label", "said"), [("B-PER", "labelled with the tag 'B-PER'"), ("O", "labelled 'O'")])
def test_a_span_labelled_with_a_tag_or_o_is_refused_naming_the_row(tmp_path, label, said):
    """A span's label is its entity type: 'B-PER' trained on 'B-B-PER' tags, refused as tags that "never occur in
    the training data" of the training data itself."""
    path = tmp_path / "spans.jsonl"
    rows = [{"text": "Anna met Bo", "entities": [[9, 11, "PER"]]}, {"text": "Anna met Bo", "entities": [[0, 4, label]]}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(DataError) as caught:
        read_tagged(str(path), "train", ReadOptions(), TaggedColumns())
    assert f"spans.jsonl: row 2: the span [0, 4, '{label}'] is {said}" in str(caught.value), str(caught.value)
