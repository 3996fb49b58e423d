"""CPU threads that hold up when the machine is shared.

Two things make a CPU run collapse beside a busy neighbour. OpenMP's threads spin at every barrier waiting for
each other (libgomp's default), so a thread whose core the neighbour holds keeps the others burning their cores
on nothing: on this project's 2-core machine beside one spinning neighbour, MiniLM trained at 6.1 samples/s with
libgomp's default against 16.5 alone (benchmarks/results/busy_machine.md). And OpenMP counts the cores in the
affinity mask, not a container's CPU quota, so a process allowed 1 CPU of 8 runs 8 threads that take turns.

Sleeping at barriers instead (`OMP_WAIT_POLICY=PASSIVE`) holds up beside a neighbour but cost a quiet run
12-27% of its training speed (`leantrain train`, SST-2, alternating runs: docs/performance.md). So the threads
keep libgomp's spinning and, with `--thread-governor`, the `ThreadGovernor` gives cores back instead: every two
seconds of training it reads how much of this process's CPUs other processes used (/proc/stat) and runs one thread
fewer per core they held, all of them again once they leave; with one thread there is no barrier to spin at.

The governor is opt-in: a thread count that moves with the neighbours' load moves the reductions' order, so two
runs of the same job (or a run and its resumption) beside a busy neighbour ended 2e-7 apart in their weights after
12 steps. Off, the thread count is fixed for the run and the same job gives the same bits whatever the load.

`prepare_environment` runs before torch loads (OpenMP reads its settings once, when the library loads): the CLI
calls it first thing, and passes the result to every process it launches. A value the user set is kept; a
user's OMP_NUM_THREADS, or LEANTRAIN_THREAD_GOVERNOR=0, keeps the governor off even when asked for.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Collection, MutableMapping
from pathlib import Path

CGROUP = Path("/sys/fs/cgroup")
#: set when OMP_NUM_THREADS is leantrain's own choice (the quota), not the user's: a launcher may split it
CHOSEN_THREADS_ENV = "LEANTRAIN_CHOSE_OMP_THREADS"
#: set when the thread count is leantrain's to govern (with --thread-governor): the user set no OMP_NUM_THREADS and
#: no quota caps it
GOVERNOR_ENV = "LEANTRAIN_THREAD_GOVERNOR"
PROC_STAT = Path("/proc/stat")
#: cores' worth of other processes' CPU that counts as a busy machine: beyond a quiet machine's noise (0.01-0.1)
BUSY_CORES = 0.5


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
    """Under a CPU quota, the thread count; otherwise leave it to the governor. Returns what it set."""
    chosen = {}
    if "OMP_NUM_THREADS" not in environ:
        cpus = usable_cpus(root)
        try:
            mask = len(os.sched_getaffinity(0))
        except (AttributeError, OSError):  # pragma: no cover - not Linux
            mask = os.cpu_count() or 1
        if cpus < mask:
            chosen["OMP_NUM_THREADS"] = str(cpus)
            chosen[CHOSEN_THREADS_ENV] = "1"
        elif GOVERNOR_ENV not in environ:  # LEANTRAIN_THREAD_GOVERNOR=0 turns it off
            chosen[GOVERNOR_ENV] = "1"
    environ.update(chosen)
    return chosen


def busy_seconds(cpus: Collection[int], stat: Path = PROC_STAT) -> float | None:
    """Seconds the CPUs numbered `cpus` have been busy, by any process (/proc/stat); None where it cannot tell."""
    try:
        lines = stat.read_text().splitlines()
    except OSError:
        return None
    busy, found = 0, 0
    for line in lines:
        name, *fields = line.split() or [""]
        if name.startswith("cpu") and name[3:].isdigit() and int(name[3:]) in cpus:
            ticks = [int(x) for x in fields[:8]]  # user nice system idle iowait irq softirq steal
            busy += sum(ticks) - ticks[3] - ticks[4]
            found += 1
    return busy / os.sysconf("SC_CLK_TCK") if found == len(cpus) else None


def own_cpu_seconds() -> float:
    """CPU seconds of this process, all its threads."""
    t = os.times()
    return t.user + t.system


def neighbour_load(stat: Path = PROC_STAT) -> Callable[[], float | None]:
    """Start watching this process's CPUs; the function returned gives the cores' worth of CPU other processes used
    on them since (their busy time less this process's own, over the wall time), or None where it cannot tell."""
    try:
        cpus = os.sched_getaffinity(0)
    except (AttributeError, OSError):  # pragma: no cover - not Linux
        return lambda: None
    then, busy_then, own_then = time.monotonic(), busy_seconds(cpus, stat), own_cpu_seconds()

    def since() -> float | None:
        busy, elapsed = busy_seconds(cpus, stat), time.monotonic() - then
        if busy is None or busy_then is None or elapsed <= 0:
            return None
        return max(0.0, (busy - busy_then) - (own_cpu_seconds() - own_then)) / elapsed

    return since


class ThreadGovernor:
    """One thread fewer for each core other processes hold, all of them again when they leave.

    `update()` is called every training step; every `interval` seconds it measures the CPU that other processes
    used on this process's CPUs (their busy time less this process's own) and sets the thread count to the most
    threads less those cores, beyond a `slack` of background noise (a quiet machine measured 0.01-0.1 cores).
    """

    def __init__(
        self,
        threads: int,
        cpus: Collection[int],
        interval: float = 2.0,
        slack: float = 0.25,
        set_threads: Callable[[int], None] | None = None,
        busy: Callable[[], float | None] | None = None,
        own: Callable[[], float] = own_cpu_seconds,
        clock: Callable[[], float] = time.monotonic,
    ):
        import torch

        self.most = self.threads = threads
        self.interval, self.slack = interval, slack
        self.set_threads = set_threads or torch.set_num_threads
        self.busy = busy or (lambda: busy_seconds(cpus))
        self.own, self.clock = own, clock
        self.others = 0.0  # cores' worth of CPU other processes used over the last interval
        self._mark = (clock(), self.busy() or 0.0, own())

    def update(self) -> int | None:
        """Measure and set the thread count once an interval has passed; returns the new count when it changed."""
        now = self.clock()
        then, busy_then, own_then = self._mark
        if now - then < max(self.interval, 1e-3):
            return None
        busy, own = self.busy(), self.own()
        if busy is None:
            return None
        self._mark = (now, busy, own)
        self.others = max(0.0, (busy - busy_then) - (own - own_then)) / (now - then)
        held = max(0, math.ceil(self.others - self.slack))
        threads = max(1, self.most - held)
        if threads == self.threads:
            return None
        self.threads = threads
        self.set_threads(threads)
        return threads


def thread_governor(
    asked: bool, num_processes: int, loader_workers: int, device_type: str
) -> tuple[ThreadGovernor | None, str | None]:
    """With --thread-governor (`asked`), the governor where the thread count is leantrain's to choose: a `leantrain`
    command's only process, on the CPU, with no loader workers (their CPU would count as another process's) and
    more than one thread. Returns it (or None) and, when it was asked for but cannot run, why not."""
    if not asked or device_type != "cpu":
        return None, None
    found = _governable(num_processes, loader_workers)
    if isinstance(found, str):
        return None, found
    return ThreadGovernor(*found), None


def busy_watch(num_processes: int, loader_workers: int, device_type: str) -> ThreadGovernor | None:
    """Without --thread-governor, where it could run: a governor that only watches (it sets no thread count) over
    ten-second spans, so that a run slowed by a neighbour's load can say once what the flag would do."""
    found = _governable(num_processes, loader_workers) if device_type == "cpu" else "not a CPU run"
    if isinstance(found, str):
        return None
    return ThreadGovernor(*found, interval=10.0, slack=BUSY_CORES, set_threads=lambda n: None)


def _governable(num_processes: int, loader_workers: int) -> tuple[int, Collection[int]] | str:
    """(threads, CPUs) where the thread count is leantrain's to govern, else why not."""
    import torch

    if os.environ.get(GOVERNOR_ENV) != "1":
        return "OMP_NUM_THREADS, a CPU quota or LEANTRAIN_THREAD_GOVERNOR=0 fixes the thread count, or not the CLI"
    if num_processes != 1:
        return "the processes of a launch share the cores already"
    if loader_workers:
        return "--dataloader-num-workers' processes would count as a neighbour"
    try:
        cpus = os.sched_getaffinity(0)
    except (AttributeError, OSError):  # pragma: no cover - not Linux
        return "not Linux"
    threads = torch.get_num_threads()
    if threads < 2:
        return "one thread has nothing to give back"
    if busy_seconds(cpus) is None:
        return "/proc/stat cannot be read"
    return threads, cpus
