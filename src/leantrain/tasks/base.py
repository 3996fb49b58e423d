"""The task interface: everything that differs between workloads, so the trainer never branches on one.

A task turns a config into data and a model, batches examples, computes the loss and scores predictions.
The trainer (leantrain.training) imports this module and nothing else from `tasks/`: a new workload is a
new `Task` subclass, registered with `leantrain.tasks.register` or passed to `leantrain.train(task=...)`.

Loss normalisation is the trainer's, and exact: a task returns the loss *summed* over the units it counts
(examples for sequence tasks, tokens for token tasks), and the trainer divides by the units of the whole
optimizer step across micro-batches and processes, which the sampler knows before the step begins.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
import torch


@dataclass
class TaskData:
    """A task's prepared data: what the trainer batches, evaluates and saves beside the model."""

    #: training examples (`data.prepare.Examples`: features and labels, batched through
    #: `data.batching.ExamplesDataset`)
    train: Any
    eval: Any
    #: class names, in label-id order (empty for tasks without classes)
    label_names: list[str]
    #: the tokenizer or media processor: saved with the model so that `predict` prepares inputs alike
    processor: Any
    #: what the user should hear about the data (one line each)
    notes: list[str] = field(default_factory=list)
    #: a model config sized to the data (a preset's audio length, say); None: the model's own
    model_config: Any = None


class Task(ABC):
    """One workload. Subclasses set `name` and `input_names` and implement the abstract methods."""

    #: the `--task` name
    name: ClassVar[str]
    #: the batch keys the model takes as keyword arguments
    input_names: ClassVar[tuple[str, ...]]

    #: whether `prepare_data` can leave the training examples a stream (`--streaming`)
    streams: ClassVar[bool] = False

    def __init__(self, cfg: Any):
        self.cfg = cfg

    # -- data and model ----------------------------------------------------------------------------------
    @abstractmethod
    def prepare_data(self, model_path: str, model_config: Any) -> TaskData:
        """Read, label, split and tokenize (or process) the data the config names, using the cache."""

    @abstractmethod
    def build_model(self, model_path: str, data: TaskData) -> torch.nn.Module:
        """The model to train, its head sized from the data."""

    def check_model(self, model: torch.nn.Module) -> None:  # noqa: B027 (most tasks have nothing to check)
        """Refuse (ConfigError) a model that cannot train as configured, once its attention kernel is chosen."""

    @abstractmethod
    def collator(self, data: TaskData, *, train: bool) -> Callable[[list[dict]], dict[str, Any]]:
        """Batches examples. Every batch carries, besides the model's inputs: `labels`, `index` (example ids),
        `step_units`, `units` and `step_end` (`data.batching.slot_fields`), `num_tokens` and `padded_tokens`
        (0 without tokens): what loss normalisation and throughput need."""

    def flop_input_shapes(self, data: TaskData) -> dict[str, tuple[int, ...]] | None:
        """Fixed input shapes of one example, for counting FLOPs; None: token sequences of varying length."""
        return None

    # -- a step --------------------------------------------------------------------------------------------
    def model_inputs(self, batch: dict[str, Any]) -> dict[str, torch.Tensor]:
        return {k: batch[k] for k in self.input_names if k in batch}

    def forward(self, model: torch.nn.Module, batch: dict[str, Any]) -> Any:
        """The model's outputs for one batch, in training and evaluation (a task may compute less of the output
        than the model would, for `loss_sum` and `eval_rows` to read)."""
        return model(**self.model_inputs(batch))

    def tail_rows(self, batch: dict[str, Any]) -> int | None:
        """On how many rows `forward` runs the model's tail when on fewer than one per token (FLOP counting); None:
        every token's."""
        return None

    def tail_flops(self, model: torch.nn.Module) -> float:
        """FLOPs per row (forward + backward) of the part of the model that `forward` runs on `tail_rows` rows only;
        0: `forward` runs the whole model on every token."""
        return 0.0

    def loss_units(self, data: TaskData) -> np.ndarray | None:
        """What `loss_sum` counts for each training example of `data.train` (counted tokens, or a class weight):
        the trainer divides by their sum over the optimizer step. None: one unit per example."""
        return None

    @abstractmethod
    def loss_sum(self, outputs: Any, batch: dict[str, Any]) -> torch.Tensor:
        """The batch's loss summed (not averaged) over the units it counts, in float32."""

    # -- evaluation ----------------------------------------------------------------------------------------
    @abstractmethod
    def eval_rows(self, outputs: Any, batch: dict[str, Any]) -> dict[str, torch.Tensor]:
        """Per-example results of an evaluation batch (first dimension: the batch), gathered across
        processes by the evaluator and handed to `metrics`."""

    @abstractmethod
    def metrics(self, rows: dict[str, np.ndarray]) -> dict[str, float]:
        """Scores over every evaluation example (loss included)."""

    #: the metrics `metrics` reports, which `--metric-for-best` may name (leantrain.scoring.LOWER_IS_BETTER says
    #: which improve downwards); a task may set its own per instance (`--metrics`)
    metric_names: tuple[str, ...] = ("loss",)
    #: what `--metric-for-best` is when not given
    default_metric: ClassVar[str] = "loss"

    # --- metrics and losses (issue #17)
    #: a user's `compute_metrics(EvalPrediction) -> {name: number}` (`leantrain.train(compute_metrics=...)`), as
    #: the HF Trainer takes it: its scores join the task's own
    compute_metrics: Callable[[Any], dict[str, float]] | None = None

    def scores(self, rows: dict[str, np.ndarray]) -> dict[str, float]:
        """`metrics`, and the user's `compute_metrics` given the predictions (`logits`, else `probs` or `preds`)
        and the labels of every evaluation example."""
        out = self.metrics(rows)
        if self.compute_metrics is None:
            return out
        from transformers import EvalPrediction

        from leantrain.errors import ConfigError

        predictions = next(rows[k] for k in ("logits", "probs", "preds", "index") if k in rows)
        extra = self.compute_metrics(
            EvalPrediction(predictions=predictions, label_ids=rows.get("labels", rows["index"]))
        )
        for key, value in (extra or {}).items():
            try:
                out[str(key).removeprefix("eval_")] = float(value)
            except (TypeError, ValueError):
                raise ConfigError(f"compute_metrics returned {key}={value!r}; give numbers only") from None
        return out

    def metric_for_best(self, name: str | None) -> str:
        """`--metric-for-best` as the evaluation's key (None: the task's `default_metric`), refused in one line
        when this task does not report it."""
        from leantrain.errors import ConfigError

        key = (name or self.default_metric).removeprefix("eval_")
        if key in self.metric_names or self.compute_metrics is not None:  # the user's names are known at the end
            return key
        raise ConfigError(
            f"--metric-for-best {name!r} is not an evaluation metric of this run; choose one of "
            f"{', '.join(self.metric_names)} (or add it with --metrics)"
        )

    def evaluation_report(self, rows: dict[str, np.ndarray], data: TaskData) -> dict[str, Any] | None:
        """What the final evaluation shows beyond its scores (evaluation.json, report.html): None, or for instance
        a classifier's per-class table and confusion matrix."""
        return None

    def summary_rows(self, metrics: dict[str, float]) -> list[tuple[str, str]]:
        """The end-of-run table's evaluation rows."""
        return [(f"eval {k.replace('_', ' ')}", f"{v:.4f}") for k, v in metrics.items()]

    def data_facts(self, data: TaskData) -> dict[str, Any]:
        """Facts about the training data that a resumed run must match (same examples, same labels)."""
        import zlib

        if getattr(data.train, "streaming", False):  # a stream is known by its source, not its rows
            return {"train_source": data.train.fingerprint(), "label_names": list(data.label_names)}
        lengths = np.ascontiguousarray(data.train.lengths, dtype=np.int64).tobytes()
        labels = np.ascontiguousarray(data.train.labels, dtype=np.int64).tobytes()
        return {
            "train_examples": len(data.train),
            "label_names": list(data.label_names),
            "data_fingerprint": zlib.crc32(labels + lengths),
        }


def same_logits(model: torch.nn.Module, whole: Callable[[], torch.Tensor], cut: Callable[[], torch.Tensor]) -> bool:
    """Whether a task's shortcut keeps the model's logits: `cut()` against `whole()`, both in evaluation mode without
    gradients, equal up to rounding. A model that fails either way does not take the shortcut."""
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            full, chosen = whole(), cut()
    except (RuntimeError, ValueError, IndexError, TypeError, AttributeError):
        return False
    finally:
        model.train(was_training)
    scale = float(full.abs().max()) + 1.0
    return chosen.shape == full.shape and float((chosen - full).abs().max()) <= 1e-4 * scale
