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


def test_a_conllu_file_is_read_by_its_form_column_without_comments_ranges_or_empty_nodes(tmp_path):
    """`.conllu` was read as any CoNLL file: its IDs became the words, and with --tag-column its comments became
    words tagged '1' or 'Anna'; a comment in another file is told for what it is."""
    from pathlib import Path

    from leantrain.data.tagged import read_conll

    lines = [
        "# sent_id = 1",
        "# text = Anna met Paul's friend",
        "1\tAnna\tAnna\tPROPN\tNNP\t_\t2\tnsubj\t_\t_",
        "2\tmet\tmeet\tVERB\tVBD\t_\t0\troot\t_\t_",
        "3-4\tPaul's\t_\t_\t_\t_\t_\t_\t_\t_",
        "3\tPaul\tPaul\tPROPN\tNNP\t_\t5\tnmod\t_\t_",
        "4\t's\t's\tPART\tPOS\t_\t3\tcase\t_\t_",
        "4.1\tx\tx\tX\tX\t_\t_\t_\t_\t_",
        "5\tfriend\tfriend\tNOUN\tNN\t_\t2\tobj\t_\t_",
        "",
        "# text = New York",
        "1\tNew York\tNew York\tPROPN\tNNP\t_\t0\troot\t_\t_",
    ]
    path = tmp_path / "ud.conllu"
    path.write_text("\n".join(lines) + "\n")
    rows = read_conll(Path(path), 4)
    assert rows.words == [["Anna", "met", "Paul", "'s", "friend"], ["New York"]]
    assert rows.tags == [["PROPN", "VERB", "PROPN", "PART", "NOUN"], ["PROPN"]] and rows.where == ["line 3", "line 12"]
    with pytest.raises(DataError, match=r"line 3 has 10 columns .*--tag-column \(counting from 1; -1 for the last; 4"):
        read_conll(Path(path), None)
    other = tmp_path / "commented.conll"
    other.write_text("# sent_id = 1\nAnna\tB-PER\n")
    with pytest.raises(DataError, match=r"line 1 has 4 columns \(# sent_id = 1\) \(a comment\? only \.conllu"):
        read_conll(Path(other), None)
