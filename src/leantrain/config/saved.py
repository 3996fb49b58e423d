"""A run's config on disk: `config.yaml` beside `model/` (what ran, written when the run publishes) and the config in
a checkpoint's `checkpoint.json`. One writer and one reader, so `evaluate` and `predict` see the run as it ran."""

from __future__ import annotations

import json
from dataclasses import fields
from pathlib import Path
from typing import Any

#: the file a published run's config is in, beside model/
CONFIG_FILE = "config.yaml"


def write_run_config(run_dir: Path, values: dict[str, Any]) -> Path:
    """config.yaml in `run_dir`: the resolved values (`sections.resolved_values`)."""
    import yaml

    path = Path(run_dir) / CONFIG_FILE
    path.write_text(yaml.safe_dump(values, sort_keys=False))
    return path


def read_run_values(model_path: str | Path) -> dict[str, Any] | None:
    """The config a model was trained with, as recorded: a checkpoint folder's manifest, or the config.yaml of the
    run whose model/ this is; None for a model leantrain did not train. Keys that are no config field (a run of an
    older leantrain) are left out."""
    import yaml

    from leantrain.config.sections import TrainConfig

    path = Path(model_path)
    try:
        if (path / "checkpoint.json").is_file():
            saved = json.loads((path / "checkpoint.json").read_text())["config"]
        elif (path.parent / CONFIG_FILE).is_file() and (path.parent / "metrics.json").is_file():
            saved = yaml.safe_load((path.parent / CONFIG_FILE).read_text())
        else:
            return None
    except (OSError, ValueError, KeyError, TypeError, yaml.YAMLError):
        return None
    if not isinstance(saved, dict):
        return None
    known = {f.name for f in fields(TrainConfig)}
    return {k: v for k, v in saved.items() if k in known}
