"""What every classification task shares: cross-entropy summed over examples (label smoothing and class weights
optional), softmax rows, and the scores `--metrics` names (leantrain.tasks.scoring)."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import torch
import torch.nn.functional as F

from leantrain.tasks.base import Task, TaskData, same_logits


class Classification(Task):
    """One label per example; the loss counts examples, or their class weights (`--class-weights`)."""

    #: the kind of problem, as leantrain.tasks.scoring names it
    problem_type: ClassVar[str] = "single-label"
    default_metric: ClassVar[str] = "accuracy"

    def __init__(self, cfg: Any):
        from leantrain.tasks.scoring import metric_names, parse_metrics

        super().__init__(cfg)
        self.metric_names = metric_names(self.problem_type, parse_metrics(getattr(cfg, "metrics", None)))
        self.label_smoothing = float(getattr(cfg, "label_smoothing", 0.0) or 0.0)
        self.weight_spec: str | None = getattr(cfg, "class_weights", None)
        self.class_weights: np.ndarray | None = None  # per class id, from the training data (loss_units)
        self._weights_tensor: torch.Tensor | None = None
        #: at inference, the trained model's class names (set by `prediction_data`)
        self.class_names: list[str] = []

    #: the encoder's last layer after its attention, run at the first token only (`forward`); set by `check_model`
    tail: FirstTokenTail | None = None

    def check_model(self, model: torch.nn.Module) -> None:
        self.tail = first_token_tail(model) if cuts_at_the_first_token(self.cfg) else None

    def forward(self, model: torch.nn.Module, batch: dict[str, Any]) -> Any:
        """The model's outputs with its last layer's attention output and feed-forward run at the first token only,
        where the model reads its classification (BERT's pooler, RoBERTa's head). Every token still feeds the
        last attention's keys and values, so the logits, loss and gradients are the same up to rounding, for
        up to a sixth less work in a six-layer encoder. With dropout on, the last layer draws the whole
        sequence's masks and keeps the first token's: the same random numbers as the whole model."""
        if self.tail is None:
            return super().forward(model, batch)
        with self.tail.cut():
            return model(**self.model_inputs(batch))

    def tail_rows(self, batch: dict[str, Any]) -> int | None:
        return None if self.tail is None else int(batch["labels"].shape[0])

    def tail_flops(self, model: torch.nn.Module) -> float:
        from leantrain.telemetry.flops import row_flops

        return 0.0 if self.tail is None else row_flops(self.tail.parameters())

    def loss_units(self, data: TaskData) -> np.ndarray | None:
        """Each example's class weight (None without --class-weights: one unit each)."""
        if self.weight_spec is None:
            return None
        from leantrain.errors import ConfigError
        from leantrain.model.losses import class_weights

        if getattr(data.train, "streaming", False):
            raise ConfigError("--class-weights needs the training labels whole; it does not work with --streaming yet")
        labels = np.asarray(data.train.labels)
        self.class_weights = class_weights(self.weight_spec, labels, len(data.label_names))
        self._weights_tensor = None
        return self.class_weights[labels]

    def loss_sum(self, outputs: Any, batch: dict[str, Any]) -> torch.Tensor:
        from leantrain.model.losses import weighted_cross_entropy_sum

        logits = outputs.logits
        return weighted_cross_entropy_sum(logits, batch["labels"], self._weights(logits), self.label_smoothing)

    def row_losses(self, outputs: Any, batch: dict[str, Any]) -> torch.Tensor:
        """Each example's weighted cross-entropy: what `loss_sum` adds up."""
        logits = outputs.logits.detach()
        return F.cross_entropy(
            logits.float(), batch["labels"], weight=self._weights(logits), label_smoothing=self.label_smoothing,
            reduction="none",
        )  # fmt: skip

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
        from leantrain.tasks.scoring import score

        return score(self.problem_type, self.metric_names, rows["probs"], rows["labels"])

    def summary_rows(self, metrics: dict[str, float]) -> list[tuple[str, str]]:
        names = {"accuracy": "eval accuracy", "macro_f1": "eval macro-F1", "f1": "eval F1", "loss": "eval loss"}
        return [(names.get(k, f"eval {k.replace('_', ' ')}"), f"{v:.4f}") for k, v in metrics.items()]

    # -- inference -------------------------------------------------------------------------------------------------
    def evaluation_report(self, rows: dict[str, np.ndarray], data: TaskData) -> dict[str, Any]:
        """The per-class table and the confusion matrix (rows: true class, columns: predicted), and the counts."""
        from leantrain.tasks.scoring import classification_report

        return {**classification_report(rows["probs"], rows["labels"], data.label_names), **data.facts}

    def prediction_rows(self, rows: dict[str, np.ndarray], shown: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Each input with its most probable class, that class's probability and every class's."""
        names = self.class_names
        out: list[dict[str, Any]] = [{} for _ in shown]
        for p, i in zip(rows["probs"], rows["index"]):
            best = int(p.argmax())
            out[i] = {
                **shown[i],
                "label": names[best],
                "score": float(p[best]),
                "probabilities": {n: round(float(q), 6) for n, q in zip(names, p)},
            }
        return out


@dataclass
class FirstTokenTail:
    """The last layer of a BERT-shaped encoder (`layer.attention.self`, `layer.attention.output`): after its
    self-attention, which reads every token, the rest of the layer can run at the first token alone."""

    layer: torch.nn.Module
    #: the self-attention, whose first output is every position's attention context
    attention: torch.nn.Module
    #: what adds the context to its input: called as (context, input)
    residual: torch.nn.Module

    @contextlib.contextmanager
    def cut(self) -> Iterator[None]:
        """Within: the layer's output is its first position's, (batch, 1, hidden)."""
        with self._select(lambda x: x[:, :1]):
            yield

    @contextlib.contextmanager
    def rows(self, keep: torch.Tensor) -> Iterator[None]:
        """Within: the layer's output is the positions `keep` (batch, length) marks, row-major, as (1, rows,
        hidden): a token classifier's rows that carry a label or a score."""
        with self._select(lambda x: x[keep].unsqueeze(0)):
            yield

    @contextlib.contextmanager
    def _select(self, pick: Callable[[torch.Tensor], torch.Tensor]) -> Iterator[None]:
        """Within: the rest of the layer after its self-attention runs on `pick` of every position's rows. Its
        dropouts draw the masks the whole sequence would (`picked_dropout`), so a training step's random numbers,
        and so its loss, are the whole model's (to rounding) and every later draw is where it would be."""
        shape: list[int] = []  # (batch, length) of the whole sequence, seen at the attention's output

        def picked_context(_module, _args, out):
            shape[:] = list((out[0] if isinstance(out, tuple) else out).shape[:2])
            return (pick(out[0]), *out[1:]) if isinstance(out, tuple) else pick(out)

        hooks = [
            self.attention.register_forward_hook(picked_context),
            self.residual.register_forward_pre_hook(lambda _module, args: (args[0], pick(args[1]), *args[2:])),
        ]
        dropouts = self.dropouts()
        for dropout in dropouts:
            dropout.forward = functools.partial(picked_dropout, dropout, shape, pick)  # type: ignore[method-assign]
        try:
            yield
        finally:
            for hook in hooks:
                hook.remove()
            for dropout in dropouts:
                del dropout.forward  # the class's own again

    def dropouts(self) -> list[torch.nn.Dropout]:
        """The layer's dropouts after its self-attention (those that see the cut rows)."""
        inside = {id(m) for m in self.attention.modules()}
        return [m for m in self.layer.modules() if isinstance(m, torch.nn.Dropout) and id(m) not in inside]

    def parameters(self) -> list[torch.nn.Parameter]:
        """The parameters of what runs at the first token only: the layer but for its self-attention."""
        skipped = {id(p) for p in self.attention.parameters()}
        return [p for p in self.layer.parameters() if id(p) not in skipped]


def picked_dropout(
    module: torch.nn.Dropout, shape: list[int], pick: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor
) -> torch.Tensor:
    """`module`'s dropout of the picked rows `x` with the picked part of the mask that the whole sequence (`shape`:
    its batch and length) would draw: the same random numbers drawn, in the same amount (one CPU kernel draws per
    element, another per call), on CPUs and GPUs alike (F.dropout itself draws it)."""
    if not module.training or module.p == 0 or not shape:
        return x  # nn.Dropout draws nothing here either
    full = torch.ones((*shape, *x.shape[2:]), dtype=x.dtype, device=x.device)
    return x * pick(F.dropout(full, module.p, True)).contiguous()  # the copy: the full mask is not kept


def last_layer_tail(model: torch.nn.Module) -> FirstTokenTail | None:
    """The last layer of a BERT-shaped encoder, split at its self-attention (None for another shape); unchecked:
    `first_token_tail` and a token classifier's check it on the model."""
    from leantrain.telemetry.flops import unwrap

    model = unwrap(model)
    found = [name for name, _ in model.named_modules() if name.endswith(".attention.self")]
    if not found:
        return None
    layer = model.get_submodule(found[-1].removesuffix(".attention.self"))
    attention = layer.get_submodule("attention")
    if not isinstance(getattr(attention, "output", None), torch.nn.Module):
        return None
    return FirstTokenTail(layer, attention.get_submodule("self"), attention.get_submodule("output"))


def first_token_tail(model: torch.nn.Module) -> FirstTokenTail | None:
    """The model's `FirstTokenTail`, or None when it has none or its logits read more than the first token (mean
    pooling, the last token): two short rows, one padded, through the model with and without the cut."""
    from leantrain.telemetry.flops import unwrap

    model = unwrap(model)
    tail = last_layer_tail(model)
    if tail is None:
        return None
    vocab = int(getattr(model.config, "vocab_size", None) or 16)  # any valid ids will do
    device = next(model.parameters()).device
    ids = ((torch.arange(12) * 7 + 3) % vocab).view(2, 6).to(device)
    mask = torch.tensor([[1] * 6, [1] * 4 + [0] * 2], device=device)

    def cut() -> torch.Tensor:
        with tail.cut():
            return model(input_ids=ids, attention_mask=mask).logits

    return tail if same_logits(model, lambda: model(input_ids=ids, attention_mask=mask).logits, cut) else None


def cuts_at_the_first_token(cfg: Any) -> bool:
    """Whether a classifier trains its last layer at the first token (`Classification.forward`): not where the step is
    compiled (a graph would not see the hooks) or checkpointed (a layer recomputes without them)."""
    return not (getattr(cfg, "compile", False) or getattr(cfg, "activation_checkpointing", False))


def cut_at_the_first_token(model: torch.nn.Module) -> Callable[[], contextlib.AbstractContextManager] | None:
    """What a classifier's training step runs its forward within: its `FirstTokenTail.cut`, where it has one."""
    tail = first_token_tail(model)
    return tail.cut if tail else None


def classification_metrics(probs: np.ndarray, labels: np.ndarray, names: tuple[str, ...] = ()) -> dict[str, float]:
    """The named scores (default: accuracy, macro-F1) and the mean cross-entropy of predicted class probabilities."""
    from leantrain.tasks.scoring import metric_names, score

    return score("single-label", metric_names("single-label", names), probs, labels)
