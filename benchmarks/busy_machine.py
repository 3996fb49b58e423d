"""Training throughput beside a CPU-bound neighbour: OpenMP's wait policy and thread count.

Each setting trains the embedded MiniLM (AdamW, batch 16, length 48, random tokens) for --seconds in a fresh
process (OpenMP reads its settings when torch loads), alone and then with a neighbour this script starts: one
process spinning on one core, as another user's job would. Settings: libgomp's default (threads spin a while at
each barrier), `OMP_WAIT_POLICY=PASSIVE` (what the `leantrain` command set until 2026-12-02), libgomp's default
with leantrain's `ThreadGovernor` (one thread fewer per core other processes hold, measured every 2 s; what the
`leantrain` command does now), and one thread. Shorter spins (`GOMP_SPINCOUNT` 2,000 and 30,000) were measured
in an earlier run: no better than passive waits (docs/performance.md). The goal: beside the neighbour, at least
40% of the default's quiet throughput (a fair share of 2 cores is 50%). Rounds alternate the settings so that
other load on the machine falls on all of them alike; medians are reported.

    python benchmarks/busy_machine.py                    # writes benchmarks/results/busy_machine.{json,md}
    python benchmarks/busy_machine.py --seconds 5 --rounds 1   # a quick look
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
from pathlib import Path

RESULTS = Path(__file__).parent / "results"
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # `benchmarks` as a package when run as a script
DEFAULT = "2 threads, libgomp default (spin, then sleep)"
SETTINGS = {
    DEFAULT: {"OMP_NUM_THREADS": "2"},
    "2 threads, OMP_WAIT_POLICY=PASSIVE (leantrain before 2026-12-02)": {
        "OMP_NUM_THREADS": "2",
        "OMP_WAIT_POLICY": "PASSIVE",
    },
    # leantrain's default: libgomp's spinning waits, and ThreadGovernor.update() after every step
    "2 threads, libgomp default + the thread governor (leantrain)": {"OMP_NUM_THREADS": "2", "BUSY_GOVERNOR": "1"},
    "1 thread": {"OMP_NUM_THREADS": "1"},
}

STEP = r"""
import os, sys, time
import torch
from transformers import AutoModelForSequenceClassification
from leantrain.model.loading import embedded_model_path
seconds = float(sys.argv[1])
torch.manual_seed(0)
model = AutoModelForSequenceClassification.from_pretrained(str(embedded_model_path()), num_labels=2)
ids, labels = torch.randint(1000, 20000, (16, 48)), torch.zeros(16, dtype=torch.long)
opt = torch.optim.AdamW(model.parameters(), lr=1e-5)
governor = None
if os.environ.get("BUSY_GOVERNOR"):
    from leantrain.parallel.threads import ThreadGovernor
    governor = ThreadGovernor(torch.get_num_threads(), os.sched_getaffinity(0))
def step():
    model(input_ids=ids, labels=labels).loss.backward(); opt.step(); opt.zero_grad()
    if governor is not None:
        governor.update()
step()
steps, started = 0, time.perf_counter()
while time.perf_counter() - started < seconds:
    step(); steps += 1
print(16 * steps / (time.perf_counter() - started))
"""


def throughput(env: dict[str, str], seconds: float) -> float:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("OMP_", "GOMP_"))}
    src = str(Path(__file__).resolve().parents[1] / "src")
    full = {**base, **env, "HF_HUB_OFFLINE": "1", "PYTHONPATH": src + os.pathsep + base.get("PYTHONPATH", "")}
    out = subprocess.run([sys.executable, "-c", STEP, str(seconds)], env=full, capture_output=True, text=True)
    if out.returncode:
        raise RuntimeError(out.stderr.strip().splitlines()[-1])
    return float(out.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=float, default=20)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--out", type=Path, default=RESULTS)
    args = p.parse_args(argv)
    load_before = os.getloadavg()
    runs: dict[str, dict[str, list[float]]] = {name: {"quiet": [], "busy": []} for name in SETTINGS}
    for _ in range(args.rounds):
        for name, env in SETTINGS.items():
            runs[name]["quiet"].append(throughput(env, args.seconds))
            neighbour = subprocess.Popen([sys.executable, "-c", "while True: pass"])
            try:
                runs[name]["busy"].append(throughput(env, args.seconds))
            finally:
                neighbour.kill()
                neighbour.wait()
            print(name, {k: round(v[-1], 1) for k, v in runs[name].items()}, flush=True)
    rows = []
    default_quiet = statistics.median(runs[DEFAULT]["quiet"])
    for name, r in runs.items():
        quiet, busy = statistics.median(r["quiet"]), statistics.median(r["busy"])
        rows.append(
            {
                "setting": name,
                "quiet": quiet,
                "busy": busy,
                "busy_over_quiet": busy / quiet,
                "busy_over_default_quiet": busy / default_quiet,
                "runs": r,
            }
        )
    context = {
        "cpu cores": os.cpu_count(),
        "load average before / after": f"{load_before[0]:.1f} / {os.getloadavg()[0]:.1f}",
        "command": "python benchmarks/busy_machine.py " + " ".join(argv if argv is not None else sys.argv[1:]),
    }
    lines = [
        "# Beside a CPU-bound neighbour: OpenMP wait policy and threads",
        "",
        f"MiniLM training steps (AdamW, batch 16, length 48), {args.seconds:.0f} s per run, median of {args.rounds} "
        "alternating rounds; 'busy': a process spinning on a core beside it. Goal: busy >= 40% of the default's quiet.",
        "",
        "| setting | quiet samples/s | busy samples/s | busy / quiet | busy / the default's quiet |",
        "|---|---|---|---|---|",
        *[
            f"| {r['setting']} | {r['quiet']:.1f} | {r['busy']:.1f} | {r['busy_over_quiet']:.0%} "
            f"| {r['busy_over_default_quiet']:.0%} |"
            for r in rows
        ],
    ]
    from benchmarks._results import write_results

    print(write_results(args.out, "busy_machine", lines, context, {"rows": rows}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
