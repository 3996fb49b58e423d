"""Labels: whole numbers are classes, numbers with a fraction are refused (issue #19.12)."""

import pandas as pd
import pytest

from leantrain.data.columns import build_label_map, normalise_labels
from leantrain.errors import DataError


def test_fractional_labels_are_refused_naming_regression():
    scores = pd.Series([f"{i / 36:.2f}" for i in range(180)])  # an STS-B-like similarity score
    with pytest.raises(DataError, match="--problem-type regression") as info:
        build_label_map(normalise_labels(scores), "stsb.tsv", "score")
    message = str(info.value)
    assert "stsb.tsv" in message and "'score'" in message and "classifiers" in message
    assert "\n" not in message


@pytest.mark.parametrize(
    "values,names",
    [
        ([1.0, 0.0, 1.0], ["0", "1"]),  # a float column of whole numbers (pandas, JSON)
        (["1.0", "0.0", "2.00"], ["0", "1", "2"]),  # the same written to a CSV
        (["1", "0", "1.0"], ["0", "1"]),  # 1 and 1.0 are one class
        (["nan", "inf", "ok"], ["inf", "nan", "ok"]),  # words, not numbers
        (["1.5.2", "2.0.1"], ["1.5.2", "2.0.1"]),  # versions, not numbers
    ],
)
def test_whole_numbers_and_words_are_classes(values, names):
    assert build_label_map(normalise_labels(pd.Series(values)), "f", "label") == names


def test_an_sts_b_file_needs_no_column_flags():
    """GLUE's STS-B names its pair sentence1/sentence2 and its graded target 'score'; a 'label' column still wins."""
    from leantrain.data.columns import resolve_columns

    df = pd.DataFrame({"sentence1": ["a"], "sentence2": ["b"], "score": [3.2]})
    cols = resolve_columns(df, "stsb.tsv", None, None, None)
    assert (cols.text, cols.text_pair, cols.label) == ("sentence1", "sentence2", "score")
    both = pd.DataFrame({"text": ["a"], "score": [0.9], "label": ["pos"]})
    assert resolve_columns(both, "x.csv", None, None, None).label == "label"


def test_a_list_column_is_refused_naming_multi_label():
    """A JSON/Parquet column of lists under the default single-label problem would train one class per
    combination of classes; it is refused with the flag that reads it as sets."""
    tags = pd.Series([["sports", "tech"], ["tech"], [], ["sports"]])
    with pytest.raises(DataError, match="--problem-type multi-label") as info:
        build_label_map(normalise_labels(tags), "tags.jsonl", "labels")
    message = str(info.value)
    assert "tags.jsonl" in message and "'labels'" in message and "\n" not in message
    assert '["sports", "tech"]' in message  # the example shown is a set, not the empty one
    # a name that reads as a list, among other names, stays a class
    assert build_label_map(pd.Series(['["draft"]', "final"]), "f", "label") == ['["draft"]', "final"]


@pytest.mark.parametrize(
    "lines,names",
    [
        ("ham\tGo until jurong point, crazy.. Available only\nspam\tFree entry in 2 a wkly comp\n", "label,text"),
        ("great movie\t1\nawful plot and acting\t0\nfine\t1\n", "text,label"),
    ],
)  # fmt: skip
def test_a_file_without_a_header_is_told_to_name_its_columns(tmp_path, lines, names):
    from leantrain.data.columns import resolve_columns
    from leantrain.data.sources import read_table

    path = tmp_path / "sms.tsv"
    path.write_text(lines)
    df, _ = read_table(str(path))
    with pytest.raises(DataError, match=f"first line looks like data.*--column-names {names}$"):
        resolve_columns(df, str(path), None, None, None)


def test_a_header_of_names_gets_no_header_hint():
    from leantrain.data.columns import resolve_columns

    df = pd.DataFrame({"body text": ["a b c", "d e", "f"], "stars": ["1", "5", "1"]})
    with pytest.raises(DataError, match=r"name it with --label-column$"):
        resolve_columns(df, "reviews.csv", None, None, None)


def test_a_table_of_text_and_row_ids_is_told_it_has_no_labels():
    from leantrain.data.columns import resolve_columns

    df = pd.DataFrame({"index": ["0", "1", "2"], "sentence": ["uneasy mishmash .", "a fine film", "dull"]})
    with pytest.raises(DataError, match=r"test.tsv: no label column .*leantrain predict RUN --data test.tsv$"):
        resolve_columns(df, "test.tsv", None, None, None)


@pytest.mark.parametrize(
    "given, needle",
    [
        # each sentence paired with itself: MRPC scored near all-paraphrase, exit 0
        (dict(text="sentence1", pair="sentence1"), "the text column and --text-pair-column are both 'sentence1'"),
        (dict(pair="text"), "the text column and --text-pair-column are both 'text'"),  # the guessed text
        # the label as the second text: it was read as a candidate text column, "text column ambiguous"
        (dict(pair="label"), "--text-pair-column and the label column are both 'label'"),
    ],
)
def test_a_pair_column_that_is_the_text_or_the_label_column_is_refused(given, needle):
    from leantrain.data.columns import resolve_columns

    df = pd.DataFrame({"sentence1": ["a b"], "text": ["c d"], "label": ["1"]})
    if "text" not in given:
        df = df.drop(columns="sentence1")
    with pytest.raises(DataError, match=needle) as info:
        resolve_columns(df, "pairs.csv", given.get("text"), given["pair"], None)
    assert str(info.value).startswith("pairs.csv: ") and "\n" not in str(info.value)
    assert resolve_columns(df, "pairs.csv", given.get("text"), None, None).text_pair is None  # no pair: fine
