"""Typed training config: one dataclass, validated on creation, loadable from YAML, overridable by flags.

Every field is both a YAML key (`batch_size`) and a CLI flag (`--batch-size`); the CLI is generated
from the fields below, so the two can never drift apart. Precedence: defaults < YAML file < flags.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import types
import typing
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import yaml

from leantrain.errors import ConfigError

#: rows of the embedded tweet corpus used by the default job, sized for ~5 minutes on 2 CPU cores
DEFAULT_JOB_LIMIT = 30_000

SCHEDULERS = ("linear", "cosine", "constant")
PRECISIONS = ("auto", "fp32", "bf16", "fp16")
OPTIMIZERS = ("adamw", "adafactor", "adamw8bit", "sgd")
LAUNCHERS = ("accelerate", "torchrun", "ray")
SHARDING = ("none", "fsdp")
ON_NAN = ("stop", "skip")
LOGS = ("jsonl", "tensorboard")
TASKS = ("text-classification", "image-classification", "audio-classification")


def _help(text: str, **kw: Any) -> Any:
    return field(metadata={"help": text}, **kw)


@dataclass
class TrainConfig:
    """Everything that defines a training run. Unset (None) fields are resolved by `resolved()`."""

    # --- model and data
    model: str | None = _help(
        "Hugging Face model: a local folder or a hub name. Default: the embedded all-MiniLM-L6-v2.",
        default=None,
    )
    data: str | None = _help(
        "Training data: a CSV/TSV/JSON/JSONL/Parquet file, a `save_to_disk` folder or a hub data set "
        "name. Default: the embedded 3-class tweet sentiment corpus.",
        default=None,
    )
    eval_data: str | None = _help(
        "Evaluation data in the same formats. Default: a stratified split of --data.", default=None
    )
    text_column: str | None = _help("Column holding the text. Guessed when obvious.", default=None)
    text_pair_column: str | None = _help(
        "Column holding the second text of a sentence pair. Guessed when obvious.", default=None
    )
    label_column: str | None = _help("Column holding the label. Guessed when obvious.", default=None)
    max_length: int = _help("Longest tokenized input; longer inputs are truncated.", default=128)
    limit: int | None = _help(
        "Train on a stratified sample of this many training rows. The default job uses "
        f"{DEFAULT_JOB_LIMIT}; otherwise all rows.",
        default=None,
    )
    eval_fraction: float = _help(
        "Share of --data held out for evaluation when --eval-data is not given (0 < f < 1).", default=0.1
    )
    # --- images and audio (issue #8)
    task: str | None = _help(
        f"What the model learns: {'|'.join(TASKS)}. Default: inferred from the model's config (text when unclear).",
        default=None,
    )
    image_column: str | None = _help(
        "Table column holding images (paths relative to the table, or `datasets` images). Guessed when obvious.",
        default=None,
    )
    audio_column: str | None = _help(
        "Table column holding audio (paths relative to the table, or `datasets` audio). Guessed when obvious.",
        default=None,
    )
    label_pattern: str | None = _help(
        "Regular expression that takes each file's label from its path inside a --data folder (the group named "
        "'label', else the first group), e.g. '^(\\d+)_' for '7_jackson_3.wav'. Default: the class sub-folder.",
        default=None,
    )
    eval_pattern: str | None = _help(
        "Regular expression: the files of --data whose path matches (e.g. '_[0-4]\\.wav$') are the evaluation "
        "set, instead of a random --eval-fraction.",
        default=None,
    )
    max_seconds: float | None = _help(
        "Audio: pad or cut every clip to this many seconds. Default: the feature extractor's own length, "
        "else the longest training clip (at most 30 s).",
        default=None,
    )
    augment: bool = _help(
        "Random augmentation of training examples: images shifted by up to 1/8 of their size, audio shifted "
        "in time by up to 1/10 of its length.",
        default=False,
    )
    strict: bool = _help("Stop at the first unreadable image or audio file instead of skipping it.", default=False)
    # --- optimisation
    batch_size: int = _help("Examples per micro-batch on each device.", default=32)
    epochs: float = _help("Passes over the training data (fractions allowed).", default=1.0)
    max_steps: int | None = _help("Stop after this many optimizer steps (overrides --epochs).", default=None)
    lr: float = _help("Peak learning rate.", default=5e-5)
    weight_decay: float = _help("AdamW weight decay; never applied to biases and LayerNorm weights.", default=0.01)
    warmup_ratio: float = _help("Share of the optimizer steps spent warming up the learning rate.", default=0.06)
    scheduler: str = _help(f"Learning-rate schedule after warm-up: {'|'.join(SCHEDULERS)}.", default="linear")
    max_grad_norm: float = _help("Clip the global gradient norm to this (0 disables clipping).", default=1.0)
    optimizer: str = _help(
        f"Optimizer: {'|'.join(OPTIMIZERS)}. adafactor and adamw8bit keep far less state than adamw.",
        default="adamw",
    )
    grad_accum: int = _help(
        "Micro-batches per optimizer step (exact: the loss is normalised over the whole step).", default=1
    )
    activation_checkpointing: bool = _help(
        "Recompute activations in the backward pass: less memory, about a third more compute.", default=False
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
    compile: bool = _help("torch.compile the model (compile time is reported apart from throughput).", default=False)
    precision: str = _help(
        f"Numeric precision: {'|'.join(PRECISIONS)}. auto picks bf16 where the device runs it fast.",
        default="auto",
    )
    pad_to_max_length: bool = _help(
        "Pad every batch to --max-length (fixed shapes: for compiled models and memory benchmarks).", default=False
    )
    # --- planning (issue #7)
    auto: bool = _help(
        "Let the planner choose precision, activation checkpointing, optimizer (adamw, adafactor or adamw8bit; "
        "--optimizer sgd is kept) and the micro-batch/accumulation split of the global batch (--batch-size x "
        "--grad-accum x processes, held fixed) to train fastest within --memory; out of memory then halves the "
        "micro-batch and redoes the step. The plan is written to plan.json and plan.md.",
        default=False,
    )
    memory: str | None = _help(
        "Memory budget per process for --auto and `leantrain plan`, e.g. 8GiB, 512MiB, 8GB. Default: the GPU's "
        "memory, or the memory available on this machine.",
        default=None,
    )
    # --- processes and machines
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
    num_workers: int | None = _help("Ray workers (with --launcher ray).", default=None)
    use_gpu: bool = _help("Ray workers use one GPU each (with --launcher ray).", default=False)
    shard: str = _help(
        f"Shard model, gradients and optimizer state across processes: {'|'.join(SHARDING)}.", default="none"
    )
    # --- checkpoints
    save_every: int | None = _help("Save a checkpoint every N optimizer steps.", default=None)
    save_total_limit: int | None = _help("Keep only the newest N checkpoints (the best is kept apart).", default=None)
    metric_for_best: str = _help(
        "Eval metric that picks the best checkpoint (higher is better; loss: lower).", default="accuracy"
    )
    resume: str | None = _help(
        "Resume from a checkpoint: 'auto' (newest complete in --output-dir) or a path.", default=None
    )
    on_nan: str = _help(
        f"On a non-finite loss or gradient norm: {'|'.join(ON_NAN)} (stop saves the last good state first).",
        default="stop",
    )
    trust_remote_code: bool = _help("Allow model code shipped with a checkpoint to run (off: safer).", default=False)
    # --- reliability (issue #19)
    save_on_interrupt: bool = _help(
        "On Ctrl-C or SIGTERM (a cluster's preemption), save a checkpoint at the next step boundary even without "
        "--save-every (with it, one is always saved), then stop with the command that resumes it.",
        default=False,
    )
    # --- evaluation, logging, output
    eval_every: int | None = _help("Evaluate every N optimizer steps (and always at the end).", default=None)
    log_every: int = _help("Log a row to metrics.jsonl every N optimizer steps.", default=10)
    seed: int = _help("Seed for data order, splits, head initialisation and dropout.", default=42)
    output_dir: str | None = _help("Where the run is written. Default: runs/<timestamp>.", default=None)
    overwrite: bool = _help("Replace a finished run in --output-dir (only once the new run succeeds).", default=False)
    cache_dir: str | None = _help(
        "Where tokenized data is cached. Default: $LEANTRAIN_CACHE or ~/.cache/leantrain.", default=None
    )
    progress: bool = _help("Show a progress bar.", default=True)
    log: str = _help(
        f"Per-step metrics go to metrics.jsonl, and with {'|'.join(LOGS[1:])} also to TensorBoard "
        "event files in OUTPUT_DIR/tensorboard/ (pip install 'leantrain[tensorboard]').",
        default="jsonl",
    )
    report: bool = _help("Write report.html (plots, config, environment) at the end of the run.", default=True)

    def __post_init__(self) -> None:
        _coerce_types(self)
        _check_finite(self)
        _check_media(self)
        _positive(self, "max_length", "batch_size", "log_every", "grad_accum")
        _positive(self, "limit", "max_steps", "eval_every", "local_sgd_steps", optional=True)
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
        if not (self.epochs > 0 and math.isfinite(self.epochs)):
            raise ConfigError(f"{_flag('epochs')} must be a positive number, got {self.epochs}")
        if not 0 < self.eval_fraction < 1:
            raise ConfigError(f"{_flag('eval_fraction')} must be between 0 and 1 (exclusive), got {self.eval_fraction}")
        if not 0 <= self.warmup_ratio < 1:
            raise ConfigError(f"{_flag('warmup_ratio')} must be in [0, 1), got {self.warmup_ratio}")
        if not self.lr > 0:
            raise ConfigError(f"{_flag('lr')} must be positive, got {self.lr}")
        for name in ("weight_decay", "max_grad_norm"):
            if getattr(self, name) < 0:
                raise ConfigError(f"{_flag(name)} must be >= 0, got {getattr(self, name)}")
        _choice(self, "scheduler", SCHEDULERS)
        _choice(self, "precision", PRECISIONS)
        _choice(self, "optimizer", OPTIMIZERS)
        _choice(self, "launcher", LAUNCHERS)
        _choice(self, "shard", SHARDING)
        _choice(self, "on_nan", ON_NAN)
        _choice(self, "log", LOGS)
        if self.memory is not None:
            from leantrain.planner.memory import parse_memory

            parse_memory(self.memory)  # a clear one-line error for '8 gigs'
        _positive(self, "num_machines")
        _positive(
            self, "num_processes", "num_workers", "save_every", "save_total_limit", "main_process_port", optional=True
        )
        if not 0 <= self.machine_rank < self.num_machines:
            raise ConfigError(f"--machine-rank must be in [0, --num-machines), got {self.machine_rank}")

    # -- construction ----------------------------------------------------------------------------

    @classmethod
    def from_dict(cls, values: dict[str, Any], source: str = "config") -> TrainConfig:
        """Build from a mapping, refusing unknown keys with a suggestion."""
        known = {f.name for f in fields(cls)}
        for key in values:
            if key not in known:
                hint = difflib.get_close_matches(key, sorted(known), n=1)
                fix = f"; did you mean '{hint[0]}'?" if hint else "; see `leantrain train --help`"
                raise ConfigError(f"{source}: unknown key '{key}'{fix}")
        return cls(**values)

    @classmethod
    def from_yaml(cls, path: str | Path, overrides: dict[str, Any] | None = None) -> TrainConfig:
        """Load a YAML file, then apply `overrides` (the flags given on the command line)."""
        path = Path(path)
        if not path.is_file():
            raise ConfigError(f"--config: no such file '{path}'")
        try:
            values = yaml.safe_load(path.read_text()) or {}
        except yaml.YAMLError as exc:
            raise ConfigError(f"{path}: not valid YAML ({_first_line(exc)})") from None
        if not isinstance(values, dict):
            raise ConfigError(f"{path}: expected a mapping of config keys, got {type(values).__name__}")
        values = {str(k).replace("-", "_"): v for k, v in values.items()}
        return cls.from_dict({**values, **(overrides or {})}, source=str(path))

    def replace(self, **changes: Any) -> TrainConfig:
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def field_help(cls: type = TrainConfig) -> dict[str, str]:
    return {f.name: f.metadata.get("help", "") for f in fields(cls)}


def field_base_type(f: dataclasses.Field) -> type:
    """The concrete type of a field, with `| None` stripped."""
    hint = typing.get_type_hints(TrainConfig)[f.name]
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        hint = args[0]
    return hint


def _flag(name: str) -> str:
    return f"--{name.replace('_', '-')}"


def _first_line(exc: Exception) -> str:
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__


def _coerce_types(cfg: TrainConfig) -> None:
    """Accept what YAML and Python callers naturally give (1 for 1.0, "1e-4" for 1e-4); refuse the rest."""
    for f in fields(cfg):
        value = getattr(cfg, f.name)
        if value is None:
            continue
        want = field_base_type(f)
        if want is bool:
            if not isinstance(value, bool):
                raise ConfigError(f"{_flag(f.name)} must be true or false, got {value!r}")
        elif want is int:
            if isinstance(value, bool) or not (
                isinstance(value, int) or (isinstance(value, float) and value.is_integer())
            ):
                raise ConfigError(f"{_flag(f.name)} must be an integer, got {value!r}")
            setattr(cfg, f.name, int(value))
        elif want is float:
            try:
                if isinstance(value, bool):
                    raise ValueError
                setattr(cfg, f.name, float(value))
            except (TypeError, ValueError):
                raise ConfigError(f"{_flag(f.name)} must be a number, got {value!r}") from None
        elif want is str:
            if not isinstance(value, (str, Path)):
                raise ConfigError(f"{_flag(f.name)} must be a string, got {value!r}")
            setattr(cfg, f.name, str(value))


def _positive(cfg: TrainConfig, *names: str, optional: bool = False) -> None:
    for name in names:
        value = getattr(cfg, name)
        if value is None and optional:
            continue
        if value is None or value <= 0:
            raise ConfigError(f"{_flag(name)} must be a positive integer, got {value}")


def _choice(cfg: TrainConfig, name: str, choices: tuple[str, ...]) -> None:
    value = getattr(cfg, name)
    if value not in choices:
        raise ConfigError(f"{_flag(name)} must be one of {', '.join(choices)}; got '{value}'")


def _check_media(cfg: TrainConfig) -> None:
    """The images-and-audio keys (issue #8): a known task, valid regular expressions, a positive length."""
    import re

    if cfg.task is not None:
        _choice(cfg, "task", TASKS)
    for name in ("label_pattern", "eval_pattern"):
        pattern = getattr(cfg, name)
        if pattern is not None:
            try:
                re.compile(pattern)
            except re.error as exc:
                raise ConfigError(f"{_flag(name)} '{pattern}' is not a regular expression ({exc})") from None
    if cfg.max_seconds is not None and not (cfg.max_seconds > 0 and math.isfinite(cfg.max_seconds)):
        raise ConfigError(f"{_flag('max_seconds')} must be a positive number, got {cfg.max_seconds}")


def _check_finite(cfg: TrainConfig) -> None:
    """Reliability (issue #19): NaN or infinity in a numeric setting (--lr inf, --weight-decay nan) would train a
    non-finite model while passing every range check (comparisons with NaN are false)."""
    for f in fields(cfg):
        value = getattr(cfg, f.name)
        if isinstance(value, float) and not math.isfinite(value):
            raise ConfigError(f"{_flag(f.name)} must be a finite number, got {value}")
