"""Evaluation: predictions gathered across processes without duplicates, then standard metrics."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from leantrain.training.loop import model_inputs


@torch.no_grad()
def predict_loop(model, loader, accelerator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Probabilities, labels and example indices for every example in `loader`, in loader order."""
    model.eval()
    probs_t: list[torch.Tensor] = []
    labels_t: list[torch.Tensor] = []
    indices_t: list[torch.Tensor] = []
    for batch in loader:
        logits = model(**model_inputs(batch)).logits.float()
        p, y, i = F.softmax(logits, dim=-1), batch["labels"], batch["index"]
        if accelerator.num_processes > 1:
            # Length-sorted eval batches differ in size across processes, and the sharded loader repeats
            # examples to give every process a batch: pad to a common size (index -1), gather, drop the
            # padding here and the repeats below. (gather_for_metrics assumes equal batch sizes.)
            p, y, i = accelerator.pad_across_processes((p, y, i), dim=0, pad_index=-1)
            p, y, i = accelerator.gather((p.contiguous(), y.contiguous(), i.contiguous()))
            keep = i >= 0
            p, y, i = p[keep], y[keep], i[keep]
        probs_t.append(p.cpu())
        labels_t.append(y.cpu())
        indices_t.append(i.cpu())
    probs, labels, indices = torch.cat(probs_t).numpy(), torch.cat(labels_t).numpy(), torch.cat(indices_t).numpy()
    if accelerator.num_processes > 1:
        _, first = np.unique(indices, return_index=True)
        first.sort()  # each example once, in the order it was first seen
        probs, labels, indices = probs[first], labels[first], indices[first]
    return probs, labels, indices


def classification_metrics(probs: np.ndarray, labels: np.ndarray) -> dict[str, float]:
    from sklearn.metrics import accuracy_score, f1_score

    preds = probs.argmax(-1)
    eps = 1e-12
    loss = float(-np.log(np.clip(probs[np.arange(len(labels)), labels], eps, 1)).mean())
    return {
        "accuracy": float(accuracy_score(labels, preds)),
        "macro_f1": float(f1_score(labels, preds, average="macro", zero_division=0)),
        "loss": loss,
    }


def evaluate_loop(model, loader, accelerator) -> dict[str, float]:
    probs, labels, _ = predict_loop(model, loader, accelerator)
    return classification_metrics(probs, labels)
