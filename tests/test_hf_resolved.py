"""What a run records and reuses (issue #17): `predict` and `evaluate` cut inputs at the run's own --max-length,
config.yaml holds resolved values, and `train --print-config` shows them without training."""

from __future__ import annotations

import json

import pytest
import yaml

from leantrain import TrainConfig, train
from leantrain.commands import cli

LONG_TEXT = " ".join(["the film was a story with acting and plot"] * 40 + ["wonderful"])  # ~400 tokens


@pytest.fixture(scope="module")
def long_model_dir(tiny_model_dir, tmp_path_factory):
    """The tiny BERT with 512 positions, so that it can train at --max-length 256."""
    import shutil

    path = tmp_path_factory.mktemp("tiny-bert-512")
    for f in tiny_model_dir.iterdir():
        shutil.copy(f, path / f.name)
    config = json.loads((path / "config.json").read_text())
    config["max_position_embeddings"] = 512
    (path / "config.json").write_text(json.dumps(config))
    (path / "model.safetensors").unlink()  # positions resized: the weights start random, seeded
    return path


@pytest.fixture(scope="module")
def run_256(long_model_dir, sentiment_csv, tmp_path_factory):
    out = tmp_path_factory.mktemp("runs") / "run"
    cfg = TrainConfig(
        model=str(long_model_dir),
        data=str(sentiment_csv),
        cache_dir=str(out.parent / "cache"),
        output_dir=str(out),
        max_length=256,
        max_steps=2,
        save_every=2,
        progress=False,
        report=False,
    )
    return train(cfg)


@pytest.fixture()
def cut_lengths(monkeypatch):
    """The longest tokenized input of each `tokenize` call (predict and evaluate both go through it)."""
    from leantrain.data import tokenize as module

    seen: list[int] = []
    real = module.tokenize

    def recording(*args, **kwargs):
        tokens = real(*args, **kwargs)
        seen.append(int(tokens.lengths.max()))
        return tokens

    from leantrain.data import prepare

    monkeypatch.setattr(module, "tokenize", recording)
    monkeypatch.setattr(prepare, "tokenize", recording)  # evaluate's path (imported by name there)
    return seen


def test_predict_cuts_at_the_runs_max_length(run_256, cut_lengths, capsys):
    assert cli.main(["predict", str(run_256.output_dir), "--text", LONG_TEXT]) == 0
    assert cut_lengths == [256]
    ckpt = run_256.output_dir / "checkpoints" / "step-000002"
    assert cli.main(["predict", str(ckpt), "--text", LONG_TEXT]) == 0  # a checkpoint folder knows it too
    assert cli.main(["predict", str(run_256.output_dir), "--text", LONG_TEXT, "--max-length", "64"]) == 0
    assert cut_lengths == [256, 256, 64]  # a given --max-length still wins


def test_evaluate_cuts_at_the_runs_max_length(run_256, cut_lengths, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("LEANTRAIN_CACHE", str(tmp_path / "cache"))  # tokenized afresh, not from a cache
    data = tmp_path / "long.csv"
    data.write_text(f"text,label\n{LONG_TEXT},pos\n{LONG_TEXT.replace('wonderful', 'awful')},neg\n")
    assert cli.main(["evaluate", str(run_256.output_dir), "--data", str(data)]) == 0
    assert cut_lengths == [256]


def test_config_yaml_records_resolved_values(run_256):
    saved = yaml.safe_load((run_256.output_dir / "config.yaml").read_text())
    assert saved["precision"] == run_256.metrics["precision"] != "auto"
    assert (saved["metric_for_best"], saved["eval_batch_size"], saved["num_processes"]) == ("accuracy", 64, 1)
    assert saved["max_length"] == 256


def test_print_config_shows_the_resolved_config_without_training(tiny_model_dir, sentiment_csv, tmp_path, capsys):
    out = tmp_path / "never"
    argv = ["train", "--model", str(tiny_model_dir), "--data", str(sentiment_csv), "--output-dir", str(out)]
    assert cli.main([*argv, "--learning_rate", "1e-4", "--print-config"]) == 0
    text = capsys.readouterr().out
    shown = yaml.safe_load(text)
    assert shown["lr"] == 1e-4 and shown["precision"] in ("fp32", "bf16", "fp16")
    assert shown["metric_for_best"] == "accuracy" and shown["eval_batch_size"] == 64
    assert text.startswith(f"# precision {shown['precision']}: ")
    assert not out.exists()  # nothing trained, nothing written
