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
        mixed = self._refuse_unread_columns()

        def read(source_cfg: Any, codec: Any) -> SourceData:
            # a run's own data read back (evaluate's held-out rows) is read as the run read it: not checked again
            checked = not mixed and not self.recorded
            data = media.prepare_media_data(
                source_cfg, processor, Path(cfg.cache_dir), codec, seed=source_cfg.seed, check_columns=checked
            )
            return SourceData(data.train, data.eval, list(data.notes), list(data.label_names))

        data = prepare_sources(cfg, read, tokens=False, what=self.name)
        sized = media.model_config(model_path, model_config, processor, cfg.trust_remote_code)
        return TaskData(data.train, data.eval, data.label_names, processor, data.notes, sized, sources=data.facts())

    def _refuse_unread_columns(self) -> bool:
        """Whether the data is a mixture; if so, a run-wide column flag is refused where no source is a table (one
        source's folder beside another's table is no mistake: the table reads it)."""
        from leantrain.data import media
        from leantrain.data.combine import is_mixture, source_config, sources_of
        from leantrain.data.sources import read_options
        from leantrain.errors import DataError

        cfg, specs = self.cfg, sources_of(self.cfg)
        if not is_mixture(specs):
            return False
        subs = [(spec, source_config(cfg, spec)) for spec in specs]
        sources = [(spec.path, read_options(sub, "train")) for spec, sub in subs]
        key = media.column_key(self.name)
        columns = {key: self.input_column, "label_column": cfg.label_column}
        media.refuse_unread_columns(self.name, [*sources, (cfg.eval_data, read_options(cfg, "eval"))], **columns)
        for spec, sub in subs:  # a source's own column flag is read by its own files or by none
            own = {k: spec.option(k) for k in (key, "label_column") if spec.option(k) is not None}
            try:
                media.refuse_unread_columns(
                    self.name,
                    [(spec.path, read_options(sub, "train")), (sub.eval_data, read_options(sub, "eval"))],
                    **own,
                )
            except DataError as exc:
                raise DataError(f"--data source {spec.name}: {exc}") from None
        return True

    def build_model(self, model_path: str, data: TaskData):
        from leantrain.model import loading

        return loading.load_for_classification(
            model_path,
            data.label_names,
            trust_remote_code=self.cfg.trust_remote_code,
            auto_model=self.auto_model,
            config=data.model_config,
            notes=self.head_notes,
        )

    def collator(self, data: TaskData, *, train: bool):
        from leantrain.data.media import MediaCollator

        examples = data.train if data.train is not None else data.eval  # at inference there is no training data
        norm = getattr(examples.features, "norm", None)  # uint8 pixels: normalised per batch
        if train:
            return MediaCollator(self.name, norm, augment=self.cfg.augment, seed=self.cfg.seed)
        return MediaCollator(self.name, norm)

    def flop_input_shapes(self, data: TaskData) -> dict[str, tuple[int, ...]] | None:
        return data.train.features.input_shapes

    # -- inference -------------------------------------------------------------------------------------------------
    def _given_columns(self) -> dict[str, Any]:
        """The column flags to check against a source: of a trained run's config read back, only those evaluate or
        predict was given (the run's own, such as a table's --image-column, may not fit another source)."""
        from leantrain.data import media

        columns = {media.column_key(self.name): self.input_column, "label_column": self.cfg.label_column}
        return {k: v for k, v in columns.items() if not self.recorded or k in self.given}

    @property
    def input_column(self) -> str | None:
        """--image-column or --audio-column, whichever is this task's."""
        return self.cfg.image_column if self.name == "image-classification" else self.cfg.audio_column

    def evaluation_data(self, model_path: str, model_config: Any) -> TaskData:
        import numpy as np

        from leantrain.data import media
        from leantrain.data.prepare import Examples
        from leantrain.data.sources import read_options
        from leantrain.errors import DataError
        from leantrain.tasks.text_classification import class_names

        cfg = self.cfg
        media.refuse_unread_columns(self.name, [(cfg.eval_data, read_options(cfg, "eval"))], **self._given_columns())
        processor = media.load_processor(model_path, model_config, self.name)
        src = media.load_media_source(
            cfg.eval_data,
            processor,
            Path(cfg.cache_dir),
            "eval",
            input_column=self.input_column,
            label_column=cfg.label_column,
            label_pattern=cfg.label_pattern,
            options=read_options(cfg, "eval"),
        )
        names = class_names(model_config)
        label_id = {n: i for i, n in enumerate(names)}
        unseen = sorted(set(src.labels) - set(label_id))
        if unseen:
            raise DataError(f"{cfg.eval_data}: labels {unseen[:5]} are unknown to the model (it knows {names})")
        labels = np.array([label_id[x] for x in src.labels], dtype=np.int64)
        if src.report.rows_dropped:  # the scores count fewer files than the source holds: said, as for text
            import logging

            logging.getLogger("leantrain").warning("%s", src.summary())
        facts = {"examples": len(labels), "skipped": src.report.rows_dropped}
        return TaskData(None, Examples(src.features, labels), names, processor, facts=facts)

    def prediction_data(self, model_path: str, model_config: Any, inputs: Any) -> tuple[TaskData, list[dict]]:
        import numpy as np

        from leantrain.data import media
        from leantrain.data.prepare import Examples
        from leantrain.data.sources import ReadReport, read_options
        from leantrain.errors import DataError
        from leantrain.tasks.text_classification import class_names

        cfg, files = self.cfg, inputs.files
        if inputs.texts is not None:
            what = self.name.split("-")[0]
            raise DataError(f"{model_path}: an {what} classifier; give {what} files with --file or --data")
        processor = media.load_processor(model_path, model_config, self.name)
        if files is not None:
            missing = [f for f in files if not Path(f).is_file()]
            if missing and Path(missing[0]).is_dir():  # it exists: "no such file" would send the user looking for it
                raise DataError(f"{missing[0]}: a folder; give its files with --data {missing[0]} (or --file FILE)")
            if missing:
                raise DataError(f"{missing[0]}: no such file")
            report = ReadReport("--file", len(files))
            listing = media.MediaListing("--file", list(files), list(files), None, "-", "files", report)
        else:
            source = [(cfg.eval_data, read_options(cfg, "eval"))]
            given = {k: v for k, v in self._given_columns().items() if k != "label_column"}  # (predict reads none)
            media.refuse_unread_columns(self.name, source, **given)
            listing = media.list_source(
                cfg.eval_data, self.name, need_labels=False, input_column=self.input_column, split="eval",
                options=read_options(cfg, "eval"),
            )  # fmt: skip
        src = media.process_source(listing, processor, strict=files is not None)
        if src.skipped:
            import logging

            logging.getLogger("leantrain").warning(
                "%s: %d unreadable files skipped (%s)", cfg.eval_data, src.report.rows_dropped, ", ".join(src.skipped)
            )
        self.class_names = names = class_names(model_config)
        data = TaskData(None, Examples(src.features, np.zeros(len(src.names), dtype=np.int64)), names, processor)
        return data, [{"file": name} for name in src.names]
