"""Where the wall time of a run goes: data wait, generation, forward+backward, optimizer, evaluation, checkpoint,
communication.

`StepTimer` charges every interval between two clock readings to exactly one part: the phase open
at the time (the innermost, when phases nest), or "other" when none is. The parts therefore add up
to the wall time since `start()`, by construction, and "other" is what the loop did outside any
named phase (logging, bookkeeping, Python overhead).

On CUDA the clock is read only after `torch.cuda.synchronize()`: kernels run asynchronously, and
without it a phase would be charged for the launch of its work, the next one for its execution.
Synchronising at each phase boundary costs a little overlap between the host and the device; the
timer is for telling the truth about where time goes, and it is cheap next to a training step.

Communication is a part of its own where the loop can name it (local SGD's parameter averaging,
explicit reductions). DDP's gradient all-reduce overlaps the backward pass and cannot be told
apart from it without a profiler: it stays inside "forward_backward".
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

DATA = "data"
#: a task making the step's examples while training (`Task.step_examples`: sampling completions, scoring them)
GENERATE = "generate"
FORWARD_BACKWARD = "forward_backward"
OPTIMIZER = "optimizer"
EVAL = "eval"
CHECKPOINT = "checkpoint"
COMM = "comm"
OTHER = "other"
PHASES = (DATA, GENERATE, FORWARD_BACKWARD, OPTIMIZER, EVAL, CHECKPOINT, COMM, OTHER)


def row_key(phase: str) -> str:
    """The metrics.jsonl / metrics.json key for a phase's seconds."""
    return f"time_{phase}_seconds"


class StepTimer:
    def __init__(self, device: Any = None, sync: bool | None = None, clock=time.perf_counter, sync_on_read=False):
        """`sync_on_read`: with `sync` off, synchronise CUDA only when the parts are read (the window's total is then
        the device's, its split between phases the host's)."""
        self._sync_fn = self._read_sync = None
        device_type = getattr(device, "type", None) or (str(device).split(":")[0] if device is not None else "cpu")
        if device_type == "cuda":
            import torch

            dev = device if not isinstance(device, str) else torch.device(device)
            if sync if sync is not None else True:
                self._sync_fn = lambda: torch.cuda.synchronize(dev)
            elif sync_on_read:
                self._read_sync = lambda: torch.cuda.synchronize(dev)
        self._clock = clock
        self.totals: dict[str, float] = {p: 0.0 for p in PHASES}
        self._window_mark: dict[str, float] = dict(self.totals)
        self._stack: list[str] = []
        self._last: float | None = None

    # -- clock --------------------------------------------------------------------------------------
    def _now(self) -> float:
        if self._sync_fn is not None:
            self._sync_fn()
        return self._clock()

    def _charge(self) -> None:
        now = self._now()
        if self._last is not None:
            part = self._stack[-1] if self._stack else OTHER
            self.totals[part] = self.totals.get(part, 0.0) + (now - self._last)
        self._last = now

    def start(self) -> None:
        """Start the wall clock (time before this is not counted)."""
        self._last = self._now()

    # -- phases -------------------------------------------------------------------------------------
    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Charge the time inside the block to `name`; a nested phase takes its share from the outer one."""
        if self._last is None:
            self.start()
        self._charge()
        self._stack.append(name)
        try:
            yield
        finally:
            self._charge()
            self._stack.pop()

    def timed(self, iterable: Iterable, name: str = DATA) -> Iterator[Any]:
        """Iterate, charging the wait for each next item to `name` (the loader's batch: data wait)."""
        it = iter(iterable)
        while True:
            with self.phase(name):
                try:
                    item = next(it)
                except StopIteration:
                    return
            yield item

    # -- readings -----------------------------------------------------------------------------------
    def read(self) -> dict[str, float]:
        """Seconds per part since start() (the open phase included up to now) and their sum as 'wall'."""
        if self._read_sync is not None:
            self._read_sync()
        if self._last is not None:
            self._charge()
        out = dict(self.totals)
        out["wall"] = sum(self.totals.values())
        return out

    def window(self) -> dict[str, float]:
        """Seconds per part since the previous window() call (or start()), and 'wall'."""
        now = self.read()
        delta = {p: now[p] - self._window_mark.get(p, 0.0) for p in self.totals}
        self._window_mark = {p: now[p] for p in self.totals}
        delta["wall"] = sum(delta.values())
        return delta

    def window_row(self) -> dict[str, float]:
        """`window()` as metrics.jsonl fields: time_<part>_seconds, time_wall_seconds."""
        return {row_key(k): v for k, v in self.window().items()}

    def total_row(self) -> dict[str, float]:
        """`read()` as metrics.json fields."""
        return {row_key(k): v for k, v in self.read().items()}

    def fractions(self, seconds: dict[str, float] | None = None) -> dict[str, float]:
        """Each part's share of the wall time (of `seconds`, a read()/window() result, or of the totals)."""
        seconds = seconds or self.read()
        wall = seconds.get("wall") or sum(v for k, v in seconds.items() if k != "wall")
        return {k: (v / wall if wall > 0 else 0.0) for k, v in seconds.items() if k != "wall"}


def fractions_from_row(row: dict[str, Any]) -> dict[str, float]:
    """Parts' shares of the wall time from a metrics row's time_*_seconds fields ({} if there are none)."""
    recorded = {p: row.get(row_key(p)) for p in PHASES}
    parts = {p: float(v) for p, v in recorded.items() if isinstance(v, (int, float))}
    wall = row.get(row_key("wall"))
    wall = float(wall) if isinstance(wall, (int, float)) else sum(parts.values())
    return {p: v / wall for p, v in parts.items()} if wall > 0 else {}
