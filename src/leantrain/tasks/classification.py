"""What every classification task shares: cross-entropy summed over examples, softmax rows, accuracy and F1."""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np
import torch
import torch.nn.functional as F

from leantrain.tasks.base import Task


class Classification(Task):
    """One label per example; the loss counts examples."""

    metric_names: ClassVar[tuple[str, ...]] = ("accuracy", "macro_f1", "loss")
    default_metric: ClassVar[str] = "accuracy"

    def loss_sum(self, outputs: Any, batch: dict[str, Any]) -> torch.Tensor:
        return F.cross_entropy(outputs.logits.float(), batch["labels"], reduction="sum")

    def eval_rows(self, outputs: Any, batch: dict[str, Any]) -> dict[str, torch.Tensor]:
        return {"probs": F.softmax(outputs.logits.float(), dim=-1), "labels": batch["labels"]}

    def metrics(self, rows: dict[str, np.ndarray]) -> dict[str, float]:
        return classification_metrics(rows["probs"], rows["labels"])

    def summary_rows(self, metrics: dict[str, float]) -> list[tuple[str, str]]:
        names = {"accuracy": "eval accuracy", "macro_f1": "eval macro-F1", "loss": "eval loss"}
        return [(names.get(k, f"eval {k}"), f"{v:.4f}") for k, v in metrics.items()]


def classification_metrics(probs: np.ndarray, labels: np.ndarray) -> dict[str, float]:
    """Accuracy, macro-F1 and the mean cross-entropy of predicted class probabilities."""
    from sklearn.metrics import accuracy_score, f1_score

    preds = probs.argmax(-1)
    eps = 1e-12
    loss = float(-np.log(np.clip(probs[np.arange(len(labels)), labels], eps, 1)).mean())
    return {
        "accuracy": float(accuracy_score(labels, preds)),
        "macro_f1": float(f1_score(labels, preds, average="macro", zero_division=0)),
        "loss": loss,
    }
