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


def test_a_chart_it_cannot_write_is_refused_in_one_line_before_the_table(tiny_runs, tmp_path, capsys):
    from leantrain.commands.cli import main

    blocker = tmp_path / "file"
    blocker.write_text("")
    for out, says in ((tmp_path / "c.txt", "unknown format '.txt'"), (blocker / "c.png", "cannot create its folder")):
        assert main(["compare", str(tiny_runs[0]), str(tiny_runs[1]), "--output", str(out)]) == 2
        captured = capsys.readouterr()
        assert captured.out == "" and "Traceback" not in captured.err
        assert f"--output {out}: {says}" in captured.err and len(captured.err.strip().splitlines()) == 1


def test_runs_that_do_not_load_leave_no_chart_folder(tmp_path, capsys):
    from leantrain.commands.cli import main

    out = tmp_path / "new" / "folder" / "c.png"
    assert main(["compare", str(tmp_path / "no-run-a"), str(tmp_path / "no-run-b"), "--output", str(out)]) == 2
    assert "no-run-a" in capsys.readouterr().err
    assert not (tmp_path / "new").exists()


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


def _written_run(root, name: str, metrics: dict, config: dict):
    import json

    import yaml

    path = root / name
    path.mkdir()
    (path / "metrics.json").write_text(json.dumps(metrics))
    (path / "config.yaml").write_text(yaml.safe_dump(config))
    return path


@pytest.fixture
def ner_and_lm_runs(tmp_path):
    """A token classifier's and a causal LM's metrics.json as the trainer writes them: neither has a macro-F1."""
    ner = _written_run(
        tmp_path,
        "ner",
        {
            **dict(eval_f1=0.61, eval_precision=0.58, eval_recall=0.64, eval_accuracy=0.93, eval_f1_person=0.7),
            **dict(eval_loss=0.21, train_loss=0.3, optimizer_steps=4, eval_attention="sdpa", best_metric="f1"),
        },
        {"task": "ner", "metric_for_best": "f1"},
    )
    lm = _written_run(
        tmp_path,
        "lm",
        dict(eval_loss=3.4, eval_perplexity=29.96, eval_exact_match=0.12, train_loss=3.5, optimizer_steps=4),
        {"task": "causal-lm", "metric_for_best": "loss"},
    )
    return [load_run(ner), load_run(lm)]


def test_results_show_each_tasks_own_scores(ner_and_lm_runs):
    results = {label: cells for sec, label, cells in comparison_rows(ner_and_lm_runs) if sec == "results"}
    assert results["eval f1"] == ["0.61", "-"] and results["eval perplexity"] == ["-", "30.0"]
    for label in ("eval precision", "eval recall", "eval accuracy", "eval exact match", "eval f1 person"):
        assert label in results, label
    assert "eval macro-F1" not in results and "eval attention" not in results  # none has it; not a score
    order = list(results)
    assert order[:2] == ["eval f1", "eval loss"]  # each run's selection metric first
    assert order.index("eval f1 person") > order.index("eval perplexity")  # a breakdown after the scores
    assert order[-2:] == ["train loss (last log)", "optimizer steps"]


def test_the_chart_draws_the_leading_scores(ner_and_lm_runs, tmp_path):
    from leantrain.run.compare import _chart_scores

    assert _chart_scores(ner_and_lm_runs) == ["eval_f1", "eval_precision"]
    assert _chart_scores(ner_and_lm_runs[1:]) == ["eval_perplexity"]  # not beside a fraction
    assert write_chart(ner_and_lm_runs, tmp_path / "c.png").read_bytes().startswith(b"\x89PNG")


def test_compare_from_python_writes_no_chart_unless_asked(ner_and_lm_runs, tmp_path, monkeypatch):
    from rich.console import Console

    from leantrain.run.compare import compare

    monkeypatch.chdir(tmp_path)
    before = sorted(tmp_path.iterdir())
    console = Console(file=io.StringIO(), width=200)
    assert compare([r.path for r in ner_and_lm_runs], console=console) is None
    assert sorted(tmp_path.iterdir()) == before and "eval perplexity" in console.file.getvalue()


def test_across_tasks_scores_keep_two_decimals_and_settings_show_for_the_runs_that_read_them(tmp_path):
    ner = _written_run(
        tmp_path,
        "ner",
        dict(eval_f1=0.5, eval_loss=1.2, optimizer_steps=4),
        {"task": "ner", "max_target_length": 128, "max_completion_length": 64, "lr": 0.001, "my_field": 1},
    )
    s2s = _written_run(
        tmp_path,
        "s2s",
        dict(eval_rouge1=0.0, eval_rougeL=0.0, eval_loss=10.23, optimizer_steps=4),
        {"task": "seq2seq", "max_target_length": 64, "max_completion_length": 32, "lr": 0.003, "my_field": 2},
    )
    grpo = _written_run(
        tmp_path,
        "grpo",
        dict(eval_reward=0.1234567, eval_loss=1.0, optimizer_steps=4),
        {"task": "grpo", "max_target_length": 256, "max_completion_length": 16, "lr": 0.001, "my_field": 1},
    )
    runs = [load_run(p) for p in (ner, s2s, grpo)]
    diffs = dict(config_differences(runs))
    assert diffs["max_target_length"] == [None, 64, None]  # seq2seq's only
    assert diffs["max_completion_length"] == [None, None, 16]  # GRPO's only
    assert diffs["lr"] == [0.001, 0.003, 0.001] and diffs["my_field"] == [1, 2, 1]  # read by every task
    rows = {label: cells for _, label, cells in comparison_rows(runs)}
    assert rows["max_target_length"] == ["-", "64", "-"]
    assert rows["eval rouge1"] == ["-", "0.00", "-"] and rows["eval f1"] == ["0.50", "-", "-"]
    assert rows["eval reward (greedy)"] == ["-", "-", "0.1235"] and rows["eval loss"] == ["1.20", "10.2", "1.00"]
    assert rows["optimizer steps"] == ["4", "4", "4"]
    # a setting that differs only in runs whose tasks do not read it is no difference
    assert "max_target_length" not in dict(config_differences(runs[:1] + runs[2:]))
