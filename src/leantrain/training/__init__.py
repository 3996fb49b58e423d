"""The trainer and its components: evaluator, checkpointer, metrics logger, NaN and OOM guards, hooks."""

from leantrain.training.hooks import Hooks
from leantrain.training.trainer import Trainer, TrainResult

__all__ = ["Hooks", "TrainResult", "Trainer"]
