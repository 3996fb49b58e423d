"""`leantrain report RUN_DIR`: one self-contained HTML page about a run.

The page (`RUN_DIR/report.html`) embeds its plots as base64 PNG data URIs, so it can be mailed or
attached to an issue as one file. It reads what the run wrote: `metrics.json` (final figures),
`metrics.jsonl` (one row per log interval and per evaluation), `config.yaml` (the resolved config)
and, when present, `environment.json`. A run still in progress is read from `RUN_DIR/.incomplete/`.
Columns that a run did not log (MFU, the time breakdown, memory over time) are left out of the
page, not drawn empty.
"""

from __future__ import annotations

import base64
import html
import io
import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from leantrain.errors import LeantrainError
from leantrain.telemetry.timing import PHASES, row_key

REPORT_NAME = "report.html"
ENVIRONMENT_NAME = "environment.json"
EVALUATION_NAME = "evaluation.json"
PHASE_COLORS = {
    "data": "#e4a11b",
    "generate": "#17a2b8",
    "forward_backward": "#3b7dd8",
    "optimizer": "#6aa84f",
    "eval": "#9b59b6",
    "checkpoint": "#8e6c4a",
    "comm": "#d9534f",
    "other": "#aaaaaa",
}
MEMORY_KEYS = (
    ("weights_bytes", "weights"),
    ("gradients_bytes", "gradients"),
    ("optimizer_state_bytes", "optimizer state"),
    ("peak_memory_over_baseline_bytes", "peak over baseline"),
    ("peak_memory_bytes", "peak (process)"),
    ("peak_reserved_bytes", "peak reserved (CUDA)"),
)


@dataclass
class RunData:
    path: Path
    finished: bool
    metrics: dict[str, Any] = field(default_factory=dict)
    rows: list[dict[str, Any]] = field(default_factory=list)
    config: dict[str, Any] = field(default_factory=dict)
    config_text: str = ""
    environment: dict[str, Any] = field(default_factory=dict)
    #: evaluation.json: the final evaluation beyond its scores (a classifier's per-class table, confusion matrix)
    evaluation: dict[str, Any] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.display_path.name

    @property
    def display_path(self) -> Path:
        """The run's directory (a report written from the staging directory names the run, not the stage)."""
        path = self.path.resolve()
        return path.parent if path.name.startswith(".incomplete") else path  # .incomplete-PID (run_dir.py)

    @property
    def train_rows(self) -> list[dict[str, Any]]:
        return [r for r in self.rows if "loss" in r and "step" in r]

    @property
    def eval_rows(self) -> list[dict[str, Any]]:
        return [r for r in self.rows if "step" in r and any(k.startswith("eval_") for k in r)]


# -- reading ---------------------------------------------------------------------------------------


def _number(value: Any) -> Any:
    """metrics.jsonl writes non-finite floats as strings ('nan', 'inf'): read them back as floats."""
    if isinstance(value, str) and value.lower() in ("nan", "inf", "-inf", "infinity", "-infinity"):
        return float(value)
    return value


def read_rows(path: Path) -> list[dict[str, Any]]:
    """The JSON lines of metrics.jsonl; a torn last line (a run killed mid-write) is skipped."""
    rows: list[dict[str, Any]] = []
    try:
        text = path.read_text(encoding="utf-8")
    except OSError:
        return rows
    for line in text.splitlines():
        line = line.strip()
        if not line:
            continue
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict):
            rows.append({k: _number(v) for k, v in row.items()})
    return rows


def load_run(run_dir: str | Path) -> RunData:
    """What a run directory holds; raises LeantrainError when it holds nothing a report could show."""
    import yaml

    from leantrain.run.directory import staging_dir

    path = Path(run_dir)
    if not path.is_dir():
        raise LeantrainError(f"'{path}' is not a directory; give a run's output directory")
    finished = (path / "metrics.json").is_file()
    staging = None if finished else staging_dir(path)  # a run in progress, or one that failed
    source = staging or path
    run = RunData(path=path, finished=finished)
    names = ("metrics.json", "metrics.jsonl", "config.yaml")
    if not any((source / n).is_file() for n in names):
        raise LeantrainError(f"'{path}' holds no run: none of {', '.join(names)} is there")
    try:
        run.metrics = {k: _number(v) for k, v in json.loads((source / "metrics.json").read_text()).items()}
    except (OSError, ValueError, AttributeError):
        run.metrics = {}
    run.rows = read_rows(source / "metrics.jsonl")
    try:
        run.config_text = (source / "config.yaml").read_text(encoding="utf-8")
        run.config = yaml.safe_load(run.config_text) or {}
    except (OSError, yaml.YAMLError):
        run.config, run.config_text = {}, ""
    try:
        run.evaluation = json.loads((source / EVALUATION_NAME).read_text())
    except (OSError, ValueError):
        run.evaluation = {}
    for where in (source / ENVIRONMENT_NAME, path / ENVIRONMENT_NAME):
        try:
            run.environment = json.loads(where.read_text())
            break
        except (OSError, ValueError):
            continue
    return run


def collect_environment(device: Any = None, peak: Any = None, num_processes: int | None = None) -> dict[str, Any]:
    """The facts a reader needs to judge a run's speed; the loop writes them to environment.json."""
    import os
    import platform

    import torch

    from leantrain.parallel import cpu_model, cpu_name

    env: dict[str, Any] = {"date": time.strftime("%Y-%m-%d %H:%M:%S")}
    dev = torch.device(device) if device is not None else torch.device("cpu")
    if dev.type == "cuda":
        env["device"] = torch.cuda.get_device_name(dev)
        env["cuda"] = torch.version.cuda
    else:
        env["device"] = cpu_name()
    env.update(
        {
            "cpu": cpu_name(),
            "cpu_model": cpu_model(),
            "cpu_count": os.cpu_count(),
            "torch_threads": torch.get_num_threads(),
            "python": platform.python_version(),
            "platform": platform.platform(),
            "torch": torch.__version__,
        }
    )
    from leantrain.parallel import package_version

    for lib in ("transformers", "accelerate", "datasets"):  # read without importing them
        env[lib] = package_version(lib)
    if num_processes is not None:
        env["num_processes"] = num_processes
    if peak is not None:
        env["peak_tflops"] = peak.flops_per_second / 1e12
        env["peak_dtype"] = peak.dtype
        env["peak_source"] = peak.source
    return env


def write_environment(directory: str | Path, **kwargs: Any) -> Path:
    path = Path(directory) / ENVIRONMENT_NAME
    path.write_text(json.dumps(collect_environment(**kwargs), indent=2) + "\n")
    return path


# -- formatting ------------------------------------------------------------------------------------


def fmt_bytes(value: Any) -> str:
    """Bytes in binary units, one rule for every figure on the page (MiB below 1 GiB, GiB from there)."""
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return "-"
    mib = value / 2**20
    return f"{mib / 1024:.2f} GiB" if mib >= 1024 else f"{mib:,.1f} MiB"


def fmt_value(key: str, value: Any) -> str:
    """A metric as a reader wants it: bytes in MB, fractions in %, seconds with units."""
    if value is None:
        return "-"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return str(value)
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if key.endswith("_bytes"):
        return fmt_bytes(value)
    if key in ("mfu", "mfu_useful", "steady_mfu") or key.endswith("_fraction"):
        return f"{value:.1%}"
    if key.endswith("_seconds") and "per_second" not in key:
        return f"{value:.1f} s" if value >= 1 else f"{value * 1000:.0f} ms"
    if isinstance(value, int):
        return f"{value:,}"
    if abs(value) >= 1000:
        return f"{value:,.0f}"
    if abs(value) >= 10:
        return f"{value:.1f}"
    return f"{value:.4g}"


def fmt_score(key: str, value: Any) -> str:
    """A score as `fmt_value` writes it, with two decimals at least below 10: a ROUGE of 0 reads 0.00 beside
    another run's 0.61, not 0."""
    text = fmt_value(key, value)
    number = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if number and abs(value) < 10 and "e" not in text and len(text.partition(".")[2]) < 2:
        return f"{value:.2f}"
    return text


def _series(rows: list[dict[str, Any]], key: str) -> tuple[list[float], list[float]]:
    xs, ys = [], []
    for r in rows:
        v = r.get(key)
        if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and "step" in r:
            xs.append(r["step"])
            ys.append(float(v))
    return xs, ys


def _has(rows: list[dict[str, Any]], key: str) -> bool:
    return bool(_series(rows, key)[0])


# -- plots -----------------------------------------------------------------------------------------


def _figure(
    ncols: int = 1, width: float = 10.0, height: float = 3.6, left: float = 0.8, gap: float = 1.0, right: float = 0.3
):
    """A figure of `ncols` plots side by side, with fixed margins and `gap` between plots (inches).

    Fixed, not matplotlib's constrained layout: that measured every tick label two or three times and was
    half the page's cost (the five plots 2.0 -> 1.0 s, benchmarks/results/report_plots.md).
    """
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height))
    plot_width = (width - left - right - gap * (ncols - 1)) / ncols
    fig.subplots_adjust(
        left=left / width, right=1 - right / width, wspace=gap / plot_width, bottom=0.55 / height, top=1 - 0.35 / height
    )
    axes = fig.subplots(1, ncols, squeeze=False)[0]
    return fig, list(axes)


def _png(fig) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=96)
    return buf.getvalue()


def lr_schedule(run: RunData) -> list[float] | None:
    """The learning rate at every step from 0 to the run's last, rebuilt from its config with the schedule training
    used (`optim.build_scheduler`), so a warm-up shorter than --log-every shows; None where the rebuilt schedule
    does not give the rates the run logged (a resumed run that changed --epochs, say)."""
    cfg, logged = run.config, [(r["step"], r["lr"]) for r in run.train_rows if isinstance(r.get("lr"), (int, float))]
    steps, epochs = run.metrics.get("optimizer_steps"), run.metrics.get("epochs")
    if not logged or not isinstance(steps, int) or not cfg.get("scheduler") or not isinstance(cfg.get("lr"), float):
        return None
    total = cfg.get("max_steps") or (math.ceil(steps / epochs * cfg.get("epochs", 1.0)) if epochs else steps)
    try:
        import torch

        from leantrain.model.schedules import build_scheduler

        weight = torch.zeros(1, requires_grad=True)
        optimizer = torch.optim.SGD([weight], lr=cfg["lr"])
        scheduler = build_scheduler(
            optimizer, cfg["scheduler"], int(total), cfg.get("warmup_ratio", 0.0), cfg.get("warmup_steps"),
            cfg.get("scheduler_kwargs"),
        )  # fmt: skip
        rates = [scheduler.get_last_lr()[0]]
        for _ in range(steps):
            optimizer.step()
            scheduler.step()
            rates.append(scheduler.get_last_lr()[0])
    except Exception:  # a config this leantrain cannot rebuild: the logged points alone
        return None
    fits = all(step < len(rates) and math.isclose(rates[step], lr, rel_tol=1e-5, abs_tol=1e-12) for step, lr in logged)
    return rates if fits else None


def plot_loss(run: RunData) -> bytes | None:
    train, evals = run.train_rows, run.eval_rows
    if not (_has(train, "loss") or _has(evals, "eval_loss") or _has(train, "lr")):
        return None
    fig, (ax, ax_lr) = _figure(2)
    if _has(train, "loss"):
        ax.plot(*_series(train, "loss"), label="train loss", color="#3b7dd8")
    if _has(evals, "eval_loss"):
        ax.plot(*_series(evals, "eval_loss"), "o-", label="eval loss", color="#d9534f")
    ax.set(xlabel="optimizer step", ylabel="loss", title="Loss")
    ax.legend()
    ax.grid(alpha=0.3)
    if _has(train, "lr"):
        schedule = lr_schedule(run)
        if schedule is not None:  # every step from the first, so a short warm-up shows
            ax_lr.plot(range(len(schedule)), schedule, color="#6aa84f", label="schedule")
            ax_lr.plot(*_series(train, "lr"), "o", color="#6aa84f", markersize=3, label="logged")
            ax_lr.legend(fontsize=8)
        else:
            ax_lr.plot(*_series(train, "lr"), color="#6aa84f")
        ax_lr.ticklabel_format(axis="y", style="sci", scilimits=(-3, 3))
    ax_lr.set(xlabel="optimizer step", ylabel="learning rate", title="Learning rate")
    ax_lr.grid(alpha=0.3)
    return _png(fig)


#: scores that lie in [0, 1] (the rest, perplexity, RMSE and such, have their own scale)
UNIT_SCORES = (
    "accuracy", "f1", "macro_f1", "micro_f1", "weighted_f1", "precision", "recall", "balanced_accuracy", "roc_auc",
    "subset_accuracy", "hamming_loss", "exact_match", "mcc", "pearson", "spearman", "r2",
)  # fmt: skip
#: of those, the ones that go down to -1
SIGNED_SCORES = ("mcc", "pearson", "spearman", "r2")


Series = tuple[str, list[float], list[float]]


def eval_panels(run: RunData) -> list[tuple[str, list[Series], tuple[float, float]]]:
    """(title, [(label, steps, values)], y limits) of each evaluation metric but the loss: one panel each, on its own
    scale (accuracy beside F1, perplexity beside exact match, apart); a score per entity type or class (`f1_person`,
    `f1_location`) one panel of a line each. A score in [0, 1] gets at least a tenth of that range around it, so one
    point, or two close ones, do not fill the panel with a difference of 0.01."""
    evals = run.eval_rows
    keys = sorted({k for r in evals for k in r if k.startswith("eval_") and k != "eval_loss" and _has(evals, k)})
    panels: dict[str, list[Series]] = {}
    for k in keys:
        name = k.removeprefix("eval_")
        score, _, kind = name.partition("_")
        if name not in UNIT_SCORES and score in UNIT_SCORES and kind:
            panels.setdefault(f"{score} per type", []).append((kind, *_series(evals, k)))
        else:
            panels[name] = [(name, *_series(evals, k))]
    out = []
    for title, series in panels.items():
        ys = [y for _, _, values in series for y in values]
        low, high = min(ys), max(ys)
        score = title.removesuffix(" per type")
        if score in UNIT_SCORES:
            pad = max(0.05 - (high - low) / 2, 0.02)
            floor = -1.0 if score in SIGNED_SCORES else 0.0
            limits = (max(floor, low - pad), min(1.0, high + pad))
        else:
            pad = max((high - low) * 0.1, abs(high) * 0.05, 1e-6)
            limits = (low - pad, high + pad)
        out.append((title, series, limits))
    return out


def plot_eval(run: RunData) -> bytes | None:
    """The evaluation metrics over the run; none for a run that evaluated once (its scores are the summary's)."""
    panels = eval_panels(run)
    if not panels or len({r["step"] for r in run.eval_rows if "step" in r}) < 2:
        return None
    fig, axes = _figure(len(panels), width=max(7.0, 3.3 * len(panels)), gap=0.9)
    for ax, (title, series, limits) in zip(axes, panels):
        for label, xs, ys in series:
            ax.plot(xs, ys, "o-", label=label, **({"color": "#3b7dd8"} if len(series) == 1 else {}))
        if len(series) == 1:
            ax.annotate(f"{ys[-1]:.4g}", (xs[-1], ys[-1]), textcoords="offset points", xytext=(4, 4), fontsize=8)
        else:
            ax.legend(fontsize=7)
        ax.set_ylim(*limits)
        ax.set(xlabel="optimizer step", title=title.replace("_", " "))
        ax.grid(alpha=0.3)
    return _png(fig)


def plot_reward(run: RunData) -> bytes | None:
    """A run that trains on rewards (online RL): the mean reward of each log window, each reward function's, and
    the evaluations' (greedy completions)."""
    train, evals = run.train_rows, run.eval_rows
    if not _has(train, "reward"):
        return None
    fig, (ax,) = _figure(1, width=7)
    ax.plot(*_series(train, "reward"), label="reward (sampled)", color="#3b7dd8")
    functions = sorted({k for r in train for k in r if k.startswith("rewards/") and k.endswith("/mean")})
    if len(functions) > 1:
        for k in functions:
            ax.plot(*_series(train, k), label=k.removeprefix("rewards/").removesuffix("/mean"), alpha=0.6, lw=1)
    if _has(evals, "eval_reward"):
        ax.plot(*_series(evals, "eval_reward"), "o-", label="eval reward (greedy)", color="#d9534f")
    ax.set(xlabel="optimizer step", ylabel="reward", title="Reward")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    return _png(fig)


def plot_throughput(run: RunData) -> bytes | None:
    train = run.train_rows
    has_rate = _has(train, "samples_per_second") or _has(train, "tokens_per_second")
    has_mfu = _has(train, "mfu") or _has(train, "model_tflops_per_second")
    if not (has_rate or has_mfu):
        return None
    fig, axes = _figure(2 if has_mfu and has_rate else 1, gap=1.6)  # room for the twin tokens/s axis
    if has_rate:
        ax = axes[0]
        if _has(train, "samples_per_second"):
            ax.plot(*_series(train, "samples_per_second"), color="#3b7dd8", label="samples/s")
        ax.set(xlabel="optimizer step", ylabel="samples/s", title="Throughput (training time only)")
        ax.grid(alpha=0.3)
        if _has(train, "tokens_per_second"):
            twin = ax.twinx()
            twin.plot(*_series(train, "tokens_per_second"), color="#e4a11b", label="tokens/s (no padding)")
            twin.set_ylabel("tokens/s")
            lines = ax.get_lines() + twin.get_lines()
            ax.legend(lines, [line.get_label() for line in lines], loc="lower right")
    if has_mfu:
        ax = axes[-1]
        if _has(train, "mfu"):
            xs, ys = _series(train, "mfu")
            ax.plot(xs, [100 * y for y in ys], color="#9b59b6", label="MFU (padded tokens)")
            if _has(train, "mfu_useful"):
                xs, ys = _series(train, "mfu_useful")
                ax.plot(xs, [100 * y for y in ys], "--", color="#9b59b6", label="MFU (real tokens)")
            ax.set(ylabel="MFU (%)", title="Model FLOPs utilisation")
            ax.set_ylim(bottom=0)
            ax.legend(loc="lower right")
        else:
            ax.plot(*_series(train, "model_tflops_per_second"), color="#9b59b6")
            ax.set(ylabel="model TFLOP/s", title="Model FLOP/s")
        ax.set_xlabel("optimizer step")
        ax.grid(alpha=0.3)
    return _png(fig)


def time_totals(run: RunData) -> dict[str, float]:
    """Seconds per part of the time breakdown: metrics.json totals, else the rows' windows summed."""
    recorded = {p: run.metrics.get(row_key(p)) for p in PHASES}
    totals = {p: float(v) for p, v in recorded.items() if isinstance(v, (int, float))}
    if totals:
        return totals
    summed: dict[str, float] = {}
    for r in run.rows:
        for p in PHASES:
            v = r.get(row_key(p))
            if isinstance(v, (int, float)):
                summed[p] = summed.get(p, 0.0) + float(v)
    return summed


def plot_time(run: RunData) -> bytes | None:
    totals = time_totals(run)
    windows = [r for r in run.rows if any(isinstance(r.get(row_key(p)), (int, float)) for p in PHASES)]
    if not totals and not windows:
        return None
    # the pie's legend sits in the gap, or in the right margin when the pie is alone
    fig, axes = _figure(2 if windows else 1, height=3.8, left=0.3, gap=2.6, right=0.3 if windows else 5.5)
    wall = sum(totals.values())
    if totals and wall > 0:
        ax = axes[0]
        shown = [p for p in PHASES if totals.get(p, 0.0) > 0]
        ax.pie(
            [totals[p] for p in shown],
            colors=[PHASE_COLORS[p] for p in shown],
            startangle=90,
            counterclock=False,
            wedgeprops={"width": 0.4, "edgecolor": "white"},
        )
        ax.legend(
            [f"{p} {totals[p] / wall:.1%}" for p in shown],
            loc="center left",
            bbox_to_anchor=(1.0, 0.5),
            fontsize=8,
            frameon=False,
        )
        ax.set_title(f"Where the time went ({wall:.1f} s)")
    if windows:
        ax = axes[-1]
        steps = [r["step"] for r in windows]
        bottom = [0.0] * len(windows)
        walls = []
        for r in windows:
            w = r.get(row_key("wall"))
            w = w if isinstance(w, (int, float)) and w > 0 else sum(float(r.get(row_key(p)) or 0) for p in PHASES)
            walls.append(w or 1.0)
        width = max(0.8 * (steps[1] - steps[0]), 0.5) if len(steps) > 1 else 0.8
        for p in PHASES:
            vals = [100 * float(r.get(row_key(p)) or 0) / w for r, w in zip(windows, walls)]
            if any(vals):
                ax.bar(steps, vals, bottom=bottom, width=width, color=PHASE_COLORS[p], label=p)
                bottom = [b + v for b, v in zip(bottom, vals)]
        ax.set(
            xlabel="optimizer step (end of log window)",
            ylabel="% of window",
            ylim=(0, 100),
            title="Time breakdown per log window",
        )
        if not totals:
            ax.legend(fontsize=8)
    return _png(fig)


def plot_memory(run: RunData) -> bytes | None:
    bars = [(label, run.metrics[k]) for k, label in MEMORY_KEYS if isinstance(run.metrics.get(k), (int, float))]
    mem_keys = sorted({k for r in run.train_rows for k in r if k.endswith("_bytes") and _has(run.train_rows, k)})
    if not bars and not mem_keys:
        return None
    fig, axes = _figure(2 if bars and mem_keys else 1, height=3.4, left=1.5)  # room for the bars' names
    if bars:
        ax = axes[0]
        labels = [b[0] for b in bars]
        values = [b[1] / 2**20 for b in bars]
        ax.barh(labels, values, color="#3b7dd8")
        for y, (v, raw) in enumerate(zip(values, (b[1] for b in bars))):
            ax.text(v, y, f" {fmt_bytes(raw)}", va="center", fontsize=8)
        ax.invert_yaxis()
        ax.set(xlabel="MiB", title="Memory")
        ax.margins(x=0.25)
    if mem_keys:
        ax = axes[-1]
        for k in mem_keys:
            xs, ys = _series(run.train_rows, k)
            ax.plot(xs, [y / 2**20 for y in ys], label=k.removesuffix("_bytes"))
        ax.set(xlabel="optimizer step", ylabel="MiB", title="Memory over time")
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
    return _png(fig)


def _source_series(rows: list[dict[str, Any]], name: str, key: str) -> tuple[list[float], list[float]]:
    return _series([{"step": r["step"], **(r.get("sources") or {}).get(name, {})} for r in rows if "step" in r], key)


def plot_sources(run: RunData) -> bytes | None:
    """A mixture: each source's training and evaluation loss (a curve a source), and the share of the training
    tokens each was drawn in so far beside the share asked of it."""
    sources = run.metrics.get("sources") or {}
    names = list(sources) or sorted({n for r in run.rows for n in (r.get("sources") or {})})
    if not names:
        return None
    fig, (ax, ax_share) = _figure(2)
    colors = ["#3b7dd8", "#d9534f", "#6aa84f", "#e4a11b", "#9b59b6", "#8e6c4a", "#17becf", "#aaaaaa"]
    for i, name in enumerate(names):
        color = colors[i % len(colors)]
        if _source_series(run.train_rows, name, "loss")[0]:
            ax.plot(*_source_series(run.train_rows, name, "loss"), color=color, alpha=0.8, label=f"{name} train")
        if _source_series(run.eval_rows, name, "eval_loss")[0]:
            ax.plot(*_source_series(run.eval_rows, name, "eval_loss"), "o--", color=color, label=f"{name} eval")
        ax_share.plot(*_source_series(run.train_rows, name, "share_tokens"), color=color, label=f"{name} drawn")
        weight = sources.get(name, {}).get("weight")
        if isinstance(weight, (int, float)):
            ax_share.axhline(weight, color=color, linestyle=":", label=f"{name} asked")
    ax.set(xlabel="optimizer step", ylabel="loss", title="Loss by source")
    ax_share.set(xlabel="optimizer step", ylabel="share of training tokens", title="Shares drawn so far")
    for a in (ax, ax_share):
        a.legend(fontsize=8)
        a.grid(alpha=0.3)
    return _png(fig)


def source_table(run: RunData) -> str:
    """A mixture's sources: the share asked, the shares drawn, passes over each one's rows and its evaluation."""
    sources = run.metrics.get("sources") or {}
    if not sources:
        return ""
    keys = sorted({k for row in sources.values() for k in row if k.startswith("eval_")})
    head = ["source", "asked", "drawn (examples)", "drawn (tokens)", "passes", *(k.removeprefix("eval_") for k in keys)]
    out = ["<table><tr>" + "".join(f"<th>{html.escape(h)}</th>" for h in head) + "</tr>"]
    for name, row in sources.items():
        cells = [
            _percent(row.get("weight")),
            _percent(row.get("share_examples")),
            _percent(row.get("share_tokens")),
            fmt_value("epochs", row.get("epochs")),
            *(fmt_value(k, row.get(k)) for k in keys),
        ]
        out.append(f"<tr><th>{html.escape(name)}</th>" + "".join(f"<td class='num'>{c}</td>" for c in cells) + "</tr>")
    return "".join(out) + "</table>"


def _percent(value: Any) -> str:
    return f"{value:.1%}" if isinstance(value, (int, float)) else "-"


PLOTS: list[tuple[str, str, Callable[[RunData], bytes | None]]] = [
    ("loss", "Loss and learning rate", plot_loss),
    ("sources", "Sources of the mixture", plot_sources),
    ("reward", "Reward", plot_reward),
    ("eval", "Evaluation metrics", plot_eval),
    ("throughput", "Throughput and MFU", plot_throughput),
    ("time", "Time breakdown", plot_time),
    ("memory", "Memory", plot_memory),
]


# -- page ------------------------------------------------------------------------------------------

#: how a metric is called wherever runs are shown (this page, `leantrain compare`)
METRIC_LABELS = {
    "eval_accuracy": "eval accuracy",
    "eval_macro_f1": "eval macro-F1",
    "eval_loss": "eval loss",
    "eval_reward": "eval reward (greedy)",
    "train_loss": "train loss (last log)",
    "optimizer_steps": "optimizer steps",
    "epochs": "epochs",
    "train_samples_per_second": "samples/s (train)",
    "steady_samples_per_second": "samples/s (steady)",
    "train_tokens_per_second": "tokens/s (no padding)",
    "padding_fraction": "padding",
    "model_tflops_per_second": "model TFLOP/s",
    "steady_mfu": "MFU (steady, padded tokens)",
    "mfu": "MFU (padded tokens)",
    "mfu_useful": "MFU (real tokens)",
    "train_seconds": "training time",
    "wall_seconds": "wall time",
    "peak_memory_over_baseline_bytes": "peak memory over baseline",
    "peak_memory_bytes": "peak memory (process)",
    "weights_bytes": "weights",
    "gradients_bytes": "gradients",
    "optimizer_state_bytes": "optimizer state",
    "precision": "precision",
    "num_processes": "processes",
}

HEADLINE = [
    *("eval_accuracy", "eval_macro_f1", "eval_loss", "eval_reward", "train_loss", "optimizer_steps"),
    *("train_samples_per_second", "steady_samples_per_second", "train_tokens_per_second", "padding_fraction"),
    *("model_tflops_per_second", "steady_mfu", "mfu", "mfu_useful"),
    *("peak_memory_over_baseline_bytes", "optimizer_state_bytes", "precision", "num_processes", "wall_seconds"),
]

CSS = """
body { font-family: system-ui, -apple-system, 'Segoe UI', sans-serif; margin: 2em auto; max-width: 1100px;
       color: #222; padding: 0 1em; }
h1 { font-size: 1.5em; margin-bottom: 0.2em; } h2 { font-size: 1.15em; margin-top: 1.8em;
     border-bottom: 1px solid #ddd; padding-bottom: 0.2em; }
.sub { color: #666; margin-top: 0; }
.badge { display: inline-block; padding: 0.1em 0.5em; border-radius: 0.3em; font-size: 0.8em;
         background: #e8f1fb; color: #1d5fa8; } .badge.warn { background: #fdf0dc; color: #8a5a00; }
table { border-collapse: collapse; font-size: 0.9em; } td, th { padding: 0.2em 0.9em 0.2em 0; text-align: left;
        vertical-align: top; } td.num { font-variant-numeric: tabular-nums; }
.grid { display: grid; grid-template-columns: repeat(auto-fill, minmax(330px, 1fr)); gap: 0 2em; }
img { max-width: 100%; height: auto; display: block; margin: 0.5em 0; }
pre { background: #f6f6f6; padding: 0.8em; overflow-x: auto; font-size: 0.85em; }
details summary { cursor: pointer; color: #1d5fa8; }
"""

# Sets data-images-loaded on <body> once every plot has decoded (read by tests and scripts).
SCRIPT = """
window.addEventListener('load', function () {
  var imgs = Array.prototype.slice.call(document.images);
  var ok = imgs.filter(function (i) { return i.complete && i.naturalWidth > 0 && i.naturalHeight > 0; });
  document.body.setAttribute('data-images-total', String(imgs.length));
  document.body.setAttribute('data-images-loaded', String(ok.length));
});
"""


def _table(pairs: list[tuple[str, str]]) -> str:
    rows = "".join(f"<tr><th>{html.escape(k)}</th><td class='num'>{html.escape(v)}</td></tr>" for k, v in pairs)
    return f"<table>{rows}</table>"


def render_report(run: RunData) -> str:
    m = run.metrics
    title = f"leantrain run {run.name}"
    status = (
        "<span class='badge'>finished</span>"
        if run.finished
        else "<span class='badge warn'>in progress or failed: read from .incomplete/</span>"
    )
    model = run.config.get("model") or "?"
    data = run.config.get("data") or "?"
    if isinstance(data, list):  # a mixture
        names = (x if isinstance(x, str) else x.get("name") or x.get("path") for x in data)
        data = "a mixture of " + ", ".join(str(n) for n in names)
    parts = [
        f"<h1>{html.escape(title)} {status}</h1>",
        f"<p class='sub'>{html.escape(str(model))} on {html.escape(str(data))} &middot; "
        f"{html.escape(str(run.display_path))} &middot; report written {time.strftime('%Y-%m-%d %H:%M')}</p>",
    ]
    headline = _headline(m)
    if headline:
        half = (len(headline) + 1) // 2
        parts.append(
            "<h2>Summary</h2><div class='grid'>" + _table(headline[:half]) + _table(headline[half:]) + "</div>"
        )
    peak_note = _peak_note(run)
    if peak_note:
        parts.append(f"<p class='sub'>{html.escape(peak_note)}</p>")
    parts += _plot_sections(run)
    if run.evaluation.get("per_class"):
        parts.append(_evaluation_tables(run.evaluation))
    totals = time_totals(run)
    if totals:
        wall = sum(totals.values()) or 1.0
        parts.append(_table([(p, f"{totals[p]:.2f} s ({totals[p] / wall:.1%})") for p in PHASES if p in totals]))
    if m:
        parts.append(
            "<h2>All final metrics</h2><details><summary>metrics.json</summary>"
            + _table([(k, fmt_value(k, v)) for k, v in m.items() if k != "sources"])
            + "</details>"
        )
    if run.config_text:
        parts.append(_config_section(run))
    env = run.environment or {k: m[k] for k in ("precision", "num_processes") if k in m}
    if env:
        parts.append("<h2>Environment</h2>" + _table([(k, fmt_value(k, v)) for k, v in env.items()]))
    if not run.rows:
        parts.append("<p class='sub'>metrics.jsonl is empty or missing: no curves to draw.</p>")
    body = "\n".join(parts)
    return (
        f"<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
        f"<meta name='viewport' content='width=device-width, initial-scale=1'>"
        f"<style>{CSS}</style><script>{SCRIPT}</script></head>\n<body>\n{body}\n</body></html>\n"
    )


def _plot_sections(run: RunData) -> list[str]:
    """Each plot the run has data for, under its heading (a mixture's sources with their table)."""
    parts = []
    for anchor, heading, plot in PLOTS:
        png = plot(run)
        if png is None:
            continue
        data_uri = "data:image/png;base64," + base64.b64encode(png).decode("ascii")
        parts.append(
            f"<h2 id='{anchor}'>{html.escape(heading)}</h2>"
            f"<img src='{data_uri}' alt='{html.escape(heading)}' data-plot='{anchor}'>"
        )
        if anchor == "sources":
            parts.append(source_table(run))
    return parts


def _headline(m: dict[str, Any]) -> list[tuple[str, str]]:
    """The summary: every evaluation score the run reported (a language model's perplexity and exact match too),
    then HEADLINE's other figures."""
    scores = [k for k in m if k.startswith("eval_") and k not in HEADLINE and isinstance(m[k], (int, float))]
    keys = [k for k in HEADLINE if k.startswith("eval_")] + scores + [k for k in HEADLINE if not k.startswith("eval_")]
    return [
        (metric_label(k), (fmt_score if k.startswith("eval_") else fmt_value)(k, m.get(k)))
        for k in keys
        if m.get(k) is not None
    ]


def metric_label(key: str) -> str:
    """METRIC_LABELS' name, else the score's own (`eval_rewards/accuracies` -> `eval rewards/accuracies`)."""
    return METRIC_LABELS.get(key) or f"eval {key.removeprefix('eval_').replace('_', ' ')}"


def _config_section(run: RunData) -> str:
    """What the run set, and its whole config.yaml folded away."""
    return (
        "<h2>Config</h2><p class='sub'>what this run set (every other setting at its default); rerun with "
        "<code>leantrain train --config config.yaml</code></p>"
        + _table([(k, str(v)) for k, v in _set_config(run.config).items()])
        + "<details><summary>config.yaml, every setting</summary><pre>"
        + html.escape(run.config_text)
        + "</pre></details>"
    )


def _set_config(config: dict[str, Any]) -> dict[str, Any]:
    """The settings a run gave other values than the defaults (its model and data always), in config.yaml's order."""
    import dataclasses

    from leantrain.config import TrainConfig

    defaults = {f.name: f.default for f in dataclasses.fields(TrainConfig)}
    return {
        k: v
        for k, v in config.items()
        if k in ("model", "data") or (k in defaults and v != defaults[k] and v is not None) or k not in defaults
    }


def _evaluation_tables(report: dict[str, Any]) -> str:
    """The final evaluation's per-class table and its confusion matrix (rows: true class, columns: predicted)."""
    names = [str(n) for n in report.get("labels", [])]
    per_class = report.get("per_class", {})
    head = "<tr><th>class</th><th>precision</th><th>recall</th><th>F1</th><th>support</th></tr>"
    rows = "".join(
        f"<tr><th>{html.escape(n)}</th>"
        + "".join(f"<td class='num'>{per_class[n][k]:.4f}</td>" for k in ("precision", "recall", "f1"))
        + f"<td class='num'>{per_class[n]['support']:,}</td></tr>"
        for n in names
        if n in per_class
    )
    matrix = report.get("confusion_matrix")
    if matrix is None:  # multi-label: each class predicted at the threshold
        at = f" (each class at probability {report['threshold']:g} or above)" if "threshold" in report else ""
        return f"<h2 id='classes'>Classes (final evaluation{at})</h2><table>{head}{rows}</table>"
    cells = "<tr><th>true \\ predicted</th>" + "".join(f"<th>{html.escape(n)}</th>" for n in names) + "</tr>"
    for name, row in zip(names, matrix):
        cells += f"<tr><th>{html.escape(name)}</th>" + "".join(f"<td class='num'>{v:,}</td>" for v in row) + "</tr>"
    return (
        "<h2 id='classes'>Classes (final evaluation)</h2><div class='grid'>"
        f"<table>{head}{rows}</table><table data-table='confusion'>{cells}</table></div>"
    )


def _peak_note(run: RunData) -> str:
    env, m = run.environment, run.metrics
    source = env.get("peak_source") or m.get("peak_source")
    tflops = env.get("peak_tflops") or m.get("peak_tflops")
    if not (source and tflops):
        return ""
    return f"MFU is against a peak of {float(tflops):.3g} TFLOP/s ({source})."


def write_report(run_dir: str | Path, output: str | Path | None = None) -> Path:
    """Render RUN_DIR's report.html (or `output`); returns its path."""
    from leantrain.run.directory import output_file, output_folder

    path = output_file(output, (".html", ".htm")) if output is not None else Path(run_dir) / REPORT_NAME
    run = load_run(run_dir)
    page = render_report(run)
    output_folder(path)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(page, encoding="utf-8")
    tmp.replace(path)
    return path
