"""Text classification: single texts or sentence pairs, tokenized once and cached; one label per text, a number
(regression) or a set of classes (multi-label), as `--problem-type` says. The model's saved `problem_type` makes
transformers' `pipeline` return the raw score (regression) or independent sigmoid probabilities (multi-label)."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch
import torch.nn.functional as F

from leantrain.errors import ConfigError
from leantrain.tasks.base import TaskData
from leantrain.tasks.classification import Classification


class TextClassification(Classification):
    name: ClassVar[str] = "text-classification"
    input_names: ClassVar[tuple[str, ...]] = ("input_ids", "attention_mask", "token_type_ids")
    streams: ClassVar[bool] = True
    auto_model: ClassVar[str] = "AutoModelForSequenceClassification"
    model_mapping: ClassVar[str] = "MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES"
    pipeline: ClassVar[str] = "text-classification"
    planner: ClassVar[str | None] = "classifier"
    _pooler_note: str | None = None  # what `build_model` did to the pooler (`model_notes`)
    _pairs: bool = False  # the training data's texts are sentence pairs (recorded in the model's config)

    @classmethod
    def for_config(cls, cfg: Any):
        """--problem-type: single-label classification (this class), regression or multi-label (below)."""
        for flag in ("precompute_reference", "reference_model"):
            if getattr(cfg, flag, None):
                raise ConfigError(
                    f"--{flag.replace('_', '-')}: the {cls.name} task has no reference model; leave it out"
                )
        return TEXT_PROBLEMS[getattr(cfg, "problem_type", "single-label")](cfg)

    def prepare_data(self, model_path: str, model_config: Any) -> TaskData:
        from leantrain.data.combine import SourceData, prepare_sources
        from leantrain.data.prepare import prepare_data
        from leantrain.model import loading

        tokenizer = loading.load_tokenizer(model_path, trust_remote_code=self.cfg.trust_remote_code)
        if self.cfg.normalize_tweets:  # in the tokenizer: the published model/ reads new tweets the same way
            tokenizer = loading.tweet_tokenizer(tokenizer, model_path)
        loading.check_tokenizer_fits(tokenizer, model_config, model_path)
        self._check_length(model_config, tokenizer)
        cache = Path(self.cfg.cache_dir)

        def read(cfg: Any, codec: Any) -> SourceData:
            data = prepare_data(cfg, tokenizer, cache, codec, seed=cfg.seed)
            self._pairs = self._pairs or data.columns.text_pair is not None
            return SourceData(data.train, data.eval, list(data.notes), list(data.label_names))

        codec = self.label_codec if self.label_codec() is not None else None
        data = prepare_sources(self.cfg, read, codec=codec)
        return TaskData(data.train, data.eval, data.label_names, tokenizer, data.notes, sources=data.facts())

    def label_codec(self) -> Any:
        """How labels become targets (`data.labels`); None: class ids (numbers, sets of classes)."""
        return None

    def _check_length(self, model_config: Any, tokenizer: Any) -> None:
        """Refuse a --max-length beyond the model's positions (or the tokenizer's limit)."""
        from leantrain.model import loading

        limit = loading.max_supported_length(model_config, tokenizer)
        if limit is not None and self.cfg.max_length > limit:
            raise ConfigError(
                f"--max-length {self.cfg.max_length} is beyond what {self.cfg.model} supports ({limit}); "
                f"use --max-length {limit} or less"
            )

    def build_model(self, model_path: str, data: TaskData):
        from leantrain.model import loading

        model = loading.load_for_classification(
            model_path,
            data.label_names,
            trust_remote_code=self.cfg.trust_remote_code,
            auto_model=self.auto_model,
            notes=self.head_notes,
        )
        self._pooler_note = loading.start_pooler(model, model_path, self.cfg.pooler, lora=bool(self.cfg.lora))
        # saved in config.json: inference refuses single texts for a pair model (and pairs for the other)
        model.config.leantrain_text_pairs = self._pairs
        return model

    def model_notes(self) -> list[str]:
        return super().model_notes() + ([self._pooler_note] if self._pooler_note else [])

    def collator(self, data: TaskData, *, train: bool):
        from leantrain.data.batching import Collator

        fixed = self.cfg.max_length if self.cfg.pad_to_max_length else None
        return Collator(data.processor.pad_token_id or 0, fixed_length=fixed)

    # -- inference -------------------------------------------------------------------------------------------------
    def evaluation_data(self, model_path: str, model_config: Any) -> TaskData:
        from leantrain.data.prepare import Examples, load_source
        from leantrain.data.sources import read_options
        from leantrain.model import loading

        cfg = self.cfg
        tokenizer = loading.load_tokenizer(model_path, trust_remote_code=cfg.trust_remote_code)
        source = cfg.eval_data
        src = load_source(
            source,
            tokenizer,
            cfg.max_length,
            Path(cfg.cache_dir),
            "eval",
            cfg.text_column,
            cfg.text_pair_column,
            cfg.label_column,
            options=read_options(cfg, "eval"),
        )
        check_pairs(model_path, model_config, src.path, src.columns.text_pair is not None)
        names = class_names(model_config)
        labels = self.evaluation_labels(src, names)
        src.report.say_dropped()
        facts = {"examples": len(labels), "skipped": src.report.rows_dropped}
        return TaskData(None, Examples(src.tokens, labels), names, tokenizer, facts=facts)

    def evaluation_labels(self, src: Any, names: list[str]):
        """The evaluation source's labels as the trained model's targets; a label the model does not know is refused."""
        import numpy as np

        from leantrain.errors import DataError

        label_id = {n: i for i, n in enumerate(names)}
        unseen = sorted(set(src.labels) - set(label_id))
        if unseen:
            raise DataError(
                f"{src.path}: labels {unseen[:5]} in column '{src.columns.label}' are unknown to the model "
                f"(it knows {names})"
            )
        return np.array([label_id[x] for x in src.labels], dtype=np.int64)

    def prediction_data(self, model_path: str, model_config: Any, inputs: Any) -> tuple[TaskData, list[dict]]:

        from leantrain.data.prepare import Examples
        from leantrain.data.tokenize import tokenize
        from leantrain.errors import DataError
        from leantrain.model import loading

        cfg = self.cfg
        if inputs.files is not None:
            raise DataError(f"{model_path}: a text classifier; give texts with --text or a table with --data")
        texts, pairs = (inputs.texts, None) if inputs.texts is not None else self._table_texts()
        if not texts:
            raise DataError(f"{cfg.eval_data or '--text'}: no text to predict")
        given = "--text" if inputs.texts is not None else cfg.eval_data
        check_pairs(model_path, model_config, given, pairs is not None)
        tokenizer = loading.load_tokenizer(model_path, trust_remote_code=cfg.trust_remote_code)
        tokens = tokenize(tokenizer, texts, pairs, cfg.max_length)
        self.class_names = names = class_names(model_config)
        shown = [{"text": x} if pairs is None else {"text": x, "text_pair": y} for x, y in zip(texts, pairs or texts)]
        data = TaskData(None, Examples(tokens, self.blank_labels(len(texts), names)), names, tokenizer)
        return data, shown

    def blank_labels(self, n: int, names: list[str]):
        """Placeholder targets for examples to predict (the collator batches a label with each)."""
        import numpy as np

        return np.zeros(n, dtype=np.int64)

    def _table_texts(self) -> tuple[list[str], list[str] | None]:
        from leantrain.data.columns import resolve_columns
        from leantrain.data.sources import read_options, read_table

        cfg = self.cfg
        df, report = read_table(cfg.eval_data, split="eval", options=read_options(cfg, "eval"))
        cols = resolve_columns(df, cfg.eval_data, cfg.text_column, cfg.text_pair_column, None, require_label=False)
        blank = df[cols.text].astype(str).str.strip() == ""
        report.drop("with empty text", int(blank.sum()))
        report.say_dropped()
        df = df[~blank]
        texts = df[cols.text].astype(str).tolist()
        return texts, df[cols.text_pair].astype(str).tolist() if cols.text_pair else None


def check_pairs(model_path: str, model_config: Any, source: str, pairs: bool) -> None:
    """Refuse texts of another kind than the model trained on (single texts or sentence pairs): its scores would
    mean nothing. A model that does not record which (not trained by leantrain) takes either."""
    from leantrain.errors import DataError

    trained = getattr(model_config, "leantrain_text_pairs", None)
    if trained is None or trained == pairs:
        return
    if trained:
        raise DataError(
            f"{source}: {model_path} was trained on sentence pairs, this gives single texts; give a table "
            "with both columns to --data (--text-column, --text-pair-column)"
        )
    raise DataError(
        f"{source}: {model_path} was trained on single texts, this gives sentence pairs; name the one text "
        "column with --text-column"
    )


def class_names(model_config: Any) -> list[str]:
    """A trained classifier's class names, in id order."""
    return [model_config.id2label[i] for i in range(model_config.num_labels)]


# -- other targets: numbers and sets of classes -------------------------------------------------------------------


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

    # -- inference -------------------------------------------------------------------------------------------------
    def evaluation_labels(self, src: Any, names: list[str]) -> np.ndarray:
        codec = self.label_codec()
        codec.names = names
        return codec.encode(src.labels, src.path, src.columns.label, training=False)

    def evaluation_report(self, rows: dict[str, np.ndarray], data: TaskData) -> dict[str, Any]:
        return dict(data.facts)

    def data_facts(self, data) -> dict[str, Any]:
        import zlib

        facts = super().data_facts(data)
        labels = np.ascontiguousarray(data.train.labels, dtype=np.float32).tobytes()
        return {**facts, "data_fingerprint": zlib.crc32(labels, facts["data_fingerprint"])}


def _linear_in_fp32(linear: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    with torch.autocast(x.device.type, enabled=False):
        bias = None if linear.bias is None else linear.bias.float()
        return F.linear(x.float(), linear.weight.float(), bias)


class TextRegression(_FloatTargets):
    """One number per text: mean squared error summed over examples; RMSE, Pearson and Spearman."""

    problem_type: ClassVar[str] = "regression"
    default_metric: ClassVar[str] = "loss"
    hf_problem_type: ClassVar[str] = "regression"

    def label_codec(self):
        from leantrain.data.labels import NumberLabels

        return NumberLabels()

    def build_model(self, model_path: str, data):
        """A new head's output bias starts at the training targets' mean: the untrained model is the mean predictor,
        so training starts from the baseline instead of spending its first steps finding the targets' level. A
        trained regression head, kept, keeps its own."""
        from leantrain.model import loading

        model = super().build_model(model_path, data)
        config = loading.load_config(model_path, trust_remote_code=self.cfg.trust_remote_code)
        kept = loading.has_trained_head(model_path, config, self.model_mapping) and not self.head_notes
        heads = [m for m in model.modules() if isinstance(m, torch.nn.Linear) and m.out_features == 1]
        if heads and heads[-1].bias is not None and not kept:
            with torch.no_grad():
                heads[-1].bias.fill_(float(np.mean(data.train.labels)))
        return model

    def check_model(self, model: torch.nn.Module) -> None:
        """The output layer runs in fp32 under bf16/fp16 autocast: a prediction of 2.5 in bf16 moves in steps of
        1/64, which rounds a regression's scores (every prediction of a barely trained model the same number)."""
        from leantrain.telemetry.flops import unwrap

        super().check_model(model)
        heads = [m for m in unwrap(model).modules() if isinstance(m, torch.nn.Linear) and m.out_features == 1]
        if heads:
            heads[-1].forward = functools.partial(_linear_in_fp32, heads[-1])  # type: ignore[method-assign]

    def loss_sum(self, outputs: Any, batch: dict[str, Any]) -> torch.Tensor:
        return F.mse_loss(outputs.logits.float().squeeze(-1), batch["labels"], reduction="sum")

    def row_losses(self, outputs: Any, batch: dict[str, Any]) -> torch.Tensor:
        return F.mse_loss(outputs.logits.detach().float().squeeze(-1), batch["labels"], reduction="none")

    def eval_rows(self, outputs: Any, batch: dict[str, Any]) -> dict[str, torch.Tensor]:
        return {"preds": outputs.logits.float().squeeze(-1), "labels": batch["labels"]}

    def metrics(self, rows: dict[str, np.ndarray]) -> dict[str, float]:
        from leantrain.tasks.scoring import score

        return score(self.problem_type, self.metric_names, rows["preds"], rows["labels"])

    def blank_labels(self, n: int, names: list[str]) -> np.ndarray:
        return np.zeros(n, dtype=np.float32)

    def prediction_rows(self, rows: dict[str, np.ndarray], shown: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Each input with its predicted number (`score`)."""
        out: list[dict[str, Any]] = [{} for _ in shown]
        for value, i in zip(rows["preds"], rows["index"]):
            out[i] = {**shown[i], "score": float(value)}
        return out


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

    def evaluation_report(self, rows: dict[str, np.ndarray], data: TaskData) -> dict[str, Any]:
        """Each class's precision, recall, F1 and support at the threshold."""
        from leantrain.tasks.scoring import multi_label_report

        threshold = float(getattr(self.cfg, "multi_label_threshold", 0.5))
        return {**multi_label_report(rows["probs"], rows["labels"], data.label_names, threshold), **data.facts}

    def blank_labels(self, n: int, names: list[str]) -> np.ndarray:
        return np.zeros((n, len(names)), dtype=np.float32)

    def prediction_rows(self, rows: dict[str, np.ndarray], shown: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Each input with the labels at or above --multi-label-threshold and every label's probability."""
        threshold, names = float(self.cfg.multi_label_threshold), self.class_names
        out: list[dict[str, Any]] = [{} for _ in shown]
        for p, i in zip(rows["probs"], rows["index"]):
            out[i] = {
                **shown[i],
                "labels": [n for n, q in zip(names, p) if q >= threshold],
                "probabilities": {n: round(float(q), 6) for n, q in zip(names, p)},
            }
        return out


#: `--problem-type` -> the text task that learns it
TEXT_PROBLEMS: dict[str, type[TextClassification]] = {
    "single-label": TextClassification,
    "regression": TextRegression,
    "multi-label": TextMultiLabel,
}
