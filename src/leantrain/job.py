"""One job, assembled once: the config resolved, the model found, its config read, the task chosen, `--auto`'s plan
made, the precision chosen. `leantrain.train`, `train --print-config`, `leantrain plan` and `evaluate`/`predict` all
start here, so what they print and what they run cannot drift apart."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, fields
from typing import Any

from leantrain.config import TrainConfig
from leantrain.errors import ConfigError, LeantrainError


@dataclass
class Job:
    """What a run (or an evaluation) is: everything decided before any data is read."""

    #: the config, resolved (defaults filled in; with --auto, the plan's choices)
    cfg: TrainConfig
    #: the model to build or load: a folder, a preset or a hub name
    model_path: str
    model_config: Any
    task: Any
    #: --auto's plan (None without --auto)
    plan: Any = None
    #: the precision that runs, and why
    precision: str = "fp32"
    precision_why: str = ""
    #: for inference: whether the model's own run recorded its config (a model leantrain trained)
    from_run: bool = False
    #: for inference: whether that run trained compiled (its evaluations kept the training attention kernel)
    compiled: bool = False


def assemble(
    config: TrainConfig, task: Any = None, *, plan: bool = False, inference: bool = False, given: Collection[str] = ()
) -> Job:
    """The job `config` describes. `task`: a `Task` subclass to run instead of the one the config names; `plan`:
    make --auto's plan (it prepares the data, so only `train` asks for it); `inference`: the config is a trained
    run's own, read back to score its model, but for the settings `given` to evaluate or predict itself."""
    from leantrain import parallel, tasks
    from leantrain.model import loading

    cfg = config.resolved()
    default_job = config.data is None and config.limit is None and config.task is None
    if default_job and not inference:  # the default job, as it is (predict --text on a model is no such job)
        from leantrain.data.sources import embedded_data_path

        embedded_data_path()  # without the demo extra: its one-line error, not a note before it
        _say_the_default_job(cfg)
    if not inference and (note := config.scheduler_note()):  # the optimizer chose the schedule: said
        _say(note)
    if cfg.log == "tensorboard" or cfg.report_to:  # a missing tracker package is refused before any work
        from leantrain.parallel.trackers import check_trackers, tracker_names

        check_trackers(tracker_names(cfg.report_to, cfg.log))
    model_path = loading.resolve_model(None if cfg.model == loading.EMBEDDED_MODEL else cfg.model)
    model_config = loading.load_config(model_path, trust_remote_code=cfg.trust_remote_code)

    def choose(cfg: TrainConfig) -> Any:
        return task(cfg) if task is not None else tasks.resolve(cfg, model_config)

    chosen = choose(cfg)
    if cfg.streaming and not chosen.streams:
        raise ConfigError(f"--streaming: the {chosen.name} task reads its data whole; drop --streaming")
    # a setting only another task reads would otherwise run as if it were not there; of a trained run's config
    # read back, only what evaluate or predict was given: the run recorded the rest, and is read as it ran
    from leantrain.config.sections import unread_message, unread_settings

    unread = {k: v for k, v in unread_settings(cfg, chosen.name).items() if not inference or k in given}
    if unread:
        raise ConfigError(unread_message(chosen.name, unread))
    if not inference:
        from leantrain.data.combine import refuse_unread_choices

        refuse_unread_choices(cfg, chosen.plain_folder)  # a split of a single file, say
        _refuse_two_source_lengths(cfg, chosen.name)
    made = None
    if plan and cfg.auto:  # the planner's recommendation sets precision, checkpointing, optimizer and the split
        from leantrain.planner.auto import plan_run
        from leantrain.run.directory import RunDir

        assert cfg.output_dir is not None  # resolved() filled it
        RunDir(cfg.output_dir, overwrite=cfg.overwrite, resume=cfg.resume).refuse_early()  # before the data is read
        # planned on the data as the run will see it (cached: the trainer reads it back rather than redo it)
        cfg, made = plan_run(cfg, chosen.prepare_data(model_path, model_config))
        chosen = choose(cfg)
    chosen.recorded, chosen.given = inference, frozenset(given)
    precision, why = parallel.choose_precision(cfg.precision)
    return Job(cfg, model_path, model_config, chosen, made, precision, why)


def _refuse_two_source_lengths(cfg: TrainConfig, task: str) -> None:
    """--max-length is a sequence-to-sequence run's source length only where --max-source-length is left out: given
    both, one of them would be ignored."""
    default = next(f.default for f in fields(TrainConfig) if f.name == "max_length")
    if task == "seq2seq" and cfg.max_source_length is not None and cfg.max_length != default:
        raise ConfigError(
            f"--max-length {cfg.max_length} and --max-source-length {cfg.max_source_length} both cut a "
            "sequence-to-sequence run's sources; give --max-source-length alone"
        )


def _say_the_default_job(cfg: TrainConfig) -> None:
    from leantrain.config.sections import DEFAULT_JOB_ACCURACY

    (fewest, lowest), (enough, reached) = DEFAULT_JOB_ACCURACY[0], DEFAULT_JOB_ACCURACY[-1]
    seconds = cfg.max_time_seconds
    size = (
        f"as many of {cfg.limit:,} rows of the embedded tweet corpus as this machine trains in {seconds:.0f} s "
        "(--max-time: sized from the pace of its own steps)"
        if seconds is not None
        else f"{cfg.limit:,} rows of the embedded tweet corpus"
    )
    _say(
        f"the default job: MiniLM on {size}; {enough:,} rows reach accuracy {reached:.2f}, {fewest:,} {lowest:.2f}; "
        "--limit N trains on N rows whatever the time"
    )


def _say(message: str) -> None:
    """A note for the user, from the first process only."""
    import os

    from leantrain.telemetry.console import Console

    if int(os.environ.get("RANK", "0")) == 0:
        Console().info(message)


def _compares_with_reference(saved: dict[str, Any]) -> bool:
    """Whether a run's task (as config.yaml records it) compares its model with a reference model."""
    from leantrain import tasks

    try:
        return bool(saved.get("task")) and tasks.task_class(str(saved["task"])).uses_reference
    except LeantrainError:
        return False


#: transformers' config.problem_type -> leantrain's --problem-type
HF_PROBLEM_TYPES = {"regression": "regression", "multi_label_classification": "multi-label"}
#: what `evaluate` and `predict` keep of the run's own config: how its model reads inputs and scores them
#: (the model and data sections, the metrics, the precision and attention kernel); the rest stays at defaults
_INFERENCE_SECTIONS = ("ModelConfig", "DataConfig")
_INFERENCE_FIELDS = (
    *("metrics", "precision", "attention", "pad_to_max_length", "seed", "eval_batch_size"),
    # a sequence-to-sequence run's generation settings, which its evaluation generates with
    *("generation_max_new_tokens", "generation_num_beams"),
    # a preference run's loss, which its evaluation scores held-out pairs with
    *("preference_loss", "beta", "simpo_gamma", "sft_weight", "label_smoothing"),
    *("desirable_weight", "undesirable_weight"),
)
#: what a trained model never runs again at inference, whatever its run did
_NOT_AT_INFERENCE = {"lora": False, "quantize": None, "save_adapter": False, "streaming": False, "limit": None}


def for_inference(
    run_or_model: str,
    overrides: dict[str, Any],
    *,
    cache_dir: str | None = None,
    precision: str | None = None,
    given: Collection[str] = (),
) -> Job:
    """The job of scoring or applying a trained model: the run's own config (config.yaml, or a checkpoint's
    manifest) as far as inference needs it, with `overrides` (the data to score and how to read it); a model
    leantrain did not train gets the defaults, in fp32 unless `precision` says otherwise. `given`: the keys of
    `overrides` the user gave, checked as train checks them (the rest is the run's, or what reads a new file)."""
    from leantrain.config import sections
    from leantrain.config.saved import read_run_values
    from leantrain.model import loading

    path = loading.resolve_model(run_or_model)
    saved = read_run_values(path)
    if saved is None:  # a model from elsewhere: its config says what its labels are (transformers' problem types)
        problem = getattr(loading.load_config(path), "problem_type", None) or ""
        saved = {"precision": "fp32", "problem_type": HF_PROBLEM_TYPES.get(problem, "single-label")}
        from_run = False
    else:
        from_run = True
    keep = {f.name for s in sections.SECTIONS if s.__name__ in _INFERENCE_SECTIONS for f in fields(s)}
    keep |= set(_INFERENCE_FIELDS)
    values = {k: v for k, v in saved.items() if k in keep}
    if from_run and _compares_with_reference({**saved, **overrides}):  # the model it was tuned from, not model/
        values["reference_model"] = saved.get("reference_model") or saved.get("model")
    if values.get("eval_data") is not None:  # a run that recorded --eval-pattern beside it (ignored) read the file
        values["eval_pattern"] = None
    values.update(_NOT_AT_INFERENCE, model=path, cache_dir=cache_dir, **overrides)
    if "max_length" in overrides and "max_source_length" not in overrides:
        # --max-length cuts a seq2seq run's sources as train reads it (--max-source-length's default): the length
        # the run recorded would otherwise win without a word
        values["max_source_length"] = None
    if precision is not None:
        values["precision"] = precision
    job = assemble(TrainConfig.from_dict(values, source=f"{path} (its run's config)"), inference=True, given=given)
    job.from_run = from_run
    job.compiled = bool(saved.get("compile"))
    return job
