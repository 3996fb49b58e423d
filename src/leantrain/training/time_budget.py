"""--max-time: a run's optimizer steps sized to a time, once, from the speed of its own first steps.

A probe of a few seconds before training times a proxy of the step on a machine that may drift by a sixth within
minutes; the run's own steps are the step, loader, logging and guards included. The size is decided at the end of
the warm-up, where every schedule's rate is the same whatever the run's length, so the run is the one
`--max-steps T --warmup-steps W` trains, bit for bit, and config.yaml records it so. The steps after the decision
are not timed again: a machine that slows down later runs over by what it lost, one that speeds up ends early.
"""

from __future__ import annotations

import math

#: steps left out of the timing: the first batches' allocations and caches, --compile's graphs
UNTIMED_STEPS = 3
#: the fewest steps the speed is read over, where the warm-up is shorter
TIMED_STEPS = 10


class TimeBudget:
    """The last step of a run that has `seconds` to train, at most `planned` steps, warming up for `warmup`."""

    def __init__(self, seconds: float, planned: int, warmup: int, first_step: int):
        self.seconds, self.planned, self.warmup = seconds, planned, warmup
        self.timed_from = first_step + UNTIMED_STEPS  # a resumed run times its own steps
        self.decide_at = max(warmup, self.timed_from + TIMED_STEPS)
        self._start: float | None = None
        self.seconds_per_step: float | None = None
        self.sized_steps: int | None = None
        self.elapsed = 0.0  # seconds into training at the decision

    def reads_time(self, step: int) -> bool:
        """Whether `after_step` reads the clock at this step (where the caller waits for the device first)."""
        return self.sized_steps is None and step in (self.timed_from, self.decide_at)

    def after_step(self, step: int, elapsed: float) -> int | None:
        """After optimizer step `step`, `elapsed` seconds into training: the run's last step where this step decides
        it, None at every other."""
        if self.sized_steps is not None or step < self.timed_from:
            return None
        if self._start is None:
            self._start = elapsed
            return None
        if step < self.decide_at:
            return None
        self.seconds_per_step = (elapsed - self._start) / (step - self.timed_from)
        self.elapsed = elapsed
        fit = step + math.floor(max(0.0, self.seconds - elapsed) / max(self.seconds_per_step, 1e-9))
        self.sized_steps = min(self.planned, max(step, fit))
        return self.sized_steps

    def decision(self, step: int, examples_per_step: int) -> str:
        """What was decided and why, for the log."""
        assert self.sized_steps is not None and self.seconds_per_step is not None
        steps, rate = self.sized_steps, self.seconds_per_step
        what = f"{steps:,} optimizer steps ({steps * examples_per_step:,} examples)"
        if steps == self.planned:
            what = f"all {what}: they fit"
        elif steps == step:
            what = f"{what}: the steps so far took the time"
        expected = self.elapsed + (steps - step) * rate  # the run's time at this pace
        flags = f"--max-steps {steps} --warmup-steps {self.warmup}"
        if step == self.warmup:
            exact = f"; {flags} trains the same run"
        else:
            exact = f" (timed past a {self.warmup}-step warm-up: {flags} repeats it to within that)"
        return (
            f"--max-time {self.seconds:g} s: {rate:.3f} s a step over steps {self.timed_from + 1}-{step}, so {what}, "
            f"about {expected:.0f} s of training{exact}"
        )
