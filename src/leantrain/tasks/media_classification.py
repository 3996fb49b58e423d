"""What image and audio classification share: fixed-size inputs from a processor, processed once and cached."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from leantrain.tasks.base import TaskData
from leantrain.tasks.classification import Classification


class MediaClassification(Classification):
    """A classifier over fixed-size inputs (pixels, audio features); no tokens, so no padding to count."""

    def prepare_data(self, model_path: str, model_config: Any) -> TaskData:
        from leantrain.data import media
        from leantrain.data.combine import SourceData, prepare_sources

        cfg = self.cfg
        processor = media.load_processor(model_path, model_config, self.name, cfg.max_seconds)

        def read(source_cfg: Any, codec: Any) -> SourceData:
            data = media.prepare_media_data(source_cfg, processor, Path(cfg.cache_dir), codec)
            return SourceData(data.train, data.eval, list(data.notes), list(data.label_names))

        data = prepare_sources(cfg, read, tokens=False, what=self.name)
        sized = media.model_config(model_path, model_config, processor, cfg.trust_remote_code)
        return TaskData(data.train, data.eval, data.label_names, processor, data.notes, sized, sources=data.facts())

    def build_model(self, model_path: str, data: TaskData):
        from leantrain.model import loading

        return loading.load_for_classification(
            model_path,
            data.label_names,
            trust_remote_code=self.cfg.trust_remote_code,
            task=self.name,
            config=data.model_config,
        )

    def collator(self, data: TaskData, *, train: bool):
        from leantrain.data.media import MediaCollator

        norm = getattr(data.train.features, "norm", None)  # uint8 pixels: normalised per batch
        if train:
            return MediaCollator(self.name, norm, augment=self.cfg.augment, seed=self.cfg.seed)
        return MediaCollator(self.name, norm)

    def flop_input_shapes(self, data: TaskData) -> dict[str, tuple[int, ...]] | None:
        return data.train.features.input_shapes
