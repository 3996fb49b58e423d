"""The best-model and early-stopping policy: which metric judges evaluations, when to stop.

Early stopping follows Keras' `min_delta` rule rather than a moving best: an evaluation counts as an
improvement only when it beats the value of the last counted improvement by more than the threshold, so a
metric that creeps up by less than the threshold each time still stops the run. The counters live in the
`TrainState`, so a resumed run stops exactly where the uninterrupted one would have.
"""

from __future__ import annotations

from typing import Any

from leantrain.run import checkpoint
from leantrain.run.checkpoint import TrainState
from leantrain.tasks.scoring import lower_is_better


def resolve_metric(cfg: Any, task: Any) -> str:
    """--metric-for-best as given (checked against the task's metrics), else the task's `default_metric`."""
    return task.metric_for_best(cfg.metric_for_best)


def steps_every(value: int | str | None, steps_per_epoch: int) -> int | None:
    """--eval-every / --save-every in optimizer steps: 'epoch' is the steps of one pass over the data."""
    return steps_per_epoch if value == "epoch" else (None if value is None else int(value))


class EarlyStopping:
    """`observe` each evaluation; `reason` is set once the run should stop (None: it goes on)."""

    def __init__(self, patience: int | None, threshold: float, state: TrainState):
        self.patience, self.threshold, self.state = patience, threshold, state
        self.reason: str | None = None

    @property
    def enabled(self) -> bool:
        return self.patience is not None

    def observe(self, metrics: dict[str, float], step: int, last: bool = False) -> bool:
        """Count this evaluation; True when the run should stop after it. The `last` step's evaluation is counted
        (a run trained further goes on from its record) but stops nothing: the run ends there anyway."""
        if self.patience is None:
            return False
        state = self.state
        key = checkpoint.metric_key(state.best_metric, tuple(metrics))
        value, sign = metrics[key], (-1.0 if lower_is_better(key) else 1.0)
        reference = state.stopping_reference
        if reference is None or sign * (value - reference) > self.threshold:
            state.stopping_reference, state.evals_without_improvement = value, 0
            return False
        state.evals_without_improvement += 1
        if state.evals_without_improvement < self.patience or last:
            return False
        more = f" by more than {self.threshold:g}" if self.threshold else ""
        self.reason = (
            f"early stopping at step {step}: eval {key} has not improved{more} on {reference:.6g} for "
            f"{state.evals_without_improvement} evaluations (--early-stopping-patience {self.patience})"
        )
        return True

    def summary(self) -> dict[str, Any]:
        """metrics.json's entries: whether the run stopped early (None: early stopping was off), and why."""
        return {
            "early_stopped": (self.reason is not None) if self.enabled else None,
            "early_stopping_reason": self.reason,
        }
