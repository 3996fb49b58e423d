"""Hugging Face `TrainingArguments` names, and those TRL's configs add: ONE table, read by the CLI, the YAML loader
and the docs.

A Trainer user's habits carry over: `--learning_rate 2e-5` (or `--learning-rate`), `bf16: true` or
`eval_strategy: epoch` in a YAML file set the leantrain field they mean. A name given together with the leantrain
flag it stands for is refused in one line (which one should win?); a name leantrain has no equivalent for is
refused with the reason, unless its value says what leantrain does anyway. TRL's `loss_type` is read by its value
(no two trainers share one); the few names whose TRL default differs by trainer are checked against the run's task.
`docs/for-trainer-users.md` is generated from `ROWS` (scripts/gen_trainer_docs.py).
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
    #: where the name comes from, as messages name it
    source: str = "TrainingArguments"


_TRL, _DPO, _GRPO, _SFT, _REWARD = (
    f"TRL's {c}" for c in ("configs", "DPOConfig", "GRPOConfig", "SFTConfig", "RewardConfig")
)
_MODEL, _SCRIPT, _OLD_TRL = "TRL's ModelConfig", "TRL's ScriptArguments", "TRL before 1.0"
#: the Trainer's accelerator_config as `TrainingArguments().to_dict()` writes it (transformers 5.25)
_ACCELERATOR_DEFAULTS = {
    "split_batches": False,
    "dispatch_batches": None,
    "even_batches": True,
    "use_seedable_sampler": True,
    "non_blocking": False,
    "gradient_accumulation_kwargs": None,
}
#: peft's task types: the task sets the adapters' own
_PEFT_TASK_TYPES = ("CAUSAL_LM", "SEQ_CLS", "SEQ_2_SEQ_LM", "TOKEN_CLS", "QUESTION_ANS", "FEATURE_EXTRACTION", None)
#: GRPOConfig's settings that only vLLM reads, and their defaults
_VLLM_DEFAULTS = (
    ("vllm_mode", "colocate"),
    ("vllm_model_impl", "vllm"),
    ("vllm_enable_sleep_mode", False),
    ("vllm_structured_outputs_regex", None),
    ("vllm_server_base_url", None),
    ("vllm_server_host", "0.0.0.0"),
    ("vllm_server_port", 8000),
    ("vllm_server_timeout", 240.0),
    ("vllm_group_port", 51216),
    ("vllm_gpu_memory_utilization", 0.3),
    ("vllm_max_model_length", None),
    ("vllm_tensor_parallel_size", 1),
    ("vllm_importance_sampling_correction", True),
    ("vllm_importance_sampling_mode", "sequence_mask"),
    ("vllm_importance_sampling_clip_max", 3.0),
    ("vllm_importance_sampling_clip_min", None),
    ("vllm_importance_sampling_cap", None),
)
_SAPO_VESPO = (
    ("sapo_temperature_neg", 1.05),
    ("sapo_temperature_pos", 1.0),
    ("vespo_k_pos", 2.0),
    ("vespo_lambda_pos", 3.0),
    ("vespo_k_neg", 3.0),
    ("vespo_lambda_neg", 2.0),
)
#: adaptive entropy's settings (read only with use_adaptive_entropy), and their defaults
_ENTROPY_DEFAULTS = (
    ("use_adaptive_entropy", False),
    ("entropy_coef_min", 0.0),
    ("entropy_coef_max", 1.0),
    ("entropy_coef_delta", 0.005),
    ("entropy_target", 0.2),
)


def _lora_targets(value: Any) -> str:
    """peft's target_modules as --lora-targets writes them: all-linear is auto, a list comma-separated."""
    names = [str(name) for name in (value if isinstance(value, (list, tuple)) else str(value).split(","))]
    names = [name.strip() for name in names if name.strip()]
    return "auto" if names == ["all-linear"] else ",".join(names)


def _not_completion_only(value: Any) -> bool:
    return not to_bool("completion_only_loss", value)


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
        "leantrain reads only the columns it uses (--text-column, --label-column); grpo hands a row's others to "
        "reward functions (false, as TRL's GRPOConfig)",
        joint=True,
        agrees=(True,),
    ),
    Row("use_cpu", "cpu", "true: --cpu, the run on the CPU where a GPU is visible (Accelerate's switch)"),
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
        lambda v: (",".join(map(str, v)) or "none") if isinstance(v, (list, tuple)) else v,  # to_dict's [] is none
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
    Row("neftune_noise_alpha", "neftune_noise_alpha", "the same noise, drawn alike (text models; not DPO, KTO, GRPO)"),
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
        "Accelerate's own settings come from `accelerate config` or `accelerate launch` (the Trainer's defaults, as "
        "to_dict() writes them, are accepted)",
        agrees=(None, _ACCELERATOR_DEFAULTS, {**_ACCELERATOR_DEFAULTS, "use_configured_state": False}),
    ),
    Row(
        "parallelism_config",
        None,
        "data parallel (--num-processes, --num-machines) and FSDP (--shard fsdp); no tensor or context parallelism",
        agrees=(None,),
    ),
    Row("fsdp_config", None, "--shard fsdp wraps each transformer layer (FSDP2); nothing else to set", agrees=(None,)),
    Row("dataloader_drop_last", None, "every example trains: a short last step is its own size", agrees=(False,)),
    Row(
        "dataloader_pin_memory",
        None,
        "batches are pinned where there is a GPU (the Trainer's false on a CPU, true on a GPU: either)",
        agrees=(True, False),
    ),
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
    Row("debug", None, "no debug features; --on-nan stops at a non-finite loss or gradient", agrees=("", None, [])),
    Row(
        "skip_memory_metrics",
        None,
        "peak memory is always in metrics.json (torch's counters: nothing slows)",
        agrees=(True, False),
    ),
    # --- TRL's configs beyond TrainingArguments (DPOConfig, KTOConfig, RewardConfig, SFTConfig, GRPOConfig); the
    # names leantrain shares with them (beta, max_length, label_smoothing, temperature, ...) are its own fields
    Row(
        "precompute_ref_log_probs",
        "precompute_reference",
        "DPO, KTO: the reference's log-probabilities once",
        source=_TRL,
    ),
    Row("num_iterations", "iterations_per_generation", "GRPO: optimizer steps a generation is reused", source=_GRPO),
    Row("epsilon", "clip_epsilon", "GRPO: the policy ratio's lower clip", source=_GRPO),
    Row("epsilon_high", "clip_epsilon_high", "GRPO: the policy ratio's upper clip", source=_GRPO),
    Row("dataset_text_field", "text_column", "SFT: the column of plain text", source=_SFT),
    Row("chat_template_path", "chat_template", "SFT, reward: a Jinja template, or a file holding one", source=_TRL),
    Row(
        "completion_only_loss",
        "train_on_prompt",
        "SFT: true (or null) counts the completion's tokens only, leantrain's default; false the prompt's too",
        _not_completion_only,
        source=_SFT,
    ),
    Row(
        "loss_type",
        "preference_loss",
        "DPO: sigmoid, ipo, hinge or robust (a list [LOSS, sft] with loss_weights [1, W]: --sft-weight W); GRPO: "
        "dapo (the loss over the step's completion tokens); KTO: kto; SFT: nll",
        joint=True,
        source=_TRL,
    ),
    Row("loss_weights", "sft_weight", "DPO: see loss_type", joint=True, source=_DPO),
    Row(
        "disable_dropout",
        "dropout",
        "true: every dropout off (--dropout 0); false: the model's own, except in dpo, kto and reward-model, which "
        "always train with dropout off (as TRL's trainers for them do by default)",
        joint=True,
        source=_TRL,
    ),
    Row(
        "shuffle_dataset",
        None,
        "grpo shuffles its prompts (true); causal-lm packs documents in their order and shuffles the rows (false)",
        joint=True,
        source=_TRL,
    ),
    Row(
        "assistant_only_loss",
        None,
        "SFT: a messages column counts the assistant's tokens only (--train-on-prompt: every token)",
        agrees=(True,),
        source=_SFT,
    ),
    Row(
        "packing_strategy",
        None,
        "SFT: --packing lays documents in their order, plain text continuing into the next row, instruction "
        "documents whole (no best-fit reordering)",
        source=_SFT,
    ),
    Row(
        "eval_packing",
        None,
        "SFT: evaluation rows are packed as training's, instruction data one example a row (exact match per example)",
        agrees=(None,),
        source=_SFT,
    ),
    Row(
        "dataset_kwargs",
        None,
        "SFT: --data is read as --format and the column flags say",
        agrees=(None, {}),
        source=_SFT,
    ),
    Row(
        "model_init_kwargs",
        None,
        "the model loads in the run's --precision (and --attention)",
        agrees=(None, {}),
        source=_TRL,
    ),
    Row(
        "router_aux_loss_coef",
        None,
        "a mixture of experts' balancing loss keeps its config's weight",
        agrees=(None,),
        source=_TRL,
    ),
    Row("dataset_num_proc", None, "data is tokenized once, in one process, and cached", agrees=(None,), source=_TRL),
    Row(
        "truncation_mode",
        None,
        "a sequence over --max-length keeps its start, the prompt first",
        agrees=("keep_start",),
        source=_TRL,
    ),
    Row(
        "padding_free",
        None,
        "the loss of padded batches, which it only makes cheaper: batches here are length-grouped (little "
        "padding), and --packing lays rows without any (position ids restart at each document) with any attention",
        agrees=(False, True),
        source=_TRL,
    ),
    Row(
        "pad_to_multiple_of",
        None,
        "batches are padded to their longest row (with --compile, to a few lengths: --static-shapes)",
        agrees=("auto", None),
        source=_TRL,
    ),
    Row("pad_token", None, "the tokenizer's own", agrees=(None,), source=_TRL),
    Row("eos_token", None, "the tokenizer's own", agrees=(None,), source=_TRL),
    Row("activation_offloading", None, "--activation-checkpointing recomputes instead", agrees=(False,), source=_TRL),
    Row(
        "precompute_ref_batch_size",
        None,
        "DPO, KTO: the reference's log-probabilities are computed in batches of --eval-batch-size",
        agrees=(None,),
        source=_TRL,
    ),
    Row("sync_ref_model", None, "DPO, KTO, GRPO: the reference stays the initial model", agrees=(False,), source=_TRL),
    Row("ref_model_mixup_alpha", None, "see sync_ref_model", agrees=(0.6,), source=_TRL),
    Row("ref_model_sync_steps", None, "see sync_ref_model", agrees=(512,), source=_TRL),
    Row("ld_alpha", None, "DPO: no length-desensitized weighting (LD-DPO)", agrees=(None,), source=_DPO),
    Row("f_divergence_type", None, "DPO: the reverse KL of DPO's losses", agrees=("reverse_kl",), source=_DPO),
    Row("f_alpha_divergence_coef", None, "see f_divergence_type", agrees=(0.5,), source=_DPO),
    Row("use_weighting", None, "DPO: every pair weighs the same (no WPO weighting)", agrees=(False,), source=_DPO),
    Row(
        "discopop_tau", None, "DPO: read only by loss_type discopop, which leantrain lacks", agrees=(0.05,), source=_DPO
    ),
    Row("center_rewards_coefficient", None, "reward-model: no mean-zero penalty", agrees=(None, 0.0), source=_REWARD),
    Row("cast_lm_head_to_fp32", None, "GRPO: the head runs in the run's --precision", agrees=(False,), source=_GRPO),
    Row(
        "num_generations_eval",
        None,
        "GRPO: evaluation decodes one completion a prompt greedily and scores it",
        agrees=(None,),
        source=_GRPO,
    ),
    Row(
        "ds3_gather_for_generation", None, "GRPO: read only under DeepSpeed ZeRO-3", agrees=(True, False), source=_GRPO
    ),
    Row(
        "generation_batch_size",
        None,
        "GRPO: completions are sampled for each micro-batch's prompts, every optimizer step (--iterations-per-"
        "generation reuses them for more): what TRL's defaults work out to (per_device_train_batch_size x "
        "steps_per_generation x processes) is accepted",
        joint=True,
        agrees=(None,),
        source=_GRPO,
    ),
    Row(
        "steps_per_generation",
        None,
        "see generation_batch_size (gradient_accumulation_steps, TRL's default, is accepted)",
        joint=True,
        agrees=(None,),
        source=_GRPO,
    ),
    Row("top_k", None, "GRPO: no top-k filter (--top-p filters)", agrees=(0, None), source=_GRPO),
    Row("min_p", None, "see top_k", agrees=(None,), source=_GRPO),
    Row("repetition_penalty", None, "GRPO: no repetition penalty", agrees=(1.0,), source=_GRPO),
    Row(
        "generation_kwargs",
        None,
        "GRPO: sampling reads --temperature, --top-p and --max-completion-length",
        agrees=(None, {}),
        source=_GRPO,
    ),
    Row(
        "chat_template_kwargs",
        None,
        "GRPO: the chat template renders with its defaults",
        agrees=(None, {}),
        source=_GRPO,
    ),
    Row("cache_implementation", None, "GRPO: generation keeps the model's own KV cache", agrees=(None,), source=_GRPO),
    Row(
        "use_vllm",
        None,
        "GRPO: completions are sampled with transformers (batched, a KV cache), not vLLM",
        agrees=(False,),
        source=_GRPO,
    ),
    *(Row(name, None, "see use_vllm", agrees=(default, None), source=_GRPO) for name, default in _VLLM_DEFAULTS),
    Row("use_transformers_continuous_batching", None, "see use_vllm", agrees=(False,), source=_GRPO),
    Row("transformers_continuous_batching_config", None, "see use_vllm", agrees=(None,), source=_GRPO),
    Row("use_transformers_paged", None, "see use_vllm", agrees=(False,), source=_GRPO),
    Row("max_tool_calling_iterations", None, "GRPO: no tool calls while generating", agrees=(None,), source=_GRPO),
    Row("delta", None, "GRPO: no two-sided clip (INTELLECT-2's delta)", agrees=(None,), source=_GRPO),
    Row("off_policy_mask_threshold", None, "GRPO: no off-policy masking", agrees=(None,), source=_GRPO),
    *(
        Row(name, None, "GRPO: read only by loss_type sapo or vespo", agrees=(d,), source=_GRPO)
        for name, d in _SAPO_VESPO
    ),
    Row("importance_sampling_level", None, "GRPO: the policy ratio is per token", agrees=("token",), source=_GRPO),
    Row(
        "use_bias_correction_kl",
        None,
        "GRPO: the KL is weighted by the policy ratio (DeepSeek-V3.2's unbiased estimate)",
        agrees=(True,),
        source=_GRPO,
    ),
    Row("reward_weights", None, "GRPO: weigh each reward in --reward as NAME=WEIGHT", agrees=(None,), source=_GRPO),
    Row(
        "multi_objective_aggregation",
        None,
        "GRPO: the rewards' weighted sum is scaled into advantages",
        agrees=("sum_then_normalize",),
        source=_GRPO,
    ),
    Row(
        "scale_rewards",
        None,
        "GRPO: --advantage grpo divides by the group's standard deviation (+ 1e-4); rloo subtracts the others' mean, "
        "unscaled; no batch-wide scaling",
        agrees=("group", True),
        source=_GRPO,
    ),
    Row(
        "mask_truncated_completions",
        None,
        "GRPO: a completion cut at --max-completion-length still counts",
        agrees=(False,),
        source=_GRPO,
    ),
    Row("top_entropy_quantile", None, "GRPO: every completion token counts", agrees=(1.0,), source=_GRPO),
    Row("entropy_coef", None, "GRPO: no entropy bonus", agrees=(0.0,), source=_GRPO),
    *(Row(name, None, "see entropy_coef", agrees=(d,), source=_GRPO) for name, d in _ENTROPY_DEFAULTS),
    Row(
        "log_completions",
        None,
        "GRPO: each log row has the completions' lengths, clipped share and rewards, not their text",
        agrees=(False,),
        source=_GRPO,
    ),
    Row("log_multimodal", None, "see log_completions", agrees=(True, False), source=_GRPO),
    Row("num_completions_to_print", None, "see log_completions", agrees=(None,), source=_GRPO),
    Row("log_unique_prompts", None, "see log_completions", agrees=(False,), source=_GRPO),
    Row("log_completions_hub_repo", None, "see log_completions", agrees=(None,), source=_GRPO),
    # --- TRL's ModelConfig and ScriptArguments: what its scripts (`trl sft`, `trl dpo`, ...) take besides a config
    Row("model_name_or_path", "model", "a hub name or a local folder", source=_MODEL),
    Row("model_revision", None, "a hub model's main revision, or the folder as it is", agrees=("main",), source=_MODEL),
    Row(
        "dtype",
        None,
        "the weights load in fp32, the optimizer's master weights; --precision bf16 (or fp16) sets the compute (and "
        "what --lora or --freeze freezes is then kept in bf16)",
        agrees=("float32",),
        source=_MODEL,
    ),
    Row("attn_implementation", "attention", "eager, sdpa or flex_attention (auto: measured per device)", source=_MODEL),
    Row("use_peft", "lora", "LoRA adapters (with the task's head trained whole)", source=_MODEL),
    Row(
        "lora_target_modules",
        "lora_targets",
        "a list, or all-linear (--lora-targets auto: every Linear layer outside the head)",
        _lora_targets,
        source=_MODEL,
    ),
    Row(
        "lora_target_parameters", None, "adapters go on the layers --lora-targets names", agrees=(None,), source=_MODEL
    ),
    Row(
        "lora_modules_to_save", None, "the task's head trains whole beside the adapters", agrees=(None,), source=_MODEL
    ),
    Row("lora_task_type", None, "the task sets the adapters' type", agrees=_PEFT_TASK_TYPES, source=_MODEL),
    Row("use_rslora", None, "an adapter's update is scaled by lora_alpha / lora_r", agrees=(False,), source=_MODEL),
    Row("use_dora", None, "plain LoRA adapters (no DoRA)", agrees=(False,), source=_MODEL),
    Row("load_in_4bit", "quantize", "true: --quantize 4bit (NF4, QLoRA)", joint=True, source=_MODEL),
    Row("load_in_8bit", "quantize", "true: --quantize 8bit", joint=True, source=_MODEL),
    Row("bnb_4bit_quant_type", None, "--quantize 4bit is NF4", agrees=("nf4",), source=_MODEL),
    Row(
        "use_bnb_nested_quant",
        None,
        "--quantize 4bit quantizes the quantization constants too (bitsandbytes' default: true)",
        joint=True,
        agrees=(True,),
        source=_MODEL,
    ),
    Row("bnb_4bit_quant_storage", None, "bitsandbytes' own (uint8)", agrees=(None,), source=_MODEL),
    Row("dataset_name", "data", "a hub name, a `datasets` folder or a file", source=_SCRIPT),
    Row("dataset_config", "data_config", "the data set's configuration (subset)", source=_SCRIPT),
    Row(
        "dataset_train_split",
        "data_split",
        "train (or null) is leantrain's default; another name is --data-split",
        joint=True,
        source=_SCRIPT,
    ),
    Row(
        "dataset_test_split",
        "eval_split",
        "the evaluation rows: --eval-data DATASET --eval-split NAME (else --eval-fraction of the data is held out)",
        joint=True,
        source=_SCRIPT,
    ),
    Row("dataset_streaming", "streaming", "read the data as a stream", source=_SCRIPT),
    Row("ignore_bias_buffers", None, "DistributedDataParallel keeps its defaults", agrees=(False,), source=_SCRIPT),
    # --- TRL's names before 1.0, still in older recipes
    Row("max_seq_length", "max_length", "SFTConfig's name for max_length before TRL 0.20", source=_OLD_TRL),
    Row(
        "torch_dtype",
        None,
        "see dtype (ModelConfig's name for it before transformers 5)",
        agrees=("float32",),
        source=_OLD_TRL,
    ),
    Row(
        "max_prompt_length",
        None,
        "gone from TRL 1's configs: leantrain cuts prompt and completion together at --max-length, the prompt first "
        "(GRPO: prompts longer than --max-length less --max-completion-length are skipped and counted)",
        agrees=(None,),
        source=_OLD_TRL,
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
_CHECKED = ("greater_is_better", "logging_strategy", "shuffle_dataset")


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


def translate(
    values: dict[str, Any], source: str, known: Collection[str] | None = None, task: str | None = None
) -> dict[str, Any]:
    """`values` (keys as YAML keys or flag dests, '-' already '_') with every TrainingArguments (or TRL config)
    name replaced by the leantrain field it sets. One source at a time: an alias and its field in the same source is
    an error. Every name refused is refused in one message: those leantrain has no setting for and, given the `known`
    field names, those that are neither (else they stay, for the caller's "unknown key" message). `task`: the run's
    task where another source gives it (else `values`' own), for the TRL names whose agreement depends on it."""
    # `to_dict()` writes every *_token field as <NAME> whatever it held (a secret, or TRL's pad/eos token): not set
    values = {k: None if k.endswith("_token") and v == f"<{k.upper()}>" else v for k, v in values.items()}
    refused = []
    for key in values:
        row = BY_NAME.get(key)
        if key in RENAMED:
            refused.append(RENAMED[key])
        elif row is not None and row.field is None and not row.joint and not _agrees(row, values[key]):
            accepted = f" (accepted: {shown(row.agrees)})" if row.agrees else ""
            refused.append(f"{key} ({row.source}) has no leantrain setting: {_note(row)}{accepted}")
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
    run_task = _task(task if task is not None else values.get("task"))
    _trl_losses(values, out)
    _trl_by_task(values, out, run_task)
    _trl_script(values, out)
    _grpo_batches(values, out, run_task)
    if isinstance(out.values.get("scheduler_kwargs"), dict):  # a YAML mapping under leantrain's own name
        out.values["scheduler_kwargs"] = json.dumps(out.values["scheduler_kwargs"])
    return out.values


class _Settings:
    """Translated values, remembering which name set each, to name both when two set one field."""

    def __init__(self, source: str):
        self.source, self.values, self.origin = source, {}, {}  # type: ignore[var-annotated]

    def put(self, field: str, value: Any, given_as: str) -> None:
        if field in self.values and self.values[field] == value:
            return  # two names saying the same (TRL's label_smoothing beside TrainingArguments' 0.0): no question
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
    """bf16/fp16 as TrainingArguments has them: one true picks it; both false is full precision (fp32). bf16 null
    (TRL's default: bf16 unless fp16) without fp16 true leaves --precision auto to choose."""
    given = [k for k in ("bf16", "fp16") if values.get(k) is not None]
    if not given:
        return
    on = [k for k in given if to_bool(k, values[k])]
    if len(on) > 1:
        raise ConfigError(f"{out.source}: bf16 and fp16 are both true; choose one")
    if not on and "bf16" in values and values["bf16"] is None:
        return
    out.put("precision", on[0] if on else "fp32", on[0] if on else given[0])


#: TRL's loss_type values, by the trainer that reads them: the values say which (no two trainers share one)
_PREFERENCE_LOSSES = ("sigmoid", "ipo", "hinge", "robust")  # DPOTrainer's that --preference-loss computes alike
_LOSSES_AGREEING = ("dapo", "kto", "nll")  # GRPO's, KTO's and SFT's defaults: what leantrain computes


def _listed(name: str, value: Any) -> list[Any]:
    """A list as YAML gives it, or as a flag does: JSON or comma-separated."""
    if isinstance(value, (list, tuple)):
        return list(value)
    text = str(value).strip()
    if text.startswith("["):
        try:
            read = json.loads(text)
        except ValueError:
            raise ConfigError(f"{name}: cannot read {text!r} as a list") from None
        return list(read) if isinstance(read, list) else [read]
    return [part.strip() for part in text.split(",") if part.strip()]


def _trl_losses(values: dict[str, Any], out: _Settings) -> None:
    """TRL's loss_type (with DPO's loss_weights): a DPO loss leantrain computes alike sets --preference-loss (with
    "sft" beside it, --sft-weight); GRPO's dapo, KTO's kto and SFT's nll are what leantrain computes; the rest have
    no setting."""
    if values.get("loss_type") is None:
        if values.get("loss_weights") is not None:
            raise ConfigError(f"{out.source}: {out.show('loss_weights')} weighs the losses of loss_type; give both")
        return
    losses = [str(loss) for loss in _listed("loss_type", values["loss_type"])]
    if len(losses) == 1 and losses[0] in _LOSSES_AGREEING:
        if values.get("loss_weights") not in (None, [1], [1.0]):
            raise ConfigError(f"{out.source}: loss_weights weighs several DPO losses; {losses[0]} is one")
        return
    weights = [float(w) for w in _listed("loss_weights", values.get("loss_weights") or [1.0] * len(losses))]
    dpo = [loss for loss in losses if loss != "sft"]
    if (
        len(dpo) != 1
        or dpo[0] not in _PREFERENCE_LOSSES
        or len(weights) != len(losses)
        or weights[losses.index(dpo[0])] != 1
    ):
        raise ConfigError(
            f"{out.source}: {out.show('loss_type')} {values['loss_type']}"
            f"{' with loss_weights ' + str(values['loss_weights']) if values.get('loss_weights') is not None else ''}"
            f" has no leantrain setting: leantrain computes DPO's {', '.join(_PREFERENCE_LOSSES)} (weight 1, "
            "--preference-loss), each optionally with \"sft\" at any weight (--sft-weight), GRPO's dapo, KTO's kto "
            "and SFT's nll"
        )
    out.put("preference_loss", dpo[0], "loss_type")
    if "sft" in losses:
        out.put("sft_weight", weights[losses.index("sft")], "loss_weights" if "loss_weights" in values else "loss_type")


def _task(spelling: Any) -> str | None:
    """The task a spelling names; None where there is none yet (inferred later: never a TRL trainer's) or it is
    unknown (refused later, in its own words)."""
    if spelling is None:
        return None
    from leantrain.tasks import registry

    return next((e.name for e in registry.TASKS.values() if spelling in (e.name, *e.aliases)), None)


def _grpo_batches(values: dict[str, Any], out: _Settings, task: str | None) -> None:
    """TRL's GRPO counts completions where leantrain's --batch-size counts prompts: per_device_train_batch_size is
    the prompts' completions (num_generations each). Its generation settings agree where they are its defaults."""
    per_device = values.get("per_device_train_batch_size")
    if task == "grpo" and per_device is not None:
        group = int(values.get("num_generations") or 8)  # GRPOConfig's default group, and --num-generations'
        if int(per_device) % group:
            raise ConfigError(
                f"{out.source}: {out.show('per_device_train_batch_size')} {per_device} counts completions in TRL's "
                f"GRPO: a multiple of num_generations ({group}); leantrain's --batch-size counts prompts"
            )
        out.values["batch_size"] = int(per_device) // group
    steps = values.get("steps_per_generation")
    accumulation = int(values.get("gradient_accumulation_steps") or 1)
    if steps is not None and int(steps) != accumulation:
        raise ConfigError(
            f"{out.source}: {out.show('steps_per_generation')} {steps} has no leantrain setting: "
            f"{_note(BY_NAME['steps_per_generation'])}"
        )
    generation = values.get("generation_batch_size")
    step = int(per_device or 8) * int(steps or accumulation)  # TRL's per-device default: 8
    if generation is not None and int(generation) % step:
        raise ConfigError(
            f"{out.source}: {out.show('generation_batch_size')} {generation} has no leantrain setting: "
            f"{_note(BY_NAME['generation_batch_size'])}"
        )


def _trl_by_task(values: dict[str, Any], out: _Settings, task: str | None) -> None:
    """disable_dropout, shuffle_dataset and remove_unused_columns, whose defaults differ by trainer as leantrain's
    tasks do."""
    if values.get("disable_dropout") is not None:
        from leantrain.tasks import registry

        off = task is not None and registry.task_class(task).dropout_off
        if to_bool("disable_dropout", values["disable_dropout"]):
            out.put("dropout", 0.0, "disable_dropout")
        elif off:
            raise ConfigError(
                f"{out.source}: {out.show('disable_dropout')} false: {task} trains with every dropout off (as TRL's "
                "trainer for it does by default); leave disable_dropout out"
            )
    if values.get("remove_unused_columns") is not None:
        kept = not to_bool("remove_unused_columns", values["remove_unused_columns"])
        if kept and task != "grpo":
            raise ConfigError(
                f"{out.source}: {out.show('remove_unused_columns')} false has no leantrain setting: "
                f"{_note(BY_NAME['remove_unused_columns'])} (accepted: true)"
            )
    if values.get("shuffle_dataset") is not None:
        shuffled = to_bool("shuffle_dataset", values["shuffle_dataset"])
        if shuffled != (task == "grpo"):
            raise ConfigError(
                f"{out.source}: {out.show('shuffle_dataset')} {str(shuffled).lower()} has no leantrain setting: "
                f"{_note(BY_NAME['shuffle_dataset'])}"
            )


def _trl_script(values: dict[str, Any], out: _Settings) -> None:
    """TRL's ModelConfig quantization switches and ScriptArguments' splits, which set leantrain's only where they
    ask for something other than its default."""
    for bits in ("4bit", "8bit"):
        if values.get(f"load_in_{bits}") is not None and to_bool(f"load_in_{bits}", values[f"load_in_{bits}"]):
            out.put("quantize", bits, f"load_in_{bits}")
    nested = values.get("use_bnb_nested_quant")
    if nested is not None and not to_bool("use_bnb_nested_quant", nested) and out.values.get("quantize") == "4bit":
        raise ConfigError(
            f"{out.source}: {out.show('use_bnb_nested_quant')} false has no leantrain setting: "
            f"{_note(BY_NAME['use_bnb_nested_quant'])} (accepted: true)"
        )
    train_split = values.get("dataset_train_split")
    if train_split is not None and str(train_split) != "train":
        out.put("data_split", str(train_split), "dataset_train_split")
    if values.get("dataset_test_split") is not None:
        data = values.get("dataset_name", values.get("data"))
        if data is None:
            raise ConfigError(
                f"{out.source}: {out.show('dataset_test_split')} names a split of dataset_name; give dataset_name too "
                "(or --eval-data)"
            )
        out.put("eval_data", data, "dataset_test_split")
        out.put("eval_split", str(values["dataset_test_split"]), "dataset_test_split")


def hint(name: str, known: list[str]) -> str:
    """What to add to "unknown NAME": the closest name, TrainingArguments names first (`--save-step` ->
    `--save-steps`, never `--max-steps`), or the reason when it is a TrainingArguments field leantrain has no
    setting for. `known`: the names to fall back on, spelt as the user will type them (flags or keys)."""
    as_flag = name.startswith("-")
    key = name.lstrip("-").replace("-", "_")
    if key in BY_NAME and BY_NAME[key].field is None:
        return f": {key} ({BY_NAME[key].source}) has no leantrain setting: {_note(BY_NAME[key])}"
    near = difflib.get_close_matches(key, [r.hf for r in ROWS if r.field is not None], n=1, cutoff=0.8)
    if near:
        return f"; did you mean {flag(near[0]) if as_flag else repr(near[0])}?"
    # the names alike without their dashes and separators (`--frobnicate` is not `--strict` for sharing "--")
    spelt = {k.lstrip("-").replace("-", "_"): k for k in known}
    near = difflib.get_close_matches(key, list(spelt), n=1)
    if near:
        return f"; did you mean {spelt[near[0]] if as_flag else repr(spelt[near[0]])}?"
    return ""


#: joint names whose flag takes true or false
_BOOLEAN = (
    "bf16",
    "fp16",
    "greater_is_better",
    "group_by_length",
    "disable_dropout",
    "shuffle_dataset",
    "load_in_4bit",
    "load_in_8bit",
    "use_bnb_nested_quant",
)


def cli_kind(row: Row, field_kind: type | None) -> type:
    """The type a hidden alias flag parses its value as (bool: `--bf16` alone, or `--bf16 true`)."""
    if row.hf in ("loss_type", "loss_weights"):
        return str  # lists, read by `translate`
    if row.hf in _BOOLEAN or (row.agrees and all(isinstance(v, bool) for v in row.agrees)):
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
