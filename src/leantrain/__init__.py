"""leantrain: fine-tune Hugging Face transformer models efficiently, on whatever hardware exists.

import leantrain
result = leantrain.train(leantrain.TrainConfig(data="train.csv", epochs=2))
print(result.metrics["eval_accuracy"], result.model_dir)
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from leantrain._version import __version__
from leantrain.config import TrainConfig
from leantrain.errors import LeantrainError

__all__ = ["LeantrainError", "TrainConfig", "TrainResult", "__version__", "evaluate", "predict", "train"]

if TYPE_CHECKING:
    from leantrain.api import train
    from leantrain.inference import evaluate, predict
    from leantrain.training.trainer import TrainResult


def __getattr__(name: str) -> Any:
    # Lazy: importing torch and transformers takes seconds; `import leantrain` should not.
    if name == "train":
        from leantrain.api import train

        return train
    if name == "TrainResult":
        from leantrain.training.trainer import TrainResult

        return TrainResult
    if name in ("evaluate", "predict"):
        from leantrain import inference

        return getattr(inference, name)
    raise AttributeError(f"module 'leantrain' has no attribute {name!r}")
