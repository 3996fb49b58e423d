import json
import re

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
    assert df["text"].tolist() == ["café is lovely", "naïve and dull", "I don't mind", "&amp; so on"]  # an entity
    assert report.rows_read == 4  # is text as written (a corpus of messages writes `&lt;#&gt;`), not damage
    assert report.rows_repaired == 2
    assert "2 with damaged text repaired" in report.summary()


def test_repair_keeps_real_accents_and_non_latin_text():
    for text in ["Straße und Café", "Привет, мир", "東京タワー", "¿Qué tal?"]:
        assert repair_text(text) == text


VALID_TEXT = [
    "Microsoft ’ s chief said “ in a coma , ” he added …”",  # MRPC's curly quotes, spaced as it ships them
    "la maison créée à Noël",  # two accented letters in a row
    "ÆØÅ and «Bonjour» and ½ price at 20°C",
    "ﬁne ｗｉｄｅ",  # a ligature and full-width letters: valid text, not damage
    "I'll call u &lt;#&gt; mins &amp; more",  # HTML entities as a corpus of text messages writes them
]


@pytest.mark.parametrize("text", VALID_TEXT)
def test_valid_text_is_left_as_it_is_and_not_counted_as_repaired(tmp_path, text):
    assert repair_text(text) == text
    path = write_rows(tmp_path / "valid.csv", [("text", "label"), (text, "pos"), ("plain words", "neg")])
    for df, report in _both_readers(path):
        assert df["text"].tolist()[0] == text and report.rows_repaired == 0, report.summary()


def test_damaged_text_is_still_repaired_and_counted(tmp_path):
    damaged = ["caf\u00c3\u00a9 au lait", "GoogleÕ¢_ŠÎ_†¢s car", "it\u00e2\u20ac\u2122s fine"]
    fixed = ["café au lait", "Google's car", "it’s fine"]
    assert [repair_text(t) for t in damaged] == fixed
    path = write_rows(tmp_path / "damaged.csv", [("text", "label"), *[(t, "pos") for t in damaged], ("ok", "neg")])
    for df, report in _both_readers(path):
        assert df["text"].tolist() == [*fixed, "ok"] and report.rows_repaired == 3


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


def test_a_local_data_folder_is_read_without_the_libraries_bars_which_stay_as_they_were(tmp_path, capfd):
    from datasets.utils import logging as datasets_logging

    folder = tmp_path / "data"
    folder.mkdir()
    (folder / "train.jsonl").write_text('{"text": "good", "label": 1}\n{"text": "bad", "label": 0}\n')
    df, _ = read_table(str(folder))
    assert df["label"].tolist() == [1, 0]
    assert "Generating" not in capfd.readouterr().err  # leantrain reports the rows itself
    assert datasets_logging.is_progress_bar_enabled()  # a program calling leantrain keeps its own setting


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


def test_a_text_file_is_refused_naming_every_task_that_reads_one(tmp_path):
    path = tmp_path / "texts.txt"
    path.write_text("the cat sat\n")
    with pytest.raises(DataError, match=r"texts\.txt: unknown format '\.txt'.*conll.*causal-lm.*predict.*seq2seq"):
        read_table(str(path))


def test_a_plain_folder_is_not_a_dataset(tmp_path):
    with pytest.raises(DataError, match="not one written by datasets' save_to_disk"):
        read_table(str(tmp_path))


@pytest.mark.parametrize(
    ("name", "kind", "preset"), [("0.png", "image", "tiny-vit"), ("0_george_1.wav", "audio", "tiny-audio")]
)
def test_a_folder_of_images_or_sounds_given_to_a_text_model_names_the_model_to_use(tmp_path, name, kind, preset):
    for label in ("a", "b"):
        (tmp_path / label).mkdir()
        (tmp_path / label / name).write_bytes(b"not decoded here")
    with pytest.raises(DataError, match=rf"a folder of {kind} files, .*--model preset:{preset}\b") as info:
        read_table(str(tmp_path))
    assert str(tmp_path) in str(info.value) and "\n" not in str(info.value)


def test_a_folder_with_a_table_beside_its_images_is_still_read_as_data(tmp_path):
    (tmp_path / "0.png").write_bytes(b"x")
    (tmp_path / "train.csv").write_text("text,label\nfine,1\nbad,0\n")
    df, _ = read_table(str(tmp_path))
    assert list(df.columns) == ["text", "label"]


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
        resolve_columns(_frame(text=["a"], count=[1]), "f.csv", None, None, None)  # score: STS-B's label
    with pytest.raises(DataError, match="no column 'txt' \\(given by --text-column\\)"):
        resolve_columns(_frame(text=["a"], label=[1]), "f.csv", "txt", None, None)


def test_label_map_sorts_integers_numerically_and_refuses_one_class():
    assert build_label_map(pd.Series(["10", "2", "1"]), "f", "label") == ["1", "2", "10"]
    with pytest.raises(DataError, match="single class"):
        build_label_map(pd.Series(["a", "a"]), "f.csv", "label")


# --- issue #18/#19/#20: data from anywhere, and bad input in files ----------------------------------

import random  # noqa: E402

from leantrain.data import sources  # noqa: E402
from leantrain.data.sources import ReadOptions  # noqa: E402


def write_rows(path, rows):
    import csv

    with path.open("w", newline="", encoding="utf-8") as f:
        csv.writer(f).writerows(rows)
    return path


def _both_readers(path, **options):
    """The same file through the fast (pyarrow) path and through the repairing reader."""
    fast = read_table(str(path), options=ReadOptions(**options))
    slow = read_table(str(path), options=ReadOptions(repair="always", **options))
    return fast, slow


@pytest.mark.parametrize("suffix", [".csv", ".tsv"])
def test_a_utf8_byte_order_mark_is_not_part_of_the_first_column_name(tmp_path, suffix):
    sep = "\t" if suffix == ".tsv" else ","
    path = tmp_path / f"bom{suffix}"
    path.write_bytes(b"\xef\xbb\xbf" + f"label{sep}text\n1{sep}good one\n0{sep}bad one\n".encode())
    for df, _ in _both_readers(path):
        assert list(df.columns) == ["label", "text"]


def test_real_mrpc_file_with_its_byte_order_mark(shared_data):
    df, report = read_table(str(shared_data / "mrpc" / "train.tsv"))
    assert df.columns[0] == "Quality"
    cols = resolve_columns(df, "mrpc", None, None, None)
    assert (cols.label, cols.text, cols.text_pair) == ("Quality", "#1 String", "#2 String")
    assert report.rows_read == 3668  # every row of the file, any dropped ones among them
    assert set(df["Quality"]) == {"0", "1"}
    # valid UTF-8 throughout: nothing to repair (its curly quotes were once "repaired" into straight ones)
    assert report.rows_repaired == 0 and "repaired" not in report.summary()
    assert "Microsoft ’ s global security chief" in " ".join(df["#1 String"])


@pytest.mark.parametrize("codec", ["utf-16", "utf-16-be", "utf-32"])
def test_utf16_and_utf32_files_are_recognised_by_their_byte_order_mark(tmp_path, codec):
    """Excel's "Unicode text" is UTF-16 little-endian TSV with a BOM, saved as .txt."""
    text = "label\ttext\r\npos\tcafé crème\r\nneg\t東京 is dull\r\n"
    bom = {"utf-16": b"", "utf-16-be": b"\xfe\xff", "utf-32": b""}[codec]
    path = tmp_path / "excel.txt"
    path.write_bytes(bom + text.encode(codec))
    for df, report in _both_readers(path, format="tsv"):
        assert df.to_dict("list") == {"label": ["pos", "neg"], "text": ["café crème", "東京 is dull"]}
        assert report.encoding == codec[:6].upper()
        assert f"({report.encoding})" in report.summary()


@pytest.mark.parametrize(
    "content,message",
    [
        (bytes(random.Random(0).randbytes(4096)), "not a text file"),
        (b"PAR1\x15\x04\x15\x00\x00\x00" * 50, "it is a Parquet file"),
        ("label,text\n1,good\n".encode("utf-16-le"), "UTF-16 without a byte-order mark"),
    ],
)
def test_a_binary_csv_is_not_read_as_text(tmp_path, content, message):
    path = tmp_path / "data.csv"
    path.write_bytes(content)
    with pytest.raises(DataError, match=message) as info:
        read_table(str(path))
    assert "data.csv: not a text file" in str(info.value)


def test_random_bytes_named_parquet_are_refused_in_one_line(tmp_path):
    path = tmp_path / "data.parquet"
    path.write_bytes(random.Random(1).randbytes(2048))
    with pytest.raises(DataError, match=r"data\.parquet: not a readable Parquet file"):
        read_table(str(path))


def test_an_unreadable_save_to_disk_folder_is_refused_in_one_line(tmp_path):
    import datasets

    folder = tmp_path / "ds"
    datasets.Dataset.from_dict({"text": ["x y", "z"], "label": [1, 0]}).save_to_disk(str(folder))
    for arrow in folder.glob("*.arrow"):
        arrow.write_bytes(b"not arrow at all")
    with pytest.raises(DataError, match="cannot read this save_to_disk folder") as info:
        read_table(str(folder))
    assert str(folder) in str(info.value) and "\n" not in str(info.value)


def test_headerless_files_take_their_column_names_from_the_option(tmp_path):
    path = tmp_path / "spam"  # no suffix, like the SMS Spam Collection
    path.write_text('ham\tok see you "soon"\nspam\tWIN a prize now\nham\tcall me\n')
    with pytest.raises(DataError, match=r"unknown format '\(no suffix\)'.*--format"):
        read_table(str(path))
    for df, report in _both_readers(path, format="tsv", column_names=("label", "text")):
        assert df.to_dict("list") == {
            "label": ["ham", "spam", "ham"],
            "text": ['ok see you "soon"', "WIN a prize now", "call me"],
        }
        assert report.rows_read == 3  # the first row is data, not a header
    with pytest.raises(DataError, match="--column-names is for CSV/TSV"):
        read_table(str(path), options=ReadOptions(format="jsonl", column_names=("a", "b")))


def test_real_sms_spam_collection_without_suffix_or_header(shared_data):
    options = ReadOptions(format="tsv", column_names=("label", "text"))
    df, report = read_table(str(shared_data / "sms_spam" / "SMSSpamCollection"), options=options)
    assert report.rows_read == 5574
    assert df["label"].value_counts().to_dict() == {"ham": 4827, "spam": 747}


@pytest.mark.parametrize("fmt", ["csv", "json", "jsonl", "parquet"])
def test_format_option_reads_a_file_without_a_suffix(tmp_path, fmt):
    frame = pd.DataFrame({"text": ["a b", "c d"], "label": [0, 1]})
    path = tmp_path / "data"
    if fmt == "csv":
        frame.to_csv(path, index=False)
    elif fmt == "parquet":
        frame.to_parquet(path)
    else:
        frame.to_json(path, orient="records", lines=fmt == "jsonl")
    df, _ = read_table(str(path), options=ReadOptions(format=fmt))
    assert df["text"].tolist() == ["a b", "c d"] and [int(v) for v in df["label"]] == [0, 1]


def test_ragged_rows_are_dropped_and_counted_by_both_readers(tmp_path):
    path = tmp_path / "ragged.csv"
    path.write_text("text,label\ngood film,1\ntoo,many,fields\nshort\n\nbad film,0\n")
    for df, report in _both_readers(path):
        assert df.to_dict("list") == {"text": ["good film", "bad film"], "label": ["1", "0"]}
        assert report.drop_reasons == {"with the wrong number of fields": 2}
        # the file's four data rows, two of them dropped: not "2 rows, 2 dropped"
        assert report.summary().endswith(": 4 rows, 2 dropped (2 with the wrong number of fields)")


def test_a_file_whose_every_row_has_the_wrong_width_says_so_not_that_it_has_no_rows(tmp_path):
    path = tmp_path / "ragged.csv"
    path.write_text("text,label\na;1;x;z\nb;0;y;z\n")
    for options in ({}, {"repair": "always"}):
        with pytest.raises(DataError, match=r"ragged\.csv: every row has a number of fields other than the header's 2"):
            read_table(str(path), options=ReadOptions(**options))


def _awkward_csv(path, rows: int, seed: int, sep: str = ",") -> None:
    """Quotes, embedded newlines, separators, accents, mojibake, HTML entities, spacing, empty and ragged rows."""
    rng = random.Random(seed)
    pieces = ["plain", "two  spaces", " padded ", "café", "naïve", "don’t", "donâ€™t", "&amp; co", "a,b",
              '"quoted, with comma"', '"say ""hi"""', '"multi\nline"', "tab\there", "ﬁne", "ＡＢＣ", "東京",
              "", "007", "1.50", "x\x07y"]  # fmt: skip
    lines = [sep.join(["text", "label", "id"])]
    for i in range(rows):
        text = " ".join(rng.choice(pieces) for _ in range(rng.randint(1, 4)))
        if '"' in text and not (text.startswith('"') and text.endswith('"') and text.count('"') % 2 == 0):
            text = text.replace('"', "")
        fields = [text, rng.choice(["pos", "neg", ""]), str(i)]
        if rng.random() < 0.05:
            fields.append("extra")
        lines.append(sep.join(fields))
    path.write_text("\r\n".join(lines) + "\n", encoding="utf-8")


@pytest.mark.parametrize("seed,suffix", [(0, ".csv"), (1, ".csv"), (2, ".tsv")])
def test_fast_reader_gives_exactly_what_the_repairing_reader_gives(tmp_path, seed, suffix):
    path = tmp_path / f"awkward{suffix}"
    _awkward_csv(path, 400, seed, sep="\t" if suffix == ".tsv" else ",")
    (fast, fast_report), (slow, slow_report) = _both_readers(path)
    pd.testing.assert_frame_equal(fast, slow)
    assert fast_report == slow_report
    assert slow_report.rows_repaired > 0 and slow_report.rows_dropped > 0  # the file exercised both


def test_repairing_only_cells_that_may_need_it_equals_repairing_every_cell(tmp_path):
    """The readers send only non-ASCII cells and cells with '&' through ftfy; that must change nothing."""
    import csv

    path = tmp_path / "awkward.csv"
    _awkward_csv(path, 400, 3)
    df, report = read_table(str(path))
    with path.open(newline="", encoding="utf-8") as f:
        rows = [r for r in csv.reader(f) if r][1:]
    kept = [r for r in rows if len(r) == 3]
    assert df["text"].tolist() == [repair_text(r[0]) for r in kept]
    changed = [" ".join(repair_text(r[0]).split()) != " ".join(r[0].split()) for r in kept]
    assert report.rows_repaired == sum(changed) > 0


def test_clean_utf8_takes_the_fast_path_and_damaged_text_the_repairing_one(tmp_path, monkeypatch):
    clean, damaged = tmp_path / "clean.csv", tmp_path / "damaged.csv"
    clean.write_text("text,label\ncafé is fine,1\nplain,0\n", encoding="utf-8")
    damaged.write_bytes(b"text,label\ncaf\xe9 is fine,1\nplain,0\n")
    calls = []
    repairing = sources._parse_repairing
    monkeypatch.setattr(sources, "_parse_repairing", lambda *a: calls.append(a[1].name) or repairing(*a))
    assert read_table(str(clean))[0]["text"].tolist() == ["café is fine", "plain"]
    assert read_table(str(damaged))[0]["text"].tolist() == ["café is fine", "plain"]
    assert calls == ["damaged.csv"]


def test_mixed_encodings_in_jsonl_are_repaired_as_in_csv(tmp_path):
    path = tmp_path / "mixed.jsonl"
    path.write_bytes(
        b'{"text": "caf\xc3\xa9 is lovely", "label": 1}\n'
        b'{"text": "na\xefve and dull", "label": 0}\n'
        b'{"text": "plain words", "label": 0}\n'
    )
    df, report = read_table(str(path))
    assert df["text"].tolist() == ["café is lovely", "naïve and dull", "plain words"]
    assert df["label"].tolist() == [1, 0, 0]
    assert report.rows_repaired == 1


# --- hub data sets with configurations, offline on a local `datasets` folder ---------------------------


@pytest.fixture()
def glue_like(tmp_path, monkeypatch):
    """A local data set folder whose README defines two configurations, as glue does on the Hub."""
    import datasets

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "hf-datasets"))
    root = tmp_path / "glue"
    for config, rows in {"sst2": [("good film", 1), ("bad film", 0)], "cola": [("grammar fine", 1)]}.items():
        (root / config).mkdir(parents=True)
        for split in ("train", "validation"):
            pd.DataFrame(rows, columns=["sentence", "label"]).assign(
                sentence=lambda d, s=split: d.sentence + f" {s}"
            ).to_csv(root / config / f"{split}.csv", index=False)
    configs = "".join(
        f"- config_name: {c}\n  data_files:\n  - split: train\n    path: {c}/train.csv\n"
        f"  - split: validation\n    path: {c}/validation.csv\n"
        for c in ("sst2", "cola")
    )
    (root / "README.md").write_text(f"---\nconfigs:\n{configs}---\n")
    return root


def test_a_data_set_configuration_by_option_or_by_colon(glue_like):
    by_option, report = read_table(str(glue_like), options=ReadOptions(config="sst2"))
    by_colon, _ = read_table(f"{glue_like}:sst2")
    assert by_option["sentence"].tolist() == ["good film train", "bad film train"]
    pd.testing.assert_frame_equal(by_option, by_colon)
    assert report.source.endswith("glue:sst2")
    cola, _ = read_table(f"{glue_like}:cola", split="eval")
    assert cola["sentence"].tolist() == ["grammar fine validation"]


def test_a_data_set_split_by_option(glue_like):
    df, _ = read_table(f"{glue_like}:sst2", options=ReadOptions(split="validation"))
    assert df["sentence"].tolist() == ["good film validation", "bad film validation"]
    with pytest.raises(DataError, match="no split 'dev' \\(given by --eval-split\\); it has train, validation"):
        read_table(f"{glue_like}:sst2", split="eval", options=ReadOptions(split="dev"))


def test_a_missing_or_unknown_configuration_names_the_choices(glue_like):
    with pytest.raises(DataError, match="has several configurations: sst2, cola; choose one with --data-config"):
        read_table(str(glue_like))
    with pytest.raises(DataError, match="has no configuration 'mnli': sst2, cola"):
        read_table(f"{glue_like}:mnli")
    with pytest.raises(DataError, match="names configuration 'sst2' but --data-config is 'cola'"):
        read_table(f"{glue_like}:sst2", options=ReadOptions(config="cola"))


def test_a_colon_in_an_existing_path_is_part_of_the_path(tmp_path):
    path = tmp_path / "a:b.csv"
    path.write_text("text,label\nx y,1\n")
    assert read_table(str(path))[0]["text"].tolist() == ["x y"]


def test_a_data_set_configuration_streams_its_split(glue_like):
    from leantrain.data.streaming import open_stream

    rows = list(open_stream(f"{glue_like}:sst2", "train", ReadOptions()))
    assert [r["sentence"] for r in rows] == ["good film train", "bad film train"]
    held = list(open_stream(str(glue_like), "eval", ReadOptions(config="cola")))
    assert [r["sentence"] for r in held] == ["grammar fine validation"]
    with pytest.raises(DataError, match="no split 'test'"):
        open_stream(str(glue_like), "train", ReadOptions(config="sst2", split="test"))


@pytest.mark.parametrize("pattern", [sources._WORD, sources._MAY_NEED_REPAIR])
def test_patterns_given_to_pandas_compile_in_pyarrows_regex_engine(pattern):
    """pandas 3 hands `.str.contains` patterns to pyarrow (RE2) for pyarrow-backed strings; some pandas versions
    do not fall back to Python's `re` when RE2 refuses one (every bench job failed on a GPU machine's image)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    found = pc.match_substring_regex(pa.array(["plain words", "café au lait", "12 34"]), pattern).to_pylist()
    assert found == [bool(re.search(pattern, s)) for s in ["plain words", "café au lait", "12 34"]]


@pytest.mark.parametrize("repair", ["auto", "always"], ids=["pyarrow", "repairing reader"])
def test_a_cell_of_several_megabytes_is_read_by_both_readers(tmp_path, repair):
    from leantrain.data.sources import ReadOptions

    big = "word " * 1_000_000  # 5 MB: beyond Python csv's 128 KiB field limit and pyarrow's 1 MiB block
    path = tmp_path / "big.csv"
    path.write_text(f'text,label\n"{big}",pos\nshort,neg\nanother one,pos\n')
    df, report = read_table(str(path), options=ReadOptions(repair=repair))
    assert df["text"].tolist() == [big.strip(), "short", "another one"] and report.rows_dropped == 0


def test_a_cell_beyond_the_cap_is_refused_in_one_line_naming_the_cap(tmp_path, monkeypatch):
    from leantrain.data import sources

    monkeypatch.setattr(sources, "MAX_CELL_BYTES", 2**20)
    path = tmp_path / "open_quote.csv"
    path.write_text('text,label\n"a quote never closed,pos\n' + "more text,neg\n" * 200_000)
    with pytest.raises(DataError, match=r"open_quote.csv: line \d+ holds a cell larger than 1 MiB"):
        read_table(str(path))


@pytest.mark.parametrize("names", ["sentence,label", "text,label", "TEXT,Label", "label,text"])
@pytest.mark.parametrize("streaming", [False, True])
def test_column_names_on_a_file_with_a_header_is_refused_not_read_as_a_row(tmp_path, names, streaming):
    """`--column-names` reads the first row as data: a header there trained as a row, its label cell a class of its
    own ('label, neg, pos': a 3-class head)."""
    from leantrain.data.sources import ReadOptions
    from leantrain.data.streaming import open_stream

    path = tmp_path / "headed.csv"
    path.write_text("text,label\ngood film,pos\nbad film,neg\n")
    options = ReadOptions(column_names=tuple(names.split(",")))
    with pytest.raises(DataError, match=r"headed.csv: its first row \(text,label\) is a header"):
        open_stream(str(path), "train", options) if streaming else read_table(str(path), options=options)
    path.write_text("good film,pos\nbad film,neg\nlabel,text\n")  # no header: read whole, a row not the first
    df, _ = read_table(str(path), options=options)
    assert len(df) == 3


@pytest.mark.parametrize(
    ("suffix", "fmt", "text"), [("csv", "tsv", "text,label\ngood,pos\n"), ("tsv", "csv", "text\tlabel\ngood\tpos\n")]
)
def test_a_file_read_with_the_other_delimiter_says_which_format_it_looks_like(tmp_path, suffix, fmt, text):
    """A CSV read with --format tsv was refused for having no label column (its header one column 'text,label')."""
    from leantrain.data.sources import ReadOptions

    path = tmp_path / f"data.{suffix}"
    path.write_text(text)
    with pytest.raises(DataError, match=f"read as {fmt.upper()}, its header is one column .*use --format {suffix}$"):
        read_table(str(path), options=ReadOptions(format=fmt))
    df, _ = read_table(str(path), options=ReadOptions(format=suffix))
    assert list(df.columns) == ["text", "label"]


def _folders(tmp_path):
    """One folder of each kind a reader takes whole or by its parts."""
    import datasets

    (tmp_path / "classes" / "cat").mkdir(parents=True)
    (tmp_path / "idx").mkdir()
    (tmp_path / "idx" / "train-images-idx3-ubyte").write_bytes(b"")
    (tmp_path / "idx" / "train-labels-idx1-ubyte").write_bytes(b"")
    one = datasets.Dataset.from_dict({"text": ["a"], "label": [0]})
    one.save_to_disk(str(tmp_path / "saved_one"))
    datasets.DatasetDict({"train": one, "test": one}).save_to_disk(str(tmp_path / "saved_dict"))
    (tmp_path / "t.csv").write_text("text,label\na,0\n")
    return tmp_path


@pytest.mark.parametrize(
    ("source", "folders", "split", "config", "found"),
    [
        ("t.csv", "dataset", "validation", None, ("split", "is a single file", "file")),
        ("t.csv", "image", None, "sst2", ("config", "is a single file", "file")),
        ("idx", "image", "test", None, ("split", "is a folder of IDX files (images and labels)", "folder")),
        ("idx", "image", None, "mnist", ("config", "is a folder of IDX files (images and labels)", "folder")),
        ("classes", "image", "test", None, ("split", "is a folder of class folders", "folder")),
        ("classes", "audio", "test", None, ("split", "is a folder of class folders", "folder")),
        ("classes", "image", "test", "default", None),  # a configuration reads it with `datasets`, splits and all
        ("classes", "text", "test", None, ("split", "is a folder of text files (read whole)", "folder")),
        ("classes", "dataset", "test", "x", None),  # load_dataset's data files: its splits
        ("saved_one", "dataset", "test", None, ("split", "is a save_to_disk folder of one Dataset", "folder")),
        ("saved_dict", "dataset", "test", None, None),
        ("saved_dict", "text", None, "x", ("config", "is a save_to_disk folder", "folder")),
        ("glue", "dataset", "validation", "sst2", None),  # a hub name: its own splits and configurations
        ("t.csv", "dataset", None, None, None),
    ],
)
def test_a_split_or_configuration_a_source_has_none_of_is_found(tmp_path, source, folders, split, config, found):
    from leantrain.data.sources import ReadOptions, unread_choice

    root = _folders(tmp_path)
    path = source if source == "glue" else str(root / source)
    got = unread_choice(path, ReadOptions(config=config, split=split), folders)
    assert got == (None if found is None else (found[0], f"{path} {found[1]}", found[2]))


def test_the_embedded_corpus_is_a_single_file():
    from leantrain.data.sources import EMBEDDED_DATA, ReadOptions, unread_choice

    assert unread_choice(EMBEDDED_DATA, ReadOptions(split="test")) == (
        "split",
        "the embedded tweet corpus (--data left out) is a single file",
        "file",
    )


def test_a_mixture_source_whose_split_would_be_ignored_is_named(tmp_path):
    """Each source is checked with its own settings over the run's, and named."""
    from leantrain.config import TrainConfig
    from leantrain.data.combine import refuse_unread_choices
    from leantrain.errors import ConfigError

    root = _folders(tmp_path)
    csv, saved = str(root / "t.csv"), str(root / "saved_dict")
    mixed = [{"path": saved, "eval_data": saved, "eval_split": "test", "split": "train"}, {"path": csv, "name": "t"}]
    refuse_unread_choices(TrainConfig(data=mixed), "dataset")
    with pytest.raises(ConfigError, match=f"^--data source t \\({re.escape(csv)}\\): --data-split train: .*single"):
        refuse_unread_choices(TrainConfig(data=[saved, csv], data_split="train"), "dataset")
    own = [saved, {"path": csv, "name": "t", "split": "validation"}]
    with pytest.raises(ConfigError, match=r"^--data source t .*: data_split validation: .*no splits"):
        refuse_unread_choices(TrainConfig(data=own), "dataset")


@pytest.mark.parametrize(
    ("sources", "options", "found"),
    [
        (["saved_one"], {"format": "csv"}, ("format", "csv", "saved_one is a folder, read as its files say")),
        (["classes"], {"column_names": ("text", "label")}, ("column_names", "text,label", "classes is a folder")),
        (["glue:sst2"], {"format": "json"}, ("format", "json", "glue:sst2 names a hub data set")),
        (["t.csv", "saved_one"], {"format": "csv"}, None),  # the training file reads it
        (["t.csv"], {"format": "csv"}, None),
        (["saved_one"], {}, None),
    ],
)
def test_a_format_or_column_names_no_source_reads_is_found(tmp_path, sources, options, found):
    """A folder or a hub data set is read as its own files say: --format and --column-names would be ignored."""
    from leantrain.data.sources import ReadOptions, unread_reading

    root = _folders(tmp_path)
    paths = [s if ":" in s else str(root / s) for s in sources]
    got = unread_reading(paths, ReadOptions(**options))
    if found is None:
        assert got is None
    else:
        assert got is not None and got[:2] == found[:2] and got[2].startswith(found[2].replace(sources[0], paths[0]))


def test_a_mixture_source_whose_format_would_be_ignored_is_named(tmp_path):
    from leantrain.config import TrainConfig
    from leantrain.data.combine import refuse_unread_choices
    from leantrain.errors import ConfigError

    root = _folders(tmp_path)
    csv, saved = str(root / "t.csv"), str(root / "saved_one")
    refuse_unread_choices(TrainConfig(data=[{"path": csv, "format": "csv"}, saved]), "dataset")
    with pytest.raises(ConfigError, match=r"^--data source saved_one .*: --format csv: .* is a folder, read as its"):
        refuse_unread_choices(TrainConfig(data=[csv, saved], format="csv"), "dataset")
    with pytest.raises(ConfigError, match=r"^--data source saved_one .*: column_names a,b: .*leave column_names out"):
        refuse_unread_choices(TrainConfig(data=[csv, {"path": saved, "column_names": "a,b"}]), "dataset")
