import json

import pandas as pd
import pytest

from leantrain.data.columns import build_label_map, resolve_columns
from leantrain.data.sources import read_table, repair_text
from leantrain.errors import DataError


def test_mixed_encodings_are_read_and_repaired(tmp_path):
    path = tmp_path / "mixed.csv"
    path.write_bytes(
        b"label,text\r\n"
        b"pos,caf\xc3\xa9 is lovely\r\n"  # valid UTF-8
        b"neg,na\xefve and dull\r\n"  # Latin-1 byte: not UTF-8
        b"pos,I don\xd5\xa2_\x8a\xce_\x86\xa2t mind\r\n"  # multiply garbled apostrophe
        b"neg,&amp; so on\n"
    )
    df, report = read_table(str(path))
    assert df["text"].tolist() == ["café is lovely", "naïve and dull", "I don't mind", "& so on"]
    assert report.rows_read == 4
    assert report.rows_repaired == 3
    assert "3 with damaged text repaired" in report.summary()


def test_repair_keeps_real_accents_and_non_latin_text():
    for text in ["Straße und Café", "Привет, мир", "東京タワー", "¿Qué tal?"]:
        assert repair_text(text) == text


def test_tsv_is_read_without_quoting(tmp_path):
    path = tmp_path / "d.tsv"
    path.write_text('sentence\tlabel\nsays "hi there \t1\nbye\t0\n')
    df, _ = read_table(str(path))
    assert df["sentence"].tolist() == ['says "hi there', "bye"]


@pytest.mark.parametrize("suffix", [".json", ".jsonl", ".parquet"])
def test_other_formats(tmp_path, suffix):
    frame = pd.DataFrame({"text": ["a b", "c d"], "label": [0, 1]})
    path = tmp_path / f"d{suffix}"
    if suffix == ".json":
        path.write_text(json.dumps(frame.to_dict(orient="records")))
    elif suffix == ".jsonl":
        frame.to_json(path, orient="records", lines=True)
    else:
        frame.to_parquet(path)
    df, report = read_table(str(path))
    assert df["text"].tolist() == ["a b", "c d"] and report.rows_read == 2


def test_save_to_disk_folder(tmp_path):
    import datasets

    datasets.DatasetDict({"train": datasets.Dataset.from_dict({"text": ["x y", "z"], "label": [1, 0]})}).save_to_disk(
        str(tmp_path / "ds")
    )
    df, _ = read_table(str(tmp_path / "ds"))
    assert df["label"].tolist() == [1, 0]


@pytest.mark.parametrize(
    "name,content,message",
    [
        ("missing.csv", None, "no such file"),
        ("empty.csv", b"", "empty"),
        ("header.csv", b"text,label\n", "no rows"),
        ("data.xlsx", b"PK\x03\x04", "unknown format '.xlsx'"),
        ("bad.json", b"{not json", "not valid JSON"),
    ],
)
def test_bad_files_give_clear_errors(tmp_path, name, content, message):
    path = tmp_path / name
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(DataError, match=message) as info:
        read_table(str(path))
    assert name in str(info.value)


def test_a_plain_folder_is_not_a_dataset(tmp_path):
    with pytest.raises(DataError, match="not one written by datasets' save_to_disk"):
        read_table(str(tmp_path))


def test_hub_name_offline_fails_clearly():
    with pytest.raises(DataError, match="loading it from the Hugging Face Hub failed"):
        read_table("glue-nonexistent-dataset-xyz")


def _frame(**cols):
    return pd.DataFrame(cols)


def test_columns_are_guessed_when_obvious():
    cols = resolve_columns(_frame(sentence=["a"], label=[1]), "f", None, None, None)
    assert (cols.text, cols.label, cols.text_pair) == ("sentence", "label", None)
    cols = resolve_columns(
        _frame(**{"Quality": [1], "#1 ID": [3], "#2 ID": [4], "#1 String": ["a"], "#2 String": ["b"]}),
        "mrpc",
        None,
        None,
        None,
    )
    assert (cols.text, cols.text_pair, cols.label) == ("#1 String", "#2 String", "Quality")


def test_ambiguous_or_missing_columns_are_errors():
    with pytest.raises(DataError, match=r"text column ambiguous.*--text-column"):
        resolve_columns(_frame(title=["a"], body2=["b"], label=[1]), "f.csv", None, None, None)
    with pytest.raises(DataError, match=r"which column holds the label.*--label-column"):
        resolve_columns(_frame(text=["a"], score=[1]), "f.csv", None, None, None)
    with pytest.raises(DataError, match="no column 'txt' \\(given by --text-column\\)"):
        resolve_columns(_frame(text=["a"], label=[1]), "f.csv", "txt", None, None)


def test_label_map_sorts_integers_numerically_and_refuses_one_class():
    assert build_label_map(pd.Series(["10", "2", "1"]), "f", "label") == ["1", "2", "10"]
    with pytest.raises(DataError, match="single class"):
        build_label_map(pd.Series(["a", "a"]), "f.csv", "label")
