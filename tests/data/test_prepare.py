"""From a config to tokenized sets: empty rows, eval files unlike training, configurations (issues #18, #20)."""

import pandas as pd
import pytest

from leantrain.config import TrainConfig
from leantrain.data.prepare import load_source, prepare_data
from leantrain.errors import DataError
from tests.conftest import make_sentiment_rows, write_csv


@pytest.fixture(scope="module")
def tokenizer(minilm_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(minilm_dir)


def test_empty_labels_and_empty_text_are_dropped_and_counted(tmp_path, tokenizer):
    rows = [("good film", "pos"), ("", "neg"), ("   ", "pos"), ("bad film", ""), ("fine", "neg"), ("dull", " ")]
    path = write_csv(tmp_path / "holes.csv", rows)
    src = load_source(str(path), tokenizer, 32, tmp_path / "cache", "train")
    assert src.labels == ["pos", "neg"] and len(src.tokens) == 2
    assert src.report.drop_reasons == {"with empty text": 2, "without a label (2 empty)": 2}
    assert "4 dropped (2 with empty text, 2 without a label (2 empty))" in src.report.summary()


@pytest.mark.parametrize("suffix", [".csv", ".jsonl"])
def test_nan_null_and_none_label_cells_are_missing_labels_not_classes(tmp_path, tokenizer, suffix):
    labels = ["pos", "NaN", "neg", "nan", "null", "None", "pos", "", "NONE", "neg"]
    rows = [(f"text number {i}", label) for i, label in enumerate(labels)]
    if suffix == ".csv":
        path = write_csv(tmp_path / "nan.csv", rows)
    else:  # JSON's null and a float NaN as pandas writes it
        path = tmp_path / "nan.jsonl"
        pd.DataFrame({"text": [r[0] for r in rows], "label": [None if r[1] == "null" else r[1] for r in rows]}).to_json(
            path, orient="records", lines=True
        )
    src = load_source(str(path), tokenizer, 32, tmp_path / "cache", "train")
    assert sorted(set(src.labels)) == ["NONE", "neg", "pos"]  # a class called NONE stays a class
    assert src.report.rows_dropped == 5
    reason = next(iter(src.report.drop_reasons))
    assert reason.startswith("without a label (") and "'NaN'" in reason and "'None'" in reason, reason
    assert "5 dropped" in src.report.summary()


def test_an_eval_file_with_other_column_names_is_read_by_its_own(tmp_path, tokenizer):
    train = write_csv(tmp_path / "train.csv", make_sentiment_rows(40))
    evaluation = write_csv(tmp_path / "eval.csv", make_sentiment_rows(10, seed=1), header=("sentence", "sentiment"))
    data = prepare_data(TrainConfig(data=str(train), eval_data=str(evaluation)), tokenizer, tmp_path / "cache", seed=0)
    assert len(data.eval) == 10 and data.label_names == ["neg", "pos"]


def test_an_eval_file_without_the_named_or_a_guessable_column_is_refused(tmp_path, tokenizer):
    train = write_csv(tmp_path / "train.csv", make_sentiment_rows(40))
    evaluation = write_csv(tmp_path / "eval.csv", make_sentiment_rows(10), header=("text", "stars"))
    with pytest.raises(DataError, match=r"eval\.csv: cannot tell which column holds the label"):
        prepare_data(TrainConfig(data=str(train), eval_data=str(evaluation)), tokenizer, tmp_path / "cache", seed=0)
    with pytest.raises(DataError, match=r"eval\.csv: no column 'label' \(given by --label-column\)"):
        cfg = TrainConfig(data=str(train), eval_data=str(evaluation), label_column="label")
        prepare_data(cfg, tokenizer, tmp_path / "cache", seed=0)


def test_an_eval_file_of_sentence_pairs_for_a_single_text_model_is_refused(tmp_path, tokenizer):
    train = write_csv(tmp_path / "train.csv", make_sentiment_rows(40))
    pairs = [(a, a, label) for a, label in make_sentiment_rows(10)]
    evaluation = write_csv(tmp_path / "eval.csv", pairs, header=("sentence1", "sentence2", "label"))
    with pytest.raises(DataError, match=r"eval\.csv: evaluation text is column\(s\) 'sentence1' and 'sentence2' but"):
        prepare_data(TrainConfig(data=str(train), eval_data=str(evaluation)), tokenizer, tmp_path / "cache", seed=0)


def test_config_fields_reach_the_reader(tmp_path, tokenizer, monkeypatch):
    """--data-config/--data-split/--eval-split, and --format/--column-names, through prepare_data."""
    import datasets

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "hf-datasets"))
    root = tmp_path / "glue"
    rows = make_sentiment_rows(30)
    for config in ("sst2", "other"):
        (root / config).mkdir(parents=True)
        for split, part in (("train", rows[:20]), ("validation", rows[20:])):
            frame = pd.DataFrame(part, columns=["sentence", "label"])
            frame.assign(label=frame.label if config == "sst2" else "x").to_csv(
                root / config / f"{split}.csv", index=False
            )
    (root / "README.md").write_text(
        "---\nconfigs:\n"
        + "".join(
            f"- config_name: {c}\n  data_files:\n  - split: train\n    path: {c}/train.csv\n"
            f"  - split: validation\n    path: {c}/validation.csv\n"
            for c in ("sst2", "other")
        )
        + "---\n"
    )
    cfg = TrainConfig(data=str(root), data_config="sst2", eval_data=str(root))
    data = prepare_data(cfg, tokenizer, tmp_path / "cache", seed=0)
    assert (len(data.train), len(data.eval)) == (20, 10)
    swapped = prepare_data(
        cfg.replace(data_split="validation", eval_split="train"), tokenizer, tmp_path / "cache", seed=0
    )
    assert (len(swapped.train), len(swapped.eval)) == (10, 20)

    headerless = tmp_path / "sms"
    headerless.write_text("".join(f"{label}\t{text}\n" for text, label in rows))
    cfg = TrainConfig(data=str(headerless), format="tsv", column_names="label,text")
    data = prepare_data(cfg, tokenizer, tmp_path / "cache", seed=0)
    assert len(data.train) + len(data.eval) == 30
    assert "label='label'" in data.notes[0] and "30 rows" in data.notes[0]


def test_read_options_are_part_of_the_cache_key(tmp_path, tokenizer):
    """The same bytes read with and without a header are different data: the cache must not mix them up."""
    from leantrain.data.sources import ReadOptions

    path = tmp_path / "pairs.csv"
    path.write_text("sentiment,review\n" + "".join(f"{label},{text}\n" for text, label in make_sentiment_rows(20)))
    with_header = load_source(str(path), tokenizer, 32, tmp_path / "cache", "train")
    headerless = ReadOptions(column_names=("label", "text"))  # names the header does not hold: read as a row
    without = load_source(str(path), tokenizer, 32, tmp_path / "cache", "train", options=headerless)
    assert not without.cache_hit and len(without.labels) == len(with_header.labels) + 1
    assert "sentiment" in without.labels  # the header row, read as data


def test_data_config_applies_to_eval_data_only_when_it_names_the_same_data_set():
    from leantrain.data.sources import read_options

    cfg = TrainConfig(data="glue", data_config="sst2", eval_data="glue", eval_split="validation")
    assert (read_options(cfg, "train").config, read_options(cfg, "eval").config) == ("sst2", "sst2")
    assert read_options(cfg, "eval").split == "validation" and read_options(cfg, "train").split is None
    other = cfg.replace(eval_data="saved_eval_folder")
    assert read_options(other, "eval").config is None
    colon = cfg.replace(data="glue:sst2", data_config=None, eval_data="glue")
    assert read_options(colon, "eval").config is None  # the eval side names no configuration of its own
    both = cfg.replace(data="glue:sst2", eval_data="glue")
    assert read_options(both, "eval").config == "sst2"


def test_a_limit_beyond_the_data_is_said_and_every_row_trains(tmp_path, tokenizer):
    """--limit 5000 on 40 rows trained on all of them without a word (the run's config says limit 5000); the notes
    now say it, as a limit that cuts says its sample."""
    path = write_csv(tmp_path / "few.csv", make_sentiment_rows(40, seed=3))
    cfg = TrainConfig(data=str(path), limit=5000, eval_fraction=0.25)
    data = prepare_data(cfg, tokenizer, tmp_path / "cache", seed=0)
    assert len(data.train.labels) == 30
    assert "--limit 5,000 is more than the 30 training rows there are: all of them are used" in data.notes
    cut = prepare_data(cfg.replace(limit=20), tokenizer, tmp_path / "cache", seed=0)
    assert len(cut.train.labels) == 20 and not any("more than" in n for n in cut.notes)
