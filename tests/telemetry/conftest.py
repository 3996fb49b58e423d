"""Two tiny finished runs (different learning rate and batch size), shared by the report and compare tests."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def tiny_runs(tiny_model_dir, sentiment_csv, tmp_path_factory):
    from leantrain import TrainConfig, train

    root = tmp_path_factory.mktemp("telemetry-runs")
    base = dict(
        model=str(tiny_model_dir),
        data=str(sentiment_csv),
        cache_dir=str(root / "cache"),
        epochs=1,
        progress=False,
        log_every=2,
        eval_every=4,
        precision="fp32",
        max_steps=8,
    )
    runs = []
    for name, changes in (("run-a", dict(lr=1e-3, batch_size=16)), ("run-b", dict(lr=3e-3, batch_size=8))):
        result = train(TrainConfig(**{**base, **changes, "output_dir": str(root / name)}))
        runs.append(result.output_dir)
    return runs
