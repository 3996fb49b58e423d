"""Evaluation: when to evaluate, and predictions gathered across processes with each example once."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from leantrain.tasks.base import Task
from leantrain.training.hooks import Hooks


class Evaluator:
    """Owns the evaluation policy (every `every` optimizer steps, and once at the end) and the eval loader."""

    def __init__(self, task: Task, loader, accelerator, every: int | None, hooks: Hooks | None = None):
        self.task, self.loader, self.accelerator, self.every = task, loader, accelerator, every
        self.hooks = hooks or Hooks()
        self.last_rows: dict[str, np.ndarray] | None = None  # the latest evaluation's rows (the task's report)

    def should_evaluate(self, step: int, total_steps: int) -> bool:
        """Mid-run evaluations; the final one is the caller's (`evaluate()` after the loop)."""
        return self.every is not None and step % self.every == 0 and step < total_steps

    def evaluate(self, model, should_stop: Callable[[], bool] | None = None) -> dict[str, float]:
        """The task's scores over the eval set. `should_stop()` is asked before each batch (by every process: it may
        be collective); when it says so the evaluation stops there, raising `interrupt.StopRequested`."""
        rows = gather_rows(model, self.loader, self.accelerator, self.task, self.hooks, should_stop)
        self.last_rows = rows
        self.hooks.on_evaluated(rows)
        return self.task.scores(rows)


@torch.no_grad()
def gather_rows(
    model, loader, accelerator, task: Task, hooks: Hooks | None = None, should_stop: Callable[[], bool] | None = None
) -> dict[str, np.ndarray]:
    """`task.eval_rows` for every example in `loader`, gathered from every process, each example once, in the
    order first seen; `index` holds the example ids."""
    model.eval()
    parts: dict[str, list[torch.Tensor]] = {}
    for batch in loader:
        if should_stop is not None and should_stop():
            from leantrain.training.interrupt import StopRequested

            raise StopRequested
        if hooks is not None:
            hooks.on_eval_batch(batch)
        rows = {**task.eval_rows(task.forward(model, batch), batch), "index": batch["index"]}
        if accelerator.num_processes > 1:
            # Length-sorted eval batches differ in size across processes, and the sharded loader repeats
            # examples to give every process a batch: pad to a common size (index -1), gather, drop the
            # padding here and the repeats below. (gather_for_metrics assumes equal batch sizes.)
            names = list(rows)
            padded = accelerator.pad_across_processes(tuple(rows[k] for k in names), dim=0, pad_index=-1)
            gathered = accelerator.gather(tuple(t.contiguous() for t in padded))
            keep = gathered[names.index("index")] >= 0
            rows = {k: t[keep] for k, t in zip(names, gathered)}
        for k, t in rows.items():
            parts.setdefault(k, []).append(t.cpu())
    out = {k: torch.cat(v).numpy() for k, v in parts.items()}
    if accelerator.num_processes > 1:
        _, first = np.unique(out["index"], return_index=True)
        first.sort()  # each example once, in the order it was first seen
        out = {k: v[first] for k, v in out.items()}
    return out


def prefixed(metrics: dict[str, Any]) -> dict[str, Any]:
    return {f"eval_{k}": v for k, v in metrics.items()}
