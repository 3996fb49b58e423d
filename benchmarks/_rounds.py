"""Benchmarks that run `leantrain train` on the first rows of SST-2 in settings that alternate, round after round
(heap.py, exit.py): their shared flags, the data slice, the rounds, and the results page with its context."""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from benchmarks._results import write_results
from benchmarks.trainer_comparison import (
    DEFAULT_OUT,
    QUIET_CORES,
    SHARED_DATA,
    environment,
    wait_for_quiet,
    write_train_slice,
)

#: run_one(setting, train slice, dev, a fresh folder for the run) -> the run's figures
RunOne = Callable[[str, Path, Path, Path], dict]


def add_flags(p: argparse.ArgumentParser, rounds_help: str) -> None:
    p.add_argument("--rows", type=int, default=2000, help="first N rows of SST-2 train (default: %(default)s)")
    p.add_argument("--rounds", type=int, default=3, help=f"{rounds_help} (default: %(default)s)")
    p.add_argument("--wait-quiet", type=float, default=30, help="seconds to wait for a quiet machine before a run")
    p.add_argument("--out-dir", type=Path, default=DEFAULT_OUT)


def alternate(args: argparse.Namespace, name: str, settings: list[str], run_one: RunOne) -> tuple[list[dict], str]:
    """Every setting once a round, each run after waiting for a quiet machine; the runs (each with its `round`)
    and when they started."""
    data = SHARED_DATA / "sst2"
    if not (data / "train.tsv").is_file():
        sys.exit(f"no SST-2 at {data} (see ../shared/data/README.md)")
    started = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    runs: list[dict] = []
    with tempfile.TemporaryDirectory(prefix=f"{name}-") as tmp:
        work = Path(tmp)
        train = work / "train.tsv"
        write_train_slice(data / "train.tsv", train, args.rows)
        for r in range(args.rounds):
            for i, setting in enumerate(settings):
                wait_for_quiet(args.wait_quiet)
                fresh = work / f"{r}-{i}"
                fresh.mkdir()
                row = {"round": r + 1, **run_one(setting, train, data / "dev.tsv", fresh)}
                runs.append(row)
                print(" ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()))
    return runs, started


def quiet_rounds(runs: list[dict], rounds: int) -> list[int]:
    """The rounds during all of whose runs other processes used at most QUIET_CORES."""
    return [r for r in range(1, rounds + 1) if all(x["others"] <= QUIET_CORES for x in runs if x["round"] == r)]


def publish(
    args: argparse.Namespace, name: str, page: list[str], runs: list[dict], started: str, argv, script: str = ""
) -> None:
    """benchmarks/results/NAME.md and .json (or --out-dir's), with the machine, the versions and the command
    (`script`: the benchmark's file name, when it is not NAME.py)."""
    command = f"python benchmarks/{script or name + '.py'} " + " ".join(argv if argv is not None else sys.argv[1:])
    context = {**environment(None), "run": started, "command": command}
    print(write_results(args.out_dir, name, page, context, {"runs": runs}))
