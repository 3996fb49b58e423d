"""Fixed points where instrumentation can watch or disturb a run: tests inject faults, record batches or
simulate running out of memory through a `Hooks` subclass, never through the library's own globals; the
`leantrain` command resumes garbage collection through one (`StartupOver`)."""

from __future__ import annotations

import gc
from typing import Any


class Hooks:
    """Every method does nothing by default; `leantrain.train(hooks=...)` takes a subclass."""

    def on_micro_batch(self, model: Any, batch: dict[str, Any]) -> None:
        """Before a training micro-batch's forward pass (`model` as prepared, possibly wrapped)."""

    def before_optimizer_step(self, step: int) -> None:
        """Before optimizer step `step` (counting from 1) is taken, after its gradients are complete."""

    def out_of_memory(self, step: int, batch: dict[str, Any]) -> bool:
        """After a micro-batch of step `step` (counting from 0): True makes the OOM guard act as if this process
        had run out of memory (only with --auto, where the guard is on)."""
        return False

    def on_eval_batch(self, batch: dict[str, Any]) -> None:
        """Before an evaluation batch's forward pass, on the process that holds it."""

    def on_evaluated(self, rows: dict[str, Any]) -> None:
        """After an evaluation: the per-example rows gathered from every process, each example once."""


class StartupOver(Hooks):
    """At a run's first training micro-batch: what start-up made is frozen (no later collection walks it; it
    lives to the end) and cyclic collection, which `cli.entry` turned off for start-up, resumes, so that a long
    run's few cycles a step are collected."""

    def on_micro_batch(self, model: Any, batch: dict[str, Any]) -> None:
        if not gc.isenabled():
            gc.freeze()
            gc.enable()


class SyncsPerStep(Hooks):
    """Host syncs of each optimizer step (`telemetry.syncs.HostSyncs`, entered by the caller around the run): a step's
    window runs from its first micro-batch to the next step's first, so it holds its close, log, evaluation and save.
    `steps` maps each optimizer step (from 1) to a Counter of what was read; `finish()` closes the last window."""

    def __init__(self, syncs: Any):
        from collections import Counter

        self.syncs = syncs
        self.steps: dict[int, Counter[str]] = {}
        self._mark: Counter[str] | None = None
        self._step, self._new = 0, True

    def on_micro_batch(self, model: Any, batch: dict[str, Any]) -> None:
        if self._new:
            self.finish()
            self._mark, self._new = self.syncs.kinds.copy(), False

    def before_optimizer_step(self, step: int) -> None:
        self._step, self._new = step, True

    def finish(self) -> None:
        if self._mark is not None:
            self.steps[self._step] = self.syncs.kinds - self._mark
            self._mark = None
