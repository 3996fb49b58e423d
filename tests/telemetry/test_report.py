"""report.html: built from a real tiny run and from a synthetic one that has every column; rendered in Chromium."""

from __future__ import annotations

import base64
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from leantrain.errors import LeantrainError
from leantrain.run.report import load_run, read_rows, write_report
from leantrain.telemetry.timing import PHASES, row_key

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def images(page: str) -> dict[str, bytes]:
    """data-plot name -> decoded PNG bytes, for every embedded plot."""
    found = {}
    for src, name in re.findall(
        r"<img src='data:image/png;base64,([A-Za-z0-9+/=]+)' alt='[^']*' data-plot='(\w+)'>", page
    ):
        found[name] = base64.b64decode(src)
    return found


def png_size(data: bytes) -> tuple[int, int]:
    assert data.startswith(PNG_MAGIC)
    return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")


def synthetic_run(root: Path, finished: bool = True) -> Path:
    """A run directory with every column the report can draw: MFU, time breakdown, memory over time."""
    run = root / "synthetic"
    where = run if finished else run / ".incomplete"
    where.mkdir(parents=True)
    rows = []
    for step in range(5, 101, 5):
        parts = {
            "data": 0.1,
            "forward_backward": 2.0,
            "optimizer": 0.3,
            "eval": 0.5 if step % 25 == 0 else 0.0,
            "checkpoint": 0.0,
            "comm": 0.05,
            "other": 0.05,
        }
        rows.append(
            {
                "step": step,
                "micro_step": step,
                "epoch": step / 100,
                "loss": 1.0 / step**0.3,
                "lr": 1e-4 * min(1.0, step / 20),
                "grad_norm": 1.0,
                "skipped_steps": 0,
                "samples_per_second": 40 + step / 10,
                "tokens_per_second": 2000 + step,
                "model_tflops_per_second": 0.12,
                "mfu": 0.16 + step / 2000,
                "mfu_useful": 0.15,
                "memory_bytes": 300e6 + step * 1e5,
                **{row_key(p): v for p, v in parts.items()},
                row_key("wall"): sum(parts.values()),
                "elapsed_seconds": step * 3.0,
            }
        )
        if step % 25 == 0:
            rows.append(
                {
                    "step": step,
                    "eval_accuracy": 0.5 + step / 250,
                    "eval_macro_f1": 0.45 + step / 250,
                    "eval_loss": 0.9 - step / 200,
                }
            )
    rows.append({"step": 100, "loss": "nan"})  # non-finite values are written as strings
    text = "\n".join(json.dumps(r) for r in rows) + '\n{"step": 101, "lo'  # a torn last line
    (where / "metrics.jsonl").write_text(text)
    (where / "config.yaml").write_text(yaml.safe_dump({"model": "tiny", "data": "x.csv", "lr": 1e-4}))
    if finished:
        metrics = {
            "eval_accuracy": 0.9,
            "eval_macro_f1": 0.89,
            "eval_loss": 0.4,
            "train_loss": 0.3,
            "optimizer_steps": 100,
            "train_samples_per_second": 45.0,
            "steady_samples_per_second": 47.0,
            "train_tokens_per_second": 2050.0,
            "padding_fraction": 0.03,
            "mfu": 0.2,
            "mfu_useful": 0.19,
            "model_tflops_per_second": 0.12,
            "peak_memory_bytes": 900e6,
            "peak_memory_over_baseline_bytes": 400e6,
            "weights_bytes": 90e6,
            "gradients_bytes": 90e6,
            "optimizer_state_bytes": 180e6,
            "precision": "bf16",
            "num_processes": 1,
            "wall_seconds": 300.0,
            **{row_key(p): v for p, v in zip(PHASES, (10, 0, 200, 30, 20, 0, 5, 5))},
        }
        (where / "metrics.json").write_text(json.dumps(metrics))
        (where / "environment.json").write_text(
            json.dumps(
                {
                    "device": "test CPU",
                    "torch": "x",
                    "peak_tflops": 0.7,
                    "peak_dtype": "bf16",
                    "peak_source": "measured: 2048² bf16 GEMM",
                }
            )
        )
    return run


def test_a_report_from_a_synthetic_run_has_every_plot(tmp_path):
    run = synthetic_run(tmp_path)
    path = write_report(run)
    assert path == run / "report.html"
    page = path.read_text()
    plots = images(page)
    assert set(plots) == {"loss", "eval", "throughput", "time", "memory"}
    for data in plots.values():
        w, h = png_size(data)
        assert w > 300 and h > 150
    for text in (
        "MFU (padded tokens)",
        "20.0%",
        "forward_backward",
        "what this run set",
        "test CPU",
        "MFU is against a peak of 0.7 TFLOP/s",
        "finished",
    ):
        assert text in page, text
    assert "http://" not in page and "https://" not in page  # self-contained


def test_a_report_it_cannot_write_is_refused_in_one_line(tmp_path):
    from leantrain.errors import ConfigError

    run = synthetic_run(tmp_path)
    with pytest.raises(ConfigError, match=r"--output .*r\.txt: unknown format '\.txt'; name a \.html, \.htm file"):
        write_report(run, tmp_path / "r.txt")
    (tmp_path / "file").write_text("")
    with pytest.raises(ConfigError, match=r"--output .*r\.html: cannot create its folder"):
        write_report(run, tmp_path / "file" / "r.html")
    assert write_report(run, tmp_path / "new" / "r.html").is_file()


def test_a_run_that_does_not_load_leaves_no_output_folder(tmp_path, capsys):
    """The output's folder is made once the run has loaded: a wrong RUN leaves nothing behind."""
    from leantrain.commands.cli import main

    out = tmp_path / "new" / "folder" / "report.html"
    assert main(["report", str(tmp_path / "no-run"), "--output", str(out)]) == 2
    assert "no-run" in capsys.readouterr().err
    assert not (tmp_path / "new").exists()
    assert write_report(synthetic_run(tmp_path), out).is_file()  # and a run that loads makes it


def test_an_output_in_a_folder_it_cannot_write_is_refused_before_the_run_loads(tmp_path, monkeypatch):
    """The nearest folder that exists must be writable (root writes anywhere: the check is faked)."""
    from leantrain.errors import ConfigError

    monkeypatch.setattr("os.access", lambda *args, **kwargs: False)
    with pytest.raises(ConfigError, match=r"--output .*r\.html: cannot create its folder \(Permission denied\)"):
        write_report(tmp_path / "no-run", tmp_path / "new" / "r.html")
    assert not (tmp_path / "new").exists()


def test_rows_survive_torn_lines_and_non_finite_values(tmp_path):
    run = synthetic_run(tmp_path)
    rows = read_rows(run / "metrics.jsonl")
    assert rows[-1] == {"step": 100, "loss": float("nan")} or rows[-1]["loss"] != rows[-1]["loss"]
    assert all(r["step"] <= 100 for r in rows)


def test_a_run_in_progress_is_read_from_its_staging_directory(tmp_path):
    run = synthetic_run(tmp_path, finished=False)
    data = load_run(run)
    assert not data.finished and data.name == "synthetic" and data.rows
    page = write_report(run).read_text()
    assert "in progress" in page
    assert {"loss", "throughput", "time"} <= set(images(page))


def test_a_directory_without_a_run_is_refused(tmp_path):
    with pytest.raises(LeantrainError, match="holds no run"):
        write_report(tmp_path)
    with pytest.raises(LeantrainError, match="not a directory"):
        write_report(tmp_path / "absent")


def test_a_report_from_a_real_run_draws_what_exists(tiny_runs):
    page = write_report(tiny_runs[0]).read_text()
    plots = images(page)
    assert {"loss", "eval", "throughput", "memory"} <= set(plots)
    assert "eval accuracy" in page and "batch_size: 16" in page


def test_the_report_command(tiny_runs, tmp_path, capsys):
    from leantrain.commands.cli import main

    out = tmp_path / "elsewhere" / "r.html"
    assert main(["report", str(tiny_runs[1]), "--output", str(out)]) == 0
    assert capsys.readouterr().out.strip() == str(out)
    assert images(out.read_text())
    assert main(["report", str(tmp_path)]) == 2


CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")


@pytest.mark.slow  # launches Chromium
@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (apt-get install -y chromium)")
def test_the_page_renders_with_its_images_in_headless_chromium(tmp_path):
    page = write_report(synthetic_run(tmp_path))
    flags = [
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--no-first-run",
        "--disable-dev-shm-usage",
        f"--user-data-dir={tmp_path / 'profile'}",
    ]
    dom = subprocess.run(
        [CHROMIUM, *flags, "--virtual-time-budget=10000", "--dump-dom", page.as_uri()],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert dom.returncode == 0, dom.stderr[-2000:]
    body = re.search(r"<body([^>]*)>", dom.stdout)
    assert body, dom.stdout[:500]
    loaded = re.search(r'data-images-loaded="(\d+)"', body.group(1))
    total = re.search(r'data-images-total="(\d+)"', body.group(1))
    assert loaded and total, body.group(0)
    assert int(total.group(1)) == 5 and int(loaded.group(1)) == 5  # every plot decoded with a non-zero size

    shot = tmp_path / "shot.png"
    run = subprocess.run(
        [CHROMIUM, *flags, f"--screenshot={shot}", "--window-size=1200,2000", "--hide-scrollbars", page.as_uri()],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0 and shot.is_file(), run.stderr[-2000:]
    import matplotlib.image

    pixels = matplotlib.image.imread(shot)
    assert pixels.shape[0] == 2000 and pixels.shape[1] == 1200
    assert pixels[..., :3].std() > 0.05  # not a blank page


def test_the_pages_figures_say_what_a_reader_needs(tmp_path):
    """One evaluation point is not a range of 0.012; accuracy and F1, perplexity and exact match, each on its own
    panel; the learning rate from step 0 (the warm-up shows); bytes in one unit system; the summary of a language
    model with its perplexity and exact match (a score of 0 as 0.00); the config as what was set."""
    import torch

    from leantrain.model.schedules import build_scheduler
    from leantrain.run.report import eval_panels, fmt_bytes, lr_schedule

    run = tmp_path / "lm"
    run.mkdir()
    optimizer = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=3e-4)
    scheduler = build_scheduler(optimizer, "linear", 30, 0.1)
    rows = []
    for step in range(1, 31):
        optimizer.step()
        scheduler.step()
        if step % 10 == 0:  # logged every 10 steps: the 3-step warm-up falls between two rows
            rows.append({"step": step, "loss": 2.0, "lr": scheduler.get_last_lr()[0]})
    rows.append({"step": 30, "eval_loss": 1.5, "eval_perplexity": 4.48, "eval_exact_match": 0.8})
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    metrics = {"eval_loss": 1.5, "eval_perplexity": 4.48, "eval_exact_match": 0.0, "optimizer_steps": 30,
               "epochs": 1.0, "peak_memory_bytes": 1455 * 2**20, "weights_bytes": 200 * 2**20}  # fmt: skip
    (run / "metrics.json").write_text(json.dumps(metrics))
    config = {"model": "preset:tiny-llama", "data": "notes.txt", "lr": 3e-4, "scheduler": "linear",
              "warmup_ratio": 0.1, "epochs": 1.0, "max_steps": None, "text_column": None, "batch_size": 8}  # fmt: skip
    (run / "config.yaml").write_text(yaml.safe_dump(config))
    loaded = load_run(run)
    panels = {name: limits for name, _, limits in eval_panels(loaded)}
    assert set(panels) == {"perplexity", "exact_match"}  # apart, each on its own scale
    low, high = panels["exact_match"]
    assert high - low >= 0.1 and 0 <= low < 0.8 < high <= 1
    rates = lr_schedule(loaded)
    assert rates is not None and len(rates) == 31 and rates[0] == 0.0 and max(rates) == pytest.approx(3e-4)
    assert fmt_bytes(1455 * 2**20) == "1.42 GiB" and fmt_bytes(200 * 2**20) == "200.0 MiB"
    page = write_report(run).read_text()
    assert "eval perplexity" in page and "<th>eval exact match</th><td class='num'>0.00</td>" in page  # not "0"
    assert " MB" not in page and " GB" not in page
    shown = page.split("what this run set")[1].split("<details>")[0]
    assert "batch_size" in shown and "text_column" not in shown and "epochs" not in shown  # None, defaults: out


def test_scores_per_entity_type_share_a_panel_and_one_evaluation_draws_no_chart(tmp_path):
    """Ten entity types are one panel of ten lines, not ten panels; a run that evaluated once has its scores in the
    summary and no chart of single points."""
    from leantrain.run.report import eval_panels

    kinds = [f"type{i}" for i in range(10)]
    for evaluations in (1, 2):
        run = tmp_path / f"ner{evaluations}"
        run.mkdir()
        rows = [{"step": s, "loss": 1.0} for s in (5, 10)]
        rows += [
            {"step": 5 * (e + 1), "eval_f1": 0.3 + e / 10, "eval_accuracy": 0.9, **{f"eval_f1_{k}": 0.2 for k in kinds}}
            for e in range(evaluations)
        ]
        (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        (run / "metrics.json").write_text(json.dumps({**rows[-1], "optimizer_steps": 10}))
        panels = eval_panels(load_run(run))
        assert [title for title, _, _ in panels] == ["accuracy", "f1", "f1 per type"]
        assert [label for label, _, _ in panels[2][1]] == kinds
        page = write_report(run).read_text()
        assert ("data-plot='eval'" in page) == (evaluations == 2)
        assert "eval f1 type9" in page  # the summary holds every score


def test_a_classifiers_report_has_its_confusion_matrix(tiny_runs):
    evaluation = json.loads((tiny_runs[0] / "evaluation.json").read_text())
    assert set(evaluation) == {"per_class", "confusion_matrix", "labels"} and evaluation["labels"] == ["neg", "pos"]
    page = write_report(tiny_runs[0]).read_text()
    assert "data-table='confusion'" in page and "Classes (final evaluation)" in page
