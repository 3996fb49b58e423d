"""`leantrain.train`: a config in, a trained and published run out."""

from __future__ import annotations

import contextlib
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
    **overrides: Any,
) -> TrainResult:
    """Fine-tune a model as `config` says (a `TrainConfig`, a dict of its fields, or keyword overrides); returns
    the metrics and the paths written. `task` trains a workload of your own (a `leantrain.tasks.Task` subclass)
    instead of the one the config names or the model implies; `hooks` instruments the run (tests)."""
    from leantrain import models, run_dir
    from leantrain.parallel import device_type
    from leantrain.telemetry.memory import freed_memory_returned

    if config is None:
        config = TrainConfig()
    elif isinstance(config, dict):
        config = TrainConfig.from_dict(config)
    if overrides:
        config = config.replace(**overrides)
    cfg = config.resolved()
    plan = None
    if cfg.auto:  # --auto: the planner's recommendation sets precision, checkpointing, optimizer and the split
        from leantrain.planner.auto import plan_run

        cfg, plan = plan_run(cfg)
    if cfg.log == "tensorboard":
        from leantrain.telemetry.tensorboard_log import check_tensorboard

        check_tensorboard()
    model_path = models.resolve_model(None if cfg.model == models.EMBEDDED_MODEL else cfg.model)
    model_config = models.load_config(model_path, trust_remote_code=cfg.trust_remote_code)
    chosen = task(cfg) if task is not None else resolve(cfg, model_config)
    if cfg.streaming and not chosen.streams:
        raise ConfigError(f"--streaming: the {chosen.name} task reads its data whole; drop --streaming")
    # guarded: whatever ends the run, the output directory's lock is released, and what --overwrite set aside
    # is put back unless the run published
    # under a memory budget on CPU, freed tensors go back to the kernel at once (for the run only)
    budget = freed_memory_returned() if cfg.auto and device_type() == "cpu" else contextlib.nullcontext()
    with run_dir.guarded(), models.library_bars_off(), budget:
        trainer = Trainer(
            cfg, chosen, model_path, model_config, plan=plan, hooks=hooks, share_output_dir=config.output_dir is None
        )
        return trainer.fit()
