"""--max-time: a run's optimizer steps sized to a time from the speed of its own steps.

A probe of a few seconds before training times a proxy of the step on a machine that may drift by a quarter within
minutes; the run's own steps are the step, loader, logging and guards included. The run is sized at the end of its
warm-up, where every schedule's rate is the same whatever the run's length: a run sized only then is the one
`--max-steps T --warmup-steps W` trains, bit for bit. The pace is read again at the steps where a fifth, three
tenths, ... nine tenths and nineteen twentieths of the time should have passed; where it changed (a neighbour started
or stopped on a shared machine) the run is re-sized, the rest of its schedule stretched or squeezed to end at the new
last step (`model.schedules.warp`). A machine that changes pace after the last reading runs over or ends early by
what that twentieth of the time lost or gained. The readings fall on steps, never on a clock, so every process of a
run reads at the same steps, and the first process's decision holds for all.
"""

from __future__ import annotations

import math
from typing import Any

#: steps left out of the first timing: the first batches' allocations and caches, --compile's graphs
UNTIMED_STEPS = 3
#: the fewest steps the first timing reads, where the warm-up is shorter
TIMED_STEPS = 10
#: shares of the time at which the pace is read again (at the steps where the pace so far puts them: a slower pace
#: after a reading moves the next one later in time, so they are close together)
READ_AGAIN_AT = (0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95)
#: the pace is read over the steps since the latest reading at least this share of the time before: a shared
#: machine's pace wanders by a tenth over half a minute, and the run follows its drift rather than that
PACE_OVER = 0.2
#: a re-size that moves the run's end by less than this share of the time is not made: a machine that keeps its
#: pace keeps the run sized once, and so repeatable by its flags
SMALLEST_RESIZE = 0.02


class TimeBudget:
    """The last step of a run that has `seconds` to train, at most `planned` steps, warming up for `warmup` steps,
    from step `first_step` on; `saved`: what `state()` gave a checkpoint of the run (its sizes, its readings)."""

    def __init__(self, seconds: float, planned: int, warmup: int, first_step: int, saved: dict[str, Any] | None = None):
        self.seconds, self.planned, self.warmup = seconds, planned, warmup
        saved = saved or {}
        #: (step, the run's last step) of each sizing
        self.sizes: list[tuple[int, int]] = [(int(s), int(t)) for s, t in saved.get("sizes", [])]
        #: (step, seconds into training) of each reading, the first where the run's own timing starts
        self.marks: list[tuple[int, float]] = [(int(s), float(t)) for s, t in saved.get("marks", [])]
        self.timed_from = first_step + UNTIMED_STEPS  # a run resumed before its timing began times its own steps
        #: the steps at which the pace is read next
        self.read_at = list(saved["read_at"]) if self.marks else [max(warmup, self.timed_from + TIMED_STEPS)]
        self.seconds_per_step, self.read_from = 0.0, 0

    def state(self) -> dict[str, Any]:
        """What a checkpoint keeps, so that a resumed run reads and sizes where the run left alone would."""
        return {"sizes": [list(s) for s in self.sizes], "marks": [list(m) for m in self.marks], "read_at": self.read_at}

    def due(self, step: int) -> bool:
        """Whether the pace is read after optimizer step `step` (the caller waits for the device first)."""
        return (not self.marks and step == self.timed_from) or (bool(self.read_at) and step == self.read_at[0])

    def propose(self, step: int, elapsed: float) -> tuple[int | None, list[int], float, int]:
        """This process's reading after step `step`, `elapsed` seconds into training: the run's new last step (None
        where it stays), the steps to read at next, the seconds a step and the step they are read from."""
        if not self.marks:
            return None, self.read_at, 0.0, step
        since = next((m for m in reversed(self.marks) if m[1] <= elapsed - PACE_OVER * self.seconds), self.marks[0])
        pace = max((elapsed - since[1]) / max(1, step - since[0]), 1e-9)
        fit = min(self.planned, max(step, step + math.floor(max(0.0, self.seconds - elapsed) / pace)))
        was = self.sizes[-1][1] if self.sizes else None
        stays = was is not None and abs(fit - was) * pace < SMALLEST_RESIZE * self.seconds
        end = was if stays and was is not None else fit
        gap = 0.05 * self.seconds  # readings a twentieth of the time apart at least
        later = [
            step + math.ceil((t - elapsed) / pace)
            for t in (r * self.seconds for r in READ_AGAIN_AT)
            if t >= elapsed + gap
        ]
        return None if stays else fit, sorted({s for s in later if step < s < end}), pace, since[0]

    def apply(self, step: int, elapsed: float, reading: tuple[int | None, list[int], float, int]) -> int | None:
        """Take a reading (the first process's, on every process); the run's new last step, or None."""
        last, self.read_at, self.seconds_per_step, self.read_from = reading
        self.marks.append((step, elapsed))
        if last is not None:
            self.sizes.append((step, last))
        return last

    def decision(self, step: int, elapsed: float, examples_per_step: int) -> str:
        """What the latest sizing was and why, for the log."""
        (_, last), rate = self.sizes[-1], self.seconds_per_step
        what = f"{last:,} optimizer steps ({last * examples_per_step:,} examples)"
        if last == self.planned:
            what = f"all {what}: they fit"
        elif last == step:
            what = f"{what}: the steps so far took the time"
        expected = elapsed + (last - step) * rate  # the run's time at this pace
        if len(self.sizes) > 1:
            return (
                f"--max-time {self.seconds:g} s: {rate:.3f} s a step since step {self.read_from}, so {what} instead "
                f"of {self.sizes[-2][1]:,}, about {expected:.0f} s of training"
            )
        flags = f"--max-steps {last} --warmup-steps {self.warmup}"
        if step == self.warmup:
            exact = f"; {flags} trains the same run unless the pace changes"
        else:
            exact = f" (timed past a {self.warmup}-step warm-up: {flags} repeats it to within that)"
        return (
            f"--max-time {self.seconds:g} s: {rate:.3f} s a step over steps {self.read_from + 1}-{step}, so {what}, "
            f"about {expected:.0f} s of training{exact}"
        )
