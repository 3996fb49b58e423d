"""Training losses of classification tasks (issue #17): label smoothing and class weights, exact under accumulation.

A task returns its loss summed over units (tasks/base.py). With class weights, an example's unit is its class's
weight: the summed loss is `sum_i w[y_i] * loss_i`, the sampler sums `w[y_i]` over the whole optimizer step
(micro-batches and processes), and the trainer divides one by the other: the big batch's weighted mean, which is
what `torch.nn.functional.cross_entropy(weight=w)` computes with its default mean reduction.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from leantrain.errors import ConfigError


def parse_class_weights(text: str) -> list[float]:
    """'1, 2.5' -> [1.0, 2.5]; refused in one line unless every weight is a positive finite number."""
    try:
        weights = [float(w) for w in text.split(",")]
    except ValueError:
        raise ConfigError(f"--class-weights '{text}': give auto or numbers in label order, e.g. 1,3") from None
    if not all(np.isfinite(w) and w > 0 for w in weights):
        raise ConfigError(f"--class-weights '{text}': every weight must be a positive number")
    return weights


def class_weights(spec: str, labels: np.ndarray, num_classes: int) -> np.ndarray:
    """The weight of each class id: `auto` is inverse class frequency over the training labels (scikit-learn's
    'balanced': n / (classes x count)); otherwise the given weights, one per class in label order."""
    if spec.strip().lower() == "auto":
        from sklearn.utils.class_weight import compute_class_weight

        present = np.unique(labels)
        weights = np.ones(num_classes)  # a class absent from the training data never weighs a training example
        weights[present] = compute_class_weight("balanced", classes=present, y=labels)
        return weights
    weights = np.asarray(parse_class_weights(spec))
    if len(weights) != num_classes:
        raise ConfigError(
            f"--class-weights gives {len(weights)} weights for {num_classes} classes; "
            "give one per class, in label order"
        )
    return weights


def weighted_cross_entropy_sum(
    logits: torch.Tensor, labels: torch.Tensor, weights: torch.Tensor | None, label_smoothing: float
) -> torch.Tensor:
    """The cross-entropy summed over the batch, each example weighted by its class (`weights`; None: 1 each)."""
    return F.cross_entropy(logits.float(), labels, weight=weights, label_smoothing=label_smoothing, reduction="sum")
