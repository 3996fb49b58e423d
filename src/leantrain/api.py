"""`leantrain.train`: a config in, a trained and published run out."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

from leantrain.config import TrainConfig
from leantrain.errors import ConfigError
from leantrain.tasks import Task, resolve
from leantrain.training.hooks import Hooks
from leantrain.training.trainer import Trainer, TrainResult


def train(
    config: TrainConfig | dict | None = None,
    *,
    task: type[Task] | None = None,
    hooks: Hooks | None = None,
    compute_metrics: Callable[[Any], dict[str, float]] | None = None,
    **overrides: Any,
) -> TrainResult:
    """Fine-tune a model as `config` says (a `TrainConfig`, a dict of its fields, or keyword overrides); returns
    the metrics and the paths written. `task` trains a workload of your own (a `leantrain.tasks.Task` subclass)
    instead of the one the config names or the model implies; `hooks` instruments the run (tests);
    `compute_metrics`, as the HF Trainer takes it (an `EvalPrediction` of logits and labels in, a dict of numbers
    out), adds its scores to every evaluation, and `metric_for_best` may name them."""
    from leantrain import models, run_dir
    from leantrain.parallel import device_type
    from leantrain.telemetry.memory import freed_memory_kept, freed_memory_returned

    if config is None:
        config = TrainConfig()
    elif isinstance(config, dict):
        config = TrainConfig.from_dict(config)
    if overrides:
        config = config.replace(**overrides)
    cfg = config.resolved()
    if cfg.log == "tensorboard" or cfg.report_to:  # a missing tracker package is refused before any work
        from leantrain.parallel.trackers import check_trackers, tracker_names

        check_trackers(tracker_names(cfg.report_to, cfg.log))
    model_path = models.resolve_model(None if cfg.model == models.EMBEDDED_MODEL else cfg.model)
    model_config = models.load_config(model_path, trust_remote_code=cfg.trust_remote_code)
    chosen = task(cfg) if task is not None else resolve(cfg, model_config)
    if cfg.streaming and not chosen.streams:
        raise ConfigError(f"--streaming: the {chosen.name} task reads its data whole; drop --streaming")
    plan = None
    if cfg.auto:  # --auto: the planner's recommendation sets precision, checkpointing, optimizer and the split
        from leantrain.planner.auto import plan_run

        assert cfg.output_dir is not None  # resolved() filled it
        run_dir.RunDir(cfg.output_dir, overwrite=cfg.overwrite).refuse_early()  # before the data is prepared
        # planned on the data as the run will see it (cached: the trainer reads it back rather than redo it)
        from leantrain.training import interrupt

        with interrupt.phase("planning (--auto: preparing the data)"):
            cfg, plan = plan_run(cfg, chosen.prepare_data(model_path, model_config))
        chosen = task(cfg) if task is not None else resolve(cfg, model_config)
    if compute_metrics is not None:  # issue #17
        chosen.compute_metrics = compute_metrics
    # guarded: whatever ends the run, the output directory's lock is released, and what --overwrite set aside
    # is put back unless the run published
    # the heap, on CPU, for the run only: under a memory budget freed tensors go back to the kernel at once (the
    # budget is then predictable); otherwise they are kept for the next step (no page faults)
    heap: contextlib.AbstractContextManager = contextlib.nullcontext()
    if device_type() == "cpu":
        heap = freed_memory_returned() if cfg.auto else freed_memory_kept()
    with run_dir.guarded(), models.library_bars_off(), heap:
        trainer = Trainer(
            cfg, chosen, model_path, model_config, plan=plan, hooks=hooks, share_output_dir=config.output_dir is None
        )
        return trainer.fit()
