"""A task's model run over an evaluation loader: every example's rows, gathered across processes, each once. Shared by
the trainer's evaluations and by `leantrain evaluate`/`predict`, so both score alike."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from leantrain.tasks.base import Task


class EvaluationStopped(Exception):
    """`gather_rows` stopped before a batch because `should_stop()` said so (a Ctrl-C or SIGTERM the trainer noted)."""


@torch.no_grad()
def gather_rows(
    model,
    loader,
    accelerator,
    task: Task,
    hooks: Any = None,
    should_stop: Callable[[], bool] | None = None,
    autocast: Callable[[], Any] | None = None,
) -> dict[str, np.ndarray]:
    """`task.eval_rows` for every example in `loader`, gathered from every process, each example once, in the
    order first seen; `index` holds the example ids. `should_stop()`, asked before each batch on every process (it
    may be collective), stops it there with `EvaluationStopped`. `autocast`: the run's
    (`MixedPrecision.autocast_across`, which has fp16 on a CPU where Accelerate's has none); by default Accelerate's."""
    model.eval()
    parts: dict[str, list[torch.Tensor]] = {}
    # One autocast around the whole evaluation, though the prepared model autocasts each forward itself: autocast
    # keeps its low-precision copies of the weights only while the outermost autocast lasts, so without this a
    # generating evaluation casts every weight again at every new token (1.6x the time of a bf16 generation).
    with (autocast or accelerator.autocast)():
        for batch in loader:
            rows = _batch_rows(model, batch, accelerator, task, hooks, should_stop)
            for k, t in rows.items():
                parts.setdefault(k, []).append(t.cpu())
    out = {k: torch.cat(v).numpy() for k, v in parts.items()}
    if accelerator.num_processes > 1:
        _, first = np.unique(out["index"], return_index=True)
        first.sort()  # each example once, in the order it was first seen
        out = {k: v[first] for k, v in out.items()}
    return out


def _batch_rows(model, batch, accelerator, task: Task, hooks: Any, should_stop) -> dict[str, torch.Tensor]:
    """One evaluation batch's rows, gathered from every process."""
    if should_stop is not None and should_stop():
        raise EvaluationStopped
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
    return rows


def eval_loader(task: Task, data: Any, batch_size: int, workers: int = 0):
    """The evaluation loader of `data.eval`: length-sorted batches of at most `batch_size`, the task's collator. The
    trainer's evaluations and `leantrain evaluate` use this one."""
    from torch.utils.data import DataLoader

    from leantrain.data.batching import ExamplesDataset, eval_batches

    return DataLoader(
        ExamplesDataset(data.eval),
        batch_sampler=eval_batches(data.eval.lengths, batch_size),
        collate_fn=task.collator(data, train=False),
        generator=torch.Generator(),
        num_workers=workers,
    )


def scores_by_source(task: Task, rows: dict[str, np.ndarray], spans) -> dict[str, dict[str, float]]:
    """A mixture's evaluation (`spans`: where each source's rows sit among the examples): each source's scores on
    its own rows, from the rows gathered for the pooled scores."""
    out = {}
    for span in spans:
        own = (rows["index"] >= span.start) & (rows["index"] < span.stop)
        if own.any():
            out[span.name] = task.scores({k: v[own] for k, v in rows.items()})
    return out
