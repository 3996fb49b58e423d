"""Token classification (named entities, PII, part of speech): a tag per word, learnt on its sub-word tokens.

Data: CoNLL files, tables of word and tag lists, or texts with entity spans (data/tagged.py); tags in IOB1, IOB2 or
BIOES, detected or named (`--tag-scheme`), repaired where invalid and converted to IOB2 (data/tags.py), the scheme of
the published model, which `pipeline("token-classification")` serves. Words become sub-word tokens through the fast
tokenizer's word ids, in windows of --max-length sharing --stride tokens (data/alignment.py): each word is trained
on and scored once.

The loss is the cross-entropy summed over the tokens that carry a label (each word's first sub-word, or all of them
with --label-all-tokens), class-weighted and label-smoothed as a classifier's; `loss_units` gives each window's
counted tokens (or their class weights), so the trainer divides by the counted tokens of the whole optimizer step:
accumulation and N processes are exact however unevenly tokens fall into micro-batches.

Scores: entity-level precision, recall and F1 (seqeval, strict IOB2, micro and per type) and token accuracy over
every evaluation word (tasks/entities.py); the best model is the one with the best entity F1.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import torch
import torch.nn.functional as F

from leantrain.data.alignment import IGNORE
from leantrain.data.batching import length_mask, padded, slot_fields
from leantrain.data.split import beyond_limit
from leantrain.errors import ConfigError, DataError
from leantrain.tasks.base import Task, TaskData
from leantrain.telemetry.console import counted


@dataclass
class Sentences:
    """Sentences ready to window: their tokens (`data.alignment.Aligned`), each word's label id (None: none) and
    each sentence's gold tags (IOB2 names; None without tags)."""

    aligned: Any
    tags: list[np.ndarray] | None
    gold: list[list[str]] | None
    where: list[str]


class TokenClassification(Task):
    name: ClassVar[str] = "token-classification"
    aliases: ClassVar[tuple[str, ...]] = ("ner",)
    input_names: ClassVar[tuple[str, ...]] = ("input_ids", "attention_mask")
    auto_model: ClassVar[str] = "AutoModelForTokenClassification"
    model_mapping: ClassVar[str] = "MODEL_FOR_TOKEN_CLASSIFICATION_MAPPING_NAMES"
    architectures: ClassVar[tuple[str, ...]] = ("ForTokenClassification",)
    pipeline: ClassVar[str] = "token-classification"
    planner: ClassVar[str | None] = "token-classifier"
    metric_names: tuple[str, ...] = ("f1", "precision", "recall", "accuracy", "loss")
    default_metric: ClassVar[str] = "f1"

    def __init__(self, cfg: Any):
        super().__init__(cfg)
        if getattr(cfg, "metrics", None):
            raise ConfigError(
                "--metrics is for classification; token classification reports entity F1, precision, "
                "recall, token accuracy and loss"
            )
        self.label_smoothing = float(getattr(cfg, "label_smoothing", 0.0) or 0.0)
        self.weight_spec: str | None = getattr(cfg, "class_weights", None)
        self.class_weights: np.ndarray | None = None
        self._weights_tensor: torch.Tensor | None = None
        #: the evaluation sentences' gold tags, and the scheme they are scored by ("iob2", or "none")
        self.eval_gold: list[list[str]] = []
        self.scheme = "iob2"
        self.label_names: list[str] = []
        #: at prediction, the sentences predicted on (their tokens' words and characters)
        self.predicting: Any = None

    # -- data ------------------------------------------------------------------------------------------------------
    def prepare_data(self, model_path: str, model_config: Any) -> TaskData:
        from leantrain.data.combine import single_source
        from leantrain.data.prepare import Examples
        from leantrain.data.sources import EMBEDDED_DATA

        cfg = self.cfg
        if cfg.data is not None:
            single_source(cfg, self.name)
        if cfg.data in (None, EMBEDDED_DATA):
            raise ConfigError(
                "--task token-classification needs --data: a CoNLL file, a table of tokens and tags, "
                "or texts with entity spans"
            )
        tokenizer = self._tokenizer(model_path, model_config)
        train_rows = self._read(cfg.data, "train")
        eval_rows = self._read(cfg.eval_data, "eval") if cfg.eval_data else None
        self._refuse_unread_flag([train_rows] + ([eval_rows] if eval_rows else []))
        notes = [_describe(train_rows)] + ([_describe(eval_rows)] if eval_rows else [])
        train_rows, eval_rows, notes = self._tag(train_rows, eval_rows, notes)
        train = self._sentences(tokenizer, train_rows, notes)
        if eval_rows is None:
            train, held = _hold_out(train, cfg.eval_fraction, cfg.seed)
            notes.append(
                f"held out {counted(len(held.where), 'sentence')} ({cfg.eval_fraction:.0%}, seed {cfg.seed}) "
                "for evaluation"
            )
        else:
            held = self._sentences(tokenizer, eval_rows, notes)
        if cfg.limit is not None and cfg.limit < len(train.where):
            keep = np.sort(np.random.default_rng(cfg.seed + 1).permutation(len(train.where))[: cfg.limit])
            train = _subset(train, keep)
            notes.append(f"training on a random sample of {cfg.limit:,} sentences (--limit)")
        elif over := beyond_limit(cfg.limit, len(train.where), "training sentences"):
            notes.append(over)
        train_windows, eval_windows = self._windows(tokenizer, train), self._windows(tokenizer, held)
        self.eval_gold = held.gold or []
        notes.append(_window_note(train_windows, len(train.where), cfg, tokenizer))
        if int(train_windows.counted_tokens().sum()) == 0:
            raise DataError(f"{cfg.data}: no training token carries a tag; check the data")
        return TaskData(
            Examples(train_windows, train_windows.sentence),
            Examples(eval_windows, eval_windows.sentence),
            list(self.label_names),
            tokenizer,
            notes,
            facts={"sentences": len(held.where), "words": sum(len(g) for g in self.eval_gold)},
        )

    def _tokenizer(self, model_path: str, model_config: Any):
        from leantrain.data.alignment import check_fast
        from leantrain.model import loading

        tokenizer = loading.load_tokenizer(model_path, trust_remote_code=self.cfg.trust_remote_code)
        check_fast(tokenizer, model_path)
        if getattr(tokenizer, "add_prefix_space", None) is False:  # byte-level BPE (RoBERTa) reads words with a space
            tokenizer = type(tokenizer).from_pretrained(model_path, add_prefix_space=True)
        limit = loading.max_supported_length(model_config, tokenizer)
        if limit is not None and self.cfg.max_length > limit:
            raise ConfigError(
                f"--max-length {self.cfg.max_length} is beyond what {self.cfg.model} supports ({limit}); "
                f"use --max-length {limit} or less (longer sentences are windowed)"
            )
        return tokenizer

    def _columns(self):
        from leantrain.data.tagged import TaggedColumns

        cfg = self.cfg
        return TaggedColumns(cfg.tokens_column, cfg.tags_column, cfg.text_column, cfg.spans_column, cfg.tag_column)

    def _read(self, source: str, split: str, require_tags: bool = True):
        from leantrain.data.sources import read_options, resolve_data_path
        from leantrain.data.tagged import read_tagged

        cfg = self.cfg
        rows = read_tagged(resolve_data_path(source), split, read_options(cfg, split), self._columns(), require_tags)
        if len(rows) == 0:
            raise DataError(f"{source}: no sentence to read")
        return rows

    def _refuse_unread_flag(self, read: list) -> None:
        """A reading flag that none of the sources read (--tags-column beside a CoNLL file) would be ignored without
        a word: refused, unless the config is a trained run's own, read back (then only what evaluate or predict
        was given is checked)."""
        from leantrain.data.tagged import TaggedColumns, unread_flag

        keys = ("tokens_column", "tags_column", "text_column", "spans_column", "tag_column", "tag_scheme")
        checked = {k: getattr(self.cfg, k) if not self.recorded or k in self.given else None for k in keys}
        columns = TaggedColumns(*(checked[k] for k in keys[:-1]))
        if message := unread_flag(columns, checked["tag_scheme"] or "auto", read):
            raise ConfigError(message)

    def _tag(self, train, evaluation, notes: list[str]):
        """The tags of both sources in IOB2 (or as they are, without a scheme); the label names from training's."""
        from leantrain.data import tags as schemes

        scheme = self._scheme(train)
        train, repaired = _to_iob2(train, scheme)
        if repaired:
            notes.append(
                f"{train.source}: repaired {repaired:,} tags that {scheme.upper()} does not allow where they "
                "stand (an I- that continues no entity, an entity no E- closes)"
            )
        self.scheme = "none" if scheme == "none" else "iob2"
        if self.scheme == "iob2":
            types = {schemes.parse(t)[1] for seq in _all_tags(train) for t in seq} - {None}
            self.label_names = schemes.iob2_label_names(t for t in types if t is not None)
        else:
            self.label_names = sorted({t for seq in _all_tags(train) for t in seq})
        if len(self.label_names) < 2:
            raise DataError(f"{train.source}: every tag is {self.label_names}; a tagger needs at least two")
        if train.tags is not None:
            detected = " (detected)" if self.cfg.tag_scheme == "auto" else ""
            notes.append(
                f"tags read as {scheme.upper()}{detected}"
                + (", trained as IOB2" if scheme not in ("iob2", "none") else "")
            )
        if evaluation is not None:
            evaluation, fixed = _to_iob2(evaluation, self._scheme(evaluation) if scheme != "none" else "none")
            if fixed:
                notes.append(f"{evaluation.source}: repaired {fixed:,} tags its scheme does not allow where they stand")
        return train, evaluation, notes

    def _scheme(self, rows) -> str:
        from leantrain.data import tags as schemes

        if self.cfg.tag_scheme != "auto" or rows.tags is None:
            return self.cfg.tag_scheme if self.cfg.tag_scheme != "auto" else "iob2"
        try:
            return schemes.detect(rows.tags)
        except ValueError as exc:
            raise DataError(f"{rows.source}: {exc}") from None

    def _sentences(self, tokenizer: Any, rows, notes: list[str]) -> Sentences:
        """Rows tokenized, each word's tag as a label id of the training labels (refused, named, when unknown)."""
        from leantrain.data.alignment import align_texts, align_words

        if rows.words is not None:
            aligned = align_words(tokenizer, rows.words)
            gold = rows.tags
        else:
            aligned = align_texts(tokenizer, rows.texts)
            gold, misaligned = _span_tags(aligned, rows)
            if misaligned:
                notes.append(
                    f"{rows.source}: {misaligned:,} entity spans start or end inside a word; the whole word is tagged"
                )
        if tokenless := aligned.tokenless_words():
            notes.append(
                f"{rows.source}: {tokenless:,} words have no token (the tokenizer drops them); they are "
                "scored as predicted O"
            )
        tags = None if gold is None else self._label_ids(gold, rows)
        return Sentences(aligned, tags, gold, rows.where)

    def _label_ids(self, gold: list[list[str]], rows) -> list[np.ndarray]:
        index = {n: i for i, n in enumerate(self.label_names)}
        unknown = sorted({t for seq in gold for t in seq} - set(index))
        if unknown:
            raise DataError(
                f"{rows.source}: tags {unknown[:6]} never occur in the training data (which has "
                f"{self.label_names[:12]}); fix or drop those rows"
            )
        return [np.array([index[t] for t in seq], dtype=np.int64) for seq in gold]

    def _windows(self, tokenizer: Any, sentences: Sentences):
        from leantrain.data.alignment import make_windows, special_tokens

        cfg = self.cfg
        continuation = self._continuation() if cfg.label_all_tokens else None
        return make_windows(
            sentences.aligned, sentences.tags, cfg.max_length, cfg.stride, special_tokens(tokenizer), continuation
        )

    def _continuation(self) -> np.ndarray:
        """For each label id, the label of a word's later sub-words: I-X for B-X, else the label itself."""
        index = {n: i for i, n in enumerate(self.label_names)}
        return np.array(
            [index.get("I-" + n[2:], i) if n.startswith("B-") else i for i, n in enumerate(self.label_names)],
            dtype=np.int64,
        )

    # -- model and batches -------------------------------------------------------------------------------------------
    def build_model(self, model_path: str, data: TaskData) -> torch.nn.Module:
        from leantrain.model import loading

        model = loading.load_for_classification(
            model_path,
            data.label_names,
            trust_remote_code=self.cfg.trust_remote_code,
            auto_model=self.auto_model,
            notes=self.head_notes,
        )
        # saved in config.json: tags trained as plain names (--tag-scheme none) are scored so again, not as entities
        model.config.leantrain_tag_scheme = self.scheme
        return model

    def collator(self, data: TaskData, *, train: bool):
        fixed = self.cfg.max_length if self.cfg.pad_to_max_length else None
        return TokenCollator(data.processor.pad_token_id or 0, fixed)

    #: the encoder's last layer after its attention, run only where a token carries a label or a score
    #: (`forward`); set by `check_model`
    tail: Any = None

    def check_model(self, model: torch.nn.Module) -> None:
        # A compiled graph would not see the hooks, and a checkpointed layer recomputes without them. On a CPU in
        # bf16 or fp16 the cut's gathers cost more than the rows save (WNUT-16 on MiniLM: 27% slower on a Sapphire
        # Rapids, level on an EPYC; in fp32 4-5% faster on both): benchmarks/results/token_classification_vs_hf_spr.md
        from leantrain import parallel

        half_on_cpu = parallel.device_type() == "cpu" and parallel.choose_precision(self.cfg.precision)[0] != "fp32"
        cut = not (getattr(self.cfg, "compile", False) or getattr(self.cfg, "activation_checkpointing", False))
        self.tail = labelled_rows_tail(model) if cut and not half_on_cpu else None

    def forward(self, model: torch.nn.Module, batch: dict[str, Any]) -> Any:
        """The model's logits at the positions that carry a label (training) or a score (evaluation), as (rows,
        classes): the last layer after its attention, and the head, run there only. Every token still feeds the
        last attention's keys and values, so the loss, gradients and scores are the same up to rounding, for less
        work where words have several sub-words (and no work on padding)."""
        if self.tail is None:
            return model(**self.model_inputs(batch))
        keep = self._kept(batch)
        with self.tail.rows(keep):
            logits = model(**self.model_inputs(batch)).logits[0]
        return SelectedLogits(logits, keep)

    def _kept(self, batch: dict[str, Any]) -> torch.Tensor:
        keep = batch["labels"] != IGNORE
        if not torch.is_grad_enabled():  # evaluation also scores words, and prediction reads every owned token
            keep = keep | (batch["word_index"] >= 0) | ((batch["token_index"] >= 0) & (self.predicting is not None))
        return keep

    def tail_rows(self, batch: dict[str, Any]) -> int | None:
        return None if self.tail is None else int(self._kept(batch).sum())

    def tail_flops(self, model: torch.nn.Module) -> float:
        from leantrain.model.lora import head_modules
        from leantrain.telemetry.flops import row_flops, unwrap

        if self.tail is None:
            return 0.0
        model = unwrap(model)
        base = getattr(model, "get_base_model", None)  # --lora: the model's own head
        model = base() if callable(base) else model
        head = [
            p
            for name in head_modules(model)
            for n, p in model.get_submodule(name).named_parameters()
            if "original_module" not in n  # LoRA keeps the head's original beside the copy it trains and runs
        ]
        return row_flops(self.tail.parameters() + head)

    def loss_units(self, data: TaskData) -> np.ndarray:
        """Each window's counted tokens, or with --class-weights the sum of their classes' weights."""
        windows = data.train.features
        if self.weight_spec is None:
            return windows.counted_tokens().astype(np.float64)
        from leantrain.model.losses import class_weights

        labels = windows.labels
        counted = labels != IGNORE
        self.class_weights = class_weights(self.weight_spec, labels[counted], len(data.label_names))
        self._weights_tensor = None
        per_token = np.where(counted, self.class_weights[np.maximum(labels, 0)], 0.0)
        return np.add.reduceat(per_token, windows.offsets[:-1]).astype(np.float64)

    def loss_sum(self, outputs: Any, batch: dict[str, Any]) -> torch.Tensor:
        logits, labels = _every_position(outputs, batch["labels"])
        return F.cross_entropy(
            logits.reshape(-1, logits.shape[-1]),
            labels.reshape(-1),
            weight=self._weights(logits),
            ignore_index=IGNORE,
            label_smoothing=self.label_smoothing,
            reduction="sum",
        )

    def _weights(self, logits: torch.Tensor) -> torch.Tensor | None:
        if self.class_weights is None:
            return None
        if self._weights_tensor is None or self._weights_tensor.device != logits.device:
            self._weights_tensor = torch.tensor(self.class_weights, dtype=torch.float32, device=logits.device)
        return self._weights_tensor

    # -- evaluation --------------------------------------------------------------------------------------------------
    def eval_rows(self, outputs: Any, batch: dict[str, Any]) -> dict[str, torch.Tensor]:
        """Per window, padded to --max-length: each position's predicted label and the word it scores (-1: none),
        the summed (unweighted) loss and counted tokens; predicting, every position's probabilities and token."""
        logits = _scattered(outputs, batch["labels"].shape)
        labels = batch["labels"]
        losses = F.cross_entropy(logits.transpose(1, 2), labels, ignore_index=IGNORE, reduction="none")
        width = max(self.cfg.max_length, logits.shape[1])
        pad = width - logits.shape[1]
        rows = {
            "pred": F.pad(logits.argmax(-1), (0, pad), value=0),
            "word": F.pad(batch["word_index"], (0, pad), value=-1),
            "sentence": batch["sentence"],
            "loss_sum": losses.sum(-1),
            "tokens": (labels != IGNORE).sum(-1),
        }
        if self.predicting is not None:
            rows["probs"] = F.pad(F.softmax(logits, -1), (0, 0, 0, pad))
            rows["token"] = F.pad(batch["token_index"], (0, pad), value=-1)
        return rows

    def metrics(self, rows: dict[str, np.ndarray]) -> dict[str, float]:
        from leantrain.tasks.entities import entity_scores

        predicted = self._predicted_tags(rows)
        tokens = float(rows["tokens"].sum())
        scores = entity_scores(self.eval_gold, predicted, self.scheme)
        return {**scores, "loss": float(rows["loss_sum"].sum()) / max(tokens, 1.0)}

    def _predicted_tags(self, rows: dict[str, np.ndarray]) -> list[list[str]]:
        """Each evaluation sentence's predicted tags, word by word (O for a word no window scored)."""
        predicted = [["O"] * len(g) for g in self.eval_gold]
        scored = rows["word"] >= 0
        sentence = np.broadcast_to(rows["sentence"][:, None], scored.shape)[scored]
        names = self.label_names
        for s, w, p in zip(sentence.tolist(), rows["word"][scored].tolist(), rows["pred"][scored].tolist()):
            predicted[s][w] = names[p]
        return predicted

    def summary_rows(self, metrics: dict[str, float]) -> list[tuple[str, str]]:
        entity = "entity " if self.scheme == "iob2" else "macro "
        shown = {
            "f1": f"eval {entity}F1",
            "precision": f"eval {entity}precision",
            "recall": f"eval {entity}recall",
            "accuracy": "eval token accuracy",
            "loss": "eval loss (per token)",
        }
        return [(label, f"{metrics[k]:.4f}") for k, label in shown.items() if k in metrics]

    def data_facts(self, data: TaskData) -> dict[str, Any]:
        windows = data.train.features
        crc = zlib.crc32(np.ascontiguousarray(windows.input_ids).tobytes())
        crc = zlib.crc32(np.ascontiguousarray(windows.labels).tobytes(), crc)
        from leantrain.data.alignment import special_tokens, window_stride

        # a resumed run's windows share as many tokens (evaluation's too, which the fingerprint does not cover)
        stride = window_stride(self.cfg.stride, self.cfg.max_length, special_tokens(data.processor))
        return {
            "train_examples": len(data.train),
            "label_names": list(data.label_names),
            "data_fingerprint": crc,
            "stride": stride,
        }

    # -- inference ---------------------------------------------------------------------------------------------------
    def _trained_labels(self, model_config: Any) -> None:
        from leantrain.data import tags as schemes

        self.label_names = [model_config.id2label[i] for i in range(model_config.num_labels)]
        plain = all(schemes.parse(n)[0] in ("", schemes.OUTSIDE) for n in self.label_names)
        self.scheme = getattr(model_config, "leantrain_tag_scheme", None) or ("none" if plain else "iob2")

    def evaluation_data(self, model_path: str, model_config: Any) -> TaskData:
        """The config's `eval_data` (any input format), tags converted to IOB2 and mapped to the model's labels."""
        from leantrain.data.prepare import Examples

        self._trained_labels(model_config)
        tokenizer = self._tokenizer(model_path, model_config)
        rows = self._read(self.cfg.eval_data, "eval")
        self._refuse_unread_flag([rows])
        scheme = self._scheme(rows) if self.scheme == "iob2" else "none"
        rows, repaired = _to_iob2(rows, scheme)
        notes: list[str] = []
        sentences = self._sentences(tokenizer, rows, notes)
        windows = self._windows(tokenizer, sentences)
        self.eval_gold = sentences.gold or []
        facts = {
            "sentences": len(sentences.where),
            "words": sum(len(g) for g in self.eval_gold),
            "tag_scheme": scheme,
            "tags_repaired": repaired,
        }
        return TaskData(None, Examples(windows, windows.sentence), self.label_names, tokenizer, notes, facts=facts)

    def evaluation_report(self, rows: dict[str, np.ndarray], data: TaskData) -> dict[str, Any]:
        """Each entity type's precision, recall, F1 and support (strict IOB2), and the counts."""
        from leantrain.tasks.entities import entity_report

        if self.scheme != "iob2":
            return dict(data.facts)
        report = entity_report(self.eval_gold, self._predicted_tags(rows))
        per_type = {
            k: {
                "precision": float(v["precision"]),
                "recall": float(v["recall"]),
                "f1": float(v["f1-score"]),
                "support": int(v["support"]),
            }
            for k, v in report.items()
            if k != "micro avg"
        }
        return {"per_type": per_type, **data.facts}

    def prediction_data(self, model_path: str, model_config: Any, inputs: Any) -> tuple[TaskData, list[dict]]:
        """--text (texts: the tokenizer's words), or a table, CoNLL file or text file (one text a line) of words or
        texts; each prediction shows its input."""
        from leantrain.data.alignment import align_texts, align_words
        from leantrain.data.prepare import Examples

        if inputs.files is not None:
            raise DataError(f"{model_path}: a token classifier; give texts with --text or a file with --data")
        self._trained_labels(model_config)
        tokenizer = self._tokenizer(model_path, model_config)
        words, texts = (None, inputs.texts) if inputs.texts is not None else self._inputs_of_table()
        if not (words or texts):
            raise DataError(f"{self.cfg.eval_data or '--text'}: nothing to predict on")
        aligned = align_words(tokenizer, words) if words is not None else align_texts(tokenizer, texts or [])
        self.predicting = aligned
        self.eval_gold = [["O"] * len(w) for w in aligned.words]
        windows = self._windows(tokenizer, Sentences(aligned, None, None, []))
        shown = [{"tokens": w} for w in words] if words is not None else [{"text": t} for t in texts or []]
        return TaskData(None, Examples(windows, windows.sentence), self.label_names, tokenizer), shown

    def _inputs_of_table(self) -> tuple[list[list[str]] | None, list[str] | None]:
        from leantrain.data.sources import text_lines
        from leantrain.data.tagged import TaggedRows

        source = self.cfg.eval_data
        if (lines := text_lines(source, self.cfg.format)) is not None:
            self._refuse_unread_flag([TaggedRows(source, [], kind="lines")])  # no column to name
            return None, lines
        rows = self._read(source, "eval", require_tags=False)
        self._refuse_unread_flag([rows])
        return rows.words, rows.texts

    def prediction_rows(self, rows: dict[str, np.ndarray], shown: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Each input with its entities (type, score, text and character offsets, as the pipeline gives them with
        --aggregation); inputs given as words also get each word's tag."""
        from leantrain.tasks.entities import group, pieces

        aligned, names = self.predicting, self.label_names
        probs = _token_probabilities(rows, [len(ids) for ids in aligned.token_ids], len(names))
        tags = self._predicted_tags(rows)
        out = []
        for s, show in enumerate(shown):
            units = pieces(probs[s], aligned.word_ids[s], aligned.token_chars[s], names, self.cfg.aggregation)
            row = {**show, "entities": group(units, aligned.texts[s])}
            if "tokens" in show:
                row["tags"] = tags[s]
            out.append(row)
        return out


@dataclass
class SelectedLogits:
    """`forward`'s output with the tail cut: the logits of the positions `keep` marks, row-major, (rows, classes)."""

    logits: torch.Tensor
    keep: torch.Tensor


def _every_position(outputs: Any, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The logits and labels of the positions computed: (rows, classes) and (rows,) after a cut, else (batch,
    length, classes) and (batch, length)."""
    if isinstance(outputs, SelectedLogits):
        return outputs.logits.float(), labels[outputs.keep]
    return outputs.logits.float(), labels


def _scattered(outputs: Any, shape: torch.Size) -> torch.Tensor:
    """Every position's logits, (batch, length, classes): a cut's rows put back in place, zeros elsewhere (the
    positions that neither carry a label nor score a word, which nothing reads)."""
    if not isinstance(outputs, SelectedLogits):
        return outputs.logits.float()
    full = outputs.logits.new_zeros((*shape, outputs.logits.shape[-1]), dtype=torch.float32)
    full[outputs.keep] = outputs.logits.float()
    return full


def labelled_rows_tail(model: torch.nn.Module) -> Any:
    """The model's last layer split at its attention (`tasks.classification.FirstTokenTail`), when running it and
    the head on some positions only gives those positions' logits: checked on two short rows, one padded, with and
    without the cut. None for a model of another shape."""
    from leantrain.tasks.base import same_logits
    from leantrain.tasks.classification import last_layer_tail
    from leantrain.telemetry.flops import unwrap

    model = unwrap(model)
    tail = last_layer_tail(model)
    if tail is None:
        return None
    vocab = int(getattr(model.config, "vocab_size", None) or 16)
    device = next(model.parameters()).device
    ids = ((torch.arange(12) * 7 + 3) % vocab).view(2, 6).to(device)
    mask = torch.tensor([[1] * 6, [1] * 4 + [0] * 2], device=device)
    keep = torch.tensor(
        [[False, True, False, True, True, False], [True, False, False, True, False, False]], device=device
    )

    def cut() -> torch.Tensor:
        with tail.rows(keep):
            return model(input_ids=ids, attention_mask=mask).logits[0]

    return tail if same_logits(model, lambda: model(input_ids=ids, attention_mask=mask).logits[keep], cut) else None


class TokenCollator:
    """Pads a micro-batch to its longest window (or a fixed length): token ids, the attention mask, each position's
    label (IGNORE past the end), scored word and owned token (-1), each window's sentence."""

    #: static shapes' padding of this collator's own fields: no word scored, no token owned, no sentence
    pad_values: ClassVar[dict[str, Any]] = {"word_index": -1, "token_index": -1, "sentence": -1}

    def __init__(self, pad_token_id: int, fixed_length: int | None = None):
        self.pad_token_id, self.fixed_length = pad_token_id, fixed_length

    def __call__(self, items: list[dict]) -> dict[str, Any]:
        lengths = [len(x["input_ids"]) for x in items]
        width = self.fixed_length or max(lengths)

        def field(name: str, pad: int) -> torch.Tensor:
            return torch.from_numpy(padded([x[name] for x in items], width, pad))

        ids = field("input_ids", self.pad_token_id)
        return {
            "input_ids": ids,
            "attention_mask": torch.from_numpy(length_mask(lengths, width)),
            "labels": field("token_labels", IGNORE),
            "word_index": field("word_index", -1),
            "token_index": field("token_index", -1),
            "sentence": torch.tensor([int(x["label"]) for x in items], dtype=torch.long),
            **slot_fields(items),
            "num_tokens": torch.tensor(sum(lengths), dtype=torch.long),
            "padded_tokens": torch.tensor(ids.numel(), dtype=torch.long),
        }


# -- helpers -----------------------------------------------------------------------------------------------------------


def _describe(rows) -> str:
    return f"{rows.source}: {len(rows):,} sentences ({rows.description})" + "".join(f"; {n}" for n in rows.notes)


def _all_tags(rows) -> list[list[str]]:
    return rows.tags if rows.tags is not None else [[s[2] for s in spans] for spans in rows.char_spans or []]


def _to_iob2(rows, scheme: str):
    """Word rows' tags read in `scheme` and written in IOB2 (as they are for "none"), and how many were repaired;
    span rows carry entity types, which are already what IOB2 is made from."""
    from leantrain.data import tags as schemes

    if rows.tags is None or scheme == "none":
        return rows, 0
    allowed = {"iob1": "BI", "iob2": "BI", "bioes": "BIES"}[scheme]
    converted, repaired = [], 0
    for seq, where in zip(rows.tags, rows.where):
        for tag in seq:
            prefix = schemes.parse(tag)[0]
            if prefix not in ("O", *allowed):
                how = "has no B-/I-/E-/S- prefix" if prefix == "" else f"is not {scheme.upper()}"
                raise DataError(
                    f"{rows.source}: {where}: tag {tag!r} {how}; give --tag-scheme (auto, iob1, iob2, "
                    "bioes, none) for these tags"
                )
        tags, bad = schemes.convert(seq, scheme, "iob2")
        converted.append(tags)
        repaired += bad
    rows.tags = converted
    return rows, repaired


def _span_tags(aligned, rows) -> tuple[list[list[str]] | None, int]:
    """Span rows' IOB2 tags of the tokenizer's words: a word is in an entity when its characters meet the span's;
    spans that meet the same word are refused, naming the row."""
    from leantrain.data import tags as schemes

    if rows.char_spans is None:
        return None, 0
    out, misaligned = [], 0
    for s, spans in enumerate(rows.char_spans):
        chars = aligned.word_chars[s]
        found, taken = [], np.zeros(len(chars), dtype=bool)
        for start, end, kind in sorted(spans):
            inside = np.flatnonzero((chars[:, 1] > start) & (chars[:, 0] < end))
            if not len(inside):
                continue  # a span of spaces: no word to tag
            if taken[inside].any():
                raise DataError(
                    f"{rows.source}: {rows.where[s]}: the span [{start}, {end}) ({kind}) overlaps another "
                    "one; a word takes one tag: keep one of them"
                )
            taken[inside] = True
            misaligned += int(chars[inside[0], 0] < start or chars[inside[-1], 1] > end)
            found.append(schemes.Span(kind, int(inside[0]), int(inside[-1]) + 1))
        out.append(schemes.encode(found, len(chars), "iob2"))
    return out, misaligned


def _subset(sentences: Sentences, rows: np.ndarray) -> Sentences:
    from leantrain.data.alignment import Aligned

    a = sentences.aligned
    pick = [int(i) for i in rows]
    aligned = Aligned(
        *(
            [getattr(a, f)[i] for i in pick]
            for f in ("token_ids", "word_ids", "token_chars", "words", "word_chars", "texts")
        )
    )
    tags = [sentences.tags[i] for i in pick] if sentences.tags is not None else None
    gold = [sentences.gold[i] for i in pick] if sentences.gold is not None else None
    return Sentences(aligned, tags, gold, [sentences.where[i] for i in pick])


def _hold_out(sentences: Sentences, fraction: float, seed: int) -> tuple[Sentences, Sentences]:
    n = len(sentences.where)
    if n < 2:
        raise DataError(f"only {n} sentence; need two to hold one out (or give --eval-data)")
    order = np.random.default_rng(seed).permutation(n)
    held = max(1, round(n * fraction))
    return _subset(sentences, np.sort(order[held:])), _subset(sentences, np.sort(order[:held]))


def _window_note(windows, sentences: int, cfg: Any, tokenizer: Any) -> str:
    from leantrain.data.alignment import special_tokens, window_stride

    extra = len(windows) - sentences
    cut = ""
    if extra > 0:
        stride = window_stride(cfg.stride, cfg.max_length, special_tokens(tokenizer))
        given = "--stride" if cfg.stride is not None else "--stride left out: 32, at most half of --max-length"
        cut = (
            f"; {extra:,} more windows for sentences longer than {cfg.max_length} tokens, consecutive ones sharing "
            f"{stride} ({given})"
        )
    return f"{int(windows.counted_tokens().sum()):,} training tokens carry a tag, in {len(windows):,} windows{cut}"


def _token_probabilities(rows: dict[str, np.ndarray], sizes: list[int], classes: int) -> list[np.ndarray]:
    """Each sentence's (tokens, classes) probabilities, from the windows that own its tokens."""
    out = [np.zeros((n, classes), dtype=np.float32) for n in sizes]
    owned = rows["token"] >= 0
    sentence = np.broadcast_to(rows["sentence"][:, None], owned.shape)[owned]
    for s, t, p in zip(sentence.tolist(), rows["token"][owned].tolist(), rows["probs"][owned]):
        out[s][t] = p
    return out
