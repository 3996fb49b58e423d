"""The training loop and evaluation."""

from leantrain.training.loop import TrainResult, train

__all__ = ["TrainResult", "train"]
