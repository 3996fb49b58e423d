"""Text regression and multi-label text classification (`--problem-type`): the text task's data and
model with other targets, loss and scores. The model's saved `problem_type` makes transformers' `pipeline`
return the raw score (regression) or independent sigmoid probabilities (multi-label)."""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np
import torch
import torch.nn.functional as F

from leantrain.errors import ConfigError
from leantrain.tasks.base import TaskData
from leantrain.tasks.text_classification import TextClassification


class _FloatTargets(TextClassification):
    """Shared: float targets batched as float32, no class weights or label smoothing, transformers' problem type."""

    #: transformers' `config.problem_type`
    hf_problem_type: ClassVar[str]
    #: the stream reader (data/streaming.py) maps labels to class ids
    streams: ClassVar[bool] = False

    def __init__(self, cfg: Any):
        super().__init__(cfg)
        for flag, value in (("--class-weights", self.weight_spec), ("--label-smoothing", self.label_smoothing)):
            if value:
                raise ConfigError(f"{flag} is for single-label classification, not --problem-type {self.problem_type}")

    def build_model(self, model_path: str, data):
        model = super().build_model(model_path, data)
        model.config.problem_type = self.hf_problem_type  # saved in config.json: what pipeline() reads
        return model

    def collator(self, data, *, train: bool):
        pad = super().collator(data, train=train)

        def collate(items: list[dict]) -> dict[str, Any]:
            batch = pad([{**x, "label": 0} for x in items])  # the padding collator's labels are class ids
            batch["labels"] = torch.as_tensor(np.stack([np.asarray(x["label"]) for x in items]), dtype=torch.float32)
            return batch

        return collate

    def data_facts(self, data) -> dict[str, Any]:
        import zlib

        facts = super().data_facts(data)
        labels = np.ascontiguousarray(data.train.labels, dtype=np.float32).tobytes()
        return {**facts, "data_fingerprint": zlib.crc32(labels, facts["data_fingerprint"])}


class TextRegression(_FloatTargets):
    """One number per text: mean squared error summed over examples; RMSE, Pearson and Spearman."""

    problem_type: ClassVar[str] = "regression"
    default_metric: ClassVar[str] = "loss"
    hf_problem_type: ClassVar[str] = "regression"

    def label_codec(self):
        from leantrain.data.labels import NumberLabels

        return NumberLabels()

    def build_model(self, model_path: str, data):
        """The head's output bias starts at the training targets' mean: the untrained model is the mean predictor,
        so training starts from the baseline instead of spending its first steps finding the targets' level."""
        model = super().build_model(model_path, data)
        heads = [m for m in model.modules() if isinstance(m, torch.nn.Linear) and m.out_features == 1]
        if heads and heads[-1].bias is not None:
            with torch.no_grad():
                heads[-1].bias.fill_(float(np.mean(data.train.labels)))
        return model

    def loss_sum(self, outputs: Any, batch: dict[str, Any]) -> torch.Tensor:
        return F.mse_loss(outputs.logits.float().squeeze(-1), batch["labels"], reduction="sum")

    def row_losses(self, outputs: Any, batch: dict[str, Any]) -> torch.Tensor:
        return F.mse_loss(outputs.logits.detach().float().squeeze(-1), batch["labels"], reduction="none")

    def eval_rows(self, outputs: Any, batch: dict[str, Any]) -> dict[str, torch.Tensor]:
        return {"preds": outputs.logits.float().squeeze(-1), "labels": batch["labels"]}

    def metrics(self, rows: dict[str, np.ndarray]) -> dict[str, float]:
        from leantrain.tasks.scoring import score

        return score(self.problem_type, self.metric_names, rows["preds"], rows["labels"])


class TextMultiLabel(_FloatTargets):
    """A set of classes per text: binary cross-entropy of each class, summed; the units are the classes, so a
    step's loss is the mean over examples and classes (as transformers' BCEWithLogitsLoss)."""

    problem_type: ClassVar[str] = "multi-label"
    default_metric: ClassVar[str] = "micro_f1"
    hf_problem_type: ClassVar[str] = "multi_label_classification"

    def label_codec(self):
        from leantrain.data.labels import MultiLabels

        return MultiLabels(getattr(self.cfg, "label_separator", None))

    def loss_units(self, data: TaskData) -> np.ndarray | None:
        labels = np.asarray(data.train.labels)
        return np.full(len(labels), float(labels.shape[1]))

    def loss_sum(self, outputs: Any, batch: dict[str, Any]) -> torch.Tensor:
        return F.binary_cross_entropy_with_logits(outputs.logits.float(), batch["labels"], reduction="sum")

    def row_losses(self, outputs: Any, batch: dict[str, Any]) -> torch.Tensor:
        logits = outputs.logits.detach().float()
        return F.binary_cross_entropy_with_logits(logits, batch["labels"], reduction="none").sum(-1)

    def eval_rows(self, outputs: Any, batch: dict[str, Any]) -> dict[str, torch.Tensor]:
        logits = outputs.logits.float()
        return {"probs": torch.sigmoid(logits), "logits": logits, "labels": batch["labels"]}

    def metrics(self, rows: dict[str, np.ndarray]) -> dict[str, float]:
        from leantrain.tasks.scoring import score

        threshold = float(getattr(self.cfg, "multi_label_threshold", 0.5))
        return score(self.problem_type, self.metric_names, rows["probs"], rows["labels"], threshold)


#: `--problem-type` -> the text task that learns it
TEXT_PROBLEMS: dict[str, type[TextClassification]] = {
    "single-label": TextClassification,
    "regression": TextRegression,
    "multi-label": TextMultiLabel,
}
