"""The Trainer's construction: what it opened is closed again when it fails part way."""

from __future__ import annotations

import pytest

from leantrain import TrainConfig, train
from leantrain.telemetry import metrics
from leantrain.training import trainer


class Planted(RuntimeError):
    pass


def fail(*args, **kwargs):
    raise Planted("planted")


@pytest.mark.parametrize("where", ["logger", "after the logger"])
def test_a_trainer_that_fails_after_opening_its_log_closes_it(
    tiny_model_dir, sentiment_csv, cache_dir, tmp_path, monkeypatch, where
):
    """A failure while building the metrics logger, or after it (the last announcement), leaves metrics.jsonl
    closed: the caller has no trainer whose fit() would close it."""
    opened: list[metrics.MetricsLog] = []
    real_init = metrics.MetricsLog.__init__

    def recording_init(self, path):
        real_init(self, path)
        opened.append(self)

    monkeypatch.setattr(metrics.MetricsLog, "__init__", recording_init)
    if where == "logger":
        monkeypatch.setattr(trainer, "MetricsLogger", fail)
    else:
        monkeypatch.setattr(trainer.Trainer, "_announce_training", fail)
    cfg = TrainConfig(
        model=str(tiny_model_dir), data=str(sentiment_csv), cache_dir=str(cache_dir),
        output_dir=str(tmp_path / "run"), max_steps=1, progress=False, report=False,
    )  # fmt: skip
    with pytest.raises(Planted):
        train(cfg)
    assert len(opened) == 1 and opened[0].path is not None
    assert opened[0]._file is None  # closed (MetricsLog.close drops the handle)


def test_a_log_that_cannot_open_starts_no_tracker(tiny_model_dir, sentiment_csv, cache_dir, tmp_path, monkeypatch):
    """metrics.jsonl is opened before `--report-to`'s trackers start: a failure to open it leaves none running."""
    from leantrain.parallel import trackers

    started: list[object] = []
    real_start = trackers.start_trackers
    monkeypatch.setattr(trackers, "start_trackers", lambda *a, **k: started.append(real_start(*a, **k)) or started[-1])
    monkeypatch.setattr(metrics.MetricsLog, "__init__", fail)
    cfg = TrainConfig(
        model=str(tiny_model_dir), data=str(sentiment_csv), cache_dir=str(cache_dir), report_to="tensorboard",
        output_dir=str(tmp_path / "run"), max_steps=1, progress=False, report=False,
    )  # fmt: skip
    with pytest.raises(Planted):
        train(cfg)
    assert started == []
