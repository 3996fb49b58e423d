"""Typed training config: one dataclass, validated on creation, loadable from YAML, overridable by flags.

Every field is both a YAML key (`batch_size`) and a CLI flag (`--batch-size`); the CLI is generated
from the fields below, so the two can never drift apart. Precedence: defaults < YAML file < flags.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import itertools
import json
import math
import re
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, TypeVar

import yaml

from leantrain import tasks
from leantrain.errors import ConfigError
from leantrain.model import freezing, optimizers, presets

#: the default job's --max-time, in seconds: it trains as many rows as its own first steps say fit in this time
#: (`training.time_budget`). Timed on the job's steps, not a probe beside them, the estimate errs only by how the
#: machine drifts after the warm-up (a shared 2-core EPYC: a sixth within minutes), which these seconds leave room
#: for under the quick start's five minutes
DEFAULT_JOB_SECONDS = 260
#: the default job's rows at most (24,000 trained in 148-254 s to accuracy 0.81 on 2-core CPUs with AVX-512:
#: benchmarks/results/quickstart.md); --max-time trains as many of them as fit
DEFAULT_JOB_ROWS = 24_000
#: the default job's accuracy on the held-out tweets by rows trained (fp32, as the default job trains:
#: DEFAULT_JOB_LR, DEFAULT_JOB_BATCH_SIZE, its embeddings frozen, no dropout, --normalize-tweets, MiniLM's mean
#: pooling as an added layer; the mean of two seeds at 8,000 and 13,000 rows of the 24,000-row sample, four at
#: 16,000: benchmarks/results/quickstart.md); the last row's rows are the ones said to reach 0.80 (13,000's two
#: seeds, 0.796 and 0.806, straddle it)
DEFAULT_JOB_ACCURACY = ((8_000, 0.785), (13_000, 0.801), (16_000, 0.802))
#: examples per micro-batch where --batch-size is left out
DEFAULT_BATCH_SIZE = 32
#: the default job's, where --batch-size is left out: twice the optimizer steps of 32 on the same rows, which on
#: MiniLM and tweets learn more than they cost (8,000 rows reach accuracy 0.786 against 0.777, a row costs 10% more
#: in fp32: benchmarks/results/quickstart.md)
DEFAULT_JOB_BATCH_SIZE = 16
#: the default job's --dropout where it is left out: one short epoch on tweets learns as much or more a row without
#: dropout (13,000 rows: 0.803 against 0.796) and a step costs 4% (fp32) to 16% (bf16) less
#: (benchmarks/results/quickstart.md)
DEFAULT_JOB_DROPOUT = 0.0
#: the peak learning rate where --lr is left out: the usual rate for fine-tuning a pretrained transformer
DEFAULT_LR = 5e-5
#: the default job's peak learning rate where --lr is left out: one short epoch of MiniLM on tweets
#: learns more at twice the usual fine-tuning rate (benchmarks/results/quickstart.md)
DEFAULT_JOB_LR = 1e-4

#: every per-step schedule of transformers' get_scheduler (leantrain's `constant` keeps the warm-up, as
#: constant_with_warmup; reduce_lr_on_plateau and greedy need a metric at every step and are refused)
SCHEDULERS = (
    "linear",
    "cosine",
    "constant",
    "constant_with_warmup",
    "cosine_with_restarts",
    "polynomial",
    "inverse_sqrt",
    "cosine_with_min_lr",
    "cosine_warmup_with_min_lr",
    "warmup_stable_decay",
)
#: the schedule where --scheduler is left out, for an optimizer that takes any
DEFAULT_SCHEDULER = "linear"
#: schedules that need arguments from --scheduler-kwargs: one of each tuple
SCHEDULER_NEEDS = {
    "cosine_with_min_lr": ("min_lr", "min_lr_rate"),
    "cosine_warmup_with_min_lr": ("min_lr", "min_lr_rate"),
    "warmup_stable_decay": ("num_decay_steps",),
}
PRECISIONS = ("auto", "fp32", "bf16", "fp16")
LAUNCHERS = ("accelerate", "torchrun", "ray")
SHARDING = ("none", "fsdp")
ON_NAN = ("stop", "skip")
STATIC_SHAPES = ("auto", "on", "off")
LOGS = ("jsonl", "tensorboard")
TRACKERS = ("tensorboard", "wandb", "mlflow", "all")  # --report-to, through Accelerate
PROBLEM_TYPES = ("single-label", "regression", "multi-label")
POOLER = ("auto", "keep", "identity", "mean")  # --pooler: what a BERT-style pooler starts as
DATA_FORMATS = ("csv", "tsv", "json", "jsonl", "parquet", "conll")
MIX_BY = ("examples", "tokens")  # data.mixture.MIX_BY
BATCH_ORDERS = ("shuffled", "longest-first")  # data.batching.GlobalBatchSampler
TEXT_DOCUMENTS = ("paragraphs", "lines", "files")  # --text-documents: data.lm.read_documents
QUANTIZE = ("4bit", "8bit")  # LoRA
PREFERENCE_LOSSES = ("sigmoid", "ipo", "hinge", "robust", "simpo", "orpo")
ADVANTAGES = ("grpo", "rloo")  # online RL


_Section = TypeVar("_Section")

#: the tasks (the registry's names) that read a field of one workload, as `_help(read_by=...)` declares them: a run
#: of another task given such a field refuses it (`unread_settings`) rather than train as if it were not there
TEXT = ("text-classification",)
CLASSIFIERS = (*TEXT, "image-classification", "audio-classification")
MEDIA = ("image-classification", "audio-classification")
LANGUAGE_MODELS = ("causal-lm", "dpo", "kto", "reward-model", "grpo")  # what causal LMs' tokenizers and data read
REFERENCE = ("dpo", "kto")  # the tasks with a reference model (`Task.uses_reference`)
SEQ2SEQ = ("seq2seq",)
TOKENS = ("token-classification",)
GRPO = ("grpo",)
#: the tasks NEFTune's noise may train: text models learning from labels or text, not a policy against a reference
NOISY_EMBEDDINGS = (*TEXT, "causal-lm", "reward-model", *SEQ2SEQ, *TOKENS)
#: the tasks whose readers take --text-column (seq2seq names its columns --source-column and --target-column;
#: preference pairs and media files have their own)
TEXT_COLUMN_READERS = (*TEXT, "causal-lm", "reward-model", "grpo", *TOKENS)


def _help(
    text: str, metadata_extra: dict[str, Any] | None = None, *, read_by: tuple[str, ...] | None = None, **kw: Any
) -> Any:
    """A field with its help; `read_by`: the only tasks that read it (None: every task)."""
    extra = {**(metadata_extra or {}), **({"read_by": read_by} if read_by else {})}
    return field(metadata={"help": text, **extra}, **kw)


@dataclass
class ModelConfig:
    """Which model, and what it learns."""

    model: str | None = _help(
        "Hugging Face model: a local folder, a hub name or a .gguf file. Default: the embedded all-MiniLM-L6-v2.",
        default=None,
    )
    task: str | None = _help(
        f"What the model learns: {'|'.join(tasks.spellings())}. Default: inferred from the model's config (text "
        "classification when unclear).",
        default=None,
    )
    trust_remote_code: bool = _help("Allow model code shipped with a checkpoint to run (off: safer).", default=False)
    pooler: str = _help(
        "Text classification and reward models with a BERT-style pooler (the dense layer over the first token that "
        "the head reads): "
        "auto|keep|identity|mean. identity starts it as the identity (weight I, bias 0), so the head first reads "
        "the first token's hidden state; mean also adds a last layer that averages the tokens into the first (a "
        "BERT-shaped encoder; the model stays its class, one layer deeper). auto: for a sentence-transformers "
        "checkpoint (a modules.json beside the weights), whose training never used its pooler, mean where it was "
        "trained through mean pooling (a text classifier without --lora), else identity; every other model's is "
        "kept.",
        read_by=(*TEXT, "reward-model"),
        default="auto",
    )
    freeze: str | None = _help(
        "Parameters that keep their pretrained values, without gradients or optimizer state: embeddings (the input "
        "embedding table) and globs over parameter names, comma-separated (bert.encoder.layer.[0-2].*); none: "
        "nothing. Default: none; the default job's: embeddings.",
        {"names": True},
        default=None,
    )
    dropout: float | None = _help(
        "Set every dropout of the model (hidden, attention, classifier) to this probability, 0 <= p < 1; saved in "
        "its config.json. Default: the model's own; the default job's: 0 (one short epoch learns more a row without "
        "dropout, and each step costs less).",
        default=None,
    )
    neftune_noise_alpha: float | None = _help(
        "NEFTune: in training, add noise uniform in +-alpha/sqrt(length x width) to the input embeddings "
        "(length: the batch's padded length; the HF Trainer's and TRL's rule, drawn alike); 5 is the paper's usual "
        "value, most used in instruction tuning. Text models; not DPO, KTO or GRPO, whose reference reads clean "
        "embeddings. Default: off.",
        read_by=NOISY_EMBEDDINGS,
        default=None,
    )
    # --- causal LM
    chat_template: str | None = _help(
        "Causal LM: the Jinja chat template (or a file holding one) that renders a 'messages' column, for a "
        "tokenizer without one (or to replace its own). Saved with the model.",
        read_by=LANGUAGE_MODELS,
        default=None,
    )
    # --- preference tuning
    reference_model: str | None = _help(
        "Preference tuning (dpo, kto): the reference model the policy is compared with, a folder or hub name. "
        "Default: --model, the model training starts from (with --lora: the model itself, its adapters disabled).",
        read_by=REFERENCE,
        default=None,
    )
    # --- LoRA
    lora: bool = _help(
        "Train low-rank adapters (LoRA, through peft) and the task's head (with a pooler started as the identity, "
        "--pooler); every other weight stays frozen, without gradients or optimizer state. model/ is the merged "
        "model.",
        default=False,
    )
    lora_r: int = _help("LoRA rank: inner size of each adapter (its update is B·A, B: out x r, A: r x in).", default=8)
    lora_alpha: float = _help("LoRA scale: each adapter's update is multiplied by alpha / r.", default=16.0)
    lora_dropout: float = _help(
        "Dropout on the adapters' input (0 <= p < 1). Above 0 it keeps a copy of every adapted layer's input for "
        "backward (MiniLM: 1.4x the activations, as much memory as full fine-tuning's optimizer state).",
        default=0.0,
    )
    lora_targets: str = _help(
        "Layers that get adapters: auto (every Linear layer outside the head) or comma-separated module names "
        "(a module whose name is, or ends with, one of them), e.g. query,value.",
        {"names": True},
        default="auto",
    )
    save_adapter: bool = _help(
        "With --lora, also write the adapter alone (peft format) to OUTPUT_DIR/adapter/.", default=False
    )
    quantize: str | None = _help(
        f"With --lora, quantize the frozen base to {'|'.join(QUANTIZE)} with bitsandbytes (QLoRA); model/ is the "
        "adapter merged into the dequantized base.",
        default=None,
    )
    # --- end LoRA
    # --- metrics and losses
    problem_type: str = _help(
        f"What a text label is: {'|'.join(PROBLEM_TYPES)}. single-label: one class per text (cross-entropy); "
        "regression: a number (mean squared error; Pearson, Spearman, RMSE); multi-label: a set of classes, "
        "a list column or joined by --label-separator (binary cross-entropy per class; F1 at "
        "--multi-label-threshold).",
        read_by=TEXT,
        default="single-label",
    )
    multi_label_threshold: float = _help(
        "Multi-label: a class is predicted when its probability reaches this.", read_by=TEXT, default=0.5
    )
    # --- online RL
    reward: str | None = _help(
        "GRPO: how completions are scored: exact-match (the completion is --reward-column's value), regex (it "
        "matches --reward-pattern), number (its last number is the column's), or module:function (a Python function "
        "as TRL's GRPOTrainer takes one; a file: path/to/rewards.py:function); several comma-separated, each "
        "optionally weighted NAME=WEIGHT, the reward their weighted sum.",
        {"names": True},
        read_by=GRPO,
        default=None,
    )
    reward_pattern: str | None = _help(
        "GRPO: the regular expression --reward regex looks for in each completion ('.' spans lines; anchor it with "
        "^ and $).",
        read_by=GRPO,
        default=None,
    )
    # --- end online RL

    def __post_init__(self) -> None:
        _coerce_types(self)
        self._check()

    def _check(self) -> None:
        if self.task is not None:
            self.task = tasks.canonical(self.task)  # an alias names its task; an unknown name is refused
        _choice(self, "pooler", POOLER)
        _check_lora(self)
        _check_problem(self)
        if self.dropout is not None and not 0 <= self.dropout < 1:
            raise ConfigError(f"--dropout must be in [0, 1), got {self.dropout}; 0 turns dropout off")
        if self.neftune_noise_alpha is not None and not self.neftune_noise_alpha > 0:
            raise ConfigError(
                f"--neftune-noise-alpha must be positive, got {self.neftune_noise_alpha}; leave it out for no noise"
            )
        if self.lora and freezing.patterns(self.freeze):  # one reading of --freeze: "none", "", " none " alike
            raise ConfigError("--freeze with --lora: LoRA already freezes every weight but its adapters and the head")
        if self.reward_pattern is not None:  # online RL
            try:
                re.compile(self.reward_pattern)
            except re.error as exc:
                raise ConfigError(
                    f"--reward-pattern '{self.reward_pattern}' is not a regular expression ({exc})"
                ) from None


@dataclass
class DataConfig:
    """Where the examples come from, how they are cut, split and cached."""

    data: str | list[Any] | None = _help(  # noqa: RUF009 - a field() whose default is None
        "Training data: a CSV/TSV/JSON/JSONL/Parquet file, a `save_to_disk` folder or a hub data set "
        "name. Several sources mix: repeat --data (in YAML a list), each PATH@WEIGHT or a mapping with its own "
        "read options, e.g. --data '{path: sms.tsv, weight: 0.2, column_names: \"label,text\"}' "
        "(docs/mixtures.md). Default: the embedded 3-class tweet sentiment corpus.",
        default=None,
        metadata_extra={"sources": True},
    )
    mix_by: str = _help(
        f"With several --data sources: what their weights share out, {'|'.join(MIX_BY)} (tokens: each source's "
        "share of the training tokens, what language-model mixtures mean).",
        default="examples",
    )
    batch_order: str = _help(
        f"The order of an epoch's length-grouped batches, {'|'.join(BATCH_ORDERS)}. Batches are cut from random "
        "chunks of global batches sorted by length; shuffled: chunks of 50, their batches drawn in random order; "
        "longest-first: the HF Trainer's group_by_length order (chunks of 50, or a quarter of a smaller epoch, "
        "each run longest to shortest), for matching its results.",
        default="shuffled",
    )
    dedupe: bool = _help(
        "Drop training rows whose normalised text (case, spaces, Unicode forms aside) repeats an earlier row, within "
        "a source or across sources; they are counted either way.",
        default=False,
    )
    decontaminate: bool = _help(
        "Drop training rows whose normalised text is also an evaluation row (of any source); they are counted and "
        "named either way.",
        default=False,
    )
    eval_data: str | None = _help(
        "Evaluation data in the same formats. Default: a stratified split of --data.", default=None
    )
    text_column: str | None = _help(
        "Column holding the text. Guessed when obvious.", read_by=TEXT_COLUMN_READERS, default=None
    )
    normalize_tweets: bool | None = _help(
        "Text classification: read the texts as tweets: links become 'http' and user mentions '@user' (TweetEval's "
        "preprocessing), HTML entities (&amp; &lt; &gt; &quot;) their characters. The tokenizer does it, and the "
        "published model/'s tokenizer too, so a transformers pipeline reads new tweets the same way; a fast "
        "tokenizer (tokenizer.json) is needed. Unset: on for the default job's tweets, off otherwise.",
        read_by=TEXT,
        default=None,
    )
    text_pair_column: str | None = _help(
        "Column holding the second text of a sentence pair. Guessed when obvious.", read_by=TEXT, default=None
    )
    label_column: str | None = _help(
        "Column holding the label. Guessed when obvious.", read_by=CLASSIFIERS, default=None
    )
    data_config: str | None = _help(
        "Configuration (subset) of a hub data set or a local `datasets` folder with several, e.g. sst2 for glue "
        "(also written --data glue:sst2); --eval-data naming the same data set gets it too.",
        default=None,
    )
    data_split: str | None = _help(
        "Split of --data to train on, for hub data sets and `datasets` folders (refused for a single file). "
        "Default: train.",
        default=None,
    )
    eval_split: str | None = _help(
        "Split of --eval-data to evaluate on (refused for a single file). Default: validation, else dev, else test.",
        default=None,
    )
    column_names: str | None = _help(
        "Comma-separated column names for a CSV/TSV file without a header row (its first row is then data), "
        "e.g. label,text.",
        {"names": True},
        default=None,
    )
    format: str | None = _help(
        f"Read --data and --eval-data as {'|'.join(DATA_FORMATS)} whatever their suffix (for files without one, "
        "or Excel's Unicode text .txt: tsv). Default: from the suffix.",
        default=None,
    )
    image_column: str | None = _help(
        "Table column holding images (paths relative to the table, or `datasets` images). Guessed when obvious.",
        read_by=("image-classification",),
        default=None,
    )
    audio_column: str | None = _help(
        "Table column holding audio (paths relative to the table, or `datasets` audio). Guessed when obvious.",
        read_by=("audio-classification",),
        default=None,
    )
    label_pattern: str | None = _help(
        "Regular expression that takes each file's label from its path inside a --data folder (the group named "
        "'label', else the first group), e.g. '^(\\d+)_' for '7_jackson_3.wav'. Default: the class sub-folder.",
        read_by=MEDIA,
        default=None,
    )
    eval_pattern: str | None = _help(
        "Regular expression: the files of --data whose path matches (e.g. '_[0-4]\\.wav$') are the evaluation "
        "set, instead of a random --eval-fraction.",
        read_by=MEDIA,
        default=None,
    )
    max_length: int = _help("Longest tokenized input; longer inputs are truncated.", default=128)
    limit: int | None = _help(
        "Train on a stratified sample of this many training rows. The default job: "
        f"{DEFAULT_JOB_ROWS:,}, as many of them as fit its --max-time; otherwise all rows.",
        default=None,
    )
    eval_fraction: float = _help(
        "Share of --data held out for evaluation when --eval-data is not given (0 < f < 1).", default=0.1
    )
    max_seconds: float | None = _help(
        "Audio: pad or cut every clip to this many seconds. Default: the feature extractor's own length, "
        "else the longest training clip (at most 30 s).",
        read_by=("audio-classification",),
        default=None,
    )
    augment: bool = _help(
        "Random augmentation of training examples: images shifted by up to 1/8 of their size, audio shifted "
        "in time by up to 1/10 of its length.",
        read_by=MEDIA,
        default=False,
    )
    strict: bool = _help(
        "Stop at the first unreadable image or audio file instead of skipping it.", read_by=MEDIA, default=False
    )
    # --- HF Trainer users
    dataloader_num_workers: int = _help(
        "Worker processes that batch the data (0: in the training process); batches are the same either way.",
        default=0,
    )
    # --- end HF Trainer users
    cache_dir: str | None = _help(
        "Where tokenized data is cached. Default: $LEANTRAIN_CACHE or ~/.cache/leantrain.", default=None
    )
    streaming: bool = _help(
        "Read --data as a stream (text classification) instead of whole: for data larger than memory. The same "
        "examples form each optimizer step however the batch is split; lengths are grouped within windows of 50 "
        "global batches; no tokenization cache, no text repair; needs --max-steps.",
        default=False,
    )
    streaming_eval_rows: int = _help(
        "With --streaming and no --eval-data: hold out the stream's first N rows for evaluation.", default=1000
    )
    # --- causal LM
    packing: bool | None = _help(
        "Causal LM: lay documents end to end in rows of --max-length tokens (position ids restart at each, so "
        "attention never crosses documents); --no-packing gives each document its own padded row(s). Unset: on "
        "for a causal LM; a sequence-to-sequence task refuses it (its examples are pairs).",
        read_by=(*LANGUAGE_MODELS, *SEQ2SEQ),
        default=None,
    )
    text_glob: str = _help(
        "Causal LM: the files of a --data folder read as text, searched recursively (documents are separated "
        "by blank lines).",
        read_by=("causal-lm",),
        default="*.txt",
    )
    text_documents: str = _help(
        "Causal LM: what one document of a text file is: paragraphs (the blocks between blank lines), lines (each "
        "line: one text a line, as datasets' text loader reads it) or files (each file whole).",
        read_by=("causal-lm",),
        default="paragraphs",
    )
    train_on_prompt: bool = _help(
        "Causal LM on instruction data (prompt/completion or messages columns): count the prompt's tokens in the "
        "loss too, not only the completion's.",
        read_by=("causal-lm",),
        default=False,
    )
    # --- sequence-to-sequence
    source_column: str | None = _help(
        "Seq2seq: the column holding the text to transform (in a `translation` column of {language: text} "
        "mappings: the source language, e.g. en). Guessed from source/target, document/summary, text/summary, "
        "article/highlights, dialogue/summary, input/output, inputs/targets, src/tgt.",
        read_by=SEQ2SEQ,
        default=None,
    )
    target_column: str | None = _help(
        "Seq2seq: the column holding the text to generate (in a `translation` column: the target language, e.g. "
        "fr). Guessed with the source column.",
        read_by=SEQ2SEQ,
        default=None,
    )
    source_prefix: str | None = _help(
        "Seq2seq: text put before every source, as T5 reads its task from a prompt, e.g. 'summarize: ' or "
        "'translate English to German: ' (also at evaluate and predict).",
        read_by=SEQ2SEQ,
        default=None,
    )
    max_source_length: int | None = _help(
        "Seq2seq: longest tokenized source (prefix included); longer ones are cut. Default: --max-length.",
        read_by=SEQ2SEQ,
        default=None,
    )
    max_target_length: int = _help(
        "Seq2seq: longest tokenized target; longer ones are cut (the loss counts the target's tokens).",
        read_by=SEQ2SEQ,
        default=128,
    )
    eval_limit: int | None = _help(
        "Seq2seq: evaluate on a seeded random sample of this many evaluation rows, the same rows at every "
        "evaluation (each one generates, which is what makes evaluation slow). Default: every row.",
        read_by=SEQ2SEQ,
        default=None,
    )
    # --- metrics and losses
    label_separator: str | None = _help(
        "Multi-label: the character that joins a text's labels in the label column, e.g. '|' for 'sport|politics' "
        "(a JSON or Parquet list column needs none).",
        read_by=TEXT,
        default=None,
    )
    # --- token classification
    tokens_column: str | None = _help(
        "Token classification: the column holding each row's words (a list). Guessed: tokens, words.",
        read_by=TOKENS,
        default=None,
    )
    tags_column: str | None = _help(
        "Token classification: the column holding each row's tags, one per word (names, or ids of a `datasets` "
        "ClassLabel). Guessed: ner_tags, tags.",
        read_by=TOKENS,
        default=None,
    )
    spans_column: str | None = _help(
        "Token classification: the column holding each text's entities as character spans ({start, end, label} or "
        "[start, end, label]; the text in --text-column). Guessed: entities, spans.",
        read_by=TOKENS,
        default=None,
    )
    tag_column: int | None = _help(
        "Token classification, CoNLL files with more than two columns: the column holding the tag, counting from 1 "
        "(the word's); -1 for the last.",
        read_by=TOKENS,
        default=None,
    )
    tag_scheme: str = _help(
        "Token classification: how the tags mark entities: auto|iob1|iob2 (bio)|bioes|none (tags that are not "
        "entities, e.g. part of speech). auto tells from the training tags. Tags are converted to IOB2, the scheme "
        "of the published model; tags the scheme does not allow where they stand are repaired and counted.",
        read_by=TOKENS,
        default="auto",
    )
    label_all_tokens: bool = _help(
        "Token classification: learn each word's tag on every one of its sub-word tokens (B- becoming I- after the "
        "first), not on its first only. Evaluation scores each word at its first sub-word either way.",
        read_by=TOKENS,
        default=False,
    )
    stride: int | None = _help(
        "Token classification: sentences longer than --max-length are cut into windows that share this many "
        "tokens; each word is trained on and scored once, in the window that holds it with the most context. "
        "Default: 32, at most half of --max-length.",
        read_by=TOKENS,
        default=None,
    )
    aggregation: str = _help(
        "Token classification, predict: how tokens' tags become entities, as transformers' pipeline "
        "aggregation_strategy: first (each word's first sub-word)|average|max (over its sub-words)|simple (each "
        "token; adjacent tokens of one type join).",
        read_by=TOKENS,
        default="first",
    )
    # --- online RL
    reward_column: str | None = _help(
        "GRPO: the column that exact-match and number compare completions with. Default: the first of answer, "
        "solution, completion, label, target the data has.",
        read_by=GRPO,
        default=None,
    )
    max_completion_length: int = _help(
        "GRPO: the most tokens a completion has (its EOS included); prompts longer than --max-length minus this "
        "are skipped and counted.",
        read_by=GRPO,
        default=64,
    )
    # --- end online RL

    def __post_init__(self) -> None:
        _coerce_types(self)
        self._check()

    def _check(self) -> None:
        _positive(self, "max_length", "max_completion_length")
        _check_token_labels(self)
        if self.dataloader_num_workers < 0:  # HF Trainer users
            raise ConfigError(f"--dataloader-num-workers must be >= 0, got {self.dataloader_num_workers}")
        _positive(self, "limit", optional=True)
        _positive(self, "streaming_eval_rows")
        _positive(self, "max_target_length")
        _positive(self, "max_source_length", "eval_limit", optional=True)
        _check_data_sources(self)
        _choice(self, "batch_order", BATCH_ORDERS)
        _choice(self, "text_documents", TEXT_DOCUMENTS)
        if not 0 < self.eval_fraction < 1:
            raise ConfigError(f"{_flag('eval_fraction')} must be between 0 and 1 (exclusive), got {self.eval_fraction}")
        for name in ("label_pattern", "eval_pattern"):
            pattern = getattr(self, name)
            if pattern is not None:
                try:
                    re.compile(pattern)
                except re.error as exc:
                    raise ConfigError(f"{_flag(name)} '{pattern}' is not a regular expression ({exc})") from None
        if self.eval_pattern is not None and self.eval_data is not None:  # the files --eval-data names are the ones
            raise ConfigError(
                f"--eval-pattern '{self.eval_pattern}' picks evaluation files out of --data, but --eval-data gives "
                "them, so it would be ignored: leave one of them out"
            )
        if self.max_seconds is not None and not (self.max_seconds > 0 and math.isfinite(self.max_seconds)):
            raise ConfigError(f"{_flag('max_seconds')} must be a positive number, got {self.max_seconds}")


@dataclass
class OptimizationConfig:
    """What each optimizer step computes: batch, schedule, optimizer, clipping, the NaN policy."""

    batch_size: int | None = _help(
        f"Examples per micro-batch on each device (default {DEFAULT_BATCH_SIZE}; the default job's "
        f"{DEFAULT_JOB_BATCH_SIZE}).",
        default=None,
    )
    grad_accum: int = _help(
        "Micro-batches per optimizer step (exact: the loss is normalised over the whole step).", default=1
    )
    epochs: float = _help("Passes over the training data (fractions allowed).", default=1.0)
    max_steps: int | None = _help("Stop after this many optimizer steps (overrides --epochs).", default=None)
    max_time: str | None = _help(
        "Train for about this long (260, 260s, 4.5m, 1h), at most --max-steps or --epochs allow: at the end of the "
        "warm-up the run times its own steps and keeps as many as fit, the schedule decaying over them, re-sized "
        "where the pace changes later; config.yaml records the steps as --max-steps. The default job's: "
        f"{DEFAULT_JOB_SECONDS} s.",
        default=None,
        metadata_extra={"number_ok": True},  # YAML's `max_time: 300` is seconds
    )
    lr: float | None = _help(
        f"Peak learning rate (default {DEFAULT_LR:g}; the default job's {DEFAULT_JOB_LR:g}).", default=None
    )
    weight_decay: float = _help("AdamW weight decay; never applied to biases and LayerNorm weights.", default=0.01)
    warmup_ratio: float = _help("Share of the optimizer steps spent warming up the learning rate.", default=0.06)
    scheduler: str | None = _help(
        f"Learning-rate schedule after warm-up: {'|'.join(SCHEDULERS)}. Default: {DEFAULT_SCHEDULER}; constant for an "
        "optimizer that takes no schedule (the schedule-free ones).",
        default=None,
    )
    max_grad_norm: float = _help("Clip the global gradient norm to this (0 disables clipping).", default=1.0)
    optimizer: str = _help(
        f"Optimizer: {'|'.join(optimizers.names())}. adafactor, adamw8bit, galore-adamw and apollo-adamw keep far "
        "less state than adamw; muon and the schedule-free ones aim at fewer steps to a good model "
        "(`leantrain plan` lists each one's state and step cost; docs/techniques/optimizers.md when to use which).",
        default="adamw",
    )
    # --- per-optimizer settings (model/optimizers.py SETTINGS holds their defaults)
    muon_lr: float | None = _help(
        "--optimizer muon: learning rate of the hidden matrices (default: --lr, which the update-size rule makes a "
        "sensible start); the embeddings, head, norms and biases step with AdamW at --lr.",
        default=optimizers.SETTINGS["muon_lr"],
    )
    muon_momentum: float = _help(
        "--optimizer muon: Nesterov momentum of the hidden matrices.", default=optimizers.SETTINGS["muon_momentum"]
    )
    muon_lr_rule: str = _help(
        f"--optimizer muon: how each matrix's update is sized, {'|'.join(optimizers.MUON_LR_RULES)}: match_rms_adamw "
        "scales it to AdamW's update RMS (0.2 sqrt(max side)), so AdamW's learning rate carries over; original is "
        "Keller Jordan's sqrt(max(1, rows/cols)), for learning rates near 0.02.",
        default=optimizers.SETTINGS["muon_lr_rule"],
    )
    projection_rank: int = _help(
        "--optimizer galore-adamw|apollo-adamw: rank of each hidden matrix's gradient projection (at most its "
        "smaller side); lower keeps less state.",
        default=optimizers.SETTINGS["projection_rank"],
    )
    projection_update_interval: int = _help(
        "--optimizer galore-adamw|apollo-adamw: optimizer steps between refreshes of the projection (GaLore's SVD, "
        "APOLLO's new random matrix).",
        default=optimizers.SETTINGS["projection_update_interval"],
    )
    projection_scale: float | None = _help(
        "--optimizer galore-adamw|apollo-adamw: scale of the projected update (default: GaLore 0.25, APOLLO 1.0, "
        "as the HF Trainer).",
        default=optimizers.SETTINGS["projection_scale"],
    )
    projection_embeddings: bool = _help(
        "--optimizer galore-adamw|apollo-adamw: project the input embedding matrix's gradient too (off: it keeps "
        "AdamW's state, as in the papers). For small encoders whose embeddings hold much of the model (MiniLM: half): "
        "what takes their optimizer state below half AdamW's.",
        default=optimizers.SETTINGS["projection_embeddings"],
    )
    seed: int = _help("Seed for data order, splits, head initialisation and dropout.", default=42)
    on_nan: str = _help(
        f"On a non-finite loss or gradient norm: {'|'.join(ON_NAN)} (stop saves the last good state first).",
        default="stop",
    )
    # --- metrics and losses
    label_smoothing: float = _help(
        "Label smoothing of the training cross-entropy, in [0, 1) (transformers: label_smoothing_factor); "
        "DPO: the share of flipped preferences of --preference-loss robust, below 0.5 (no other loss reads it).",
        read_by=(*CLASSIFIERS, *TOKENS, *SEQ2SEQ, "dpo"),
        default=0.0,
    )
    class_weights: str | None = _help(
        "Weigh each class in the training cross-entropy: auto (inverse class frequency, n / (classes x count)) "
        "or one weight per class in label order, e.g. 1,3. Exact under accumulation and processes: a step's "
        "loss is its examples' weighted sum over their total weight. The eval loss stays unweighted.",
        read_by=(*CLASSIFIERS, *TOKENS),
        default=None,
    )
    # --- preference tuning
    preference_loss: str = _help(
        f"DPO: the preference loss: {'|'.join(PREFERENCE_LOSSES)}. sigmoid: DPO; ipo: IPO's squared loss on "
        "per-token log-ratios; hinge: SLiC's; robust: label-smoothed DPO for noisy preferences (the flip rate is "
        "--label-smoothing, below 0.5); simpo: reference-free, length-normalised, with --simpo-gamma; orpo: "
        "reference-free odds ratio (weight --beta) plus the SFT loss on chosen.",
        read_by=("dpo",),
        default="sigmoid",
    )
    beta: float = _help(
        "DPO and KTO: the strength of the pull towards the reference (the rewards are beta x the log-ratio to it); "
        "SimPO: its reward scale; ORPO: the odds-ratio term's weight.",
        read_by=REFERENCE,
        default=0.1,
    )
    simpo_gamma: float = _help(
        "SimPO (--preference-loss simpo): the target reward margin between chosen and rejected.",
        read_by=("dpo",),
        default=0.5,
    )
    sft_weight: float = _help(
        "DPO: add this weight x the chosen completion's mean negative log-likelihood per token to each pair's loss "
        '(RPO; TRL\'s loss_type [..., "sft"] with loss_weights), so the chosen stays likely while the margin '
        "grows: without it DPO can push probability off both completions. 0: off.",
        read_by=("dpo",),
        default=0.0,
    )
    desirable_weight: float = _help(
        "KTO: the weight of a desirable (label true) example's loss.", read_by=("kto",), default=1.0
    )
    undesirable_weight: float = _help(
        "KTO: the weight of an undesirable (label false) example's loss.", read_by=("kto",), default=1.0
    )
    # --- end preference tuning
    # --- HF Trainer users
    eval_batch_size: int | None = _help(
        "Examples per evaluation batch on each device. Default: 2 x --batch-size (evaluation keeps no gradients).",
        default=None,
    )
    warmup_steps: float | None = _help(
        "Warm-up length in optimizer steps, or, below 1, as a share of them (as transformers 5); replaces "
        "--warmup-ratio.",
        default=None,
    )
    scheduler_kwargs: str | None = _help(
        "Arguments of the --scheduler as JSON, e.g. '{\"min_lr_rate\": 0.1}' for cosine_with_min_lr (in YAML: a "
        "mapping).",
        default=None,
    )
    # --- end HF Trainer users
    # --- online RL
    num_generations: int = _help(
        "GRPO: completions sampled per prompt each step, the group whose rewards give each its advantage (2 or "
        "more). --batch-size counts prompts: a micro-batch trains on batch-size x num-generations completions.",
        read_by=GRPO,
        default=8,
    )
    temperature: float = _help(
        "GRPO: the sampling temperature; the log-probabilities trained are those of logits / temperature.",
        read_by=GRPO,
        default=1.0,
    )
    top_p: float = _help(
        "GRPO: sample from the smallest set of most likely tokens whose probability reaches top-p (1: all).",
        read_by=GRPO,
        default=1.0,
    )
    advantage: str = _help(
        f"GRPO: {'|'.join(ADVANTAGES)}. grpo: each reward less its group's mean, over the group's standard "
        "deviation + 1e-4; rloo: each reward less the mean of its group's other rewards.",
        read_by=GRPO,
        default="grpo",
    )
    kl_beta: float = _help(
        "GRPO: weight of the KL penalty to the reference model (the initial model; with --lora the base with its "
        "adapters off); 0 keeps no reference.",
        read_by=GRPO,
        default=0.0,
    )
    clip_epsilon: float = _help(
        "GRPO: the policy ratio is clipped to [1 - clip-epsilon, 1 + clip-epsilon-high].", read_by=GRPO, default=0.2
    )
    clip_epsilon_high: float | None = _help(
        "GRPO: the upper clip (DAPO's clip-higher). Default: --clip-epsilon.", read_by=GRPO, default=None
    )
    iterations_per_generation: int = _help(
        "GRPO: optimizer steps that reuse each generation of completions (TRL's num_iterations), the policy ratio "
        "then taken against their log-probabilities at generation.",
        read_by=GRPO,
        default=1,
    )
    # --- end online RL

    def __post_init__(self) -> None:
        _coerce_types(self)
        self._check()

    def _check(self) -> None:
        _positive(self, "grad_accum")
        _positive(self, "batch_size", optional=True)
        _positive(self, "max_steps", optional=True)
        if self.max_time is not None:
            from leantrain.config.units import parse_duration

            parse_duration(self.max_time)  # a clear one-line error for 'five minutes'
        if not (self.epochs > 0 and math.isfinite(self.epochs)):
            raise ConfigError(f"{_flag('epochs')} must be a positive number, got {self.epochs}")
        if not 0 <= self.warmup_ratio < 1:
            raise ConfigError(f"{_flag('warmup_ratio')} must be in [0, 1), got {self.warmup_ratio}")
        if self.lr is not None and not self.lr > 0:
            raise ConfigError(f"{_flag('lr')} must be positive, got {self.lr}")
        for name in ("weight_decay", "max_grad_norm"):
            if getattr(self, name) < 0:
                raise ConfigError(f"{_flag(name)} must be >= 0, got {getattr(self, name)}")
        # NumPy's legacy generators take seeds up to 2**32 - 1, and the splits seed them with seed + 1 and + 2 too
        if not 0 <= self.seed <= 2**32 - 3:
            raise ConfigError(f"{_flag('seed')} must be a whole number from 0 to {2**32 - 3:,}, got {self.seed}")
        _check_schedule(self)  # HF Trainer users
        optimizers.entry(self.optimizer)  # refused in one line when unknown
        _check_optimizer_settings(self)
        _choice(self, "on_nan", ON_NAN)
        _check_losses(self)
        _check_online_rl(self)

    @property
    def max_time_seconds(self) -> float | None:
        """--max-time in seconds (None: not given)."""
        from leantrain.config.units import parse_duration

        return parse_duration(self.max_time) if self.max_time is not None else None


@dataclass
class EfficiencyConfig:
    """How each device goes further: precision, recomputation, compilation, the planner."""

    precision: str = _help(
        f"Numeric precision: {'|'.join(PRECISIONS)}. auto picks bf16 where the device runs it fast.",
        default="auto",
    )
    activation_checkpointing: bool = _help(
        "Recompute activations in the backward pass: less memory, about a third more compute.", default=False
    )
    compile: bool = _help(
        "torch.compile the model (compile time is reported apart from throughput; on CUDA mode reduce-overhead, "
        "CUDA graphs; on a CPU with torch's deterministic algorithms, so that the same seed and settings give the "
        "same bits).",
        default=False,
    )
    kernels: str = _help(
        "Fused kernels in place of the model's own: none|liger (Liger's RMSNorm, RoPE and SwiGLU for Llama-family "
        "models on CUDA; needs `pip install liger-kernel`).",
        default="none",
    )
    static_shapes: str = _help(
        f"Few batch shapes for a compiled model: {'|'.join(STATIC_SHAPES)}. on pads lengths up to 16, 24, 32, 48, "
        "64, 96, ... (at most a third more padding) and the short last micro-batch of an epoch with masked rows "
        "(zero loss, zero units); auto: on with --compile. Classification, token classification, seq2seq (sources and "
        "targets bucketed apart) and causal LM batches; preference pairs and reward models: lengths only.",
        default="auto",
    )
    flat_parameters: bool = _help(
        "Keep each optimizer group's small trainable parameters (up to 65,536 numbers each) in one flat tensor and "
        "their gradients in another, so that a step's update, gradient norm and clearing are one kernel call for "
        "them all instead of one per tensor (AdamW and SGD; not with --shard fsdp): the same weights to the last "
        "bits, a faster step where the host decides it (1 ms of a 13 ms step on a small BERT on a CPU). Their "
        "gradients then stay allocated between steps (the planner counts them); false frees them after each step.",
        default=True,
    )
    fast_dropout: bool = _help(
        "CPU: draw dropout's masks 16 random bits a number from torch's generator (p rounded to 1/65,536) instead "
        "of torch's bernoulli_: 2.5x cheaper dropouts, a MiniLM step 1.1x (fp32) to 1.3x (bf16) faster; the same "
        "distribution, not torch's draws. Eager training only (not --compile); --attention auto then runs eager "
        "attention for a model with attention dropout, whose SDPA kernel draws its own.",
        default=True,
    )
    pad_to_max_length: bool = _help(
        "Pad every batch to --max-length (an encoder-decoder's sources to --max-source-length, targets to "
        "--max-target-length): fixed shapes, for compiled models and memory benchmarks. A language model's head "
        "then makes the whole batch's logits (its worst case) unless it runs fused with the loss.",
        default=False,
    )
    # --- attention
    attention: str = _help(
        "Attention implementation: auto|eager|sdpa|flex_attention (flex). auto picks by what was measured: sdpa on "
        "a GPU; on a CPU eager for a model with attention dropout under --fast-dropout, or for bf16 training on a "
        "CPU with native bf16, else sdpa; evaluations (no backward pass) run sdpa unless the run is compiled or "
        "packed. The same results up to rounding; a packed causal LM is checked to keep documents apart whichever "
        "runs.",
        default="auto",
    )
    thread_governor: bool = _help(
        "CPU: give an OpenMP thread back while another process holds one of this machine's cores, and take it "
        "again when the core is free (faster beside a busy neighbour: 63% of the quiet speed against 37%). A thread "
        "count that changes mid-run sums in another order, so the weights then depend on the machine's load in "
        "their last bits: two runs, or a run and its resumption, are no longer bitwise equal. Off: the same seed "
        "and settings give the same bits whatever the load. For a `leantrain` command's single CPU process "
        "without OMP_NUM_THREADS.",
        default=False,
    )
    auto: bool = _help(
        "Let the planner choose precision, activation checkpointing and the micro-batch/accumulation split of "
        "the global batch (--batch-size x --grad-accum x processes, held fixed) to train fastest within 0.9 x "
        "--memory (a margin for what the memory model does not count); out of memory then halves the "
        "micro-batch and redoes the step. These change cost, not results; --optimizer is kept unless "
        "--auto-optimizer. The plan is written to plan.json and plan.md.",
        default=False,
    )
    auto_optimizer: bool = _help(
        "With --auto: the planner may also replace --optimizer by adamw, adafactor or adamw8bit (that changes the "
        "results, not only the cost; any other --optimizer, such as sgd or muon, is always kept).",
        default=False,
    )
    memory: str | None = _help(
        "Memory budget per process for --auto and `leantrain plan`, e.g. 8GiB, 512MiB, 8GB. Default: the GPU's "
        "memory, or the memory available on this machine.",
        default=None,
    )
    precompute_reference: bool = _help(
        "Preference tuning: compute the reference model's log-probabilities of every training and evaluation row "
        "once, before training (cached with the tokenized data), and train with no reference model in memory. "
        "Otherwise the reference is the model with its adapters disabled (--lora) or a frozen copy of it.",
        read_by=REFERENCE,
        default=False,
    )

    def __post_init__(self) -> None:
        _coerce_types(self)
        self._check()

    def _check(self) -> None:
        _choice(self, "precision", PRECISIONS)
        _choice(self, "static_shapes", STATIC_SHAPES)
        from leantrain.model.kernels import KERNELS

        _choice(self, "kernels", KERNELS)
        from leantrain.model.attention import ALIASES, CHOICES

        self.attention = ALIASES.get(self.attention, self.attention)
        _choice(self, "attention", CHOICES)
        if self.memory is not None:
            from leantrain.config.units import parse_memory

            parse_memory(self.memory)  # a clear one-line error for '8 gigs'

    @property
    def memory_bytes(self) -> int | None:
        """--memory in bytes (None: not given)."""
        from leantrain.config.units import parse_memory

        return parse_memory(self.memory) if self.memory is not None else None


@dataclass
class ParallelConfig:
    """How many processes on how many machines, started how, and how they share the work."""

    num_processes: int | None = _help(
        "Processes to start on this machine (one per GPU, or CPU processes with gloo). Default: one, or "
        "what an outer `accelerate launch`/`torchrun` already started.",
        default=None,
    )
    num_machines: int = _help("Machines taking part in the job.", default=1)
    machine_rank: int = _help("This machine's rank among --num-machines (0 is the main machine).", default=0)
    main_process_ip: str | None = _help("Address of the main machine (rank 0), for several machines.", default=None)
    main_process_port: int | None = _help("Port on the main machine for the process group.", default=None)
    launcher: str = _help(f"How processes are started: {'|'.join(LAUNCHERS)}.", default="accelerate")
    ray_workers: int | None = _help("Ray Train workers (with --launcher ray).", default=None)
    use_gpu: bool = _help("Ray workers use one GPU each (with --launcher ray).", default=False)
    cpu: bool = _help(
        "Train on the CPU even where a GPU is visible (Accelerate's `--cpu`; the Trainer's use_cpu).", default=False
    )
    shard: str = _help(
        f"Shard model, gradients and optimizer state across processes: {'|'.join(SHARDING)}.", default="none"
    )
    local_sgd_steps: int | None = _help(
        "Local SGD: each process takes this many optimizer steps alone, then parameters are averaged.",
        default=None,
    )
    local_sgd_outer_lr: float | None = _help(
        "Local SGD with an outer optimizer (DiLoCo): learning rate of the Nesterov step on the averaged delta.",
        default=None,
    )
    local_sgd_outer_momentum: float = _help("Local SGD outer optimizer momentum (Nesterov).", default=0.0)
    collective_timeout: str | None = _help(
        "How long a process waits for the others at a collective (gradients' all-reduce, a broadcast) before it "
        "fails: 10m, 600, 1h (transformers: ddp_timeout, seconds). A process that died or hangs then ends the job "
        "in that time instead of holding the others. Default: torch's (30 minutes with gloo, 10 with NCCL).",
        default=None,
        metadata_extra={"number_ok": True},  # YAML's `collective_timeout: 600` is seconds
    )

    def __post_init__(self) -> None:
        _coerce_types(self)
        self._check()

    @property
    def collective_timeout_seconds(self) -> float | None:
        """--collective-timeout in seconds (None: torch's default)."""
        from leantrain.config.units import parse_duration

        if self.collective_timeout is None:
            return None
        return parse_duration(self.collective_timeout, "--collective-timeout")

    def _check(self) -> None:
        _ = self.collective_timeout_seconds  # one line for 'ten minutes'
        _positive(self, "num_machines")
        _positive(self, "num_processes", "ray_workers", "main_process_port", "local_sgd_steps", optional=True)
        if not 0 <= self.machine_rank < self.num_machines:
            raise ConfigError(f"--machine-rank must be in [0, --num-machines), got {self.machine_rank}")
        _choice(self, "launcher", LAUNCHERS)
        _choice(self, "shard", SHARDING)
        if self.local_sgd_outer_lr is not None and not self.local_sgd_outer_lr > 0:
            raise ConfigError(f"{_flag('local_sgd_outer_lr')} must be positive, got {self.local_sgd_outer_lr}")
        if not 0 <= self.local_sgd_outer_momentum < 1:
            raise ConfigError(
                f"{_flag('local_sgd_outer_momentum')} must be in [0, 1), got {self.local_sgd_outer_momentum}"
            )
        if (self.local_sgd_outer_lr is not None or self.local_sgd_outer_momentum) and self.local_sgd_steps is None:
            raise ConfigError(
                f"{_flag('local_sgd_outer_lr')}/{_flag('local_sgd_outer_momentum')} need {_flag('local_sgd_steps')}"
            )
        if self.cpu and self.use_gpu:
            raise ConfigError("--cpu keeps the run off the GPUs; --use-gpu gives each Ray worker one: choose one")
        if self.shard != "none" and self.local_sgd_steps is not None:
            raise ConfigError("--local-sgd-steps needs whole model replicas; it cannot be combined with --shard fsdp")


@dataclass
class CheckpointConfig:
    """Where the run is written, when it is checkpointed, and what it resumes."""

    output_dir: str | None = _help(
        "Where the run is written. Default: runs/<timestamp> (-2, -3... where a run of that second has it).",
        default=None,
    )
    overwrite: bool = _help("Replace a finished run in --output-dir (only once the new run succeeds).", default=False)
    save_every: int | str | None = _help(
        "Save a checkpoint every N optimizer steps, or at the end of every epoch ('epoch'); and at the last step.",
        default=None,
        metadata_extra={"epoch_ok": True},
    )
    save_total_limit: int | None = _help("Keep only the newest N checkpoints (the best is kept apart).", default=None)
    save_on_interrupt: bool = _help(
        "On Ctrl-C or SIGTERM (a cluster's preemption), save a checkpoint at the next step boundary even without "
        "--save-every (with it, one is always saved), then stop with the command that resumes it.",
        default=False,
    )
    metric_for_best: str | None = _help(
        "Eval metric that picks the best checkpoint and early stopping's yardstick: any that --metrics reports "
        "(higher is better; loss, mse, rmse, mae: lower). Default: the task's (accuracy for classification, else "
        "loss).",
        default=None,
    )
    resume: str | None = _help(
        "Resume from a checkpoint: 'auto' (newest complete in --output-dir) or a path.", default=None
    )
    # --- HF Trainer users
    load_best_at_end: bool = _help(
        "Publish the weights of the best evaluation (--metric-for-best) as model/, not the last step's; each new "
        "best is checkpointed (needs --eval-every).",
        default=False,
    )
    early_stopping_patience: int | None = _help(
        "Stop after this many evaluations in a row without an improvement of --metric-for-best of more than "
        "--early-stopping-threshold (needs --eval-every); the reason is written to metrics.json.",
        default=None,
    )
    early_stopping_threshold: float = _help(
        "The improvement over the best value so far that early stopping counts as one.", default=0.0
    )
    # --- end HF Trainer users

    def __post_init__(self) -> None:
        _coerce_types(self)
        self._check()

    def _check(self) -> None:
        _positive(self, "save_every", "save_total_limit", optional=True)
        _positive(self, "early_stopping_patience", optional=True)  # HF Trainer users
        if self.early_stopping_threshold < 0:
            raise ConfigError(f"--early-stopping-threshold must be >= 0, got {self.early_stopping_threshold}")
        if self.resume is not None and not str(self.resume).strip():  # else read as the current folder
            raise ConfigError("--resume is empty; give auto (the newest checkpoint in --output-dir) or a checkpoint")


@dataclass
class LoggingConfig:
    """What the run reports, and how often."""

    eval_every: int | str | None = _help(
        "Evaluate every N optimizer steps, or at the end of every epoch ('epoch'); always at the end of the run.",
        default=None,
        metadata_extra={"epoch_ok": True},
    )
    log_every: int = _help("Log a row to metrics.jsonl every N optimizer steps.", default=10)
    progress: bool = _help("Show a progress bar.", default=True)
    log: str = _help(
        f"Per-step metrics go to metrics.jsonl, and with {'|'.join(LOGS[1:])} also to TensorBoard "
        "event files in OUTPUT_DIR/trackers/leantrain/ (pip install 'leantrain[tensorboard]'); the same as "
        "--report-to tensorboard.",
        default="jsonl",
    )
    report: bool = _help("Write report.html (plots, config, environment) at the end of the run.", default=True)
    profile_steps: int | None = _help(
        "Profile N optimizer steps after the first (torch.profiler): OUTPUT_DIR/profile/trace.json for Perfetto or "
        "chrome://tracing, and the time by kind of work (matmuls, attention, normalisation, casts, optimizer, "
        "data, Python) printed and written to profile/summary.json.",
        default=None,
    )
    # --- metrics and losses
    metrics: str | None = _help(
        "Evaluation metrics, comma-separated (scikit-learn): accuracy, f1 (binary on two classes, as GLUE scores "
        "MRPC; macro otherwise), macro_f1, micro_f1, weighted_f1, precision, recall, mcc, roc_auc, "
        "balanced_accuracy; regression: rmse, mse, mae, pearson, spearman, r2; multi-label: micro_f1, macro_f1, "
        "subset_accuracy, hamming_loss, roc_auc. A macro average is over the classes that have evaluation examples. "
        "The loss is always reported. Default: accuracy,macro_f1 "
        "(regression: rmse,pearson,spearman; multi-label: micro_f1,macro_f1,subset_accuracy). Seq2seq (scored "
        "on generated text): rouge1, rouge2, rougeL, rougeLsum (rouge-score, stemmed; default) or bleu, chrf "
        "(sacrebleu; --task translation's default).",
        {"names": True},
        default=None,
    )
    # --- sequence-to-sequence
    generation_max_new_tokens: int | None = _help(
        "Seq2seq: tokens an evaluation generates at most per example. Default: --max-target-length.",
        read_by=SEQ2SEQ,
        default=None,
    )
    generation_num_beams: int = _help(
        "Seq2seq: beams of the evaluation's (and predict's) beam search; 1 is greedy decoding.",
        read_by=SEQ2SEQ,
        default=1,
    )
    report_to: str | None = _help(
        f"Experiment trackers, comma-separated, through Accelerate: {'|'.join(TRACKERS)} (all: every one "
        "installed). Runs are written under OUTPUT_DIR/trackers/ (W&B honours WANDB_MODE=offline). "
        "--log tensorboard is the same as --report-to tensorboard.",
        {"names": True},
        default=None,
    )

    def __post_init__(self) -> None:
        _coerce_types(self)
        self._check()

    def _check(self) -> None:
        _positive(self, "log_every")
        _positive(self, "eval_every", optional=True)
        _positive(self, "profile_steps", optional=True)
        _positive(self, "generation_num_beams")
        _positive(self, "generation_max_new_tokens", optional=True)
        _choice(self, "log", LOGS)
        _check_reporting(self)


#: the config's sections, in the order of `--help` and config.yaml
SECTIONS = (
    ModelConfig,
    DataConfig,
    OptimizationConfig,
    EfficiencyConfig,
    ParallelConfig,
    CheckpointConfig,
    LoggingConfig,
)


@dataclass
class TrainConfig(
    LoggingConfig, CheckpointConfig, ParallelConfig, EfficiencyConfig, OptimizationConfig, DataConfig, ModelConfig
):
    """Everything that defines a training run: every section's fields, flat (`TrainConfig(lr=1e-4)`, one YAML
    key and one flag per field). Unset (None) fields are resolved by `resolved()`."""

    def __post_init__(self) -> None:
        _coerce_types(self)
        _check_finite(self)
        if self.task is not None:  # an alias may say more than its task (--task translation: BLEU and chrF)
            for key, value in tasks.implied(self.task).items():
                if getattr(self, key) is None:
                    setattr(self, key, value)
        for section in SECTIONS:
            section._check(self)
        # rules across sections
        if self.streaming and not self.max_steps:
            raise ConfigError(
                "--streaming needs --max-steps: a stream's length is unknown until it ends, and the learning-rate "
                "schedule needs the number of steps"
            )
        for name in ("eval_every", "save_every"):
            if self.streaming and getattr(self, name) == "epoch":
                raise ConfigError(f"{_flag(name)} epoch: a stream's epoch has no known length; give a number of steps")
        if self.streaming and self.auto:
            raise ConfigError(
                "--auto measures the whole data set's lengths; with --streaming choose the batch yourself"
            )
        _check_best_and_stopping(self)  # HF Trainer users
        optimizers.check(self.optimizer, self)  # what the optimizer refuses: a schedule, --shard fsdp, --lora
        _check_switches(self)
        _check_source_options(self)

    def section(self, cls: type[_Section]) -> _Section:
        """This config's values of one section, e.g. `cfg.section(CheckpointConfig)`."""
        return cls(**{f.name: getattr(self, f.name) for f in fields(typing.cast(Any, cls))})

    # -- construction ----------------------------------------------------------------------------

    @classmethod
    def from_dict(cls, values: dict[str, Any], source: str = "config") -> TrainConfig:
        """Build from a mapping, refusing unknown keys with a suggestion."""
        from leantrain.config import hf_names

        known = {f.name for f in fields(cls)}
        # TrainingArguments names; every refused or unknown name in one message
        values = hf_names.translate(values, source, known)
        return cls(**values)

    @classmethod
    def from_yaml(cls, path: str | Path, overrides: dict[str, Any] | None = None) -> TrainConfig:
        """Load a YAML file, then apply `overrides` (the flags given on the command line)."""
        path = Path(path)
        if not path.is_file():
            raise ConfigError(f"--config: no such file '{path}'")
        try:
            text = path.read_bytes().decode("utf-8-sig")
        except UnicodeDecodeError as exc:
            raise ConfigError(
                f"{path}: not UTF-8 text (byte 0x{exc.object[exc.start]:02x} at offset {exc.start}); save it as UTF-8"
            ) from None
        except OSError as exc:
            raise ConfigError(f"{path}: cannot read ({exc.strerror or exc})") from None
        try:
            values = yaml.safe_load(text) or {}
        except yaml.YAMLError as exc:
            raise ConfigError(f"{path}: not valid YAML ({_first_line(exc)})") from None
        if not isinstance(values, dict):
            raise ConfigError(f"{path}: expected a mapping of config keys, got {type(values).__name__}")
        values = {str(k).replace("-", "_"): v for k, v in values.items()}
        from leantrain.config import hf_names

        # before the flags override: each source apart
        task = values.get("task") or (overrides or {}).get("task")
        values = hf_names.translate(values, str(path), {f.name for f in fields(cls)}, task)
        fraction = values.get("eval_fraction")
        default = next(f.default for f in fields(cls) if f.name == "eval_fraction")
        if values.get("eval_data") is not None and fraction not in (None, default):
            # a run's config.yaml records both, with the fraction's default: a share set by hand means something
            raise ConfigError(
                f"{path}: eval_fraction {fraction} holds out a share of data, but eval_data gives the evaluation "
                "rows, so it would be ignored: remove eval_fraction, or eval_data to hold rows out"
            )
        return cls.from_dict({**values, **(overrides or {})}, source=str(path))

    def replace(self, **changes: Any) -> TrainConfig:
        return dataclasses.replace(self, **changes)

    def to_argv(self) -> list[str]:
        """Flags that rebuild this config: every field that differs from its default (but --eval-fraction beside
        --eval-data: a YAML file may hold both, the flags are refused together and the fraction is unread)."""
        changed = {}
        for f in fields(self):
            default = f.default if f.default is not dataclasses.MISSING else None
            value = getattr(self, f.name)
            if not (value == default and type(value) is type(default)):
                changed[f.name] = value
        if self.eval_data is not None:
            changed.pop("eval_fraction", None)
        return to_flags(changed)

    def resolved(self) -> TrainConfig:
        """Fill in what the defaults leave open, so config.yaml records exactly what ran."""
        from leantrain.data.sources import EMBEDDED_DATA
        from leantrain.data.tokenize import default_cache_dir
        from leantrain.model.loading import EMBEDDED_MODEL
        from leantrain.paths import default_output_dir

        changes: dict[str, Any] = {}
        if self.batch_size is None:
            changes["batch_size"] = self.batch_size_or_default()
        if self.freeze is None:
            changes["freeze"] = self.freeze_or_default()
        if self.dropout is None:
            changes["dropout"] = self.dropout_or_default()
        if self.normalize_tweets is None and self.normalize_tweets_or_default():
            changes["normalize_tweets"] = True  # left unset otherwise: another task's run would be refused it
        if self.data is None:
            changes["data"] = EMBEDDED_DATA
            if self.limit is None:
                changes["limit"] = DEFAULT_JOB_ROWS
                if self.max_steps is None and self.max_time is None:  # sized to its time, not to a step count
                    changes["max_time"] = f"{DEFAULT_JOB_SECONDS}s"
        if self.lr is None:
            changes["lr"] = DEFAULT_JOB_LR if self.data is None else DEFAULT_LR
        if self.scheduler is None:
            changes["scheduler"] = self.scheduler_or_default()
        if self.model is None:
            changes["model"] = EMBEDDED_MODEL
        if self.output_dir is None:
            changes["output_dir"] = str(default_output_dir())
        if self.cache_dir is None:
            changes["cache_dir"] = str(default_cache_dir())
        return self.replace(**changes)

    def batch_size_or_default(self) -> int:
        """--batch-size, or what `resolved()` fills in where it is left out (the default job's own, or the usual)."""
        if self.batch_size is not None:
            return self.batch_size
        return DEFAULT_JOB_BATCH_SIZE if self.data is None else DEFAULT_BATCH_SIZE

    def scheduler_or_default(self) -> str:
        """--scheduler, or what `resolved()` fills in where it is left out: the schedule the optimizer takes where it
        takes only some (schedule-free: constant, its warm-up kept), linear otherwise."""
        if self.scheduler is not None:
            return self.scheduler
        return (optimizers.entry(self.optimizer).schedulers or (DEFAULT_SCHEDULER,))[0]

    def scheduler_note(self) -> str | None:
        """What the user hears where --scheduler is left out and the optimizer chose it; None otherwise."""
        chosen = self.scheduler_or_default()
        if self.scheduler is not None or chosen == DEFAULT_SCHEDULER:
            return None
        why = optimizers.entry(self.optimizer).schedulers_why
        return f"--scheduler left out: {chosen} for --optimizer {self.optimizer}, as {why}"

    def normalize_tweets_or_default(self) -> bool:
        """--normalize-tweets, or what `resolved()` fills in where it is left out: on for the default job's classifier
        (its corpus is tweets: a fifth fewer tokens a row, the same accuracy a row), off otherwise."""
        from leantrain.model.loading import EMBEDDED_MODEL

        if self.normalize_tweets is not None:
            return self.normalize_tweets
        classifier = self.task == "text-classification" or (self.task is None and self.model in (None, EMBEDDED_MODEL))
        return self.data is None and classifier

    def freeze_or_default(self) -> str:
        """--freeze, or what `resolved()` fills in where it is left out: the default job's word embeddings (a faster
        step, the same accuracy), nothing otherwise."""
        if self.freeze is not None:
            return self.freeze
        return "embeddings" if self.data is None and not self.lora else "none"

    def dropout_or_default(self) -> float | None:
        """--dropout, or what `resolved()` fills in where it is left out: 0 for the default job (no dropout), None
        (the model's own) otherwise."""
        if self.dropout is not None:
            return self.dropout
        return DEFAULT_JOB_DROPOUT if self.data is None else None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def default_job_expectation(cfg: TrainConfig, rows: int, speed: float) -> str:
    """What the default job's `rows` should reach, where they are fewer than the rows that reach accuracy 0.80, and
    what those cost at `speed` (samples/s); "" for any other run, or rows enough."""
    from leantrain.data.sources import EMBEDDED_DATA
    from leantrain.model.loading import EMBEDDED_MODEL

    default_job = cfg.data == EMBEDDED_DATA and cfg.model in (None, EMBEDDED_MODEL) and cfg.limit == DEFAULT_JOB_ROWS
    if not default_job or cfg.task not in (None, "text-classification"):
        return ""
    (fewest, lowest), enough = DEFAULT_JOB_ACCURACY[0], DEFAULT_JOB_ACCURACY[-1][0]
    if rows < fewest:
        expect = f"under {lowest:.2f}"
    else:
        pair = next((p for p in itertools.pairwise(DEFAULT_JOB_ACCURACY) if rows < p[1][0]), None)
        if pair is None:
            return ""
        (r0, a0), (r1, a1) = pair
        accuracy = a0 + (a1 - a0) * (rows - r0) / (r1 - r0)
        if accuracy >= 0.80:
            return ""
        expect = f"about {accuracy:.3f}"  # not rounded: 0.796 (13,000 rows) would read as 0.80
    return (
        f"; fewer than the {enough:,} rows that reach accuracy 0.80, so expect {expect} (--limit {enough}: about "
        f"{enough / speed / 60:.0f} minutes of training here)"
    )


def to_flags(values: dict[str, Any]) -> list[str]:
    """Command-line flags that give these config values (`--no-X` for false booleans; None values left out)."""
    argv: list[str] = []
    for key, value in values.items():
        flag = "--" + key.replace("_", "-")
        if isinstance(value, list):  # several --data sources: a mapping as inline JSON, which is YAML too
            for item in value:
                argv += [flag, item if isinstance(item, str) else json.dumps(item, separators=(",", ":"))]
        elif isinstance(value, bool):
            argv.append(flag if value else "--no-" + flag[2:])
        elif value is not None:
            argv += [flag, repr(value) if isinstance(value, float) else str(value)]
    return argv


#: the defaults of settings now left unset by default, as older versions recorded them in every run's config.yaml:
#: such a file does not give them (a text classifier's config.yaml of then, read back, holds `stride: 32`)
FORMER_DEFAULTS: dict[str, Any] = {"stride": 32}


def unread_settings(cfg: TrainConfig, task: str) -> dict[str, tuple[str, ...]]:
    """The fields `cfg` gives a value other than their default that `task` does not read (their `read_by` names
    only other tasks), each with the tasks that do. None for a task no field names: one of your own may read any."""
    declared = [(f, f.metadata["read_by"]) for f in fields(TrainConfig) if "read_by" in f.metadata]
    if not any(task in read_by for _, read_by in declared):
        return {}
    unset = {f.name: (None if f.default is dataclasses.MISSING else f.default) for f, _ in declared}
    left = {name: (default, FORMER_DEFAULTS.get(name, default)) for name, default in unset.items()}
    return {
        f.name: read_by for f, read_by in declared if task not in read_by and getattr(cfg, f.name) not in left[f.name]
    }


#: a setting another task reads, given to a task whose own setting TRL's trainer for it names alike
NAMESAKES = {("grpo", "beta"): "kl_beta"}


def unread_message(task: str, unread: dict[str, tuple[str, ...]]) -> str:
    """One line naming the settings `task` does not read, grouped by the tasks that read them (and, where TRL
    calls this task's own setting by that name, which one it is)."""
    groups: dict[tuple[str, ...], list[str]] = {}
    for name, read_by in unread.items():
        groups.setdefault(read_by, []).append(_flag(name))
    named = ", ".join(f"{', '.join(flags)} ({', '.join(read_by)})" for read_by, flags in groups.items())
    them = "it" if len(unread) == 1 else "them"
    meant = [
        f"; {task}'s {_flag(NAMESAKES[task, name])} is what TRL's {task} trainer calls {name}"
        for name in unread
        if (task, name) in NAMESAKES
    ]
    said = f"the {task} task does not read {named}; leave {them} out (or choose their task with --task)"
    return said + "".join(meant)


def field_help(cls: type = TrainConfig) -> dict[str, str]:
    return {f.name: f.metadata.get("help", "") for f in fields(cls)}


def field_base_type(f: dataclasses.Field) -> type:
    """The concrete type of a field, with `| None` stripped."""
    hint = _type_hints()[f.name]
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        hint = args[0]
    return hint


@functools.cache
def _type_hints() -> dict[str, Any]:
    """TrainConfig's resolved annotations, once: resolving them per field made every TrainConfig() and parser slow."""
    return typing.get_type_hints(TrainConfig)


def _flag(name: str) -> str:
    return f"--{name.replace('_', '-')}"


def _first_line(exc: Exception) -> str:
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__


def _coerce_types(cfg: Any) -> None:
    """Accept what YAML and Python callers naturally give (1 for 1.0, "1e-4" for 1e-4); refuse the rest."""
    for f in fields(cfg):
        value = getattr(cfg, f.name)
        if value is None:
            continue
        want = field_base_type(f)
        if f.metadata.get("epoch_ok") and value == "epoch":
            continue  # --eval-every/--save-every epoch
        if f.metadata.get("sources") and isinstance(value, (list, tuple, dict)):
            continue  # several --data sources, or one with its own options: `_check_data_sources` reads them
        if want is bool:
            if not isinstance(value, bool):
                raise ConfigError(f"{_flag(f.name)} must be true or false, got {value!r}")
        elif want is int:
            if isinstance(value, bool) or not (
                isinstance(value, int) or (isinstance(value, float) and value.is_integer())
            ):
                steps = " or 'epoch'" if f.metadata.get("epoch_ok") else ""
                if f.name in ("log_every", "eval_every", "save_every") and isinstance(value, float) and 0 < value < 1:
                    steps += " (a number of optimizer steps: a fraction of the run, as the HF Trainer takes it, is not)"
                raise ConfigError(f"{_flag(f.name)} must be an integer{steps}, got {value!r}")
            setattr(cfg, f.name, int(value))
        elif want is float:
            try:
                if isinstance(value, bool):
                    raise ValueError
                setattr(cfg, f.name, float(value))
            except (TypeError, ValueError):
                raise ConfigError(f"{_flag(f.name)} must be a number, got {value!r}") from None
        elif want is str:
            names = f.metadata.get("names")  # comma-separated names: a list of them as peft's target_modules takes
            if names and isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
                value = ",".join(value)
            if f.metadata.get("number_ok") and isinstance(value, (int, float)) and not isinstance(value, bool):
                value = f"{value:g}"
            if not isinstance(value, (str, Path)):
                kinds = "a string or a list of strings" if names else "a string"
                raise ConfigError(f"{_flag(f.name)} must be {kinds}, got {value!r}")
            setattr(cfg, f.name, str(value))


def _positive(cfg: Any, *names: str, optional: bool = False) -> None:
    for name in names:
        value = getattr(cfg, name)
        if (value is None and optional) or value == "epoch":
            continue
        if value is None or value <= 0:
            raise ConfigError(f"{_flag(name)} must be a positive integer, got {value}")


def _choice(cfg: Any, name: str, choices: tuple[str, ...]) -> None:
    value = getattr(cfg, name)
    if value not in choices:
        raise ConfigError(f"{_flag(name)} must be one of {', '.join(choices)}; got '{value}'")


#: settings that mean something only beside another one: (the settings, whether their switch is on, the switch),
#: refused when a config is made. LoRA's and the optimizers' own settings are refused by a run instead (`unswitched`).
SWITCHED: tuple[tuple[tuple[str, ...], Callable[[Any], bool], str], ...] = (
    (("early_stopping_threshold",), lambda c: c.early_stopping_patience is not None, "--early-stopping-patience"),
    (("streaming_eval_rows",), lambda c: bool(c.streaming), "--streaming"),
    # a split of the evaluation data set: without one, the rows held out of --data are scored, the split unread
    (("eval_split",), lambda c: c.eval_data is not None or _sources_evaluate_on_their_own(c.data), "--eval-data"),
)


def _sources_evaluate_on_their_own(data: Any) -> bool:
    """Whether some source of a mixture names its own eval_data (which a run-wide --eval-split reads too)."""
    return isinstance(data, list) and any(isinstance(s, dict) and s.get("eval_data") for s in data)


def _check_switches(cfg: Any) -> None:
    """Refuse a setting given without the switch it belongs to (`--streaming-eval-rows` without `--streaming` would
    be silently ignored), every such setting at once."""
    defaults = {f.name: f.default for f in fields(type(cfg))}
    _refuse_unswitched(
        {n: switch for names, on, switch in SWITCHED if not on(cfg) for n in names if getattr(cfg, n) != defaults[n]}
    )


#: LoRA's own settings: they mean something only with --lora
LORA_SETTINGS = ("lora_r", "lora_alpha", "lora_dropout", "lora_targets")


def unswitched(values: dict[str, Any]) -> dict[str, str]:
    """LoRA's settings without --lora and one optimizer's settings given to another, in `values` (a config's fields
    by name; those left out are at their defaults), each with the switch it needs. A run refuses them
    (`refuse_unswitched`); `bench` and `plan` carry one job's settings across candidates that differ in the switch
    (`bench` drops them from the candidates that do not read them)."""
    defaults = {f.name: f.default for f in fields(TrainConfig)}
    found = {}
    if not values.get("lora", defaults["lora"]):
        found = {n: "--lora" for n in LORA_SETTINGS if values.get(n, defaults[n]) != defaults[n]}
    for name, readers in optimizers.unread_settings(values, (values.get("optimizer", defaults["optimizer"]),)).items():
        found[name] = "--optimizer " + " or ".join(readers)
    return found


def refuse_unswitched(cfg: TrainConfig) -> None:
    """Refuse a run's LoRA or optimizer settings given without their switch (`--lora-r 4` without `--lora` would train
    the whole model, the rank ignored), every such setting at once."""
    _refuse_unswitched(unswitched({f.name: getattr(cfg, f.name) for f in fields(cfg)}))


def without_unswitched(values: dict[str, Any]) -> dict[str, Any]:
    """`values` less the settings its own switches leave unread (a `bench` candidate's job), and less
    --eval-fraction beside --eval-data (a run's config.yaml records both; as flags they are refused together)."""
    unread = set(unswitched(values)) | ({"eval_fraction"} if values.get("eval_data") else set())
    return {name: value for name, value in values.items() if name not in unread}


def _refuse_unswitched(found: dict[str, str]) -> None:
    groups: dict[str, list[str]] = {}
    for name, switch in found.items():
        groups.setdefault(switch, []).append(_flag(name))
    missing = [f"{', '.join(given)} need{'s' if len(given) == 1 else ''} {switch}" for switch, given in groups.items()]
    if missing:
        raise ConfigError("; ".join(missing) + " (without it they would be ignored): add it, or leave them out")


def _check_data_sources(cfg: DataConfig) -> None:
    """The data-source keys: the sources of --data (recorded as config.yaml keeps them), a known format, usable column
    names, non-empty config and split names."""
    if cfg.data is not None:
        from leantrain.data.spec import parse_sources, recorded

        cfg.data = recorded(parse_sources(cfg.data))
    _choice(cfg, "mix_by", MIX_BY)
    if cfg.format is not None:
        cfg.format = cfg.format.lower().lstrip(".")
        _choice(cfg, "format", DATA_FORMATS)
    for name in ("data_config", "data_split", "eval_split"):
        value = getattr(cfg, name)
        if value is not None and not value.strip():
            raise ConfigError(f"{_flag(name)} is empty; give a name or leave it out")
    if cfg.column_names is not None:
        names = [n.strip() for n in cfg.column_names.split(",")]
        if not all(names):
            raise ConfigError(f"{_flag('column_names')} '{cfg.column_names}' has an empty name; write e.g. label,text")
        repeated = sorted({n for n in names if names.count(n) > 1})
        if repeated:
            raise ConfigError(f"{_flag('column_names')} names {', '.join(repeated)} more than once")
        if cfg.format in ("json", "jsonl", "parquet"):
            raise ConfigError(
                f"{_flag('column_names')} is for CSV/TSV files without a header, not --format {cfg.format}"
            )


def _check_token_labels(cfg: DataConfig) -> None:
    """Token classification's keys: a known tag scheme and aggregation, a stride of zero or more, a tag column."""
    from leantrain.data.tags import AGGREGATIONS, SCHEMES, canonical_scheme

    cfg.tag_scheme = canonical_scheme(cfg.tag_scheme)
    _choice(cfg, "tag_scheme", ("auto", *SCHEMES))
    _choice(cfg, "aggregation", AGGREGATIONS)
    if cfg.stride is not None and cfg.stride < 0:
        raise ConfigError(f"--stride must be 0 or more (tokens consecutive windows share), got {cfg.stride}")
    if cfg.tag_column in (0, 1):
        raise ConfigError(
            f"--tag-column {cfg.tag_column}: columns count from 1, the word's; the tag is in another (2, 3, ..., or -1)"
        )


def _check_source_options(cfg: TrainConfig) -> None:
    """A mixture source's own settings, checked now as the run's are (else refused once its data is read, without
    naming the source)."""
    from leantrain.data.spec import parse_sources

    specs = parse_sources(cfg.data) if cfg.data is not None else []
    for spec in specs:
        where = f"--data source {spec.name} ({spec.path})"
        if len(specs) > 1 and cfg.eval_split is not None and spec.option("eval_data", cfg.eval_data) is None:
            # a run-wide split that this source, holding its rows out, would not read
            raise ConfigError(
                f"{where}: --eval-split {cfg.eval_split} needs its eval_data, and it has none (its rows are held "
                "out); give eval_split in the mapping of each source with an eval_data, not --eval-split"
            )
        if spec.options:
            try:
                dataclasses.replace(cfg, data=spec.path, **dict(spec.options))
            except ConfigError as exc:
                raise ConfigError(f"{where}: {exc}") from None


def _check_finite(cfg: TrainConfig) -> None:
    """Reliability: NaN or infinity in a numeric setting (--lr inf, --weight-decay nan) would train a
    non-finite model while passing every range check (comparisons with NaN are false)."""
    for f in fields(cfg):
        value = getattr(cfg, f.name)
        if isinstance(value, float) and not math.isfinite(value):
            raise ConfigError(f"{_flag(f.name)} must be a finite number, got {value}")


def _check_lora(cfg: ModelConfig) -> None:
    """LoRA: a positive rank and scale, a dropout probability, a known quantization, and the
    options that only mean something with --lora."""
    if cfg.lora_r is None or cfg.lora_r <= 0:
        raise ConfigError(
            f"{_flag('lora_r')} must be a positive integer (the adapters' rank, e.g. 8), got {cfg.lora_r}"
        )
    if not cfg.lora_alpha > 0:
        raise ConfigError(f"{_flag('lora_alpha')} must be positive, got {cfg.lora_alpha}")
    if not 0 <= cfg.lora_dropout < 1:
        raise ConfigError(f"{_flag('lora_dropout')} must be in [0, 1), got {cfg.lora_dropout}")
    if not cfg.lora_targets.strip(", "):
        raise ConfigError(f"{_flag('lora_targets')} is empty; give auto or module names such as query,value")
    if cfg.quantize is not None:
        _choice(cfg, "quantize", QUANTIZE)
    for name in ("quantize", "save_adapter"):
        if getattr(cfg, name) and not cfg.lora:
            raise ConfigError(f"{_flag(name)} needs --lora (it trains adapters over a frozen base); add --lora")
    if cfg.save_adapter and (presets.is_preset(cfg.model) or str(cfg.model).endswith(".json")):
        raise ConfigError(
            f"--save-adapter: {cfg.model} is built from scratch, its random weights saved nowhere but in model/, so "
            "an adapter alone could not be loaded; leave --save-adapter out (model/ holds the merged model)"
        )


def _check_optimizer_settings(cfg: OptimizationConfig) -> None:
    _positive(cfg, "projection_rank", "projection_update_interval")
    for name in ("muon_lr", "projection_scale"):
        value = getattr(cfg, name)
        if value is not None and not value > 0:
            raise ConfigError(f"{_flag(name)} must be positive, got {value}")
    if not 0 <= cfg.muon_momentum < 1:
        raise ConfigError(f"{_flag('muon_momentum')} must be in [0, 1), got {cfg.muon_momentum}")
    _choice(cfg, "muon_lr_rule", optimizers.MUON_LR_RULES)


# --- metrics and losses
def _check_problem(cfg: ModelConfig) -> None:
    _choice(cfg, "problem_type", PROBLEM_TYPES)
    if not 0 < cfg.multi_label_threshold < 1:
        raise ConfigError(f"--multi-label-threshold must be between 0 and 1, got {cfg.multi_label_threshold}")


def _check_losses(cfg: OptimizationConfig) -> None:
    if not 0 <= cfg.label_smoothing < 1:
        raise ConfigError(f"--label-smoothing must be in [0, 1), got {cfg.label_smoothing}")
    _choice(cfg, "preference_loss", PREFERENCE_LOSSES)
    if not (cfg.beta > 0 and math.isfinite(cfg.beta)):
        task = getattr(cfg, "task", None)
        namesake = NAMESAKES.get((str(task), "beta"))  # a TRL config's beta: GRPO's is its KL weight
        also = (
            f"; {task} does not read it: its {_flag(namesake)} is what TRL's {task} trainer calls beta"
            if namesake
            else ""
        )
        raise ConfigError(f"--beta must be a positive number, got {cfg.beta}{also}")
    for name in ("simpo_gamma", "sft_weight", "desirable_weight", "undesirable_weight"):
        if not (getattr(cfg, name) >= 0 and math.isfinite(getattr(cfg, name))):
            raise ConfigError(f"{_flag(name)} must be a number >= 0, got {getattr(cfg, name)}")
    if cfg.preference_loss == "robust" and not cfg.label_smoothing < 0.5:
        raise ConfigError(
            f"--preference-loss robust: --label-smoothing is the share of flipped preferences and must be below 0.5, "
            f"got {cfg.label_smoothing}"
        )
    if cfg.class_weights is not None and cfg.class_weights.strip().lower() != "auto":
        from leantrain.model.losses import parse_class_weights

        parse_class_weights(cfg.class_weights)


def _check_online_rl(cfg: OptimizationConfig) -> None:
    _positive(cfg, "num_generations", "iterations_per_generation")
    _choice(cfg, "advantage", ADVANTAGES)
    if not cfg.temperature > 0:
        raise ConfigError(f"--temperature must be positive, got {cfg.temperature}")
    if not 0 < cfg.top_p <= 1:
        raise ConfigError(f"--top-p must be in (0, 1], got {cfg.top_p}")
    if cfg.kl_beta < 0:
        raise ConfigError(f"--kl-beta must be >= 0 (0: no reference model), got {cfg.kl_beta}")
    if not 0 < cfg.clip_epsilon < 1:
        raise ConfigError(f"--clip-epsilon must be in (0, 1), got {cfg.clip_epsilon}")
    if cfg.clip_epsilon_high is not None and not cfg.clip_epsilon_high > 0:
        raise ConfigError(f"--clip-epsilon-high must be positive, got {cfg.clip_epsilon_high}")


def _check_reporting(cfg: LoggingConfig) -> None:
    from leantrain.tasks.scoring import all_metric_names, parse_metrics

    for name in parse_metrics(cfg.metrics):
        if name not in all_metric_names():
            hint = difflib.get_close_matches(name, sorted(all_metric_names()), n=1)
            fix = f"did you mean '{hint[0]}'?" if hint else f"choose from {', '.join(sorted(all_metric_names()))}"
            raise ConfigError(f"--metrics: unknown metric '{name}'; {fix}")
    if cfg.report_to is not None:
        names = [n.strip().lower() for n in cfg.report_to.split(",")]
        unknown = [n for n in names if n not in (*TRACKERS, "none")]
        if unknown:
            raise ConfigError(f"--report-to: unknown tracker {unknown[0]!r}; choose from {', '.join(TRACKERS)}, none")


# --- HF Trainer users
def _check_best_and_stopping(cfg: TrainConfig) -> None:
    """Best-at-end and early stopping judge evaluations: they need some; best-at-end needs checkpoints."""
    for name in ("load_best_at_end", "early_stopping_patience"):
        if getattr(cfg, name) not in (None, False) and cfg.eval_every is None:
            raise ConfigError(f"{_flag(name)} judges evaluations: add --eval-every N (or --eval-every epoch)")
    if cfg.load_best_at_end and cfg.shard != "none":
        raise ConfigError(
            f"--load-best-at-end keeps the best step in a checkpoint, which --shard {cfg.shard} does not write yet"
        )


def _check_schedule(cfg: OptimizationConfig) -> None:
    """A known schedule with the arguments it needs; the warm-up as steps (an integer) or a ratio below 1."""
    import json

    if cfg.scheduler in ("reduce_lr_on_plateau", "greedy"):
        raise ConfigError(
            f"--scheduler {cfg.scheduler} steps on an evaluation metric, not per optimizer step; leantrain does not "
            "run it: choose one of " + ", ".join(SCHEDULERS)
        )
    if cfg.scheduler is not None:
        _choice(cfg, "scheduler", SCHEDULERS)
    kwargs: Any = {}
    if cfg.scheduler_kwargs is not None:
        try:
            kwargs = json.loads(cfg.scheduler_kwargs)
        except ValueError:
            kwargs = None
        if not isinstance(kwargs, dict):
            raise ConfigError(
                f"--scheduler-kwargs must be a JSON object, e.g. '{{\"num_cycles\": 2}}'; got {cfg.scheduler_kwargs!r}"
            )
    need = SCHEDULER_NEEDS.get(cfg.scheduler or "")
    if need and not any(k in kwargs for k in need):
        example = json.dumps({need[-1]: 0.1 if need[-1].endswith("rate") else 100})
        raise ConfigError(f"--scheduler {cfg.scheduler} needs {' or '.join(need)}: add --scheduler-kwargs '{example}'")
    if cfg.warmup_steps is not None:
        w = cfg.warmup_steps
        if w < 0 or (w >= 1 and not float(w).is_integer()):
            raise ConfigError(f"--warmup-steps must be a whole number of steps or a ratio in [0, 1), got {w}")
    _positive(cfg, "eval_batch_size", optional=True)


def resolved_values(
    cfg: TrainConfig, *, precision: str, metric_for_best: str, num_processes: int, task: str | None = None
) -> dict[str, Any]:
    """config.yaml's content: what ran, not what was asked (`precision: bf16`, not `auto`; the task that ran, as
    `tasks.registry.recorded_name` finds it again)."""
    values = cfg.to_dict()
    values.update(
        task=task or cfg.task,
        precision=precision,
        metric_for_best=metric_for_best,
        eval_batch_size=cfg.eval_batch_size or 2 * cfg.batch_size_or_default(),
        num_processes=num_processes,
    )
    return values
