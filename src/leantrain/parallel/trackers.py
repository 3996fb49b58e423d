"""Experiment trackers through Accelerate (`--report-to`): TensorBoard, Weights & Biases, MLflow and
whatever else Accelerate supports, started with `Accelerator(log_with=...)` and `init_trackers`, fed with
`accelerator.log` (the main process only: Accelerate's trackers live there).

Everything lands in OUTPUT_DIR/trackers/: TensorBoard's event files under leantrain/, MLflow's store as mlflow.db
(SQLite) or, with mlflow-skinny, the file store mlruns/ (unless MLFLOW_TRACKING_URI names a server), W&B's run
folder under wandb/ (WANDB_MODE=offline keeps it there). The rows are metrics.jsonl's, grouped by tag as
`tag_for` names them: train/ (loss, lr, grad_norm), eval/, throughput/ (samples, tokens, TFLOP/s, MFU), time/
(the step time breakdown) and memory/.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from leantrain.errors import ConfigError

#: the project (TensorBoard's folder, the W&B project, the MLflow experiment)
PROJECT = "leantrain"
INSTALL = {"tensorboard": "tensorboard", "wandb": "wandb", "mlflow": "mlflow-skinny (or mlflow)"}


def tracker_names(report_to: str | None, log: str = "jsonl") -> list[str]:
    """The trackers asked for: --report-to's names, and tensorboard for --log tensorboard (its old spelling)."""
    names = [n.strip().lower() for n in (report_to or "").split(",") if n.strip()]
    if log == "tensorboard":
        names.append("tensorboard")
    names = [n for n in dict.fromkeys(names) if n != "none"]
    return ["all"] if "all" in names else names


def check_trackers(names: list[str]) -> None:
    """Refuse, before any work, a tracker whose package is not installed (Accelerate would silently drop it)."""
    from accelerate.tracking import get_available_trackers

    available = {str(t) for t in get_available_trackers()}
    for name in names:
        if name != "all" and name not in available:
            what = INSTALL.get(name, name)
            raise ConfigError(f"--report-to {name} needs the {name} package: pip install {what}")


def _flat_config(config: dict[str, Any]) -> dict[str, Any]:
    """Hyperparameters as every tracker takes them: numbers, strings and booleans (None as 'None')."""
    return {k: v if isinstance(v, (bool, int, float, str)) else str(v) for k, v in config.items()}


def start_trackers(accelerator, directory: Path, config: dict[str, Any], run_name: str) -> TrackerLog:
    """Start the Accelerator's trackers writing under `directory`, with the run's config as hyperparameters."""
    directory.mkdir(parents=True, exist_ok=True)
    accelerator.project_configuration.project_dir = accelerator.project_configuration.logging_dir = str(directory)
    names = {str(t) for t in accelerator.log_with}
    undo = None
    if "mlflow" in names and "MLFLOW_TRACKING_URI" not in os.environ:
        undo = _local_mlflow_store(directory)
    init_kwargs = {"wandb": {"dir": str(directory), "name": run_name}, "mlflow": {"run_name": run_name}}
    try:
        accelerator.init_trackers(PROJECT, config=_flat_config(config), init_kwargs=init_kwargs)
    except Exception as exc:  # W&B without a login raises its UsageError: the user's to fix, in one line
        if undo is not None:
            undo()
        if not type(exc).__module__.startswith("wandb"):
            raise
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise ConfigError(
            f"--report-to wandb: {first} (run `wandb login` or set WANDB_API_KEY; WANDB_MODE=offline keeps the run "
            "in the run's trackers/wandb folder)"
        ) from None
    return TrackerLog(accelerator, undo)


def _local_mlflow_store(directory: Path) -> Callable[[], None]:
    """MLflow's store in the run's folder: SQLite where SQLAlchemy is installed (full mlflow), else the file store
    (mlflow-skinny), which MLflow 3 keeps working only when MLFLOW_ALLOW_FILE_STORE says so. Returns what puts
    MLflow's settings back once the run has ended."""
    import importlib.util

    import mlflow

    allowed = os.environ.get("MLFLOW_ALLOW_FILE_STORE")
    if importlib.util.find_spec("sqlalchemy") is not None:
        mlflow.set_tracking_uri(f"sqlite:///{(directory / 'mlflow.db').resolve()}")
    else:
        os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        mlflow.set_tracking_uri((directory / "mlruns").resolve().as_uri())

    def undo() -> None:
        # set_tracking_uri also set MLFLOW_TRACKING_URI: left, it would send the process's next run (and the
        # caller's own MLflow calls) to this run's staging folder, gone once the run publishes
        mlflow.set_tracking_uri(None)  # type: ignore[arg-type]  # None unsets it, the variable too
        if allowed is None:
            os.environ.pop("MLFLOW_ALLOW_FILE_STORE", None)

    return undo


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


class TrackerLog:
    """Writes metrics rows to the Accelerator's trackers (`accelerator.log`) at their `step`, finite numbers only,
    under grouped tags (train/, eval/, throughput/, time/, memory/); `close` finishes every tracker."""

    def __init__(self, accelerator, undo: Callable[[], None] | None = None):
        self.accelerator, self.undo = accelerator, undo

    def write(self, row: dict[str, Any]) -> None:
        values = {}
        for key, value in row.items():
            if key in ("step", "micro_step") or isinstance(value, bool):
                continue
            if hasattr(value, "item"):
                value = value.item()
            if isinstance(value, (int, float)) and math.isfinite(value):
                values[tag_for(key)] = value
        if values:
            self.accelerator.log(values, step=row.get("step"))

    def close(self) -> None:
        # each tracker's finish() (not accelerator.end_training(), which also ends the process group)
        for tracker in self.accelerator.trackers:
            tracker.finish()
        self.accelerator.trackers = []
        if self.undo is not None:  # the process's tracker settings as they were before the run
            self.undo()
            self.undo = None
