"""What Python's cyclic garbage collection costs a run: `leantrain train` through `cli.entry` (collection off during
start-up, resumed at the first micro-batch with start-up's objects frozen, and every object frozen at the exit)
against the same command through `cli.main` alone (the collector as Python sets it).

A process that imports torch and transformers and builds a model holds about half a million objects that live to
its end. The collector walked them seven times as they came (1.2-1.6 s on this 2-core machine), and once more in
Python's finalization, after the last line of output (2-2.5 s; py-spy: `gc_collect_main` under `Py_FinalizeEx`).
Both settings run the trainer comparison's SST-2 job (its flags, the first N rows of SST-2 train, dev for
evaluation, `--max-steps` to keep rounds short: neither cost depends on how long the loop ran), alternating, each
run its own process with an empty cache. "start s" is from the start to the line that announces training, "exit
s" from the last line the run printed to the process's end, "whole s" from start to end, as the parent saw them.

    python benchmarks/exit.py --rounds 3            # -> benchmarks/results/exit.md and .json
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # `benchmarks` as a package when run as a script
from benchmarks import _rounds
from benchmarks.trainer_comparison import QUIET_CORES, REPO, OtherLoad, leantrain_command

#: how each setting starts the command: the `leantrain` script's way, and `main` with the collector as it is
STARTS = {
    "entry": [sys.executable, "-m", "leantrain.commands.cli"],
    "main": [sys.executable, "-c", "import sys; from leantrain.commands.cli import main; sys.exit(main())"],
}
FIELDS = [("start_seconds", "start s"), ("exit_seconds", "exit s"), ("whole_seconds", "whole s")]


def run(setting: str, flags: list[str], log: Path) -> dict:
    """One run; the seconds from its start and from its last line of output to its exit."""
    started = time.perf_counter()
    last = training = started
    with OtherLoad() as load, log.open("w") as out:
        proc = subprocess.Popen(
            [*STARTS[setting], *flags], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=REPO
        )
        assert proc.stdout is not None
        for line in proc.stdout:
            last = time.perf_counter()
            if line.startswith("leantrain: training "):
                training = last
            out.write(line)
        code = proc.wait()
    ended = time.perf_counter()
    if code != 0:
        sys.exit(f"{setting} exited with {code}; see {log}")
    return {
        "setting": setting,
        "others": load.cores,
        "start_seconds": training - started,
        "exit_seconds": ended - last,
        "whole_seconds": ended - started,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    _rounds.add_flags(p, "alternating rounds")
    p.add_argument("--max-steps", type=int, default=3, help="optimizer steps a run (default: %(default)s)")
    args = p.parse_args(argv)
    from leantrain.model.loading import embedded_model_path

    def run_one(setting: str, train: Path, dev: Path, fresh: Path) -> dict:
        cmd = leantrain_command(
            embedded_model_path(), train, dev, "fp32", fresh / "run", fresh / "cache", args.max_steps
        )
        return run(setting, cmd[3:], fresh / "run.log")  # the flags after `python -m leantrain.commands.cli`

    runs, started = _rounds.alternate(args, "exit", list(STARTS), run_one)
    _rounds.publish(args, "exit", render(runs, args, started), runs, started, argv)
    return 0


def render(runs: list[dict], args: argparse.Namespace, started: str) -> list[str]:
    quiet = _rounds.quiet_rounds(runs, args.rounds)
    by = {(x["round"], x["setting"]): x for x in runs}
    lines = [
        "# Python's garbage collection in a run: `cli.entry` against `cli.main`",
        "",
        f"`leantrain train` on the first {args.rows} rows of SST-2 train (dev for evaluation), fp32, MiniLM, "
        f"{args.max_steps} optimizer steps, each run its own process with an empty cache, the settings alternating. "
        "entry: collection off during start-up, on again at the first micro-batch with start-up's objects frozen, "
        "every object frozen at the exit; main: the collector as Python sets it. "
        f"{len(quiet)} of {args.rounds} rounds quiet (other processes at most {QUIET_CORES} cores during both "
        f"runs); started {started}.",
        "",
        "| setting | " + " | ".join(f"{h} (median)" for _, h in FIELDS) + " |",
        "|---|" + "---|" * len(FIELDS),
    ]
    for setting in STARTS:
        if quiet:
            medians = [statistics.median(by[(r, setting)][k] for r in quiet) for k, _ in FIELDS]
            lines.append(f"| {setting} | " + " | ".join(f"{c:.2f}" for c in medians) + " |")
    for key, heading in FIELDS:
        saved = [by[(r, "main")][key] - by[(r, "entry")][key] for r in quiet]
        if saved:
            each = ", ".join(f"{x:.2f}" for x in saved)
            lines.append(f"\n{heading}: entry saves {statistics.median(saved):.2f} s (median; rounds: {each}).")
    lines += ["", "## Every run", "", "| round | setting | others | " + " | ".join(h for _, h in FIELDS) + " |"]
    lines.append("|---|---|---|" + "---|" * len(FIELDS))
    for x in runs:
        cells = " | ".join(f"{x[k]:.2f}" for k, _ in FIELDS)
        lines.append(f"| {x['round']} | {x['setting']} | {x['others']:.2f} | {cells} |")
    return lines


if __name__ == "__main__":
    sys.exit(main())
