"""What every classification task shares: cross-entropy summed over examples (label smoothing and class weights
optional), softmax rows, and the scores `--metrics` names (leantrain.scoring)."""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np
import torch
import torch.nn.functional as F

from leantrain.tasks.base import Task, TaskData


class Classification(Task):
    """One label per example; the loss counts examples, or their class weights (`--class-weights`)."""

    #: the kind of problem, as leantrain.scoring names it
    problem_type: ClassVar[str] = "single-label"
    default_metric: ClassVar[str] = "accuracy"

    def __init__(self, cfg: Any):
        from leantrain.scoring import metric_names, parse_metrics

        super().__init__(cfg)
        self.metric_names = metric_names(self.problem_type, parse_metrics(getattr(cfg, "metrics", None)))
        self.label_smoothing = float(getattr(cfg, "label_smoothing", 0.0) or 0.0)
        self.weight_spec: str | None = getattr(cfg, "class_weights", None)
        self.class_weights: np.ndarray | None = None  # per class id, from the training data (loss_units)
        self._weights_tensor: torch.Tensor | None = None

    def loss_units(self, data: TaskData) -> np.ndarray | None:
        """Each example's class weight (None without --class-weights: one unit each)."""
        if self.weight_spec is None:
            return None
        from leantrain.errors import ConfigError
        from leantrain.losses import class_weights

        if getattr(data.train, "streaming", False):
            raise ConfigError("--class-weights needs the training labels whole; it does not work with --streaming yet")
        labels = np.asarray(data.train.labels)
        self.class_weights = class_weights(self.weight_spec, labels, len(data.label_names))
        self._weights_tensor = None
        return self.class_weights[labels]

    def loss_sum(self, outputs: Any, batch: dict[str, Any]) -> torch.Tensor:
        from leantrain.losses import weighted_cross_entropy_sum

        logits = outputs.logits
        return weighted_cross_entropy_sum(logits, batch["labels"], self._weights(logits), self.label_smoothing)

    def _weights(self, logits: torch.Tensor) -> torch.Tensor | None:
        if self.class_weights is None:
            return None
        if self._weights_tensor is None or self._weights_tensor.device != logits.device:
            self._weights_tensor = torch.tensor(self.class_weights, dtype=torch.float32, device=logits.device)
        return self._weights_tensor

    def eval_rows(self, outputs: Any, batch: dict[str, Any]) -> dict[str, torch.Tensor]:
        logits = outputs.logits.float()
        return {"probs": F.softmax(logits, dim=-1), "logits": logits, "labels": batch["labels"]}

    def metrics(self, rows: dict[str, np.ndarray]) -> dict[str, float]:
        from leantrain.scoring import score

        return score(self.problem_type, self.metric_names, rows["probs"], rows["labels"])

    def summary_rows(self, metrics: dict[str, float]) -> list[tuple[str, str]]:
        names = {"accuracy": "eval accuracy", "macro_f1": "eval macro-F1", "f1": "eval F1", "loss": "eval loss"}
        return [(names.get(k, f"eval {k.replace('_', ' ')}"), f"{v:.4f}") for k, v in metrics.items()]


def classification_metrics(probs: np.ndarray, labels: np.ndarray, names: tuple[str, ...] = ()) -> dict[str, float]:
    """The named scores (default: accuracy, macro-F1) and the mean cross-entropy of predicted class probabilities."""
    from leantrain.scoring import metric_names, score

    return score("single-label", metric_names("single-label", names), probs, labels)
