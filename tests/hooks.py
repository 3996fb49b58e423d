"""Test instruments built on `leantrain.training.Hooks`: faults, slow steps and simulated out-of-memory.

In-process tests pass them to `leantrain.train(hooks=...)`. Subprocess jobs get them from tests/site/
sitecustomize.py (put on PYTHONPATH by `site_env`), which reads the LT_TEST_* variables below in every process
of the job, the launcher's workers included. Nothing here changes what a step computes.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

from leantrain.training import Hooks

SITE = Path(__file__).with_name("site")


def site_env(**variables: str) -> dict[str, str]:
    """Environment for a subprocess job whose processes install the hooks that `variables` describe."""
    path = os.pathsep.join(p for p in (str(SITE), os.environ.get("PYTHONPATH", "")) if p)
    return {"PYTHONPATH": path, **variables}


class Fault(Hooks):
    """Fail on process `rank` at optimizer step `step`: raise an error, SIGKILL the process (`mode` kill) or stop
    answering for an hour (`mode` hang: its launcher ends it when another process gives up on it)."""

    def __init__(self, rank: int, step: int, mode: str):
        self.rank, self.step, self.mode = rank, step, mode

    def before_optimizer_step(self, step: int) -> None:
        if step != self.step or int(os.environ.get("RANK", 0)) != self.rank:
            return
        print(
            f"leantrain: injecting a fault ({self.mode}) into process {self.rank} at optimizer step {step} "
            f"(t={time.time():.3f})",
            file=sys.stderr,
            flush=True,
        )
        if self.mode == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        if self.mode == "hang":
            time.sleep(3600)
        raise RuntimeError(f"injected fault at optimizer step {step}")


class Killed(BaseException):
    """Stands in for a kill inside the process (not an Exception: nothing in leantrain catches it)."""


class DieAt(Hooks):
    """Killed just before optimizer step `step` would be taken."""

    def __init__(self, step: int):
        self.step = step

    def before_optimizer_step(self, step: int) -> None:
        if step == self.step:
            raise Killed


class SlowSteps(Hooks):
    """Sleep before every optimizer step, so that a test can signal or kill a run mid-epoch."""

    def __init__(self, seconds: float):
        self.seconds = seconds

    def before_optimizer_step(self, step: int) -> None:
        time.sleep(self.seconds)


class OutOfMemoryAt(Hooks):
    """Act as out of memory at the last micro-batch of optimizer step `step` (from 0), on `rank` or every process,
    once."""

    def __init__(self, step: int, rank: int | None = None):
        self.step, self.rank, self.fired = step, rank, False

    def out_of_memory(self, step: int, batch) -> bool:
        if self.fired or step != self.step or not bool(batch["step_end"]):
            return False
        if self.rank is not None and int(os.environ.get("RANK", 0)) != self.rank:
            return False
        self.fired = True
        return True


class PacedClock(Hooks):
    """This process's training clock as a test sets it: `paces[RANK]` seconds an optimizer step, no sleeping (read
    by --max-time in place of `MetricsLogger.elapsed`), so that the processes of one job can disagree on the time."""

    def __init__(self, paces: list[float]):
        from leantrain.training.metrics_logger import MetricsLogger

        self.pace, self.now = paces[int(os.environ.get("RANK", 0))], 0.0
        MetricsLogger.elapsed = lambda logger: self.now  # type: ignore[method-assign]

    def before_optimizer_step(self, step: int) -> None:
        self.now = self.pace * step  # read after the step


def from_environment() -> Hooks | None:
    """The hooks LT_TEST_FAULT ("RANK:STEP:raise|kill|hang"), LT_TEST_OOM ("STEP[:RANK]"), LT_TEST_STEP_SLEEP
    (seconds) or LT_TEST_CLOCK (seconds a step on each rank: "1,3") describe, or None."""
    if spec := os.environ.get("LT_TEST_FAULT"):
        rank, step, mode = spec.split(":")
        return Fault(int(rank), int(step), mode)
    if spec := os.environ.get("LT_TEST_OOM"):
        step, _, rank = spec.partition(":")
        return OutOfMemoryAt(int(step), int(rank) if rank else None)
    if spec := os.environ.get("LT_TEST_STEP_SLEEP"):
        return SlowSteps(float(spec))
    if spec := os.environ.get("LT_TEST_CLOCK"):
        return PacedClock([float(x) for x in spec.split(",")])
    return None


class Both(Hooks):
    """The caller's hooks (the `leantrain` command's own: `StartupOver`) and the test's, at every point."""

    def __init__(self, first: Hooks, second: Hooks):
        self.pair = (first, second)

    def on_micro_batch(self, model, batch) -> None:
        for h in self.pair:
            h.on_micro_batch(model, batch)

    def before_optimizer_step(self, step: int) -> None:
        for h in self.pair:
            h.before_optimizer_step(step)

    def out_of_memory(self, step: int, batch) -> bool:
        return any([h.out_of_memory(step, batch) for h in self.pair])  # both asked, as each counts its calls

    def on_eval_batch(self, batch) -> None:
        for h in self.pair:
            h.on_eval_batch(batch)

    def on_evaluated(self, rows) -> None:
        for h in self.pair:
            h.on_evaluated(rows)


def install_from_environment() -> None:
    """Make `leantrain.train` in this process use the hooks the LT_TEST_* variables describe (if any), beside
    any the caller passes."""
    installed = from_environment()
    if installed is None:
        return
    import leantrain.api as api

    original_train = api.train

    def train(config=None, *, task=None, hooks=None, **overrides):
        hooks = installed if hooks is None else Both(hooks, installed)
        return original_train(config, task=task, hooks=hooks, **overrides)

    api.train = train
