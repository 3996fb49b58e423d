import contextlib
import csv

import pytest

from leantrain.commands import bench
from leantrain.commands.cli import main
from leantrain.errors import ConfigError


def test_technique_overrides_keep_the_global_batch():
    assert bench.job_overrides("grad_accum4", {"batch_size": 32}) == {
        "precision": "fp32",
        "optimizer": "adamw",
        "grad_accum": 4,
        "batch_size": 8,
    }
    assert bench.job_overrides("lean", {})["optimizer"] == "adamw8bit"
    with pytest.raises(ConfigError, match="not divisible"):
        bench.job_overrides("grad_accum4", {"batch_size": 6})
    with pytest.raises(ConfigError, match="unknown warp"):
        bench.parse_techniques("bf16,warp")
    assert bench.parse_techniques("bf16")[0] == "baseline"


def test_the_help_names_every_technique(capsys):
    """`leantrain bench --help` lists what --techniques takes: each technique but the optimizers', named apart."""
    from leantrain.model.optimizers import OPTIMIZERS

    with contextlib.suppress(SystemExit):  # argparse's --help exits
        main(["bench", "--help"])
    words = " ".join(capsys.readouterr().out.split("Known:", 1)[1].split()).replace(",", " ").split()
    missing = sorted(set(bench.TECHNIQUES) - set(OPTIMIZERS) - set(words))
    assert not missing, missing


@pytest.mark.slow  # launches a training process per technique
def test_bench_runs_each_technique_and_writes_the_comparison(
    tiny_model_dir, sentiment_csv, cache_dir, tmp_path, capsys
):
    code = main(
        [
            "bench",
            "--model",
            str(tiny_model_dir),
            "--data",
            str(sentiment_csv),
            "--cache-dir",
            str(cache_dir),
            "--batch-size",
            "8",
            "--steps",
            "3",
            "--techniques",
            "adafactor,grad_accum4",
            "--bench-dir",
            str(tmp_path / "b"),
        ]
    )
    out = capsys.readouterr().out
    assert code == 0
    assert "adafactor" in out and "grad_accum4" in out
    rows = list(csv.DictReader((tmp_path / "b" / "bench.csv").open()))
    assert [r["technique"] for r in rows] == ["baseline", "adafactor", "grad_accum4"]
    assert float(rows[0]["samples/s vs baseline"]) == 1.0
    # Adafactor keeps factored second moments only: far less state than AdamW's two full moments
    assert float(rows[1]["optim state MB vs baseline"]) < 0.3
    assert (tmp_path / "b" / "bench.png").stat().st_size > 1000
    assert "torch" in (tmp_path / "b" / "bench.md").read_text()


def test_the_held_out_score_is_the_tasks_own():
    """A classifier's bench shows eval accuracy, a language model's its perplexity (it has no accuracy: the column
    was empty for causal LMs), each relative to the baseline."""
    from leantrain.commands.bench import BenchRow, render, table_rows

    lm = [BenchRow("baseline", {}, {"eval_perplexity": 40.0}), BenchRow("bf16", {}, {"eval_perplexity": 42.0})]
    records = table_rows(lm)
    assert records[1]["eval ppl"] == 42.0 and records[1]["eval ppl vs baseline"] == 1.05
    assert "eval acc" not in records[0] and "eval ppl" in render(records)
    records = table_rows([BenchRow("baseline", {}, {"eval_accuracy": 0.8})])
    assert records[0]["eval acc"] == 0.8 and "eval ppl" not in records[0] and "eval acc" in render(records)


def test_output_dir_names_the_bench_folder(monkeypatch, tmp_path, tiny_model_dir, sentiment_csv):
    """`bench --output-dir D` (as `train` takes it) writes the comparison under D; it was silently ignored, the
    results going to runs/bench-<time>. --bench-dir still wins."""
    from leantrain.commands import bench
    from leantrain.commands.cli import main

    seen = []
    monkeypatch.setattr(bench, "run_bench", lambda given, names, steps, bench_dir, **kw: seen.append(bench_dir) or [])
    monkeypatch.setattr(bench, "write_outputs", lambda records, bench_dir, context: dict.fromkeys(("md", "csv", "png")))
    common = ["bench", "--model", str(tiny_model_dir), "--data", str(sentiment_csv), "--techniques", "adafactor"]
    main([*common, "--output-dir", str(tmp_path / "mine")])
    main([*common, "--output-dir", str(tmp_path / "mine"), "--bench-dir", str(tmp_path / "bench")])
    assert seen == [tmp_path / "mine", tmp_path / "bench"]


@pytest.mark.parametrize(("dropout", "told"), [(["--dropout", "0"], True), (["--dropout", "0.1"], False), ([], False)])
def test_torch_dropout_on_a_job_without_dropout_is_told_it_compares_nothing(
    monkeypatch, capsys, tiny_model_dir, sentiment_csv, dropout, told
):
    """`--techniques torch_dropout` swaps dropout's draws: on a job with --dropout 0 (the default job's) it runs as the
    baseline, which the bench says before it runs rather than show two equal rows."""
    from leantrain.commands import bench
    from leantrain.commands.cli import main

    monkeypatch.setattr(bench, "run_bench", lambda *a, **kw: [])
    monkeypatch.setattr(bench, "write_outputs", lambda records, bench_dir, context: dict.fromkeys(("md", "csv", "png")))
    job = ["bench", "--model", str(tiny_model_dir), "--data", str(sentiment_csv), "--techniques", "torch_dropout"]
    main([*job, *dropout])
    said = capsys.readouterr()
    assert ("without dropout (--dropout 0)" in said.out + said.err) == told, said
