"""Workloads, one module each, behind one interface (`tasks.base.Task`), known through one registry.

`register(MyTask)` makes a task known to `--task`, `leantrain evaluate`/`predict` and the planner; the built-ins
below are registered the same way, by path, so that reading the names imports none of them. `resolve(cfg,
model_config)` picks the task of a run: `--task` when given, else what the model's config does.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from leantrain.tasks.registry import TASKS, canonical, classes, implied, names, register, spellings, task_class

if TYPE_CHECKING:
    from leantrain.tasks.base import Task, TaskData

__all__ = [
    "TASKS",
    "Task",
    "TaskData",
    "canonical",
    "implied",
    "infer",
    "names",
    "register",
    "resolve",
    "spellings",
    "task_class",
]

register("leantrain.tasks.text_classification:TextClassification", name="text-classification")
register("leantrain.tasks.image_classification:ImageClassification", name="image-classification")
register("leantrain.tasks.audio_classification:AudioClassification", name="audio-classification")
register("leantrain.tasks.causal_lm:CausalLM", name="causal-lm", aliases=("text-generation", "sft"))
register("leantrain.tasks.token_classification:TokenClassification", name="token-classification", aliases=("ner",))
register(
    "leantrain.tasks.seq2seq:Seq2Seq",
    name="seq2seq",
    aliases=("text2text-generation", "summarization", "translation"),
    implies={"translation": {"metrics": "bleu,chrf"}},
)
register("leantrain.tasks.preference:DPO", name="dpo")
register("leantrain.tasks.kto:KTO", name="kto")
register("leantrain.tasks.reward_model:RewardModel", name="reward-model", aliases=("reward",))
register("leantrain.tasks.grpo:GRPO", name="grpo")

#: the task of a model whose config says nothing clearer
FALLBACK = "text-classification"
#: the tasks whose inputs are not text
MEDIA_TASKS = ("image-classification", "audio-classification")


def __getattr__(name: str) -> Any:
    # the interface, importable from the package as the docs show (`from leantrain.tasks import Task`), without
    # importing torch when only the registry is read
    if name in ("Task", "TaskData", "PredictionInputs"):
        from leantrain.tasks import base

        return getattr(base, name)
    raise AttributeError(f"module 'leantrain.tasks' has no attribute {name!r}")


def infer(model_config: Any, requested: str | None = None) -> str:
    """The task a model config does: `requested` (--task) when given, checked against what the model type can do;
    else the one registered task whose transformers table holds the model type, else the first of those whose
    architecture names match, else (for a model that cannot classify text) the one image or audio task among them,
    else text classification."""
    from transformers.models.auto import modeling_auto

    from leantrain.errors import ModelError

    kind = getattr(model_config, "model_type", None)
    able = [t.name for t in classes() if t.model_mapping and kind in getattr(modeling_auto, t.model_mapping, {})]
    if requested is not None:
        requested = canonical(requested)
        if able and requested not in able and TASKS[requested].load().model_mapping:
            raise ModelError(TASKS[requested].load().cannot_train(model_config, able))
        return requested
    if len(able) == 1:
        return able[0]
    for arch in getattr(model_config, "architectures", None) or []:
        for t in classes():
            # among the tasks the model type can do, where it names some (whisper's checkpoint is a
            # ...ForConditionalGeneration, yet no sequence-to-sequence model of leantrain's)
            if any(arch.endswith(suffix) for suffix in t.architectures) and (not able or t.name in able):
                return t.name
    # a model type that cannot classify text but can classify images or audio does that (whisper: audio, not its
    # decoder alone as a language model); perceiver, which can do both, stays text
    media = [name for name in able if name in MEDIA_TASKS]
    return media[0] if len(media) == 1 and FALLBACK not in able else FALLBACK


def resolve(cfg: Any, model_config: Any) -> Task:
    """The task `cfg` asks for (`--task`), checked against the model; else the one its config does."""
    return task_class(infer(model_config, cfg.task)).for_config(cfg)
