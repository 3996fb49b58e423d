"""leantrain compare: two tiny runs with different configs side by side, and the chart."""

from __future__ import annotations

import io

import pytest

from leantrain.errors import LeantrainError
from leantrain.run.compare import comparison_rows, config_differences, print_comparison, run_labels, write_chart
from leantrain.run.report import load_run


def test_only_the_config_keys_that_differ_are_shown(tiny_runs):
    runs = [load_run(p) for p in tiny_runs]
    diffs = dict(config_differences(runs))
    # output_dir always differs: it names the columns; the eval batch is resolved (2 x batch_size) in config.yaml
    assert diffs == {"batch_size": [16, 8], "eval_batch_size": [32, 16], "lr": [1e-3, 3e-3]}


def test_the_table_puts_the_runs_side_by_side(tiny_runs):
    from rich.console import Console

    runs = [load_run(p) for p in tiny_runs]
    console = Console(file=io.StringIO(), width=160)
    print_comparison(runs, console)
    text = console.file.getvalue()
    for needle in (
        "run-a",
        "run-b",
        "batch_size",
        "eval accuracy",
        "samples/s (train)",
        "optimizer state",
        "config (differences only)",
        "memory",
    ):
        assert needle in text, needle
    sections = {sec for sec, _, _ in comparison_rows(runs)}
    assert {"config (differences only)", "results", "throughput and cost", "memory"} <= sections
    samples = next(cells for _, label, cells in comparison_rows(runs) if label == "samples/s (train)")
    assert samples[1].endswith("x)") and not samples[0].endswith("x)")  # the second run relative to the first


def test_the_chart_is_written(tiny_runs, tmp_path):
    import matplotlib.image

    path = write_chart([load_run(p) for p in tiny_runs], tmp_path / "out" / "compare.png")
    pixels = matplotlib.image.imread(path)
    assert pixels.shape[0] >= 600 and pixels.shape[1] >= 1000
    assert pixels[..., :3].std() > 0.05


def test_the_compare_command(tiny_runs, tmp_path, capsys):
    from leantrain.commands.cli import main

    out = tmp_path / "c.png"
    assert main(["compare", str(tiny_runs[0]), str(tiny_runs[1]), "--output", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "run-a" in printed and "run-b" in printed and f"written: {out}" in printed
    assert out.read_bytes().startswith(b"\x89PNG")
    assert main(["compare", str(tiny_runs[0])]) == 2  # one run: nothing to compare


def test_compare_writes_no_chart_unless_asked(tiny_runs, tmp_path, capsys, monkeypatch):
    from leantrain.commands.cli import main

    monkeypatch.chdir(tmp_path)
    assert main(["compare", str(tiny_runs[0]), str(tiny_runs[1])]) == 0
    assert "written" not in capsys.readouterr().out and not list(tmp_path.iterdir())  # nothing in the folder


def test_labels_are_made_unique(tmp_path):
    from leantrain.run.report import RunData

    runs = [RunData(tmp_path / "x" / "run", True), RunData(tmp_path / "y" / "run", True)]
    assert run_labels(runs) == ["x/run", "y/run"]


def test_compare_needs_two_runs(tiny_runs):
    from leantrain.run.compare import compare

    with pytest.raises(LeantrainError):
        compare([tiny_runs[0]])
