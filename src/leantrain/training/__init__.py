"""The training loop and evaluation."""

from leantrain.train.loop import TrainResult, train

__all__ = ["TrainResult", "train"]
