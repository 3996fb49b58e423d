"""TensorBoard event files beside metrics.jsonl (`--log tensorboard`; needs the optional `tensorboard` package).

The same rows the loop writes to metrics.jsonl go to `SummaryWriter.add_scalar`, grouped by tag:
train/ (loss, lr, grad_norm), eval/, throughput/ (samples, tokens, TFLOP/s, MFU), time/ (the step
time breakdown) and memory/. `TeeLog` writes one row to several logs, so the loop's `log.write(row)`
calls stay as they are.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from leantrain.errors import ConfigError

INSTALL_HINT = "pip install 'leantrain[tensorboard]' (or: pip install tensorboard)"


def tensorboard_available() -> bool:
    import importlib.util

    return importlib.util.find_spec("tensorboard") is not None


def check_tensorboard() -> None:
    """Fail before any work when --log tensorboard is asked for and tensorboard is not installed."""
    if not tensorboard_available():
        raise ConfigError(f"--log tensorboard needs the tensorboard package: {INSTALL_HINT}")


def tag_for(key: str) -> str:
    if key.startswith("eval_"):
        return "eval/" + key[len("eval_") :]
    if key.startswith("time_") and key.endswith("_seconds"):
        return "time/" + key[len("time_") : -len("_seconds")]
    if key in (
        "samples_per_second",
        "tokens_per_second",
        "model_tflops_per_second",
        "mfu",
        "mfu_useful",
        "model_tflops",
    ):
        return "throughput/" + key
    if "memory" in key or key.endswith("_bytes"):
        return "memory/" + key
    return "train/" + key


class TensorBoardLogger:
    """Scalars of each metrics row at its `step`; text for the config. Raises ConfigError without tensorboard."""

    def __init__(self, log_dir: str | Path, config: dict[str, Any] | None = None):
        check_tensorboard()
        from torch.utils.tensorboard import SummaryWriter

        self.log_dir = Path(log_dir)
        self._writer: SummaryWriter | None = SummaryWriter(log_dir=str(self.log_dir))
        if config:
            import yaml

            text = yaml.safe_dump(config, sort_keys=False)
            self._writer.add_text("config", "```\n" + text + "\n```", 0)

    def write(self, row: dict[str, Any]) -> None:
        if self._writer is None:
            return
        step = row.get("step")
        for key, value in row.items():
            if key in ("step", "micro_step") or isinstance(value, bool):
                continue
            if hasattr(value, "item"):
                value = value.item()
            if isinstance(value, (int, float)) and math.isfinite(value):
                self._writer.add_scalar(tag_for(key), value, step)
        self._writer.flush()

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None


class TeeLog:
    """Writes every row to each log given (MetricsLog, TensorBoardLogger, ...); None entries are skipped."""

    def __init__(self, *logs: Any):
        self.logs = [log for log in logs if log is not None]

    def write(self, row: dict[str, Any]) -> None:
        for log in self.logs:
            log.write(row)

    def close(self) -> None:
        for log in self.logs:
            log.close()
