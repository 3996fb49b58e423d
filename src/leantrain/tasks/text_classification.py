"""Text classification: single texts or sentence pairs, tokenized once and cached; one label per text."""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

from leantrain.errors import ConfigError
from leantrain.tasks.base import TaskData
from leantrain.tasks.classification import Classification


class TextClassification(Classification):
    name: ClassVar[str] = "text-classification"
    input_names: ClassVar[tuple[str, ...]] = ("input_ids", "attention_mask", "token_type_ids")
    streams: ClassVar[bool] = True

    def prepare_data(self, model_path: str, model_config: Any) -> TaskData:
        from leantrain import models
        from leantrain.data.prepare import prepare_data

        tokenizer = models.load_tokenizer(model_path, trust_remote_code=self.cfg.trust_remote_code)
        models.check_tokenizer_fits(tokenizer, model_config, model_path)
        self._check_length(model_config, tokenizer)
        data = prepare_data(self.cfg, tokenizer, Path(self.cfg.cache_dir), self.label_codec())
        return TaskData(data.train, data.eval, list(data.label_names), tokenizer, list(data.notes))

    def label_codec(self) -> Any:
        """How labels become targets (`data.labels`); None: class ids (issue #17: numbers, sets of classes)."""
        return None

    def _check_length(self, model_config: Any, tokenizer: Any) -> None:
        """Refuse a --max-length beyond the model's positions (or the tokenizer's limit)."""
        from leantrain import models

        limit = models.max_supported_length(model_config, tokenizer)
        if limit is not None and self.cfg.max_length > limit:
            raise ConfigError(
                f"--max-length {self.cfg.max_length} is beyond what {self.cfg.model} supports ({limit}); "
                f"use --max-length {limit} or less"
            )

    def build_model(self, model_path: str, data: TaskData):
        from leantrain import models

        return models.load_for_classification(
            model_path, data.label_names, trust_remote_code=self.cfg.trust_remote_code, task=self.name
        )

    def collator(self, data: TaskData, *, train: bool):
        from leantrain.data.batching import Collator

        fixed = self.cfg.max_length if self.cfg.pad_to_max_length else None
        return Collator(data.processor.pad_token_id or 0, fixed_length=fixed)
