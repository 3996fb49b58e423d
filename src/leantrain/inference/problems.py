"""`evaluate` and `predict` for regression and multi-label text models: the model's saved
`problem_type` (transformers' names) picks the task whose rows and scores apply."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np

#: transformers' config.problem_type -> leantrain's --problem-type
PROBLEMS = {"regression": "regression", "multi_label_classification": "multi-label"}


def problem_of(model) -> str | None:
    """'regression' or 'multi-label' for such a model; None for single-label classifiers."""
    return PROBLEMS.get(getattr(model.config, "problem_type", None) or "")


def _task(problem: str, metrics: str | None = None, threshold: float = 0.5):
    from leantrain.tasks.text_problems import TEXT_PROBLEMS

    cfg = SimpleNamespace(
        metrics=metrics,
        multi_label_threshold=threshold,
        label_separator=None,
        class_weights=None,
        label_smoothing=0.0,
        pad_to_max_length=False,
    )
    return TEXT_PROBLEMS[problem](cfg)


def _rows(task, model, tokenizer, names: list[str], tokens, labels: np.ndarray, batch_size: int) -> dict:
    from torch.utils.data import DataLoader

    from leantrain import parallel
    from leantrain.data.batching import ExamplesDataset, eval_batches
    from leantrain.data.prepare import Examples
    from leantrain.tasks.base import TaskData
    from leantrain.tasks.evaluation import gather_rows

    data = Examples(tokens, labels)
    loader = DataLoader(
        ExamplesDataset(data),
        batch_sampler=eval_batches(data.lengths, batch_size),
        collate_fn=task.collator(TaskData(None, None, names, tokenizer), train=False),
    )
    accelerator = parallel.make_accelerator("fp32")
    model, loader = accelerator.prepare(model, loader)
    return gather_rows(model, loader, accelerator, task)


def evaluate_problem(
    problem: str,
    model,
    tokenizer,
    names: list[str],
    src,
    batch_size: int,
    metrics: str | None,
    separator: str | None = None,
    threshold: float = 0.5,
) -> dict[str, Any]:
    """The scores of a regression or multi-label model on a labelled source (`data.prepare.Source`)."""
    from leantrain.data.labels import MultiLabels, NumberLabels

    codec: Any = NumberLabels() if problem == "regression" else MultiLabels(separator)
    codec.names = names
    labels = codec.encode(src.labels, src.path, src.columns.label, training=False)
    task = _task(problem, metrics, threshold)
    rows = _rows(task, model, tokenizer, names, src.tokens, labels, batch_size)
    return {**task.metrics(rows), "examples": len(labels)}


def predict_problem(
    problem: str, model, tokenizer, names: list[str], texts, pairs, tokens, batch_size: int, threshold: float = 0.5
):
    """Regression: each text's predicted number (`score`); multi-label: the labels at or above `threshold` and
    every label's probability."""
    labels = np.zeros((len(texts), len(names)) if problem == "multi-label" else len(texts), dtype=np.float32)
    rows = _rows(_task(problem), model, tokenizer, names, tokens, labels, batch_size)
    out: list[dict[str, Any]] = [{} for _ in texts]
    for position, i in enumerate(rows["index"]):
        row: dict[str, Any] = {"text": texts[i]}
        if pairs is not None:
            row["text_pair"] = pairs[i]
        if problem == "regression":
            row["score"] = float(rows["preds"][position])
        else:
            p = rows["probs"][position]
            row["labels"] = [n for n, q in zip(names, p) if q >= threshold]
            row["probabilities"] = {n: round(float(q), 6) for n, q in zip(names, p)}
        out[i] = row
    return out
