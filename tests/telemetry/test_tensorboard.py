"""--log tensorboard: rows become scalars under grouped tags; a clear error when tensorboard is not installed."""

from __future__ import annotations

import pytest

from leantrain.errors import ConfigError
from leantrain.telemetry import tensorboard_log
from leantrain.telemetry.tensorboard_log import TeeLog, TensorBoardLogger, tag_for, tensorboard_available


def test_tags_group_the_columns():
    assert tag_for("loss") == "train/loss"
    assert tag_for("lr") == "train/lr"
    assert tag_for("eval_accuracy") == "eval/accuracy"
    assert tag_for("mfu") == "throughput/mfu"
    assert tag_for("samples_per_second") == "throughput/samples_per_second"
    assert tag_for("time_forward_backward_seconds") == "time/forward_backward"
    assert tag_for("peak_memory_bytes") == "memory/peak_memory_bytes"


def test_without_tensorboard_the_user_is_told_what_to_install(tmp_path, monkeypatch):
    monkeypatch.setattr(tensorboard_log, "tensorboard_available", lambda: False)
    with pytest.raises(ConfigError, match="pip install"):
        TensorBoardLogger(tmp_path / "tb")


class Recorder:
    def __init__(self):
        self.rows, self.closed = [], False

    def write(self, row):
        self.rows.append(row)

    def close(self):
        self.closed = True


def test_tee_writes_each_row_to_every_log():
    a, b = Recorder(), Recorder()
    tee = TeeLog(a, None, b)
    tee.write({"step": 1, "loss": 0.5})
    tee.close()
    assert a.rows == b.rows == [{"step": 1, "loss": 0.5}] and a.closed and b.closed


@pytest.mark.skipif(not tensorboard_available(), reason="tensorboard is not installed (optional extra)")
def test_rows_land_in_event_files(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    log = TensorBoardLogger(tmp_path / "tb", config={"lr": 1e-3})
    log.write(
        {
            "step": 2,
            "micro_step": 2,
            "loss": 0.7,
            "lr": 1e-3,
            "mfu": 0.2,
            "grad_norm": float("nan"),
            "time_data_seconds": 0.1,
        }
    )
    log.write({"step": 4, "loss": 0.5, "lr": 9e-4, "mfu": 0.25})
    log.write({"step": 4, "eval_accuracy": 0.8})
    log.close()
    events = EventAccumulator(str(tmp_path / "tb"))
    events.Reload()
    tags = set(events.Tags()["scalars"])
    assert {"train/loss", "train/lr", "throughput/mfu", "time/data", "eval/accuracy"} <= tags
    assert "train/grad_norm" not in tags  # non-finite values are skipped
    assert [(e.step, round(e.value, 4)) for e in events.Scalars("train/loss")] == [(2, 0.7), (4, 0.5)]
