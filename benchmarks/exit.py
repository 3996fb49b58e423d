"""What a run's exit costs: `leantrain train` ending through `cli.entry` (every object frozen before Python's last
garbage collection) against the same command ending through `cli.main` alone (the collection walks them all).

Python's finalization runs one more cyclic collection, and a process that imported torch and transformers and
trained a model holds millions of objects: on this 2-core machine it took 2-2.5 s after the last line of output
(py-spy: `gc_collect_main` under `Py_FinalizeEx`). Both settings run the trainer comparison's SST-2 job (its flags,
the first N rows of SST-2 train, dev for evaluation, `--max-steps` to keep rounds short: the exit does not depend
on how long the loop ran), alternating, each run its own process with an empty cache. "exit s" is from the last
line the run printed to the process's end, as the parent saw them; "whole s" from start to end.

    python benchmarks/exit.py --rounds 3            # -> benchmarks/results/exit.md and .json
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # `benchmarks` as a package when run as a script
from benchmarks._results import write_results
from benchmarks.trainer_comparison import (
    DEFAULT_OUT,
    QUIET_CORES,
    REPO,
    SHARED_DATA,
    OtherLoad,
    environment,
    leantrain_command,
    wait_for_quiet,
    write_train_slice,
)

#: how each setting starts the command: the `leantrain` script's way, and `main` without the freeze
STARTS = {
    "entry (frozen)": [sys.executable, "-m", "leantrain.cli"],
    "main (collected)": [sys.executable, "-c", "import sys; from leantrain.cli import main; sys.exit(main())"],
}


def run(setting: str, flags: list[str], log: Path) -> dict:
    """One run; the seconds from its start and from its last line of output to its exit."""
    started = time.perf_counter()
    last = started
    with OtherLoad() as load, log.open("w") as out:
        proc = subprocess.Popen(
            [*STARTS[setting], *flags], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=REPO
        )
        assert proc.stdout is not None
        for line in proc.stdout:
            last = time.perf_counter()
            out.write(line)
        code = proc.wait()
    ended = time.perf_counter()
    if code != 0:
        sys.exit(f"{setting} exited with {code}; see {log}")
    return {"setting": setting, "others": load.cores, "whole_seconds": ended - started, "exit_seconds": ended - last}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, default=2000, help="first N rows of SST-2 train (default: %(default)s)")
    p.add_argument("--max-steps", type=int, default=3, help="optimizer steps a run (default: %(default)s)")
    p.add_argument("--rounds", type=int, default=3, help="alternating rounds (default: %(default)s)")
    p.add_argument("--wait-quiet", type=float, default=30, help="seconds to wait for a quiet machine before a run")
    p.add_argument("--out-dir", type=Path, default=DEFAULT_OUT)
    args = p.parse_args(argv)
    data = SHARED_DATA / "sst2"
    if not (data / "train.tsv").is_file():
        sys.exit(f"no SST-2 at {data} (see ../shared/data/README.md)")
    from leantrain.models import embedded_model_path

    started = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    runs: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="exit-") as tmp:
        work = Path(tmp)
        train = work / "train.tsv"
        write_train_slice(data / "train.tsv", train, args.rows)
        for r in range(args.rounds):
            for i, setting in enumerate(STARTS):
                wait_for_quiet(args.wait_quiet)
                fresh = work / f"{r}-{i}"
                cmd = leantrain_command(
                    embedded_model_path(), train, data / "dev.tsv", "fp32", fresh / "run", fresh / "cache",
                    args.max_steps,
                )  # fmt: skip
                row = {"round": r + 1, **run(setting, cmd[3:], work / f"{r}-{i}.log")}  # the flags after `-m ...`
                runs.append(row)
                print(" ".join(f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()))
    page = render(runs, args, started)
    command = "python benchmarks/exit.py " + " ".join(argv if argv is not None else sys.argv[1:])
    context = {**environment(None), "run": started, "command": command}
    print(write_results(args.out_dir, "exit", page, context, {"runs": runs}))
    return 0


def render(runs: list[dict], args: argparse.Namespace, started: str) -> list[str]:
    quiet = [r for r in range(1, args.rounds + 1) if all(x["others"] <= QUIET_CORES for x in runs if x["round"] == r)]
    by = {(x["round"], x["setting"]): x for x in runs}
    frozen, collected = STARTS
    lines = [
        "# A run's exit: every object frozen before Python's last collection, or not",
        "",
        f"`leantrain train` on the first {args.rows} rows of SST-2 train (dev for evaluation), fp32, MiniLM, "
        f"{args.max_steps} optimizer steps, each run its own process with an empty cache, the settings alternating. "
        f"{len(quiet)} of {args.rounds} rounds quiet (other processes at most {QUIET_CORES} cores during both "
        f"runs); started {started}.",
        "",
        "| setting | exit s (median) | whole s (median) | exit s per round |",
        "|---|---|---|---|",
    ]
    for setting in STARTS:
        exits = [by[(r, setting)]["exit_seconds"] for r in quiet]
        wholes = [by[(r, setting)]["whole_seconds"] for r in quiet]
        if exits:
            every = ", ".join(f"{x:.2f}" for x in exits)
            lines.append(f"| {setting} | {statistics.median(exits):.2f} | {statistics.median(wholes):.1f} | {every} |")
    saved = [by[(r, collected)]["exit_seconds"] - by[(r, frozen)]["exit_seconds"] for r in quiet]
    if saved:
        lines += ["", f"Seconds saved at each exit: median {statistics.median(saved):.2f} (rounds: "
                  + ", ".join(f"{x:.2f}" for x in saved) + ")."]  # fmt: skip
    lines += ["", "## Every run", "", "| round | setting | others | exit s | whole s |", "|---|---|---|---|---|"]
    for x in runs:
        seconds = f"{x['exit_seconds']:.2f} | {x['whole_seconds']:.1f}"
        lines.append(f"| {x['round']} | {x['setting']} | {x['others']:.2f} | {seconds} |")
    return lines


if __name__ == "__main__":
    sys.exit(main())
