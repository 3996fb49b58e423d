"""`leantrain.train`: a config in, a trained and published run out."""

from __future__ import annotations

import contextlib
import traceback
from collections.abc import Callable
from typing import Any

import torch

from leantrain.config import TrainConfig, refuse_unswitched
from leantrain.errors import ConfigError, LeantrainError
from leantrain.tasks.base import Task
from leantrain.training.hooks import Hooks
from leantrain.training.trainer import Trainer, TrainResult


def _config(config: TrainConfig | dict | None, overrides: dict[str, Any]) -> TrainConfig:
    """The config `train` was given, with the keyword overrides applied; an unknown key is a ConfigError."""
    if config is None:
        config = TrainConfig()
    elif isinstance(config, dict):
        config = TrainConfig.from_dict(config)
    elif not isinstance(config, TrainConfig):
        got = type(config).__name__
        raise ConfigError(f"train(): config must be a TrainConfig, a dict of its fields or None; got a {got}")
    if overrides:  # read as a dict's keys are: an unknown one refused with a suggestion, not as a TypeError
        from dataclasses import fields

        from leantrain.config import hf_names

        known = {f.name for f in fields(TrainConfig)}
        task = overrides.get("task") or config.task
        config = config.replace(**hf_names.translate(overrides, "train()", known, task))
    return config


def train(
    config: TrainConfig | dict | None = None,
    *,
    task: type[Task] | str | None = None,
    hooks: Hooks | None = None,
    compute_metrics: Callable[[Any], dict[str, float]] | None = None,
    **overrides: Any,
) -> TrainResult:
    """Fine-tune a model as `config` says (a `TrainConfig`, a dict of its fields, or keyword overrides); returns
    the metrics and the paths written. `task` trains a workload of your own (a `leantrain.tasks.Task` subclass)
    instead of the one the config names or the model implies; a task's name (`task="dpo"`) sets the config's field.
    `hooks` instruments the run (tests);
    `compute_metrics`, as the HF Trainer takes it (an `EvalPrediction` of logits and labels in, a dict of numbers
    out), adds its scores to every evaluation, and `metric_for_best` may name them."""
    from leantrain.parallel import callers_random_states, cpu_only

    if isinstance(task, str):  # `task` is also TrainConfig's field: a name given here is that
        overrides["task"], task = task, None
    config = _config(config, overrides)
    refuse_unswitched(config)  # --lora-r without --lora would train the whole model
    # the run seeds Python's, NumPy's and torch's generators: the caller's draws go on after it as they would have
    with callers_random_states(), cpu_only(config.cpu):
        try:
            return _run(config, task, hooks, compute_metrics)
        except (LeantrainError, KeyboardInterrupt, torch.OutOfMemoryError) as exc:
            # a notebook keeps the last exception, and its traceback the run's frames (model, optimizer,
            # activations) until the next one: where the user retries rather than debugs, they are let go
            traceback.clear_frames(exc.__traceback__)
            raise


def _run(config: TrainConfig, task: type[Task] | None, hooks: Hooks | None, compute_metrics) -> TrainResult:
    from leantrain.job import assemble
    from leantrain.model import loading
    from leantrain.parallel import device_type
    from leantrain.run import directory
    from leantrain.telemetry.memory import freed_memory_kept, freed_memory_returned
    from leantrain.training import interrupt
    from leantrain.training.determinism import deterministic_compiled_kernels

    # --auto plans on the prepared data: a Ctrl-C there stops at once, as while the trainer prepares it
    with interrupt.phase("planning (--auto: preparing the data)" if config.auto else "starting the run"):
        job = assemble(config, task, plan=True)
    cfg, chosen = job.cfg, job.task
    if compute_metrics is not None:
        chosen.compute_metrics = compute_metrics
    # guarded: whatever ends the run, the output directory's lock is released, and what --overwrite set aside
    # is put back unless the run published
    # the heap, on CPU, for the run only: under a memory budget freed tensors go back to the kernel at once (the
    # budget is then predictable); otherwise they are kept for the next step (no page faults)
    heap: contextlib.AbstractContextManager = contextlib.nullcontext()
    if device_type() == "cpu":
        heap = freed_memory_returned() if cfg.auto else freed_memory_kept()
    # --compile on a CPU: inductor's kernels without atomic adds, so that a compiled run is bitwise repeatable
    exact = deterministic_compiled_kernels(bool(cfg.compile) and device_type() == "cpu")
    with directory.guarded(), loading.library_bars_off(), heap, exact:
        trainer = Trainer(
            cfg, chosen, job.model_path, job.model_config, plan=job.plan, hooks=hooks,
            share_output_dir=config.output_dir is None,
        )  # fmt: skip
        return trainer.fit()
