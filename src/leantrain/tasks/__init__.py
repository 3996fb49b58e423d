"""Workloads, one module each, behind one interface (`tasks.base.Task`).

`resolve(cfg, model_config)` picks the task: `--task` when given, else what the model's config does. A task
defined elsewhere (a user's own, or a test's) is a `Task` subclass passed to `leantrain.train(task=...)`.
"""

from __future__ import annotations

from typing import Any

from leantrain.tasks.audio_classification import AudioClassification
from leantrain.tasks.base import Task, TaskData
from leantrain.tasks.causal_lm import CausalLM
from leantrain.tasks.image_classification import ImageClassification
from leantrain.tasks.text_classification import TextClassification

__all__ = ["BUILTIN", "Task", "TaskData", "resolve"]

#: `--task` name -> task
BUILTIN: dict[str, type[Task]] = {
    t.name: t for t in (TextClassification, ImageClassification, AudioClassification, CausalLM)
}


def resolve(cfg: Any, model_config: Any) -> Task:
    """The task `cfg` asks for (`--task`), checked against the model; else the one its config does."""
    from leantrain.model import loading

    name = loading.infer_task(model_config, cfg.task)
    problem = getattr(cfg, "problem_type", "single-label")
    if problem != "single-label":  # regression and multi-label text tasks
        from leantrain.errors import ConfigError
        from leantrain.tasks.text_problems import TEXT_PROBLEMS

        if name != "text-classification":
            raise ConfigError(f"--problem-type {problem} is for text models; {cfg.model or 'the model'} is {name}")
        return TEXT_PROBLEMS[problem](cfg)
    return BUILTIN[name](cfg)
