"""How metrics rows reach the experiment trackers: their tags, and `TeeLog`, which writes one row to several logs.

The trackers themselves (TensorBoard, W&B, MLflow: `--report-to`, and `--log tensorboard`) run through
Accelerate (`parallel/trackers.py`, issue #17). Tags group the columns: train/ (loss, lr, grad_norm), eval/,
throughput/ (samples, tokens, TFLOP/s, MFU), time/ (the step time breakdown) and memory/. The loop's
`log.write(row)` calls stay as they are.
"""

from __future__ import annotations

from typing import Any


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
