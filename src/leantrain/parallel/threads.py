"""CPU threads that hold up when the machine is shared (issue #16).

Two things make a CPU run collapse beside a busy neighbour. OpenMP's threads spin at every barrier waiting for
each other (libgomp's default), so a thread whose core the neighbour holds keeps the others burning their cores
on nothing. On this project's 2-core machine beside one spinning neighbour, MiniLM trained at 9.1 samples/s
with libgomp's default and 13.9 with the threads sleeping at barriers (`OMP_WAIT_POLICY=PASSIVE`); alone, 23.1
and 22.0: passive waits cost 5% on a quiet machine, 16% in an earlier run, and a shorter spin
(`GOMP_SPINCOUNT`) gained nothing over them (benchmarks/results/busy_machine.md). And OpenMP counts the
cores in the affinity mask, not a container's CPU quota, so a process allowed 1 CPU of 8 runs 8 threads that take
turns.

`prepare_environment` sets both before torch loads (OpenMP reads them once, when the library loads): the CLI
calls it first thing, and passes the result to every process it launches. A value the user set is kept.
"""

from __future__ import annotations

import math
import os
from collections.abc import MutableMapping
from pathlib import Path

CGROUP = Path("/sys/fs/cgroup")
#: set when OMP_NUM_THREADS is leantrain's own choice (the quota), not the user's: a launcher may split it
CHOSEN_THREADS_ENV = "LEANTRAIN_CHOSE_OMP_THREADS"


def threads_are_users(environ: MutableMapping[str, str] = os.environ) -> bool:
    """Whether OMP_NUM_THREADS was set by the user (kept as is) rather than by `prepare_environment`."""
    return "OMP_NUM_THREADS" in environ and CHOSEN_THREADS_ENV not in environ


def cgroup_cpu_quota(root: Path = CGROUP) -> float | None:
    """CPUs' worth of time the cgroup may use (cgroup v2 `cpu.max`, v1 `cpu.cfs_quota_us`); None: no limit."""
    try:
        limit, interval = (root / "cpu.max").read_text().split()[:2]
        return None if limit == "max" else int(limit) / int(interval)
    except (OSError, ValueError):
        pass
    try:
        quota = int((root / "cpu" / "cpu.cfs_quota_us").read_text())
        period = int((root / "cpu" / "cpu.cfs_period_us").read_text())
        return None if quota <= 0 else quota / period
    except (OSError, ValueError):
        return None


def usable_cpus(root: Path = CGROUP) -> int:
    """The CPUs this process may really use: its affinity mask, capped by its cgroup's CPU quota."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # pragma: no cover - not Linux
        cpus = os.cpu_count() or 1
    quota = cgroup_cpu_quota(root)
    return max(1, min(cpus, math.ceil(quota))) if quota else cpus


def prepare_environment(environ: MutableMapping[str, str] = os.environ, root: Path = CGROUP) -> dict[str, str]:
    """Set the OpenMP wait policy and, under a CPU quota, the thread count; returns what it set."""
    chosen = {}
    if "OMP_WAIT_POLICY" not in environ:
        chosen["OMP_WAIT_POLICY"] = "PASSIVE"
    if "OMP_NUM_THREADS" not in environ:
        cpus = usable_cpus(root)
        try:
            mask = len(os.sched_getaffinity(0))
        except (AttributeError, OSError):  # pragma: no cover - not Linux
            mask = os.cpu_count() or 1
        if cpus < mask:
            chosen["OMP_NUM_THREADS"] = str(cpus)
            chosen[CHOSEN_THREADS_ENV] = "1"
    environ.update(chosen)
    return chosen
