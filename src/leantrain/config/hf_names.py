"""Hugging Face `TrainingArguments` names (and the few of TRL's configs that mean one setting in every task): ONE
table, read by the CLI, the YAML loader and the docs.

A Trainer user's habits carry over: `--learning_rate 2e-5` (or `--learning-rate`), `bf16: true` or
`eval_strategy: epoch` in a YAML file set the leantrain field they mean. A name given together with the leantrain
flag it stands for is refused in one line (which one should win?); a TrainingArguments name leantrain has no
equivalent for is refused with the reason. `docs/for-trainer-users.md` is generated from `ROWS`
(scripts/gen_trainer_docs.py).
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any

from leantrain.errors import ConfigError


def to_bool(hf: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("true", "1", "yes"):
        return True
    if text in ("false", "0", "no"):
        return False
    raise ConfigError(f"{hf} must be true or false, got {value!r}")


def optim_names() -> dict[str, str]:
    """HF optimizer names (`optim`) leantrain runs, and what it calls them: the optimizer registry's."""
    from leantrain.model.optimizers import OPTIMIZERS

    return {hf: name for name, e in OPTIMIZERS.items() for hf in e.hf_names}


def _optim(value: Any) -> str:
    name, known = str(value), optim_names()
    if name not in known:
        raise ConfigError(f"optim {name!r} has no leantrain optimizer; use one of {', '.join(known)} (or --optimizer)")
    return known[name]


def _resume(value: Any) -> str | None:
    """TrainingArguments' resume_from_checkpoint: a path, or True for the newest checkpoint in output_dir."""
    if isinstance(value, bool) or str(value).lower() in ("true", "false"):
        return "auto" if to_bool("resume_from_checkpoint", value) else None
    return str(value)


def _max_steps(value: Any) -> Any:
    return None if value in (-1, "-1") else value  # TrainingArguments' "not set"


def _new_tokens(value: Any) -> int:
    """Seq2SeqTrainingArguments' generation_max_length counts the decoder's start token: one less is generated."""
    try:
        length = int(value)
    except (TypeError, ValueError):
        length = 0
    if isinstance(value, bool) or length < 2 or str(length) != str(value).strip():
        raise ConfigError(
            f"generation_max_length must be an integer of 2 or more (the start token and one new token), got {value}"
        )
    return length - 1


def _kwargs_json(value: Any) -> Any:
    return json.dumps(value) if isinstance(value, dict) else value


@dataclass(frozen=True)
class Row:
    """One TrainingArguments field: the leantrain field it sets (None: no equivalent), how its value converts,
    and a note for the docs (or, without a field, the reason there is none)."""

    hf: str
    field: str | None
    note: str = ""
    convert: Callable[[Any], Any] | None = None
    #: joint rows (eval/save strategies, bf16/fp16) are resolved together by `translate`, not one by one
    joint: bool = False
    #: without a field: the values that agree with what leantrain does (accepted, nothing to set; the Trainer's
    #: default among them where it does), any other refused with the note; None: every value refused
    agrees: tuple[Any, ...] | None = None


ROWS: tuple[Row, ...] = (
    Row("learning_rate", "lr"),
    Row("num_train_epochs", "epochs"),
    Row("max_steps", "max_steps", "-1 (TrainingArguments' 'not set') is accepted", _max_steps),
    Row("per_device_train_batch_size", "batch_size"),
    Row("per_device_eval_batch_size", "eval_batch_size", "default: 2 x --batch-size (evaluation keeps no gradients)"),
    Row(
        "gradient_accumulation_steps",
        "grad_accum",
        "exact: the loss is normalised over the whole optimizer step, not averaged per micro-batch",
    ),
    Row("warmup_steps", "warmup_steps", "an integer number of steps, or a ratio below 1 (as transformers 5)"),
    Row("warmup_ratio", "warmup_ratio", "gone from transformers 5 (a float warmup_steps instead); leantrain keeps it"),
    Row("weight_decay", "weight_decay", "never applied to biases and norm weights, as the Trainer does"),
    Row("max_grad_norm", "max_grad_norm"),
    Row("lr_scheduler_type", "scheduler", "every get_scheduler schedule run per step; leantrain's constant warms up"),
    Row("lr_scheduler_kwargs", "scheduler_kwargs", "a mapping in YAML, JSON on the command line", _kwargs_json),
    Row(
        "optim",
        "optimizer",
        "adamw_torch(_fused), adafactor, adamw_bnb_8bit, sgd, schedule_free_adamw, schedule_free_sgd, lion_32bit, "
        "galore_adamw, apollo_adamw (and --optimizer muon, which the Trainer lacks)",
        _optim,
    ),
    Row(
        "optim_args",
        None,
        "use --projection-rank, --projection-update-interval, --projection-scale (GaLore, APOLLO) or --muon-lr, "
        "--muon-momentum (Muon)",
        agrees=(None, ""),
    ),
    Row(
        "optim_target_modules",
        None,
        "GaLore, APOLLO and Muon take every 2-D weight of the model's repeated blocks (printed at start); the "
        "embeddings and head step with AdamW",
        agrees=(None,),
    ),
    Row("seed", "seed", "also seeds the data order, splits and head initialisation"),
    Row("output_dir", "output_dir", "default: runs/<timestamp>"),
    Row("overwrite_output_dir", "overwrite", "replaces a finished run only once the new one succeeds"),
    Row("eval_strategy", "eval_every", "no | steps (every eval_steps) | epoch", joint=True),
    Row("eval_steps", "eval_every", "", joint=True),
    Row(
        "save_strategy",
        "save_every",
        "no | steps (every save_steps) | epoch; leantrain saves only when asked",
        joint=True,
    ),
    Row("save_steps", "save_every", "", joint=True),
    Row("logging_steps", "log_every"),
    Row(
        "save_total_limit",
        "save_total_limit",
        "the best checkpoint is kept apart: the newest N, plus the best when older (the Trainer counts it among its N)",
    ),
    Row("metric_for_best_model", "metric_for_best", "default: the task's (accuracy for classification)"),
    Row("load_best_model_at_end", "load_best_at_end", "each new best is checkpointed; model/ holds the best"),
    Row(
        "greater_is_better",
        None,
        "known per metric (loss and errors lower-is-better, the rest higher): accepted where it agrees with "
        "metric_for_best_model, refused where it does not; false without a metric means the loss, as the Trainer's",
        joint=True,
    ),
    Row("early_stopping_patience", "early_stopping_patience", "EarlyStoppingCallback's; the reason in metrics.json"),
    Row("early_stopping_threshold", "early_stopping_threshold", "EarlyStoppingCallback's"),
    Row(
        "resume_from_checkpoint",
        "resume",
        "true means the newest checkpoint (leantrain: auto); resume is exact",
        _resume,
    ),
    Row("gradient_checkpointing", "activation_checkpointing", "", lambda v: to_bool("gradient_checkpointing", v)),
    Row("bf16", "precision", "true: --precision bf16; default auto picks bf16 where it is fast", joint=True),
    Row("fp16", "precision", "true: --precision fp16 (loss scaling on CPU too)", joint=True),
    Row("torch_compile", "compile", "compile time is reported apart", lambda v: to_bool("torch_compile", v)),
    Row("dataloader_num_workers", "dataloader_num_workers", "batches stay identical to 0 workers"),
    Row("fsdp", None, "use --shard fsdp (FSDP2, one transformer layer per unit)", agrees=(None, "", False)),
    Row("deepspeed", None, "not supported: use --shard fsdp, or --auto to fit memory", agrees=(None,)),
    Row(
        "group_by_length",
        "batch_order",
        "true: --batch-order longest-first, its order (leantrain always groups by length: false has no setting)",
        lambda v: _length_grouped("group_by_length", "false", to_bool("group_by_length", v)),
    ),
    Row(
        "train_sampling_strategy",
        "batch_order",
        "transformers 5's name for group_by_length: group_by_length is --batch-order longest-first",
        lambda v: _length_grouped("train_sampling_strategy", v, v == "group_by_length"),
    ),
    Row(
        "auto_find_batch_size",
        None,
        "use --auto: the planner picks the split and halves it on out-of-memory",
        agrees=(False,),
    ),
    Row(
        "push_to_hub",
        None,
        "model/ is a save_pretrained folder with a model card: push it with `hf upload`",
        agrees=(False,),
    ),
    Row("hub_model_id", None, "see push_to_hub", agrees=(None,)),
    Row("hub_token", None, "see push_to_hub", agrees=(None,)),
    Row("hub_private_repo", None, "see push_to_hub", agrees=(None,)),
    Row("hub_strategy", None, "see push_to_hub", agrees=("every_save",)),
    Row("hub_always_push", None, "see push_to_hub", agrees=(False,)),
    Row("hub_revision", None, "see push_to_hub", agrees=(None,)),
    Row(
        "logging_dir",
        None,
        "metrics.jsonl lives in --output-dir, the trackers' files in OUTPUT_DIR/trackers",
        agrees=(None,),
    ),
    Row(
        "logging_strategy",
        None,
        "steps is what leantrain does (every --log-every steps: logging_steps); epoch and no have no equivalent",
        joint=True,
    ),
    Row(
        "eval_accumulation_steps",
        None,
        "not needed: evaluation moves its per-example rows off the device batch by batch",
        agrees=(None,),
    ),
    Row("evaluation_strategy", None, "the name before transformers 4.46: write eval_strategy"),
    Row("disable_tqdm", "progress", "true: --no-progress", lambda v: not to_bool("disable_tqdm", v)),
    Row(
        "adam_beta1",
        None,
        "AdamW keeps torch's defaults (betas 0.9, 0.999; eps 1e-8), as the Trainer's do",
        agrees=(0.9,),
    ),
    Row("adam_beta2", None, "see adam_beta1", agrees=(0.999,)),
    Row("adam_epsilon", None, "see adam_beta1", agrees=(1e-8,)),
    Row("label_names", None, "leantrain finds the label column (or --label-column)", agrees=(None,)),
    Row(
        "remove_unused_columns",
        None,
        "leantrain reads only the columns it uses (--text-column, --label-column)",
        agrees=(True,),
    ),
    Row(
        "use_cpu",
        None,
        "leantrain uses the GPU when there is one; CUDA_VISIBLE_DEVICES= hides it",
        agrees=(False,),
    ),
    Row("local_rank", None, "set by the launcher (--num-processes, accelerate launch, torchrun)", agrees=(-1,)),
    Row(
        "do_train",
        None,
        "read by scripts, not by the Trainer, nor by leantrain: `leantrain train` trains and evaluates",
        agrees=(True, False),
    ),
    Row("do_eval", None, "see do_train", agrees=(True, False)),
    Row("do_predict", None, "see do_train; `leantrain predict RUN --data FILE` predicts", agrees=(True, False)),
    Row("run_name", None, "the run is named by --output-dir", agrees=(None,)),
    Row(
        "report_to",
        "report_to",
        "tensorboard, wandb, mlflow (or all, none) through Accelerate's trackers; files under OUTPUT_DIR/trackers",
        lambda v: ",".join(map(str, v)) if isinstance(v, (list, tuple)) else v,
    ),
    Row("label_smoothing_factor", "label_smoothing", "exact under accumulation: smoothing is per example"),
    # --- Seq2SeqTrainingArguments
    Row(
        "predict_with_generate",
        None,
        "seq2seq: evaluation always generates (--metrics loss evaluates without)",
        agrees=(True,),
    ),
    Row(
        "generation_max_length",
        "generation_max_new_tokens",
        "seq2seq: the decoder's length with its start token, so generation_max_length - 1 new tokens",
        _new_tokens,
    ),
    Row("generation_num_beams", "generation_num_beams", "seq2seq: 1 (the default) is greedy decoding"),
    Row(
        "sortish_sampler",
        None,
        "seq2seq: batches are always grouped by source length (see group_by_length)",
        agrees=(True,),
    ),
    Row(
        "generation_config",
        None,
        "seq2seq: the model's own generation config is used, its length and beams set by --generation-max-new-tokens "
        "and --generation-num-beams",
        agrees=(None,),
    ),
    # --- TRL's configs: the names that mean one setting in every task (beta and loss_type do not: DPO's are
    # --beta and --preference-loss, GRPO's --kl-beta and its loss's normalisation)
    Row("precompute_ref_log_probs", "precompute_reference", "TRL's DPOConfig: the reference's log-probabilities once"),
    Row("num_iterations", "iterations_per_generation", "TRL's GRPOConfig: optimizer steps a generation is reused"),
    Row("epsilon", "clip_epsilon", "TRL's GRPOConfig: the policy ratio's lower clip"),
    Row("epsilon_high", "clip_epsilon_high", "TRL's GRPOConfig: the policy ratio's upper clip"),
    # --- the rest of TrainingArguments: what leantrain does, and the values that say the same
    Row(
        "average_tokens_across_devices",
        None,
        "the loss is always divided by the examples (or tokens) of the whole optimizer step, across processes",
        agrees=(True,),
    ),
    Row("bf16_full_eval", None, "evaluation runs in the run's --precision, as training does", agrees=(False,)),
    Row("fp16_full_eval", None, "see bf16_full_eval", agrees=(False,)),
    Row(
        "tf32",
        None,
        "fp32 matrix products stay full fp32 on a GPU, torch's default; --precision bf16 is the fast path",
        agrees=(None, False),
    ),
    Row("activation_checkpointing", "activation_checkpointing", "transformers 5's name for gradient_checkpointing"),
    Row(
        "activation_checkpointing_kwargs",
        None,
        "every layer is checkpointed, non-reentrant (use_reentrant false); every_n_layers has no setting",
        agrees=(None, {}, {"use_reentrant": False}),
    ),
    Row(
        "gradient_checkpointing_kwargs",
        None,
        "see activation_checkpointing_kwargs",
        agrees=(None, {}, {"use_reentrant": False}),
    ),
    Row(
        "torch_compile_backend",
        None,
        "--compile compiles with inductor, torch's default backend",
        agrees=(None, "inductor"),
    ),
    Row(
        "torch_compile_mode",
        None,
        "--compile picks the mode: reduce-overhead (CUDA graphs) on a GPU, torch's default on a CPU",
        agrees=(None,),
    ),
    Row(
        "use_liger_kernel",
        "kernels",
        "true: --kernels liger (Llama-family models on CUDA)",
        lambda v: "liger" if to_bool("use_liger_kernel", v) else "none",
    ),
    Row(
        "liger_kernel_config",
        None,
        "--kernels liger applies Liger's RMSNorm, RoPE and SwiGLU; its fused cross-entropy stays off (leantrain's "
        "losses run the head in chunks)",
        agrees=(None,),
    ),
    Row(
        "use_cache",
        None,
        "training runs without the key-value cache, which saves nothing there; generating evaluations use it",
        agrees=(False,),
    ),
    Row("neftune_noise_alpha", None, "NEFTune's noise on the embeddings is not implemented", agrees=(None,)),
    Row(
        "torch_empty_cache_steps",
        None,
        "the CUDA allocator keeps its cache; --auto halves the micro-batch on out-of-memory",
        agrees=(None,),
    ),
    Row(
        "logging_first_step",
        None,
        "metrics.jsonl rows come every --log-every optimizer steps and at the last",
        agrees=(False,),
    ),
    Row(
        "log_on_each_node",
        None,
        "leantrain's lines and logs come from the job's first process alone, on any number of machines",
        agrees=(True, False),
    ),
    Row(
        "logging_nan_inf_filter",
        None,
        "no non-finite loss reaches the log: --on-nan stops the run at it (saving the last good state) or skips the "
        "step",
        agrees=(True,),
    ),
    Row(
        "include_num_input_tokens_seen",
        None,
        "metrics.jsonl rows give tokens per second (padding left out); no running count of tokens",
        agrees=("no", False),
    ),
    Row(
        "log_level",
        None,
        "leantrain prints its own lines; transformers' verbosity is TRANSFORMERS_VERBOSITY=info|warning|error",
        agrees=("passive",),
    ),
    Row(
        "log_level_replica",
        None,
        "processes other than the first print only their errors",
        agrees=("warning", "passive"),
    ),
    Row(
        "project",
        None,
        "Trackio's project: Trackio is not among --report-to's trackers (tensorboard, wandb, mlflow; wandb's "
        "project is WANDB_PROJECT)",
        agrees=("huggingface",),
    ),
    Row("trackio_space_id", None, "see project", agrees=(None,)),
    Row("trackio_bucket_id", None, "see project", agrees=(None,)),
    Row("trackio_static_space_id", None, "see project", agrees=(None,)),
    Row("eval_delay", None, "the first evaluation comes at the first --eval-every step", agrees=(0,)),
    Row(
        "prediction_loss_only",
        None,
        "evaluations score the task's metrics and the loss; a seq2seq run's --metrics loss scores the loss alone",
        agrees=(False,),
    ),
    Row(
        "eval_on_start",
        None,
        "no evaluation before training: `leantrain evaluate MODEL --data FILE` scores a model as it is",
        agrees=(False,),
    ),
    Row(
        "eval_do_concat_batches",
        None,
        "evaluation keeps each example's row, batch after batch",
        agrees=(True,),
    ),
    Row(
        "eval_use_gather_object",
        None,
        "evaluation gathers each example's row once across processes, as tensors",
        agrees=(False,),
    ),
    Row(
        "include_for_metrics",
        None,
        "each task scores its own predictions and labels; there is no compute_metrics",
        agrees=(None, []),
    ),
    Row("batch_eval_metrics", None, "scores are computed once, over every example's row", agrees=(False,)),
    Row(
        "save_only_model",
        None,
        "checkpoints hold the optimizer, schedule and random states for an exact resume; model/ the weights alone",
        agrees=(False,),
    ),
    Row("save_on_each_node", None, "the job's first process writes every file", agrees=(False,)),
    Row(
        "enable_jit_checkpoint",
        "save_on_interrupt",
        "true: --save-on-interrupt (a checkpoint at the next step boundary on SIGTERM or Ctrl-C)",
        lambda v: to_bool("enable_jit_checkpoint", v),
    ),
    Row(
        "ignore_data_skip",
        None,
        "a resumed run takes up its data where it stopped without reading through it again: exact and at once",
        agrees=(False,),
    ),
    Row(
        "restore_callback_states_from_checkpoint",
        None,
        "leantrain has no callbacks: early stopping is a setting",
        agrees=(False,),
    ),
    Row(
        "full_determinism",
        None,
        "the same seed and settings give the same bits on a CPU by default; torch's deterministic algorithms for a "
        "GPU have no setting",
        agrees=(False,),
    ),
    Row("data_seed", None, "--seed also seeds the data order", agrees=(None,)),
    Row(
        "accelerator_config",
        None,
        "Accelerate's own settings come from `accelerate config` or `accelerate launch`",
        agrees=(None,),
    ),
    Row(
        "parallelism_config",
        None,
        "data parallel (--num-processes, --num-machines) and FSDP (--shard fsdp); no tensor or context parallelism",
        agrees=(None,),
    ),
    Row("fsdp_config", None, "--shard fsdp wraps each transformer layer (FSDP2); nothing else to set", agrees=(None,)),
    Row("dataloader_drop_last", None, "every example trains: a short last step is its own size", agrees=(False,)),
    Row("dataloader_pin_memory", None, "batches are pinned where there is a GPU", agrees=(True,)),
    Row(
        "dataloader_persistent_workers",
        None,
        "--dataloader-num-workers' processes run with torch's defaults",
        agrees=(False,),
    ),
    Row("dataloader_prefetch_factor", None, "see dataloader_persistent_workers", agrees=(None,)),
    Row("dataloader_multiprocessing_context", None, "see dataloader_persistent_workers", agrees=(None,)),
    Row("dataloader_in_order", None, "batches come in order, the same with workers as without", agrees=(True,)),
    Row("length_column_name", None, "each row's length is taken when it is tokenized", agrees=("length",)),
    Row(
        "ddp_find_unused_parameters",
        None,
        "DistributedDataParallel keeps its defaults (every parameter that trains gets a gradient)",
        agrees=(None, False),
    ),
    Row("ddp_bucket_cap_mb", None, "see ddp_find_unused_parameters", agrees=(None,)),
    Row("ddp_broadcast_buffers", None, "see ddp_find_unused_parameters", agrees=(None, True)),
    Row("ddp_static_graph", None, "see ddp_find_unused_parameters", agrees=(None, False)),
    Row("ddp_backend", None, "Accelerate picks NCCL on GPUs and gloo on CPUs", agrees=(None,)),
    Row(
        "ddp_timeout",
        "collective_timeout",
        "seconds, as --collective-timeout reads a bare number (the Trainer's 1800 is 30 minutes)",
        str,
    ),
    Row("debug", None, "no debug features; --on-nan stops at a non-finite loss or gradient", agrees=("", None)),
    Row(
        "skip_memory_metrics",
        None,
        "peak memory is always in metrics.json (torch's counters: nothing slows)",
        agrees=(True, False),
    ),
)

#: names leantrain used to have, and what replaced them
RENAMED = {
    "num_workers": "--num-workers is gone: --ray-workers N sets Ray Train workers (with --launcher ray), "
    "--dataloader-num-workers N data-loader worker processes",
}

BY_NAME = {r.hf: r for r in ROWS}
_SEE_HELP = "; see `leantrain train --help`"
#: the names that are aliases (different from the leantrain field they set), for the CLI's hidden flags
ALIASES = tuple(r.hf for r in ROWS if r.field is not None and r.field != r.hf)
#: accepted where they agree with what leantrain does (checked by `translate`), refused where they do not
_CHECKED = ("greater_is_better", "logging_strategy")


def _agrees(row: Row, value: Any) -> bool:
    """Whether `value` (from YAML, or a flag's text) is one of the values `row` accepts as what leantrain does; null
    always is (the Trainer's "not set")."""
    if value is None:
        return True
    for agreed in row.agrees or ():
        if agreed is None or isinstance(agreed, (list, dict)):
            read = value
            if isinstance(value, str) and value.strip().lower() in ("none", "null", "~", ""):
                read = None
            elif isinstance(value, str) and agreed is not None:
                try:
                    read = json.loads(value)
                except ValueError:
                    continue
            if read == agreed:
                return True
        elif isinstance(agreed, bool):
            try:
                if to_bool(row.hf, value) == agreed:
                    return True
            except ConfigError:
                continue
        elif isinstance(agreed, (int, float)):
            try:
                if not isinstance(value, bool) and float(value) == float(agreed):
                    return True
            except (TypeError, ValueError):
                continue
        elif str(value).strip().lower() == str(agreed).lower():
            return True
    return False


def _note(row: Row) -> str:
    """The row's note, with the note it points to where it says "see NAME" (the terminal has no table to look in)."""
    named = BY_NAME.get(row.note.removeprefix("see ").split(";")[0]) if row.note.startswith("see ") else None
    return row.note if named is None else f"{row.note} ({named.note})"


def shown(values: tuple[Any, ...]) -> str:
    """Agreeing values as a YAML file writes them: "true or false", "null", "[]"."""

    def one(value: Any) -> str:
        if value is None or isinstance(value, (bool, list, dict)):
            return json.dumps(value)
        return repr(value) if value == "" else str(value)

    return " or ".join(one(v) for v in values)


def _length_grouped(name: str, value: Any, grouped: bool) -> str:
    if not grouped:
        raise ConfigError(
            f"{name} {value}: leantrain always groups batches by length (--batch-order shuffled, or longest-first "
            "for the Trainer's group_by_length order); other samplers have no setting"
        )
    return "longest-first"


def flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def translate(values: dict[str, Any], source: str, known: Collection[str] | None = None) -> dict[str, Any]:
    """`values` (keys as YAML keys or flag dests, '-' already '_') with every TrainingArguments name replaced by
    the leantrain field it sets. One source at a time: an alias and its field in the same source is an error.
    Every name refused is refused in one message: those leantrain has no setting for and, given the `known` field
    names, those that are neither (else they stay, for the caller's "unknown key" message)."""
    refused = []
    for key in values:
        row = BY_NAME.get(key)
        if key in RENAMED:
            refused.append(RENAMED[key])
        elif row is not None and row.field is None and not row.joint and not _agrees(row, values[key]):
            accepted = f" (accepted: {shown(row.agrees)})" if row.agrees else ""
            refused.append(f"{key} (TrainingArguments) has no leantrain setting: {_note(row)}{accepted}")
        elif row is None and known is not None and key not in known:
            refused.append(f"unknown key '{key}'{hint(key, sorted(known)) or ''}")
    if refused:
        many = f"{len(refused)} names refused: " if len(refused) > 1 else ""
        raise ConfigError(f"{source}: {many}{'; '.join(refused)}" + ("" if known is None else _SEE_HELP))
    out = _Settings(source)
    for key, value in values.items():
        row = BY_NAME.get(key)
        if row is None:
            out.put(key, value, key)
        elif value is None:
            continue  # a TrainingArguments name left null: the Trainer's "not set", so leantrain's default
        elif not row.joint and row.field is not None:
            out.put(row.field, row.convert(value) if row.convert else value, key)
    _strategy(values, out, "eval", "eval_every")
    _strategy(values, out, "save", "save_every")
    _precision(values, out)
    _logging(values, out)
    _greater_is_better(values, out)
    if isinstance(out.values.get("scheduler_kwargs"), dict):  # a YAML mapping under leantrain's own name
        out.values["scheduler_kwargs"] = json.dumps(out.values["scheduler_kwargs"])
    return out.values


class _Settings:
    """Translated values, remembering which name set each, to name both when two set one field."""

    def __init__(self, source: str):
        self.source, self.values, self.origin = source, {}, {}  # type: ignore[var-annotated]

    def put(self, field: str, value: Any, given_as: str) -> None:
        if field in self.values:
            raise ConfigError(
                f"{self.source}: {self.show(self.origin[field])} and {self.show(given_as)} both set {field}; give one"
            )
        self.values[field], self.origin[field] = value, given_as

    def show(self, name: str) -> str:
        return flag(name) if self.source == "flags" else name


def _strategy(values: dict[str, Any], out: _Settings, what: str, field: str) -> None:
    """eval_strategy/eval_steps (save_*) together: 'no', 'steps' (every *_steps, else logging_steps, else 500, as
    TrainingArguments), or 'epoch'. *_steps alone means 'steps'."""
    strategy_key, steps_key = f"{what}_strategy", f"{what}_steps"
    if strategy_key not in values and steps_key not in values:
        return
    strategy = str(values.get(strategy_key, "steps")).lower()
    steps = values.get(steps_key)
    given = strategy_key if strategy_key in values else steps_key
    if strategy == "steps":
        out.put(field, steps if steps is not None else values.get("logging_steps", 500), given)
    elif strategy in ("no", "epoch"):
        if steps is not None:
            raise ConfigError(f"{out.source}: {out.show(steps_key)} needs {strategy_key} steps, not {strategy}")
        if strategy == "epoch" or field in out.values:  # 'no' is leantrain's default: only a clash is news
            out.put(field, "epoch" if strategy == "epoch" else None, given)
    elif strategy == "best" and what == "save":
        raise ConfigError(f"{out.source}: save_strategy best: use --load-best-at-end (it checkpoints every new best)")
    else:
        raise ConfigError(f"{out.source}: {out.show(strategy_key)} must be no, steps or epoch; got {strategy!r}")


def _logging(values: dict[str, Any], out: _Settings) -> None:
    """logging_strategy steps is what leantrain does; epoch and no are refused with the reason."""
    if "logging_strategy" not in values:
        return
    strategy = str(values["logging_strategy"]).lower()
    if strategy != "steps":
        raise ConfigError(
            f"{out.source}: {out.show('logging_strategy')} {strategy}: leantrain logs a metrics.jsonl row every "
            "--log-every optimizer steps (logging_strategy steps); give logging_steps (or --log-every) instead"
        )


def _greater_is_better(values: dict[str, Any], out: _Settings) -> None:
    """Accepted where it agrees with the direction leantrain knows for metric_for_best; false without a metric
    names the loss (the Trainer's own default pair)."""
    if values.get("greater_is_better") is None:  # not given, or null: the Trainer's "not set"
        return
    from leantrain.tasks.scoring import lower_is_better

    greater = to_bool("greater_is_better", values["greater_is_better"])
    metric = out.values.get("metric_for_best")
    if metric is None:
        if not greater:
            out.put("metric_for_best", "loss", "greater_is_better")
        return
    name = str(metric).removeprefix("eval_")
    if greater == lower_is_better(name):
        better = "lower" if lower_is_better(name) else "higher"
        raise ConfigError(
            f"{out.source}: {out.show('greater_is_better')} {str(greater).lower()} contradicts "
            f"{out.show(out.origin['metric_for_best'])} {metric}: for {name}, {better} is better (leantrain knows each "
            "metric's direction); drop greater_is_better"
        )


def _precision(values: dict[str, Any], out: _Settings) -> None:
    """bf16/fp16 as TrainingArguments has them: one true picks it; both false is full precision (fp32)."""
    given = [k for k in ("bf16", "fp16") if k in values]
    if not given:
        return
    on = [k for k in given if to_bool(k, values[k])]
    if len(on) > 1:
        raise ConfigError(f"{out.source}: bf16 and fp16 are both true; choose one")
    out.put("precision", on[0] if on else "fp32", on[0] if on else given[0])


def hint(name: str, known: list[str]) -> str:
    """What to add to "unknown NAME": the closest name, TrainingArguments names first (`--save-step` ->
    `--save-steps`, never `--max-steps`), or the reason when it is a TrainingArguments field leantrain has no
    setting for. `known`: the names to fall back on, spelt as the user will type them (flags or keys)."""
    as_flag = name.startswith("-")
    key = name.lstrip("-").replace("-", "_")
    if key in BY_NAME and BY_NAME[key].field is None:
        return f": {key} (TrainingArguments) has no leantrain setting: {_note(BY_NAME[key])}"
    near = difflib.get_close_matches(key, [r.hf for r in ROWS if r.field is not None], n=1, cutoff=0.8)
    if near:
        return f"; did you mean {flag(near[0]) if as_flag else repr(near[0])}?"
    # the names alike without their dashes and separators (`--frobnicate` is not `--strict` for sharing "--")
    spelt = {k.lstrip("-").replace("-", "_"): k for k in known}
    near = difflib.get_close_matches(key, list(spelt), n=1)
    if near:
        return f"; did you mean {spelt[near[0]] if as_flag else repr(spelt[near[0]])}?"
    return ""


def cli_kind(row: Row, field_kind: type | None) -> type:
    """The type a hidden alias flag parses its value as (bool: `--bf16` alone, or `--bf16 true`)."""
    if row.hf in ("bf16", "fp16", "greater_is_better", "group_by_length") or (
        row.agrees and all(isinstance(v, bool) for v in row.agrees)
    ):
        return bool
    if row.agrees:
        return str  # read by `translate`
    if row.hf.endswith("_strategy") or (row.convert is not None and field_kind is not bool):
        return str
    if row.hf.endswith("_steps") and row.joint:
        return int
    return field_kind or str


def cli_rows() -> tuple[Row, ...]:
    """The rows that get a flag of their own: aliases, and the names accepted where they agree with leantrain."""
    return tuple(r for r in ROWS if (r.field is not None and r.field != r.hf) or r.agrees or r.hf in _CHECKED)
