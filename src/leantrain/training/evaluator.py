"""Evaluation: when to evaluate, and predictions gathered across processes with each example once."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from leantrain.tasks.base import Task
from leantrain.tasks.evaluation import gather_rows, scores_by_source
from leantrain.training.hooks import Hooks


class Evaluator:
    """Owns the evaluation policy (every `every` optimizer steps, and once at the end) and the eval loader. With a
    mixture's `spans` (where each source's evaluation rows sit) it also scores each source on its own rows."""

    def __init__(
        self, task: Task, loader, accelerator, every: int | None, hooks: Hooks | None = None, spans=(), autocast=None
    ):
        self.task, self.loader, self.accelerator, self.every = task, loader, accelerator, every
        self.autocast = autocast  # the run's autocast (fp16 on a CPU is not Accelerate's); None: Accelerate's
        self.hooks = hooks or Hooks()
        self.spans = tuple(spans)
        #: the latest evaluation's scores of each source's rows (empty: one source)
        self.by_source: dict[str, dict[str, float]] = {}
        self.last_rows: dict[str, Any] | None = None  # the latest evaluation's rows (the task's report)

    def should_evaluate(self, step: int, total_steps: int) -> bool:
        """Mid-run evaluations; the final one is the trainer's (before the last step's checkpoint, else after the
        loop)."""
        return self.every is not None and step % self.every == 0 and step < total_steps

    def evaluate(self, model, should_stop: Callable[[], bool] | None = None) -> dict[str, float]:
        """The task's scores over the eval set. `should_stop()` is asked before each batch (by every process: it may
        be collective); when it says so the evaluation stops there, raising `EvaluationStopped`."""
        rows = gather_rows(model, self.loader, self.accelerator, self.task, self.hooks, should_stop, self.autocast)
        self.last_rows = rows
        self.hooks.on_evaluated(rows)
        self.by_source = scores_by_source(self.task, rows, self.spans)  # each source's own eval loss, perplexity...
        return self.task.scores(rows)


def prefixed(metrics: dict[str, Any]) -> dict[str, Any]:
    return {f"eval_{k}": v for k, v in metrics.items()}
