"""`--task reward-model`: a Bradley-Terry reward model on preference pairs, `AutoModelForSequenceClassification`
with one output: the reward of prompt + completion (or of a whole text, without a prompt column).

The loss of a pair is -log σ(r_chosen - r_rejected - m), m the row's `margin` column when the data has one (0
otherwise), summed over pairs and divided by the pairs of the whole optimizer step (exact under accumulation and
processes). Both sequences of a pair run in one forward, each its own padded row (a classifier reads its last
token, so rows are not packed). Training and evaluation report `accuracy` (the share of pairs whose chosen outscores
the rejected), `margin` (the mean r_chosen - r_rejected) and `mean_reward`, TRL's RewardTrainer's names.

The published model/ loads with `pipeline("text-classification")` and returns the reward as its score (its config
says regression: no sigmoid). Sequences end with EOS in training, as TRL's: score a text as `text + eos_token`.
`leantrain predict` scores texts (and a table's prompt + completion, or its chosen and rejected) so already.
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np
import torch
import torch.nn.functional as F

from leantrain.data.lm import IGNORE
from leantrain.errors import DataError
from leantrain.tasks.base import PredictionInputs, TaskData, TrainingContext
from leantrain.tasks.preference import PolicyTask

REWARD_METRICS = ("accuracy", "margin", "mean_reward")


def bradley_terry_losses(rewards: torch.Tensor, margin: torch.Tensor | None = None) -> torch.Tensor:
    """Each pair's -log σ(r_c - r_r - m), rewards (pairs, 2: chosen, rejected), m the pairs' margins (or 0)."""
    gap = rewards[:, 0] - rewards[:, 1]
    return -F.logsigmoid(gap if margin is None else gap - margin)


class RewardModel(PolicyTask):
    name: ClassVar[str] = "reward-model"
    aliases: ClassVar[tuple[str, ...]] = ("reward",)
    input_names: ClassVar[tuple[str, ...]] = ("input_ids", "attention_mask")
    auto_model: ClassVar[str] = "AutoModelForSequenceClassification"
    pipeline: ClassVar[str] = "text-classification"
    planner: ClassVar[str | None] = None
    _pooler_note: str | None = None  # what `build_model` did to the pooler (`model_notes`)
    generates: ClassVar[bool] = False
    empty_prompts: ClassVar[bool] = False  # it scores texts: an empty one says nothing
    metric_names: tuple[str, ...] = ("loss", *REWARD_METRICS)
    default_metric: ClassVar[str] = "accuracy"
    uses_reference: ClassVar[bool] = False
    #: whether the model reads prompt and completion as two segments (set when the model is built or loaded)
    segments: bool = False

    @property
    def reference_free(self) -> bool:
        return True

    @classmethod
    def planned_reference(cls, cfg: Any) -> tuple[float, bool]:
        return 0.0, False

    # -- the model -------------------------------------------------------------------------------------------------
    def build_model(self, model_path: str, data: TaskData) -> torch.nn.Module:
        from leantrain.model import loading

        model = loading.load_for_classification(
            model_path,
            ["reward"],
            trust_remote_code=self.cfg.trust_remote_code,
            config=data.model_config,
            notes=self.head_notes,
        )
        # auto: the pooler alone (the added mean layer was measured on classification, not on rewards)
        lora = bool(self.cfg.lora)
        self._pooler_note = loading.start_pooler(model, model_path, self.cfg.pooler, lora=lora, auto_mean=False)
        model.config.problem_type = "regression"  # the pipeline returns the reward itself, no sigmoid
        model.config.pad_token_id = data.processor.pad_token_id  # where each row's last token is
        # an encoder with sentence pairs (BERT) reads prompt and completion as its segments A and B
        self.segments = getattr(model.config, "type_vocab_size", 0) > 1
        self._turn_dropout_off(model)  # as TRL's RewardTrainer turns it off
        return model

    def model_notes(self) -> list[str]:
        return super().model_notes() + ([self._pooler_note] if self._pooler_note else [])

    def check_model(self, model: torch.nn.Module) -> None:
        return None

    def before_training(self, model: torch.nn.Module, data: TaskData, context: TrainingContext) -> None:
        context.say("reward model: the Bradley-Terry loss of each pair's two rewards (no reference model)")

    def collator(self, data: TaskData, *, train: bool):
        from leantrain.data.batching import length_buckets, static_shapes_on
        from leantrain.data.preferences import SequencesCollator

        buckets = length_buckets(self.cfg.max_length) if train and static_shapes_on(self.cfg) else []
        # a classifier reads each row's last real token (an encoder's: its first), however much padding follows
        return SequencesCollator(data.processor.pad_token_id, packing=False, buckets=buckets)

    # -- a step ----------------------------------------------------------------------------------------------------
    def model_inputs(self, batch: dict[str, Any]) -> dict[str, torch.Tensor]:
        inputs = super().model_inputs(batch)
        if self.segments:  # the completion's tokens (the labelled ones) are segment B
            inputs["token_type_ids"] = (batch["labels"] != IGNORE).long()
        return inputs

    def forward(self, model: torch.nn.Module, batch: dict[str, Any]) -> torch.Tensor:
        """Every sequence's reward (sequences,), fp32."""
        return model(**self.model_inputs(batch)).logits[:, 0].float()

    def tail_rows(self, batch: dict[str, Any]) -> int | None:
        return None

    def tail_flops(self, model: torch.nn.Module) -> float:
        return 0.0

    def loss_sum(self, outputs: torch.Tensor, batch: dict[str, Any]) -> torch.Tensor:
        return bradley_terry_losses(outputs.reshape(-1, 2), batch.get("margin")).sum()

    def _row_values(self, rewards: torch.Tensor, batch: dict[str, Any]) -> dict[str, torch.Tensor]:
        pairs = rewards.detach().reshape(-1, 2)
        return {
            "loss": bradley_terry_losses(pairs, batch.get("margin")),
            "accuracy": (pairs[:, 0] > pairs[:, 1]).float(),
            "margin": pairs[:, 0] - pairs[:, 1],
            "mean_reward": pairs.mean(1),
        }

    def train_sums(self, outputs: torch.Tensor, batch: dict[str, Any]) -> dict[str, torch.Tensor]:
        rows = self._row_values(outputs, batch)
        return {**{k: rows[k].sum() for k in REWARD_METRICS}, "pairs": torch.tensor(float(len(rows["loss"])))}

    def train_metrics(self, sums: dict[str, float]) -> dict[str, float]:
        return {k: sums[k] / max(sums["pairs"], 1.0) for k in REWARD_METRICS}

    def eval_rows(self, outputs: torch.Tensor, batch: dict[str, Any]) -> dict[str, torch.Tensor]:
        if batch["sequence_ids"].shape[0] == len(batch["index"]):  # `predict`: one text an example
            return {"score": outputs}
        return self._row_values(outputs, batch)

    def metrics(self, rows: dict[str, np.ndarray]) -> dict[str, float]:
        return {k: float(np.mean(rows[k])) for k in ("loss", *REWARD_METRICS)}

    def summary_rows(self, metrics: dict[str, float]) -> list[tuple[str, str]]:
        return [
            ("eval loss (per pair)", f"{metrics['loss']:.4f}"),
            ("eval pairwise accuracy", f"{metrics['accuracy']:.4f}"),
            ("eval mean margin", f"{metrics['margin']:.4f}"),
        ]

    # -- inference -------------------------------------------------------------------------------------------------
    def load_trained(self, model_path: str) -> torch.nn.Module:
        model = super(PolicyTask, self).load_trained(model_path)
        self.segments = getattr(model.config, "type_vocab_size", 0) > 1
        return model

    def prediction_data(
        self, model_path: str, model_config: Any, inputs: PredictionInputs
    ) -> tuple[TaskData, list[dict[str, Any]]]:
        """Texts to score: --text (each a whole text), else the table's prompt + completion, its chosen and rejected
        (each scored), or its one text column."""
        from leantrain.data.instructions import encode_completion
        from leantrain.data.preferences import from_sequences
        from leantrain.data.prepare import Examples
        from leantrain.model import loading

        if inputs.files is not None:
            raise DataError(f"{model_path}: a reward model scores text; give --text or a table with --data")
        tokenizer = loading.load_tokenizer(model_path, trust_remote_code=self.cfg.trust_remote_code)
        if tokenizer.pad_token_id is None:
            tokenizer.pad_token = tokenizer.eos_token
        shown = [{"text": t} for t in inputs.texts] if inputs.texts is not None else self._table_inputs()
        if not shown:
            raise DataError("predict: no text to score")
        sequences = [list(encode_completion(tokenizer, s.get("prompt", ""), s.get("completion", s.get("text", ""))))
                     for s in shown]  # fmt: skip
        examples = from_sequences(sequences, {})
        return TaskData(None, Examples(examples, np.zeros(len(shown), dtype=np.int64)), [], tokenizer), shown

    def _table_inputs(self) -> list[dict[str, Any]]:
        from leantrain.data import preferences
        from leantrain.data.columns import resolve_columns
        from leantrain.data.sources import read_options, read_table

        df, _ = read_table(self.cfg.eval_data, split="eval", options=read_options(self.cfg, "eval"))
        columns = {str(c).lower() for c in df.columns}
        if {"chosen", "rejected"} <= columns:
            rows = preferences.pair_turns(df, self.cfg.eval_data)
            return [{"prompt": p, "completion": c} for p, *both in rows for c in both]
        if {"prompt", "completion"} <= columns:
            cols = {str(c).lower(): c for c in df.columns}
            return [{"prompt": p, "completion": c} for p, c in zip(df[cols["prompt"]], df[cols["completion"]])]
        text = resolve_columns(df, self.cfg.eval_data, self.cfg.text_column, None, None, require_label=False).text
        return [{"text": str(t)} for t in df[text]]

    def predict(self, model, data: TaskData, shown, rows_of, inputs) -> list[dict[str, Any]]:
        return self.prediction_rows(rows_of(), shown)  # scores, not generation

    def prediction_rows(self, rows: dict[str, np.ndarray], shown: list[dict[str, Any]]) -> list[dict[str, Any]]:
        scores = dict(zip(rows["index"].tolist(), rows["score"].tolist()))
        return [{**s, "score": scores[i]} for i, s in enumerate(shown)]
