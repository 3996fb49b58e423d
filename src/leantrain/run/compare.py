"""`leantrain compare RUN_A RUN_B ...`: runs side by side, and a chart of them.

The tables show only the config keys whose values differ between the runs (the output directory, which always does,
names the columns instead), then results (every held-out score a run reported, its selection metric first),
throughput and cost, the time breakdown and memory. Throughput and memory figures also carry their ratio to the first
run: on a shared machine ratios within one comparison are what survive the noise.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from leantrain.errors import LeantrainError
from leantrain.run.report import RunData, fmt_score, fmt_value, load_run, metric_label, time_totals
from leantrain.telemetry.timing import PHASES

IGNORED_CONFIG = {"output_dir", "overwrite", "progress", "cache_dir"}

#: (section, metrics, whether to show each run's ratio to the first); labels from report.METRIC_LABELS; the
#: results section starts with the runs' evaluation scores (`score_keys`)
SECTIONS: list[tuple[str, list[str], bool]] = [
    ("results", ["train_loss", "optimizer_steps", "epochs"], False),
    (
        "throughput and cost",
        [
            *("train_samples_per_second", "steady_samples_per_second", "train_tokens_per_second", "padding_fraction"),
            *("model_tflops_per_second", "steady_mfu", "mfu", "mfu_useful", "train_seconds", "wall_seconds"),
        ],
        True,
    ),
    (
        "memory",
        [
            *("peak_memory_over_baseline_bytes", "peak_memory_bytes", "weights_bytes", "gradients_bytes"),
            "optimizer_state_bytes",
        ],
        True,
    ),
]


def run_labels(runs: list[RunData]) -> list[str]:
    """Column names: the directory names, with parents added until they are unique."""
    paths = [r.path.resolve() for r in runs]
    depth = 1
    while True:
        labels = ["/".join(p.parts[-depth:]) for p in paths]
        if len(set(labels)) == len(labels) or depth >= max(len(p.parts) for p in paths):
            return labels
        depth += 1


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return a == b


def _readers() -> dict[str, tuple[str, ...]]:
    """The settings only some tasks read (the config's `read_by`), with those tasks."""
    from dataclasses import fields

    from leantrain.config import TrainConfig

    return {f.name: f.metadata["read_by"] for f in fields(TrainConfig) if "read_by" in f.metadata}


def _reads(task: Any, key: str, readers: dict[str, tuple[str, ...]]) -> bool:
    """Whether a run of `task` reads setting `key`: a task no setting names (one of your own) may read any."""
    from leantrain.tasks import registry

    if not isinstance(task, str) or key not in readers:
        return True
    task = registry.canonical(task) if task in registry.spellings() else task
    return task in readers[key] or not any(task in r for r in readers.values())


def config_differences(runs: list[RunData]) -> list[tuple[str, list[Any]]]:
    """(key, value per run) for each config key whose value is not the same in every run; a setting only other
    tasks read has no value for a run (config.yaml records every setting, read or not), and a setting that differs
    only there is no difference."""
    keys: list[str] = []
    for r in runs:
        keys += [k for k in r.config if k not in keys]
    missing = object()
    readers = _readers()
    diffs = []
    for k in keys:
        if k in IGNORED_CONFIG:
            continue
        values = [r.config.get(k, missing) for r in runs]
        if all(_same(values[0], v) for v in values[1:]):
            continue
        values = [v if _reads(r.config.get("task"), k, readers) else missing for r, v in zip(runs, values)]
        if not all(_same(values[0], v) for v in values[1:]):  # (else: it differs only where no task reads it)
            diffs.append((k, [None if v is missing else v for v in values]))
    return diffs


def _ratio(value: Any, first: Any) -> str:
    if (
        isinstance(value, (int, float))
        and isinstance(first, (int, float))
        and not isinstance(value, bool)
        and first
        and math.isfinite(value)
        and math.isfinite(first)
    ):
        return f" ({value / first:.2f}x)"
    return ""


def score_keys(runs: list[RunData]) -> list[str]:
    """The held-out scores any run reported (metrics.json's numeric `eval_*`, each task's own: entity F1,
    perplexity, ROUGE, reward accuracy...) in the runs' order, each run's selection metric first."""
    best = []
    for r in runs:
        name = r.metrics.get("best_metric") or r.config.get("metric_for_best")
        if isinstance(name, str):
            best.append("eval_" + name.removeprefix("eval_"))
    keys = [
        k
        for r in runs
        for k, v in r.metrics.items()
        if k.startswith("eval_") and isinstance(v, (int, float)) and not isinstance(v, bool)
    ]
    keys = list(dict.fromkeys(k for k in best + keys if k in keys))
    # a breakdown of a reported score (NER's eval_f1_person of eval_f1) after the scores themselves
    part = {k for k in keys if any(k.startswith(b + "_") for b in keys)}
    return [k for k in keys if k not in part] + [k for k in keys if k in part]


def comparison_rows(runs: list[RunData]) -> list[tuple[str, str, list[str]]]:
    """(section, label, cell per run) for every row at least one run has a value for."""
    rows: list[tuple[str, str, list[str]]] = []
    for key, values in config_differences(runs):
        rows.append(("config (differences only)", key, ["-" if v is None else str(v) for v in values]))
    scores = score_keys(runs)
    for section, keys, with_ratio in SECTIONS:
        for key in (scores + keys) if section == "results" else keys:
            label = metric_label(key)
            values = [r.metrics.get(key) for r in runs]
            if all(v is None for v in values):
                continue
            ratio = with_ratio and not (key.endswith("_fraction") or "mfu" in key)
            show = fmt_score if key in scores or key == "train_loss" else fmt_value
            cells = [show(key, v) + (_ratio(v, values[0]) if ratio and i else "") for i, v in enumerate(values)]
            rows.append((section, label, cells))
    totals = [time_totals(r) for r in runs]
    for phase in PHASES:
        if not any(phase in t for t in totals):
            continue
        cells = []
        for t in totals:
            wall = sum(t.values())
            cells.append(f"{t[phase]:.1f} s ({t[phase] / wall:.0%})" if phase in t and wall > 0 else "-")
        rows.append(("time breakdown", phase, cells))
    return rows


def print_comparison(runs: list[RunData], console=None) -> None:
    from rich.console import Console
    from rich.table import Table

    console = console or Console()
    labels = run_labels(runs)
    table = Table(title="leantrain compare", title_justify="left", show_lines=False)
    table.add_column("", style="bold")
    for label in labels:
        table.add_column(label, justify="right", overflow="fold")
    section = None
    for sec, label, cells in comparison_rows(runs):
        if sec != section:
            if section is not None:
                table.add_section()
            table.add_row(f"[dim]{sec}[/dim]", *([""] * len(cells)))
            section = sec
        table.add_row(label, *cells)
    console.print(table)
    unfinished = [lab for lab, r in zip(labels, runs) if not r.finished]
    if unfinished:
        console.print(f"not finished (read from .incomplete/): {', '.join(unfinished)}")


def write_chart(runs: list[RunData], path: str | Path) -> Path:
    """2 x 2 panels: loss curves, eval metrics, throughput and memory per run."""
    from matplotlib.figure import Figure

    labels = run_labels(runs)
    colors = [f"C{i % 10}" for i in range(len(runs))]
    fig = Figure(figsize=(12, 8), layout="constrained")
    (ax_loss, ax_eval), (ax_tp, ax_mem) = fig.subplots(2, 2)

    _plot_losses(ax_loss, runs, labels, colors)

    def bars(ax, key: str, scale: float, title: str, unit: str) -> None:
        values = [r.metrics.get(key) for r in runs]
        values = [float(v) * scale if isinstance(v, (int, float)) and math.isfinite(v) else 0.0 for v in values]
        ax.barh(labels, values, color=colors)
        for y, v in enumerate(values):
            ax.text(v, y, f" {v:,.3g} {unit}", va="center", fontsize=8)
        ax.invert_yaxis()
        ax.margins(x=0.3)
        ax.set_title(title)

    _plot_eval(ax_eval, runs, labels)

    tp_key = next(
        (
            k
            for k in ("steady_samples_per_second", "train_samples_per_second")
            if any(isinstance(r.metrics.get(k), (int, float)) for r in runs)
        ),
        None,
    )
    if tp_key:
        bars(ax_tp, tp_key, 1.0, "Throughput (" + ("steady " if tp_key.startswith("steady") else "") + "samples/s)", "")
    else:
        ax_tp.set_axis_off()
    mem_key = next(
        (
            k
            for k in ("peak_memory_over_baseline_bytes", "peak_memory_bytes")
            if any(isinstance(r.metrics.get(k), (int, float)) for r in runs)
        ),
        None,
    )
    if mem_key:
        bars(ax_mem, mem_key, 1 / 2**20, "Peak memory" + (" over baseline" if "baseline" in mem_key else ""), "MB")
    else:
        ax_mem.set_axis_off()
    from leantrain.run.directory import output_folder

    path = output_folder(path)
    fig.savefig(path, dpi=100)
    return path


#: chart formats matplotlib writes that a comparison is useful in
CHART_SUFFIXES = (".png", ".svg", ".pdf", ".jpg", ".jpeg")


def compare(run_dirs: list[str | Path], output: str | Path | None = None, console=None) -> Path | None:
    """Print the comparison; write the chart to `output` (None: no chart). Returns the chart's path."""
    if len(run_dirs) < 2:
        raise LeantrainError("compare needs at least two run directories")
    if output is not None:
        from leantrain.run.directory import output_file

        output_file(output, CHART_SUFFIXES)  # before the table is printed: a chart it cannot write fails first
    runs = [load_run(d) for d in run_dirs]
    print_comparison(runs, console)
    return write_chart(runs, output) if output is not None else None


def _plot_losses(ax, runs: list[RunData], labels: list[str], colors: list[str]) -> None:
    from leantrain.run.report import _series

    for run, label, color in zip(runs, labels, colors):
        xs, ys = _series(run.train_rows, "loss")
        if xs:
            ax.plot(xs, ys, color=color, label=label)
        xs, ys = _series(run.eval_rows, "eval_loss")
        if xs:
            ax.plot(xs, ys, "o--", color=color, markersize=4)
    ax.set(xlabel="optimizer step", ylabel="loss", title="Loss (line: train, dashed: eval)")
    ax.grid(alpha=0.3)
    if ax.lines:
        ax.legend(fontsize=8)


def _plot_eval(ax_eval, runs: list[RunData], labels: list[str]) -> None:
    eval_keys = _chart_scores(runs)
    if eval_keys:
        import numpy as np

        y = np.arange(len(runs))
        h = 0.8 / len(eval_keys)
        for j, key in enumerate(eval_keys):
            vals = [float(r.metrics[key]) if _finite(r.metrics.get(key)) else 0.0 for r in runs]
            ax_eval.barh(
                y + j * h, vals, height=h, label=key.removeprefix("eval_"), color=["#3b7dd8", "#6aa84f"][j % 2]
            )
            for yy, v in zip(y + j * h, vals):
                ax_eval.text(v, yy, f" {v:.3f}", va="center", fontsize=8)
        ax_eval.set_yticks(y + h * (len(eval_keys) - 1) / 2, labels)
        ax_eval.invert_yaxis()
        top = max((float(r.metrics[k]) for r in runs for k in eval_keys if _finite(r.metrics.get(k))), default=1.0)
        ax_eval.set(xlim=(0, max(top, 1.0) * 1.15), title="Final evaluation")
        ax_eval.legend(fontsize=8, loc="lower right")
    else:
        ax_eval.set_axis_off()


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _chart_scores(runs: list[RunData]) -> list[str]:
    """Up to two leading scores other than the loss (the loss panel has it), on one scale: a fraction's bars
    beside a ROUGE or a perplexity would be flat."""
    keys = [k for k in score_keys(runs) if k != "eval_loss"]

    def scale(key: str) -> str | None:
        values = [float(r.metrics[key]) for r in runs if _finite(r.metrics.get(key))]
        if not values or min(values) < 0:
            return None
        return "fraction" if max(values) <= 1 else "number"

    first = next((k for k in keys if scale(k)), None)
    if first is None:
        return []
    return [first, *[k for k in keys if k != first and scale(k) == scale(first)][:1]]
