"""Freed memory kept in the heap against glibc's heap as it is: the real `leantrain train`, alternating runs.

glibc maps each block above its mmap threshold (which rises to at most 32 MiB) apart and unmaps it when freed, and
trims the heap's top: a block allocated again every step, such as the 47 MiB dense gradient of MiniLM's 30k-row
embedding table, page-faults over all its pages anew. `kept` is leantrain's default since 2026-12-02
(`telemetry.memory.freed_memory_kept`: glibc told to map nothing apart and never trim, for the run), so that every
step reuses the pages of the step before; `glibc` runs with LEANTRAIN_KEEP_FREED_MEMORY=0. It runs the trainer
comparison's SST-2 job (the same flags, the first N rows of SST-2 train, dev for evaluation) both ways in
alternating rounds, each run its own process with an empty cache, and records samples/s, the loop's phases, the
whole process's wall time, the run's page faults and its peak memory. Ratios are kept over glibc's, per round;
medians over the quiet rounds.

    python benchmarks/heap.py --rounds 3            # -> benchmarks/results/heap.md and .json
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # `benchmarks` as a package when run as a script
from benchmarks import _rounds
from benchmarks.trainer_comparison import QUIET_CORES, OtherLoad, leantrain_command, run_child

SETTINGS = {"glibc": {"LEANTRAIN_KEEP_FREED_MEMORY": "0"}, "kept": {}}


def lm_command(train: Path, dev: Path, precision: str, out: Path, cache: Path) -> list[str]:
    """`--job lm`: `preset:tiny-llama` pretrained from scratch on the slice's sentences (packed rows of 128 tokens,
    16 a step, one epoch; its tokenizer trained on them), dev's sentences held out."""
    flags = {
        "model": "preset:tiny-llama", "data": train, "eval-data": dev, "text-column": "sentence",
        "max-length": 128, "batch-size": 16, "epochs": 1, "lr": 3e-3, "seed": 0, "precision": precision,
        "metric-for-best": "loss", "output-dir": out, "cache-dir": cache,
    }  # fmt: skip
    return [sys.executable, "-m", "leantrain.commands.cli", "train", "--no-progress"] + [
        arg for name, value in flags.items() for arg in (f"--{name}", str(value))
    ]


def run(setting: str, train: Path, dev: Path, fresh: Path, precision: str, job: str) -> dict:
    import json

    from leantrain.model.loading import embedded_model_path

    if job == "lm":
        cmd = lm_command(train, dev, precision, fresh / "run", fresh / "cache")
    else:
        cmd = leantrain_command(embedded_model_path(), train, dev, precision, fresh / "run", fresh / "cache", None)
    env = {k: v for k, v in os.environ.items() if k != "GLIBC_TUNABLES" and not k.startswith("MALLOC_")}
    env.update(SETTINGS[setting])
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    with OtherLoad() as load:
        seconds = run_child(cmd, fresh / "run.log", env)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    m = json.loads((fresh / "run" / "metrics.json").read_text())
    return {
        "setting": setting,
        "others": load.cores,
        "process_seconds": seconds,
        "minor_faults": after.ru_minflt - before.ru_minflt,
        "system_seconds": after.ru_stime - before.ru_stime,
        "samples_per_second": m["train_samples_per_second"],
        "forward_backward_seconds": m["time_forward_backward_seconds"],
        "optimizer_seconds": m["time_optimizer_seconds"],
        "eval_seconds": m["time_eval_seconds"],
        "peak_memory_bytes": m.get("peak_memory_bytes"),
        "train_loss": m["train_loss"],
    }


FIELDS = [  # (key, heading, format)
    ("samples_per_second", "samples/s", "{:.1f}"),
    ("forward_backward_seconds", "forward+backward s", "{:.2f}"),
    ("optimizer_seconds", "optimizer s", "{:.2f}"),
    ("eval_seconds", "final eval s", "{:.2f}"),
    ("process_seconds", "whole process s", "{:.1f}"),
    ("minor_faults", "page faults", "{:,.0f}"),
    ("system_seconds", "system CPU s", "{:.2f}"),
    ("peak_memory_bytes", "peak MiB", "{:.0f}"),
]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    _rounds.add_flags(p, "alternating (glibc, kept) rounds")
    p.add_argument("--precision", default="fp32", choices=["fp32", "bf16"])
    p.add_argument("--job", default="sst2", choices=["sst2", "lm"], help="MiniLM on SST-2, or tiny-llama on its text")
    args = p.parse_args(argv)
    runs, started = _rounds.alternate(
        args,
        "heap",
        list(SETTINGS),
        lambda setting, train, dev, fresh: run(setting, train, dev, fresh, args.precision, args.job),
    )
    name = "heap" if args.job == "sst2" else "heap_lm"
    _rounds.publish(args, name, render(runs, args, started), runs, started, argv, script="heap.py")
    return 0


def render(runs: list[dict], args: argparse.Namespace, started: str) -> list[str]:
    quiet = _rounds.quiet_rounds(runs, args.rounds)
    by = {(x["round"], x["setting"]): x for x in runs}
    lines = [
        "# Freed memory kept in the heap against glibc's heap as it is",
        "",
        f"`leantrain train` on the first {args.rows} rows of SST-2 train (dev for evaluation), {args.precision}, "
        + (
            "MiniLM, batch 32, 1 epoch, max length 128, "
            if args.job == "sst2"
            else "`preset:tiny-llama` from scratch on the sentences (labels dropped), 16 packed rows of 128 tokens, "
            "1 epoch, "
        )
        + "each run its own process with an empty cache; "
        "`kept`: leantrain's default (glibc's M_MMAP_MAX 0 and a 2 GiB M_TRIM_THRESHOLD for the run); `glibc`: "
        "LEANTRAIN_KEEP_FREED_MEMORY=0. "
        f"{len(quiet)} of {args.rounds} rounds quiet (other processes at most {QUIET_CORES} cores during both runs); "
        f"started {started}.",
        "",
        "| setting | " + " | ".join(h for _, h, _ in FIELDS) + " |",
        "|---|" + "---|" * len(FIELDS),
    ]
    for setting in SETTINGS:
        medians = {}
        for key, _, _ in FIELDS:
            values = [by[(r, setting)][key] for r in quiet if by[(r, setting)][key] is not None]
            medians[key] = statistics.median(values) if values else None
        lines.append(f"| {setting} (median) | " + cells(medians) + " |")
    ratios = [by[(r, "kept")]["samples_per_second"] / by[(r, "glibc")]["samples_per_second"] for r in quiet]
    whole = [by[(r, "glibc")]["process_seconds"] / by[(r, "kept")]["process_seconds"] for r in quiet]
    if ratios:
        lines += [
            "",
            f"kept / glibc, samples/s: median {statistics.median(ratios):.3f} (rounds: "
            + ", ".join(f"{x:.3f}" for x in ratios)
            + f"); whole process (glibc's seconds / kept's): median {statistics.median(whole):.3f} ("
            + ", ".join(f"{x:.3f}" for x in whole)
            + ").",
        ]
    headings = " | ".join(h for _, h, _ in FIELDS)
    lines += ["", "## Every run", "", f"| round | setting | others | {headings} | train loss |"]
    lines.append("|---|---|---|" + "---|" * (len(FIELDS) + 1))
    for x in runs:
        lines.append(f"| {x['round']} | {x['setting']} | {x['others']:.2f} | {cells(x)} | {x['train_loss']:.6f} |")
    return lines


def cells(values: dict) -> str:
    out = []
    for key, _, fmt in FIELDS:
        v = values[key]
        if key == "peak_memory_bytes" and v is not None:
            v /= 2**20
        out.append(fmt.format(v) if v is not None else "-")
    return " | ".join(out)


if __name__ == "__main__":
    sys.exit(main())
