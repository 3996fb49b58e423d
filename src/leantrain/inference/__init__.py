"""`leantrain evaluate` and `predict`: a trained run's model scored on, or applied to, new data."""

from leantrain.inference.api import evaluate, predict, write_predictions

__all__ = ["evaluate", "predict", "write_predictions"]
