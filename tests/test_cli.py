"""The command line: every bad input ends in one line naming the file/flag/column, exit 2, no traceback."""

import json
import subprocess
import sys

import pytest

from leantrain.cli import main
from tests.conftest import write_csv


def run(capsys, *argv):
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.fixture()
def base(tiny_model_dir, sentiment_csv, tmp_path, cache_dir):
    return [
        "train",
        "--model",
        str(tiny_model_dir),
        "--data",
        str(sentiment_csv),
        "--output-dir",
        str(tmp_path / "run"),
        "--cache-dir",
        str(cache_dir),
        "--no-progress",
        "--precision",
        "fp32",
    ]


def _one_line_error(code, err, *needles):
    assert code == 2
    lines = [line for line in err.strip().splitlines() if line]
    assert len(lines) == 1, err
    assert "Traceback" not in err
    for needle in needles:
        assert needle in lines[0], lines[0]


@pytest.mark.parametrize(
    "change,needles",
    [
        (["--data", "missing.csv"], ["missing.csv", "no such file"]),
        (["--data", "{tmp}/notes.xyz"], ["notes.xyz", "unknown format"]),
        (["--data", "{tmp}/empty.csv"], ["empty.csv", "empty"]),
        (["--data", "{tmp}/nolabel.csv"], ["nolabel.csv", "--label-column"]),
        (["--data", "{tmp}/ambiguous.csv"], ["ambiguous.csv", "--text-column"]),
        (["--data", "{tmp}/oneclass.csv"], ["oneclass.csv", "single class"]),
        (["--label-column", "stars"], ["no column 'stars'", "--label-column"]),
        (["--model", "{tmp}"], ["holds no model"]),
        (["--batch-size", "0"], ["--batch-size", "positive"]),
        (["--max-length", "-5"], ["--max-length", "positive"]),
        (["--max-length", "100000"], ["--max-length 100000", "supports"]),
        (["--eval-fraction", "1.5"], ["--eval-fraction"]),
        (["--batch-size", "abc"], ["--batch-size", "integer"]),
        (["--batch-sise", "8"], ["unknown flag --batch-sise", "did you mean --batch-size"]),
        (["--config", "{tmp}/bad.yaml"], ["bad.yaml", "unknown key 'lrate'"]),
    ],
)
def test_bad_input(capsys, base, tmp_path, change, needles):
    (tmp_path / "notes.xyz").write_text("a,b\n")
    (tmp_path / "empty.csv").write_text("")
    write_csv(tmp_path / "nolabel.csv", [("good", "4")], header=("text", "stars"))
    write_csv(tmp_path / "ambiguous.csv", [("good", "bad", "1")], header=("title", "summary", "label"))
    write_csv(tmp_path / "oneclass.csv", [("good", "1"), ("fine", "1")])
    (tmp_path / "bad.yaml").write_text("lrate: 0.1\n")
    argv = base + [c.replace("{tmp}", str(tmp_path)) for c in change]
    code, _, err = run(capsys, *argv)
    _one_line_error(code, err, *needles)
    assert not (tmp_path / "run" / "metrics.json").exists()


def test_finished_run_is_refused_without_overwrite(capsys, base):
    assert run(capsys, *base, "--max-steps", "1")[0] == 0
    code, _, err = run(capsys, *base, "--max-steps", "1")
    _one_line_error(code, err, "holds a finished run", "--overwrite")


def test_train_evaluate_predict_round_trip(capsys, base, tmp_path, sentiment_csv):
    code, out, _ = run(capsys, *base, "--epochs", "4", "--lr", "3e-3", "--warmup-ratio", "0")
    assert code == 0 and "accuracy" in out
    run_dir = str(tmp_path / "run")

    code, out, _ = run(capsys, "evaluate", run_dir, "--data", str(sentiment_csv))
    metrics = json.loads(out)
    assert code == 0 and metrics["examples"] == 240 and metrics["accuracy"] > 0.8

    code, out, _ = run(capsys, "predict", run_dir, "--text", "a wonderful superb film", "--text", "awful and boring")
    rows = [json.loads(line) for line in out.splitlines()]
    assert code == 0 and [r["label"] for r in rows] == ["pos", "neg"]
    assert sum(rows[0]["probabilities"].values()) == pytest.approx(1, abs=1e-4)

    target = tmp_path / "pred.csv"
    code, _, _ = run(capsys, "predict", run_dir, "--data", str(sentiment_csv), "--output", str(target))
    import pandas as pd

    pred = pd.read_csv(target)
    assert code == 0 and len(pred) == 240 and {"text", "label", "score", "p_pos", "p_neg"} <= set(pred.columns)


def test_evaluate_refuses_labels_the_model_does_not_know(capsys, base, tmp_path):
    assert run(capsys, *base, "--max-steps", "1")[0] == 0
    other = write_csv(tmp_path / "other.csv", [("good", "pos"), ("so-so", "neutral")])
    code, _, err = run(capsys, "evaluate", str(tmp_path / "run"), "--data", str(other))
    _one_line_error(code, err, "other.csv", "'neutral'", "unknown to the model")


def test_info_shows_config_counts_and_head(capsys, tiny_model_dir):
    code, out, _ = run(capsys, "info", str(tiny_model_dir), "--num-labels", "5")
    assert code == 0
    assert '"hidden_size": 64' in out and "BertConfig" in out
    assert "trainable" in out and "in embeddings" in out
    assert "classifier: Linear(64 -> 5)" in out


def test_env_reports_devices_precisions_and_versions(capsys):
    code, out, _ = run(capsys, "env")
    assert code == 0
    for needle in (
        "device",
        "distributed type",
        "processes",
        "bf16",
        "fp16",
        "--precision auto",
        "torch",
        "transformers",
        "accelerate",
        "datasets",
    ):
        assert needle in out


@pytest.mark.slow  # launches a Python process
def test_the_installed_command_exits_2_without_a_traceback(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "leantrain", "train", "--data", str(tmp_path / "nope.csv")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1].startswith("leantrain train: error: ")


def test_yaml_config_with_flag_override(capsys, tiny_model_dir, sentiment_csv, tmp_path, cache_dir):
    cfg = tmp_path / "job.yaml"
    cfg.write_text(
        f"model: {tiny_model_dir}\ndata: {sentiment_csv}\nmax_steps: 5\nbatch_size: 8\n"
        f"cache_dir: {cache_dir}\nprecision: fp32\nprogress: false\n"
    )
    code, _, _ = run(capsys, "train", "--config", str(cfg), "--max-steps", "2", "--output-dir", str(tmp_path / "r"))
    assert code == 0
    metrics = json.loads((tmp_path / "r" / "metrics.json").read_text())
    assert metrics["optimizer_steps"] == 2
    import yaml

    assert yaml.safe_load((tmp_path / "r" / "config.yaml").read_text())["batch_size"] == 8
