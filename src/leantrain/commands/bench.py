"""`leantrain bench`: the same short job under the baseline and under each technique, side by side.

Each configuration runs in its own process (`python -m leantrain train ...`), so peak memory is that
job's alone and one job's allocator or compile cache cannot flatter the next. Throughput is the steady
rate after the first optimizer steps (see telemetry.Throughput); every figure is also given relative to
the baseline measured in the same bench, which is what survives a noisy, shared machine.
"""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from leantrain.config import to_flags, without_unswitched
from leantrain.errors import ConfigError
from leantrain.model.optimizers import OPTIMIZERS

#: name -> overrides of the user's job. "baseline" is fp32 AdamW whatever the job says.
TECHNIQUES: dict[str, dict[str, Any]] = {
    "baseline": {"precision": "fp32", "optimizer": "adamw"},
    "bf16": {"precision": "bf16"},
    "fp16": {"precision": "fp16"},
    "grad_accum4": {"grad_accum": 4},  # micro-batch divided by 4: same global batch
    "activation_ckpt": {"activation_checkpointing": True},
    "compile": {"compile": True},
    "torch_dropout": {"fast_dropout": False},  # torch's CPU dropout draws, where the baseline draws its own
    "bf16+activation_ckpt": {"precision": "bf16", "activation_checkpointing": True},
    "bf16+adafactor": {"precision": "bf16", "optimizer": "adafactor"},
    "lean": {"precision": "bf16", "activation_checkpointing": True, "optimizer": "adamw8bit"},
    # --- LoRA: adapters and head train over a frozen base (changes what trains, unlike the rest)
    "lora": {"lora": True},
    "qlora4bit": {"lora": True, "quantize": "4bit"},
    "qlora8bit": {"lora": True, "quantize": "8bit"},
    # --- preference tuning (dpo, kto): the reference's forms; the baseline holds a frozen copy
    "precompute_reference": {"precompute_reference": True},
    "lora+precompute_reference": {"lora": True, "precompute_reference": True},
    # every registered optimizer but the baseline's, by its own name
    **{name: {"optimizer": name} for name in OPTIMIZERS if name != "adamw"},
}
DEFAULT_TECHNIQUES = (
    "baseline",
    "bf16",
    "fp16",
    "grad_accum4",
    "activation_ckpt",
    "adafactor",
    "adamw8bit",
    "bf16+activation_ckpt",
    "bf16+adafactor",
    "lean",
    "lora",
)


@dataclass
class BenchRow:
    name: str
    overrides: dict[str, Any]
    metrics: dict[str, Any] | None
    error: str | None = None


def parse_techniques(text: str | None) -> list[str]:
    names = list(DEFAULT_TECHNIQUES) if not text else [t.strip() for t in text.split(",") if t.strip()]
    unknown = [n for n in names if n not in TECHNIQUES]
    if unknown:
        raise ConfigError(f"--techniques: unknown {', '.join(unknown)}; choose from {', '.join(TECHNIQUES)}")
    if "baseline" not in names:
        names.insert(0, "baseline")
    return names


def job_overrides(name: str, base: dict[str, Any]) -> dict[str, Any]:
    """The overrides for technique `name`, applied on top of the fp32/AdamW baseline of the job."""
    over = {**TECHNIQUES["baseline"], **TECHNIQUES[name]}
    if "grad_accum" in TECHNIQUES[name]:
        k = TECHNIQUES[name]["grad_accum"] * base.get("grad_accum", 1)
        from leantrain.config import TrainConfig

        batch = TrainConfig.from_dict(base).batch_size_or_default()  # the default job's own where not given
        if batch % k:
            raise ConfigError(f"--batch-size {batch} is not divisible by {k} for technique {name}")
        over.update(grad_accum=k, batch_size=batch // k)
    return over


def run_bench(
    base: dict[str, Any],
    techniques: list[str],
    steps: int | None,
    bench_dir: Path,
    say=print,
    timeout: float = 3600,
    repeats: int = 1,
) -> list[BenchRow]:
    """Run every technique as its own `leantrain train` process; `steps=None` trains --epochs fully.

    With repeats > 1 the whole list runs round-robin that many times (so a neighbour's load hits all
    techniques alike) and each technique keeps the run with the median steady throughput.
    """
    bench_dir.mkdir(parents=True, exist_ok=True)
    runs: dict[str, list[BenchRow]] = {name: [] for name in techniques}
    for _ in range(repeats):
        for row in _run_once(base, techniques, steps, bench_dir, say, timeout):
            runs[row.name].append(row)

    def steady(r: BenchRow) -> float:
        assert r.metrics is not None  # only runs with metrics are sorted
        return r.metrics["steady_samples_per_second"]

    rows = []
    for tries in runs.values():
        ok = sorted((r for r in tries if r.metrics), key=steady)
        rows.append(ok[len(ok) // 2] if ok else tries[0])
    return rows


def _run_once(base, techniques, steps, bench_dir, say, timeout) -> list[BenchRow]:
    return [
        run_job(name, job_overrides(name, base), base, steps, bench_dir / "runs" / name.replace("+", "_"), say, timeout)
        for name in techniques
    ]


def run_job(
    name: str,
    over: dict[str, Any],
    base: dict[str, Any],
    steps: int | None,
    out_dir: Path,
    say=print,
    timeout: float = 3600,
    env: dict[str, str] | None = None,
) -> BenchRow:
    """Train `base` with `over` on top in its own `leantrain train` process; its metrics.json, or the error.

    `steps=None` trains --epochs fully. `env` adds environment variables (the planner's probe uses it)."""
    # the job's LoRA and optimizer settings go to the candidates that read them (a run refuses them elsewhere)
    job = without_unswitched({**base, **over, "output_dir": str(out_dir), "overwrite": True, "progress": False})
    if steps is not None:
        job.update(max_steps=steps, log_every=max(1, steps // 3))
    cmd = [sys.executable, "-m", "leantrain", "train", *to_flags(job)]
    say(f"bench: {name} ...")
    started = time.perf_counter()
    proc = subprocess.run(
        cmd, capture_output=True, text=True, timeout=timeout, env={**os.environ, **env} if env else None
    )
    if proc.returncode != 0:
        err = (proc.stderr.strip().splitlines() or ["failed"])[-1]
        say(f"bench: {name} failed: {err}")
        return BenchRow(name, over, None, err)
    metrics = json.loads((Path(job["output_dir"]) / "metrics.json").read_text())
    metrics["process_seconds"] = time.perf_counter() - started
    say(f"bench: {name}: {metrics['steady_samples_per_second']:.1f} samples/s")
    return BenchRow(name, over, metrics)


COLUMNS = [
    ("samples/s", "steady_samples_per_second", 1, ".1f"),
    ("tokens/s", "steady_tokens_per_second", 1, ".0f"),
    ("MFU", "steady_mfu", 1, ".1%"),
    ("peak MB", "peak_memory_over_baseline_bytes", 2**-20, ".0f"),
    ("activations MB", "activation_bytes_estimate", 2**-20, ".0f"),
    ("optim state MB", "optimizer_state_bytes", 2**-20, ".1f"),
    ("train loss", "train_loss", 1, ".4f"),
]
#: a preference task's reference: the weights it holds beside the policy and the seconds it took to set up (a
#: precomputation's passes over the data), shown when the job has one
REFERENCE_COLUMNS = [("reference MB", "reference_bytes", 2**-20, ".1f"), ("reference s", "reference_seconds", 1, ".1f")]
#: the held-out score, whichever the task reports: a classifier's accuracy, a language model's perplexity, a token
#: classifier's entity F1, a sequence-to-sequence model's ROUGE-L or BLEU, a preference model's reward accuracy
EVAL_COLUMNS: list[tuple[str, str, float, str]] = [
    ("eval acc", "eval_accuracy", 1, ".4f"),
    ("eval ppl", "eval_perplexity", 1, ".2f"),
    ("eval F1", "eval_f1", 1, ".4f"),
    ("eval ROUGE-L", "eval_rougeL", 1, ".2f"),
    ("eval BLEU", "eval_bleu", 1, ".2f"),
    ("eval reward acc", "eval_rewards/accuracies", 1, ".4f"),
]


def _value(row: BenchRow, key: str) -> float | None:
    if row.metrics is None:
        return None
    if key == "activation_bytes_estimate":
        m = row.metrics
        peak = m.get("peak_memory_over_baseline_bytes")
        if peak is None:
            return None
        # what the step needed beyond gradients and optimizer state: activations and workspace
        return max(peak - m["gradients_bytes"] - m["optimizer_state_bytes"], 0)
    return row.metrics.get(key)


def table_rows(rows: list[BenchRow]) -> list[dict[str, Any]]:
    base = next((r for r in rows if r.name == "baseline" and r.metrics), None)
    scores = [c for c in EVAL_COLUMNS if any(_value(r, c[1]) is not None for r in rows)] or EVAL_COLUMNS[:1]
    scores += [c for c in REFERENCE_COLUMNS if any(_value(r, c[1]) is not None for r in rows)]
    out = []
    for r in rows:
        rec: dict[str, Any] = {"technique": r.name, "error": r.error}
        for label, key, scale, _ in COLUMNS + scores:
            v = _value(r, key)
            rec[label] = v * scale if v is not None else None
            b = _value(base, key) if base else None
            rec[f"{label} vs baseline"] = (v / b) if (v is not None and b) else None
        out.append(rec)
    return out


def render(records: list[dict[str, Any]]) -> str:
    import io

    from rich.console import Console
    from rich.table import Table

    table = Table(title="leantrain bench (relative to the fp32/AdamW baseline in brackets)")
    table.add_column("technique")
    columns = COLUMNS + [c for c in EVAL_COLUMNS + REFERENCE_COLUMNS if records and c[0] in records[0]]
    for label, _, _, _ in columns:
        table.add_column(label, justify="right")
    for rec in records:
        cells = []
        for label, _, _, fmt in columns:
            v, rel = rec[label], rec[f"{label} vs baseline"]
            cells.append("-" if v is None else f"{v:{fmt}}" + (f" ({rel:.2f}x)" if rel is not None else ""))
        table.add_row(rec["technique"] + (" [failed]" if rec["error"] else ""), *cells)
    buffer = io.StringIO()
    console = Console(width=160, file=buffer)
    console.print(table)
    return buffer.getvalue()


def write_outputs(records: list[dict[str, Any]], bench_dir: Path, context: dict[str, Any]) -> dict[str, Path]:
    paths = {
        "csv": bench_dir / "bench.csv",
        "png": bench_dir / "bench.png",
        "md": bench_dir / "bench.md",
        "json": bench_dir / "bench.json",
    }
    with paths["csv"].open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(records[0]))
        writer.writeheader()
        writer.writerows(records)
    paths["json"].write_text(json.dumps({"context": context, "rows": records}, indent=2) + "\n")
    _chart(records, paths["png"])
    lines = ["# leantrain bench", "", "```", render(records).rstrip(), "```", "", "| context | |", "|---|---|"]
    lines += [f"| {k} | {v} |" for k, v in context.items()]
    paths["md"].write_text("\n".join(lines) + "\n")
    return paths


def _chart(records: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = [r for r in records if not r["error"]]
    names = [r["technique"] for r in ok]
    fig, axes = plt.subplots(1, 3, figsize=(15, 0.45 * len(names) + 1.8), sharey=True)
    for ax, label in zip(axes, ("samples/s", "peak MB", "optim state MB")):
        values = [r[f"{label} vs baseline"] or 0 for r in ok]
        ax.barh(names, values, color=["#888" if n == "baseline" else "#3b7dd8" for n in names])
        ax.axvline(1.0, color="black", lw=0.8)
        ax.set_title(f"{label} (x baseline)")
        for y, v in enumerate(values):
            ax.text(v, y, f" {v:.2f}", va="center", fontsize=8)
    axes[0].invert_yaxis()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def environment_context() -> dict[str, Any]:
    """The run environment (telemetry.report.collect_environment, the one collector) as bench tables show it."""
    from leantrain.parallel import device_type
    from leantrain.run.report import collect_environment

    env = collect_environment(device="cuda" if device_type() == "cuda" else "cpu")
    return {
        "date": env["date"][:16],
        "device": env["device"],
        "cpu": env["cpu_model"],
        "cores": env["cpu_count"],
        "torch threads": env["torch_threads"],
        **{k: env[k] for k in ("python", "torch", "transformers", "accelerate", "datasets")},
    }
