"""Sequence-to-sequence: an encoder-decoder model (T5, BART, Marian, a bert2bert `EncoderDecoderModel`) learns to
write a target text from a source text (summaries, translations, rewrites).

The loss is the cross-entropy of the target's tokens, summed, and `loss_units` gives each pair's target tokens, so
the trainer divides by the target tokens of the whole optimizer step (across micro-batches and processes): exact
however unevenly the targets fall into micro-batches. What counts is each target's own tokens (`target_mask`); a
label at a padded position is never read. The output head runs only at those positions, fused with the loss in
training (as a causal LM's). Evaluation generates (greedy, or beam search), in length-sorted batches, and scores
the text against the references with ROUGE (rouge-score) or BLEU and chrF (sacrebleu), besides the loss.
"""

from __future__ import annotations

import contextlib
import copy
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch
import torch.nn.functional as F

from leantrain.data.batching import length_mask, padded
from leantrain.data.split import beyond_limit
from leantrain.errors import ConfigError, DataError
from leantrain.tasks.base import Task, TaskData
from leantrain.telemetry.console import counted

#: a summary-table row per metric: its name as papers print it
SHOWN = {
    "rouge1": "ROUGE-1",
    "rouge2": "ROUGE-2",
    "rougeL": "ROUGE-L",
    "rougeLsum": "ROUGE-Lsum",
    "bleu": "BLEU",
    "chrf": "chrF",
}
#: examples `leantrain evaluate` shows with its scores (source, reference, generated)
SHOWN_EXAMPLES = 3


@dataclass(frozen=True)
class DecoderIds:
    """The token ids generation and the shifted decoder input need."""

    start: int
    pad: int
    eos: int | None


@dataclass
class GeneratedOutputs:
    """An evaluation batch's outputs: the teacher-forced logits (for the loss) and the generated ids."""

    logits: torch.Tensor
    generated: torch.Tensor


class Seq2Seq(Task):
    name: ClassVar[str] = "seq2seq"
    aliases: ClassVar[tuple[str, ...]] = ("text2text-generation", "summarization", "translation")
    input_names: ClassVar[tuple[str, ...]] = ("input_ids", "attention_mask", "decoder_input_ids")
    auto_model: ClassVar[str] = "AutoModelForSeq2SeqLM"
    model_mapping: ClassVar[str] = "MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES"
    architectures: ClassVar[tuple[str, ...]] = ("ForConditionalGeneration", "EncoderDecoderModel", "MTModel")
    # the Hub's pipeline tag; transformers 5 removed this pipeline (model/ loads with AutoModelForSeq2SeqLM)
    pipeline: ClassVar[str] = "text2text-generation"
    # planned on encoder-decoder proxies at the run's source and target lengths, the head fused with the loss at
    # target tokens as `forward` runs it (planner.memory)
    planner: ClassVar[str | None] = "seq2seq"
    generates: ClassVar[bool] = True
    default_metric: ClassVar[str] = "loss"
    #: whether the output head runs only at target tokens (`forward`); set by `check_model`
    selects_logits: bool = False
    #: whether training runs the head and the loss in one chunked pass; set by `check_model`
    fuses_head_loss: bool = False

    def __init__(self, cfg: Any):
        from leantrain.tasks.scoring import GENERATION, metric_names, parse_metrics

        super().__init__(cfg)
        if getattr(cfg, "packing", None):
            raise ConfigError(
                "--packing lays a causal LM's documents end to end; a sequence-to-sequence example is a (source, "
                "target) pair: drop --packing (batches are grouped by source length instead)"
            )
        if getattr(cfg, "class_weights", None):
            raise ConfigError("--class-weights weighs a classifier's classes; a sequence-to-sequence task has none")
        self.label_smoothing = float(getattr(cfg, "label_smoothing", 0.0) or 0.0)
        requested = parse_metrics(getattr(cfg, "metrics", None))
        unknown = [n for n in requested if n not in GENERATION and n != "loss"]
        if unknown:
            raise ConfigError(
                f"--metrics: {', '.join(unknown)} do not score generated text; choose from {', '.join(GENERATION)} "
                "(or loss alone: evaluations then generate nothing)"
            )
        self.metric_names = metric_names("generation", requested)
        #: the generation metrics; none (--metrics loss): evaluations do not generate
        self.scored = tuple(n for n in self.metric_names if n != "loss")
        self.best_default = "rougeL" if "rougeL" in self.scored else (self.scored or ("loss",))[0]
        self.ids: DecoderIds | None = None
        self.tokenizer: Any = None
        #: the evaluation examples' target texts, by example id: what generated text is scored against
        self.references: list[str] = []

    @classmethod
    def cannot_train(cls, model_config: Any, able: list[str]) -> str:
        from transformers.models.auto import modeling_auto

        kind = getattr(model_config, "model_type", None)
        if kind in modeling_auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES and (
            kind not in modeling_auto.MODEL_FOR_MASKED_LM_MAPPING_NAMES
        ):
            return (
                f"--task {cls.name} needs an encoder-decoder model (T5, BART, Marian, a bert2bert); a '{kind}' model "
                "is decoder-only: use --task causal-lm with the pairs as prompt/completion columns"
            )
        return (
            f"--task {cls.name} needs an encoder-decoder model (T5, BART, Marian, a bert2bert); a '{kind}' model is "
            "not one (it does " + ", ".join(able) + "): warm-start an EncoderDecoderModel from it (docs/seq2seq.md)"
        )

    def metric_for_best(self, name: str | None) -> str:
        return super().metric_for_best(name or self.best_default)

    @property
    def max_new_tokens(self) -> int:
        return int(getattr(self.cfg, "generation_max_new_tokens", None) or self.cfg.max_target_length)

    # -- data and model ------------------------------------------------------------------------------------------
    def _settings(self):
        from leantrain.data.seq2seq import PairSettings

        cfg = self.cfg
        return PairSettings(
            source_column=cfg.source_column,
            target_column=cfg.target_column,
            prefix=cfg.source_prefix or "",
            max_source_length=cfg.max_source_length or cfg.max_length,
            max_target_length=cfg.max_target_length,
        )

    def _set_up(self, model_path: str, model_config: Any):
        """The tokenizer and the decoder's token ids; lengths beyond the model's positions refused."""
        from leantrain.model import loading

        tokenizer = loading.load_tokenizer(model_path, trust_remote_code=self.cfg.trust_remote_code)
        self.tokenizer, self.ids = tokenizer, decoder_ids(model_config, tokenizer)
        settings = self._settings()
        encoder = getattr(model_config, "encoder", model_config)
        decoder = getattr(model_config, "decoder", model_config)
        for flag, wanted, config in (
            ("--max-source-length", settings.max_source_length, encoder),
            ("--max-target-length", settings.max_target_length, decoder),
            ("--generation-max-new-tokens", self.max_new_tokens + 1, decoder),
        ):
            limit = loading.max_supported_length(config)
            if limit is not None and wanted > limit:
                raise ConfigError(f"{flag} {wanted} is beyond what {self.cfg.model} supports ({limit}); lower it")
        return tokenizer

    def _load(self, source: str, split: str, tokenizer: Any):
        from leantrain.data.seq2seq import drop_leading, load_pairs
        from leantrain.data.sources import read_options

        cfg = self.cfg
        role = "train" if split == "train" else "eval"
        src = load_pairs(source, tokenizer, Path(cfg.cache_dir), split, self._settings(), read_options(cfg, role))
        assert self.ids is not None
        src.rows.target = drop_leading(src.rows.target, self.ids.start)
        return src

    def prepare_data(self, model_path: str, model_config: Any) -> TaskData:
        from leantrain.data.combine import single_source
        from leantrain.data.sources import resolve_data_path

        cfg = self.cfg
        single_source(cfg, self.name)
        tokenizer = self._set_up(model_path, model_config)
        train_src = self._load(resolve_data_path(cfg.data), "train", tokenizer)
        notes, train = [train_src.describe()], train_src.rows
        if cfg.eval_data:
            eval_src = self._load(cfg.eval_data, "eval", tokenizer)
            notes.append(eval_src.describe())
            evaluation = eval_src.rows
        else:
            if len(train) < 2:
                raise DataError(f"{train_src.path}: only {len(train)} usable pair; need two to hold one out")
            order = np.random.default_rng(cfg.seed).permutation(len(train))
            held = max(1, round(len(train) * cfg.eval_fraction))
            train, evaluation = train.subset(np.sort(order[held:])), train.subset(np.sort(order[:held]))
            notes.append(f"held out {counted(held, 'pair')} ({cfg.eval_fraction:.0%}, seed {cfg.seed}) for evaluation")
        train = sample(train, cfg.limit, cfg.seed + 1, "training on", "--limit", notes)
        evaluation = sample(evaluation, cfg.eval_limit, cfg.seed + 2, "evaluating on", "--eval-limit", notes)
        notes.append(lengths_note(train, self._settings()))
        if not self.recorded and (prefix := prefix_note(cfg, model_config, tokenizer, self._settings())):
            notes.append(prefix)
        self.references = list(evaluation.references)
        facts, cut = self._cut_references(evaluation, cfg.eval_data or train_src.path)
        if cut:
            notes.append(cut)
            if self.recorded:  # evaluate's rescoring of the run's held-out pairs, whose notes it does not show
                _warn(cut)
        return TaskData(examples(train), examples(evaluation), [], tokenizer, notes, facts=facts)

    def build_model(self, model_path: str, data: TaskData) -> torch.nn.Module:
        from transformers import AutoModelForSeq2SeqLM

        from leantrain.model import loading

        config = loading.load_config(model_path, trust_remote_code=self.cfg.trust_remote_code)
        model = loading.weights_or_random(
            AutoModelForSeq2SeqLM, model_path, config, self.cfg.trust_remote_code, "a sequence-to-sequence model"
        )
        assert self.ids is not None
        set_decoder_ids(model, self.ids)
        return model

    def check_model(self, model: torch.nn.Module) -> None:
        from leantrain.tasks.causal_lm import head_loss_works, head_rows_work

        # a compiled model keeps the full logits: a data-dependent row count would give it a graph per batch
        rows = not getattr(self.cfg, "compile", False) and head_rows_work(model, decoder=True)
        # the fused loss is plain cross-entropy: label smoothing takes the logits
        self.fuses_head_loss = rows and not self.label_smoothing and head_loss_works(model, decoder=True)
        # padded to fixed lengths, the logits are a full batch's (one shape, the peak `plan --probe` measures),
        # except where the fused loss keeps them from existing
        self.selects_logits = rows and (self.fuses_head_loss or not getattr(self.cfg, "pad_to_max_length", False))

    def collator(self, data: TaskData, *, train: bool):
        from leantrain.data.seq2seq import PairCollator

        assert self.ids is not None
        settings = self._settings()
        fixed = (settings.max_source_length, settings.max_target_length) if self.cfg.pad_to_max_length else None
        return PairCollator(self.ids.pad, self.ids.start, fixed)

    # -- a step --------------------------------------------------------------------------------------------------
    def forward(self, model: torch.nn.Module, batch: dict[str, Any]) -> Any:
        """The logits at target tokens only (row-major: (target tokens, vocabulary)), or in training their summed
        loss with the head (`causal_lm.head_loss`); in evaluation also the generated ids (`GeneratedOutputs`)."""
        from leantrain.tasks.causal_lm import head_loss, head_rows

        inputs = {**self.model_inputs(batch), "use_cache": False}
        keep = batch["target_mask"]
        if self.fuses_head_loss and torch.is_grad_enabled():
            with head_loss(model, keep, batch["labels"][keep]):
                return model(**inputs)
        with head_rows(model, keep) if self.selects_logits else contextlib.nullcontext():
            outputs = model(**inputs)
        if model.training or torch.is_grad_enabled() or not self.scored:
            return outputs
        return GeneratedOutputs(outputs.logits, self._generate(model, batch["input_ids"], batch["attention_mask"]))

    def _generate(
        self, model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor, max_new_tokens: int | None = None,
        **sampling: Any,
    ) -> torch.Tensor:  # fmt: skip
        from leantrain.parallel import sharding
        from leantrain.telemetry.flops import unwrap

        assert self.ids is not None
        return generate_ids(
            unwrap(model), input_ids, attention_mask, self.ids, max_new_tokens or self.max_new_tokens,
            num_beams=int(self.cfg.generation_num_beams), synced=sharding.is_sharded(model), **sampling,
        )  # fmt: skip

    def tail_rows(self, batch: dict[str, Any]) -> int | None:
        return int(batch["target_mask"].sum()) if self.selects_logits else None

    def tail_flops(self, model: torch.nn.Module) -> float:
        from leantrain.telemetry.flops import row_flops, unwrap

        if not self.selects_logits:
            return 0.0
        # the weight's products only: an encoder-decoder's FLOPs are counted (FlopCounterMode), biases not among them
        return row_flops(p for p in unwrap(model).get_output_embeddings().parameters() if p.dim() > 1)

    def loss_units(self, data: TaskData) -> np.ndarray:
        return data.train.features.target_lengths.astype(np.float64)

    def loss_sum(self, outputs: Any, batch: dict[str, Any]) -> torch.Tensor:
        logits, keep = outputs.logits, batch["target_mask"]
        if logits.dim() == 0:  # `forward` computed the loss with the head
            return logits
        if logits.dim() == 3:
            logits = logits[keep]
        smoothing = self.label_smoothing if torch.is_grad_enabled() else 0.0  # (the evaluation's loss is plain)
        return F.cross_entropy(logits.float(), batch["labels"][keep], reduction="sum", label_smoothing=smoothing)

    # -- evaluation ----------------------------------------------------------------------------------------------
    def eval_rows(self, outputs: Any, batch: dict[str, Any]) -> dict[str, torch.Tensor]:
        """Each example's summed loss and target tokens; with generation, its generated ids (`preds`) and its target
        ids padded with -100 to --max-target-length (`labels`, as a HF `compute_metrics` reads them)."""
        from leantrain.data.seq2seq import IGNORE

        keep, labels = batch["target_mask"], batch["labels"]
        logits = outputs.logits if outputs.logits.dim() == 2 else outputs.logits[keep]
        per_token = F.cross_entropy(logits.float(), labels[keep], reduction="none")
        loss_sum = torch.zeros(keep.shape[0], dtype=torch.float32, device=keep.device)
        loss_sum.index_add_(0, keep.nonzero()[:, 0], per_token)
        rows = {"loss_sum": loss_sum, "tokens": keep.sum(-1)}
        if isinstance(outputs, GeneratedOutputs):
            width = int(self.cfg.max_target_length)
            targets = torch.full((keep.shape[0], width), IGNORE, dtype=torch.long, device=keep.device)
            cut = min(width, labels.shape[1])
            targets[:, :cut] = labels[:, :cut].masked_fill(~keep[:, :cut], IGNORE)
            rows |= {"preds": outputs.generated, "labels": targets}
        return rows

    def metrics(self, rows: dict[str, np.ndarray]) -> dict[str, float]:
        from leantrain.tasks.scoring import score

        out: dict[str, float] = {}
        if "preds" in rows:
            texts = self.decode(rows["preds"])
            # the reference texts as written, not their tokens cut at --max-target-length (which HF's
            # run_summarization decodes): a model that writes a long reference whole is not scored as wrong
            references = [self.references[int(i)] for i in rows["index"]]
            out |= score("generation", self.scored, texts, references)
        out["loss"] = float(rows["loss_sum"].sum()) / max(float(rows["tokens"].sum()), 1.0)
        if "preds" in rows:
            assert self.ids is not None
            out["mean_generated_tokens"] = float((rows["preds"] != self.ids.pad).sum(-1).mean())
        return out

    def decode(self, ids: np.ndarray) -> list[str]:
        """Generated ids as text: special tokens (start, end, padding) left out."""
        return [t.strip() for t in self.tokenizer.batch_decode(np.asarray(ids).tolist(), skip_special_tokens=True)]

    def summary_rows(self, metrics: dict[str, float]) -> list[tuple[str, str]]:
        rows = [(f"eval {SHOWN[k]}", f"{v:.2f}") for k, v in metrics.items() if k in SHOWN]
        rows.append(("eval loss (per target token)", f"{metrics['loss']:.4f}"))
        if "mean_generated_tokens" in metrics:
            rows.append(("eval generated tokens (mean)", f"{metrics['mean_generated_tokens']:.1f}"))
        return rows

    def data_facts(self, data: TaskData) -> dict[str, Any]:
        rows = data.train.features
        crc = 0
        for part in (rows.source.input_ids, rows.source.offsets, rows.target.input_ids, rows.target.offsets):
            crc = zlib.crc32(np.ascontiguousarray(part).tobytes(), crc)
        return {"train_examples": len(data.train), "label_names": [], "data_fingerprint": crc}

    # -- inference -------------------------------------------------------------------------------------------------
    def evaluation_data(self, model_path: str, model_config: Any) -> TaskData:
        """The config's `eval_data` pairs, prepared as training prepares them (prefix, lengths, columns)."""
        tokenizer = self._set_up(model_path, model_config)
        src = self._load(self.cfg.eval_data, "eval", tokenizer)
        self.references = list(src.rows.references)
        src.report.say_dropped()
        cut_facts, cut = self._cut_references(src.rows, self.cfg.eval_data)
        if cut:
            _warn(cut)
        facts = {"examples": len(src.rows), "skipped": src.report.rows_dropped, **cut_facts}
        return TaskData(None, examples(src.rows), [], tokenizer, facts=facts)

    def _cut_references(self, rows: Any, source: str) -> tuple[dict[str, int], str | None]:
        """How many evaluation targets --max-target-length cuts (its facts), and the line that says so (None: none):
        their loss counts the cut tokens only, and generation may stop short of them."""
        from leantrain.data.seq2seq import cut_targets

        limit = int(self.cfg.max_target_length)
        cut, longest = cut_targets(self.tokenizer, rows, limit)
        facts = {"references_cut": cut, "max_target_length": limit}
        if not cut:
            return facts, self._capped_references(rows, source, longest)
        writes = raise_it = ""
        if self.scored and self.max_new_tokens < longest:
            writes = f" and the model writes at most {self.max_new_tokens}"
            # the flag that lets it write as far: its own when set, else --max-target-length (its default)
            own = getattr(self.cfg, "generation_max_new_tokens", None)
            let = f", --generation-max-new-tokens {longest}" if own else " and"
            raise_it = f"{let} lets the model write them"
        return facts, (
            f"{source}: {cut:,} of {len(rows):,} references are longer than --max-target-length {limit} tokens (the "
            f"longest: {longest:,}): the loss counts only their first {limit}{writes} (the scores compare the whole "
            f"texts); --max-target-length {longest} counts them whole{raise_it}"
        )

    def _capped_references(self, rows: Any, source: str, longest: int) -> str | None:
        """The line on references longer than what the model may write (--generation-max-new-tokens below them),
        which no output can match whole; None where every reference fits or nothing is generated."""
        capped = int((rows.target_lengths > self.max_new_tokens).sum()) if self.scored else 0
        if not capped:
            return None
        return (
            f"{source}: {capped:,} of {len(rows):,} references are longer than the {self.max_new_tokens} tokens the "
            f"model writes at most (the longest: {longest:,}), so no output matches them whole; "
            f"--generation-max-new-tokens {longest} lets the model write them"
        )

    def evaluation_report(self, rows: dict[str, np.ndarray], data: TaskData) -> dict[str, Any]:
        """The counts, and the first few examples with what the model generated."""
        report = {**data.facts, "target_tokens": int(rows["tokens"].sum())}
        if "preds" in rows:
            first = np.argsort(rows["index"])[:SHOWN_EXAMPLES]
            generated = self.decode(rows["preds"][first])
            pairs = data.eval.features
            report["examples_shown"] = [
                {"source": pairs.sources[int(i)], "reference": pairs.references[int(i)], "generated": g}
                for i, g in zip(rows["index"][first], generated)
            ]
        return report

    def prediction_data(self, model_path: str, model_config: Any, inputs: Any) -> tuple[TaskData, list[dict]]:
        """The sources: --text, else a text file's lines (one source each), else the table's source column (its
        targets, if any, are not read)."""
        from leantrain.data.seq2seq import PairRows, pair_texts, resolve_pair_columns
        from leantrain.data.sources import read_options, read_table, text_lines
        from leantrain.data.tokenize import TokenizedText, tokenize

        cfg = self.cfg
        if inputs.files is not None or inputs.chat:
            what = "files" if inputs.files is not None else "--chat"
            raise DataError(f"{model_path}: a sequence-to-sequence model reads plain text, not {what}; give --text")
        texts = inputs.texts if inputs.texts is not None else text_lines(cfg.eval_data, cfg.format)
        if texts is None:
            df, report = read_table(cfg.eval_data, split="eval", options=read_options(cfg, "eval"))
            cols = resolve_pair_columns(df, cfg.eval_data, cfg.source_column, cfg.target_column, require_target=False)
            texts, _ = pair_texts(df, type(cols)(cols.source, "", cols.translation), report)
            report.say_dropped()
        if not texts:
            raise DataError(f"{cfg.eval_data or '--text'}: no text to transform")
        tokenizer = self._set_up(model_path, model_config)
        settings = self._settings()
        tokens = tokenize(tokenizer, [settings.prefix + t for t in texts], None, settings.max_source_length)
        empty = TokenizedText(np.zeros(0, dtype=np.int32), np.zeros(len(texts) + 1, dtype=np.int64))
        rows = PairRows(tokens, empty, list(texts), [""] * len(texts))
        return TaskData(None, examples(rows), [], tokenizer), [{"text": t} for t in texts]

    def predict(self, model, data: TaskData, shown, rows_of, inputs) -> list[dict[str, Any]]:
        """Each source with the text the model generates for it: batched, longest sources first, greedy (or beam
        search with the run's --generation-num-beams; sampled with --temperature)."""
        from leantrain.data.batching import eval_batches

        rows = data.eval.features
        sampling = sampling_settings(inputs.generation, self.max_new_tokens)
        out: list[dict[str, Any]] = [{} for _ in shown]
        torch.manual_seed(int(getattr(self.cfg, "seed", 0)))
        device = next(model.parameters()).device
        assert self.ids is not None
        for batch in eval_batches(rows.lengths, int(self.cfg.eval_batch_size or 32)):
            ids, mask = pad_sources([rows.source.row(i)["input_ids"] for i in batch], self.ids.pad)
            generated = self._generate(model, ids.to(device), mask.to(device), **sampling)
            for i, text in zip(batch, self.decode(generated.cpu().numpy())):
                out[i] = {**shown[i], "generated_text": text}
        return out


def _warn(message: str) -> None:
    """A line evaluate says before it scores (as `ReadReport.say_dropped` says the rows it leaves out)."""
    import logging

    logging.getLogger("leantrain").warning("%s", message)


def examples(rows: Any):
    """Pairs as the trainer batches them (`data.prepare.Examples`: the labels are the pairs' own, unused)."""
    from leantrain.data.prepare import Examples

    return Examples(rows, np.zeros(len(rows), dtype=np.int64))


def sample(rows: Any, limit: int | None, seed: int, what: str, flag: str, notes: list[str]) -> Any:
    """A seeded random `limit` of the pairs (in their order), said in `notes`; all of them without a limit."""
    if limit is None or limit >= len(rows):
        if over := beyond_limit(limit, len(rows), "pairs", flag):
            notes.append(over)
        return rows
    keep = np.sort(np.random.default_rng(seed).permutation(len(rows))[:limit])
    notes.append(f"{what} a random sample of {limit:,} of {len(rows):,} pairs ({flag})")
    return rows.subset(keep)


def lengths_note(rows: Any, settings: Any) -> str:
    """How long the training pairs are, and how many reach the length limits (the longer ones were cut)."""
    src, tgt = rows.lengths, rows.target_lengths
    at_source = int((src >= settings.max_source_length).sum())
    at_target = int((tgt >= settings.max_target_length).sum())
    return (
        f"{len(rows):,} training pairs: sources {src.mean():.1f} tokens on average ({at_source:,} reach "
        f"--max-source-length {settings.max_source_length}), targets {tgt.mean():.1f} ({at_target:,} reach "
        f"--max-target-length {settings.max_target_length}); the loss counts {int(tgt.sum()):,} target tokens"
    )


#: the model types whose checkpoints read a task prefix (T5's convention: "summarize: ", "translate ... : ")
T5_FAMILY = ("t5", "mt5", "umt5", "longt5", "switch_transformers")
#: the checkpoints pretrained on T5's multi-task mixture, whose inputs began with a task prefix (the ones HF's
#: run_summarization warns about when no --source_prefix is given)
T5_PREFIXED = ("t5-small", "t5-base", "t5-large", "t5-3b", "t5-11b")


def prefix_note(cfg: Any, model_config: Any, tokenizer: Any, settings: Any) -> str | None:
    """A line on a --source-prefix the model was not pretrained to read (BART, mBART, Marian, Pegasus: legal, but
    the same text before every source only costs source tokens), or on a T5 checkpoint given none (it reads its
    task from one); None otherwise."""
    prefix, kind = cfg.source_prefix, getattr(model_config, "model_type", None)
    if prefix and kind not in T5_FAMILY:
        cost, room = len(tokenizer(prefix, add_special_tokens=False)["input_ids"]), settings.max_source_length
        return (
            f"--source-prefix {prefix!r}: a '{kind}' model was not pretrained with task prefixes (T5 was), so the "
            f"same text before every source tells it nothing and takes {cost} of its {room} tokens "
            "(--max-source-length); leave --source-prefix out unless you mean it"
        )
    if not prefix and Path(str(cfg.model).rstrip("/")).name in T5_PREFIXED:
        return (
            f"{cfg.model} was pretrained with a task prefix before every input, and no --source-prefix is given: "
            "give one, e.g. --source-prefix 'summarize: ' or 'translate English to German: '"
        )
    return None


def decoder_ids(model_config: Any, tokenizer: Any) -> DecoderIds:
    """The decoder's start, padding and end ids: the model config's, else the tokenizer's (a freshly warm-started
    bert2bert has none: its decoder starts from [CLS] and stops at [SEP])."""
    decoder = getattr(model_config, "decoder", None)
    own = {k: getattr(model_config, k, None) for k in ("pad_token_id", "eos_token_id", "decoder_start_token_id")}

    def first(*values: Any) -> Any:
        return next((int(v) for v in values if v is not None), None)

    pad = first(own["pad_token_id"], getattr(decoder, "pad_token_id", None), tokenizer.pad_token_id)
    eos = first(own["eos_token_id"], getattr(decoder, "eos_token_id", None), tokenizer.eos_token_id)
    eos = first(eos, tokenizer.sep_token_id)  # BERT's end of text
    start = first(own["decoder_start_token_id"], tokenizer.cls_token_id, tokenizer.bos_token_id, pad)
    if pad is None:
        pad = eos
    if start is None or pad is None:
        raise ConfigError(
            f"{getattr(model_config, '_name_or_path', 'the model')}: neither its config nor its tokenizer names a "
            "decoder start or padding token; set decoder_start_token_id and pad_token_id in its config.json"
        )
    return DecoderIds(start, pad, eos)


def set_decoder_ids(model: Any, ids: DecoderIds) -> None:
    """Write the ids training used into the model's config and generation config (saved with it), where unset."""
    for config in (model.config, model.generation_config):
        for key, value in (("decoder_start_token_id", ids.start), ("pad_token_id", ids.pad), ("eos_token_id", ids.eos)):
            if getattr(config, key, None) is None and value is not None:
                setattr(config, key, value)


def pad_sources(sources: list[np.ndarray], pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded source ids and their attention mask (an encoder reads padding through the mask)."""
    width = max(map(len, sources))
    return torch.from_numpy(padded(sources, width, pad)), torch.from_numpy(length_mask(list(map(len, sources)), width))


def sampling_settings(generation: dict[str, Any], max_new_tokens: int) -> dict[str, Any]:
    """`predict`'s generation settings (--max-new-tokens, --temperature, --top-p) as `generate_ids` takes them."""
    from leantrain.errors import LeantrainError

    given = generation.get("max_new_tokens")
    tokens = max_new_tokens if given is None else given  # 0 is refused, not taken for "the run's"
    temperature, top_p = generation.get("temperature"), generation.get("top_p")
    if tokens <= 0:
        raise LeantrainError(f"--max-new-tokens must be a positive integer, got {tokens}")
    if temperature is not None and temperature <= 0:
        raise LeantrainError(f"--temperature must be positive (leave it out for greedy decoding), got {temperature}")
    if top_p is not None and (temperature is None or not 0 < top_p <= 1):
        raise LeantrainError("--top-p samples, in (0, 1]: give --temperature too, or leave both out for greedy")
    out: dict[str, Any] = {"max_new_tokens": int(tokens)}
    if temperature is not None:
        out |= {"do_sample": True, "temperature": temperature, "top_p": top_p or 1.0, "top_k": 0}
    return out


def generate_ids(
    model: Any,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    ids: DecoderIds,
    max_new_tokens: int,
    *,
    num_beams: int = 1,
    synced: bool = False,
    **sampling: Any,
) -> torch.Tensor:
    """The generated ids of each source (batch, max_new_tokens), the start token left out, padded with `ids.pad`:
    one width on every process, so that they gather. The model's own generation settings stand but for the length,
    the beams and sampling (greedy unless `sampling` says). `synced`: every process runs every step (sharded
    weights need all of them at each forward)."""
    from leantrain.model.generation import greedy_pairs
    from leantrain.parallel.precision import own_forward

    config = copy.deepcopy(model.generation_config)
    settings = dict(
        max_new_tokens=max_new_tokens, num_beams=num_beams, do_sample=False, decoder_start_token_id=ids.start
    )
    config.update(**{**settings, "pad_token_id": ids.pad, "eos_token_id": ids.eos, **sampling})
    with torch.no_grad(), own_forward(model):
        if (
            num_beams == 1
            and not sampling
            and not synced
            and ids.eos is not None
            and _as_argmax(model, config, input_ids)
        ):
            return greedy_pairs(model, input_ids, attention_mask, ids.start, [ids.eos], ids.pad, max_new_tokens)
        out = model.generate(
            input_ids=input_ids, attention_mask=attention_mask, generation_config=config, synced_gpus=synced
        )
    out = out[:, 1 : 1 + max_new_tokens]  # an encoder-decoder's output starts with the decoder's start token
    if out.shape[1] < max_new_tokens:
        out = F.pad(out, (0, max_new_tokens - out.shape[1]), value=ids.pad)
    return out


def _as_argmax(model: Any, config: Any, input_ids: torch.Tensor) -> bool:
    """Whether `model.generate` under `config` would take each step's most likely token as the logits give it: no
    logits processor (a forced token, a repetition penalty, a minimum length) applies. False where that cannot be
    told (transformers' private `_get_logits_processor` changed): its own generation then."""
    try:
        processors = model._get_logits_processor(
            generation_config=config, input_ids_seq_length=1, encoder_input_ids=input_ids, device=input_ids.device
        )
    except Exception:  # any failure: leave the generation to transformers
        return False
    return len(processors) == 0
