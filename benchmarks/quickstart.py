"""The quick start's default job, timed as a new user meets it: `leantrain train` with no arguments (the embedded
all-MiniLM-L6-v2 on as many rows of the embedded tweet corpus as fit its --max-time), in a fresh process with an
empty cache (reading, repairing and tokenizing the corpus, the CPU's GEMM probe and the report page included).

"whole s" is the process from start to exit as this script saw it; "training s" the run's own training time
(`train_seconds`), "evaluation s" its final evaluation, "start s" from the process's start to the line that
announces training. `--avx2` also runs the job as a CPU with AVX2 only would: torch's kernels, oneDNN and MKL held
to AVX2 (ATEN_CPU_CAPABILITY, ONEDNN_MAX_CPU_ISA, MKL_ENABLE_INSTRUCTIONS), in fp32 (bf16 would be emulated there);
each job sizes its steps from the speed of its own warm-up. Other processes' load is measured during each run (cores
of 2) and the load average before and after; quick-start times are only meaningful on a quiet machine.

    python benchmarks/quickstart.py --avx2          # -> benchmarks/results/quickstart.md and .json
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # `benchmarks` as a package when run as a script
from benchmarks._results import write_results
from benchmarks.trainer_comparison import REPO, OtherLoad

#: a process whose torch, oneDNN and MKL use AVX2 and nothing wider: a CPU without AVX-512, as far as they can tell
AVX2_ONLY = {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_ENABLE_INSTRUCTIONS": "AVX2"}
FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16")


def run(name: str, env_extra: dict[str, str], flags: list[str], work: Path) -> dict:
    out = work / name
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LEANTRAIN_", "OMP_"))}
    env.update(HF_HUB_OFFLINE="1", LEANTRAIN_CACHE=str(work / f"cache-{name}"), **env_extra)
    command = [sys.executable, "-m", "leantrain", "train", "--no-progress", "--output-dir", str(out), *flags]
    load_before = os.getloadavg()
    started = time.perf_counter()
    training_at, measured = None, None
    with OtherLoad() as others, (work / f"{name}.log").open("w") as log:
        proc = subprocess.Popen(command, env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        assert proc.stdout is not None
        for line in proc.stdout:
            if training_at is None and line.startswith("leantrain: training "):
                training_at = time.perf_counter()
            if measured is None and (found := re.search(r"--max-time .*: ([0-9.]+) s a step", line)):
                measured = float(found[1])  # seconds a step at the sizing
            log.write(line)
        code = proc.wait()
    whole = time.perf_counter() - started
    if code != 0:
        sys.exit(f"{name}: exit {code}; see {work / f'{name}.log'}")
    m = json.loads((out / "metrics.json").read_text())
    config = (out / "config.yaml").read_text()
    lr = next(float(x.split(":")[1]) for x in config.splitlines() if x.startswith("lr:"))
    batch = next(int(x.split(":")[1]) for x in config.splitlines() if x.startswith("batch_size:"))
    return {
        "job": name,
        "rows": m["train_examples"],
        "lr": lr,
        "batch_size": batch,
        "precision": m["precision"],
        "accuracy": m["eval_accuracy"],
        "macro_f1": m["eval_macro_f1"],
        "measured_samples_per_second": batch / measured if measured else None,
        "samples_per_second": m["train_samples_per_second"],
        "start_seconds": (training_at or started) - started,
        "training_seconds": m["train_seconds"],
        "evaluation_seconds": m["time_eval_seconds"],
        "whole_seconds": whole,
        "others": others.cores,
        "load_before": round(load_before[0], 2),
        "load_after": round(os.getloadavg()[0], 2),
    }


def cpu() -> tuple[str, list[str]]:
    from leantrain.parallel import cpu_flags, cpu_name

    return cpu_name(), [f for f in FLAGS if f in cpu_flags()]


def page(rows: list[dict]) -> list[str]:
    lines = [
        "# The quick start's default job",
        "",
        "`leantrain train` with no arguments, as `scripts/quickstart.sh` runs it after installing: a fresh process, an "
        "empty cache (`python benchmarks/quickstart.py --avx2`). whole: the process from start to exit; start: to the "
        "line that announces training; others: cores' worth of other processes' CPU during the run (of 2); load: the "
        "1-minute load average before and after; rows: the rows trained; measured: the speed of the job's warm-up, "
        "which sized it.",
        "",
        "| job | rows | lr | batch | precision | accuracy | macro-F1 | measured samples/s | samples/s | start s | "
        "training s | evaluation s | whole s | others | load before, after |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['job']} | {r['rows']:,} | {r['lr']:g} | {r['batch_size']} | {r['precision']} | "
            f"{r['accuracy']:.4f} | {r['macro_f1']:.4f} | {r['measured_samples_per_second'] or 0:.0f} | "
            f"{r['samples_per_second']:.1f} | {r['start_seconds']:.1f} | {r['training_seconds']:.1f} | "
            f"{r['evaluation_seconds']:.1f} | {r['whole_seconds']:.1f} | {r['others']:.2f} | "
            f"{r['load_before']}, {r['load_after']} |"
        )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--avx2", action="store_true", help="Also run the job as an AVX2-only CPU would.")
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "results"))
    parser.add_argument("--flags", default="", help="More flags for every run, e.g. '--pooler identity'.")
    args = parser.parse_args()
    extra = shlex.split(args.flags)
    import platform

    import torch
    import transformers

    import leantrain

    rows = []
    with tempfile.TemporaryDirectory(prefix="leantrain-quickstart-") as tmp:
        work = Path(tmp)
        rows.append(run("this CPU", {}, extra, work))
        if args.avx2:
            rows.append(run("AVX2 only", AVX2_ONLY, ["--precision", "fp32", *extra], work))
    name, flags = cpu()
    context = {
        "CPU": name,
        "instruction sets": ", ".join(flags) or "-",
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "leantrain": leantrain.__version__,
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        **({"flags": args.flags} if extra else {}),
    }
    print(write_results(Path(args.out), "quickstart", page(rows), context, {"runs": rows}))


if __name__ == "__main__":
    main()
