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
