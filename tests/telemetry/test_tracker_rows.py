"""Tracker rows: scalars under grouped tags, one row to every log (the trackers: tests/telemetry/test_trackers.py)."""

from __future__ import annotations

from leantrain.parallel.trackers import tag_for
from leantrain.telemetry import TeeLog


def test_tags_group_the_columns():
    assert tag_for("loss") == "train/loss"
    assert tag_for("lr") == "train/lr"
    assert tag_for("eval_accuracy") == "eval/accuracy"
    assert tag_for("mfu") == "throughput/mfu"
    assert tag_for("samples_per_second") == "throughput/samples_per_second"
    assert tag_for("time_forward_backward_seconds") == "time/forward_backward"
    assert tag_for("peak_memory_bytes") == "memory/peak_memory_bytes"


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
