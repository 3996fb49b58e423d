"""The suite keeps out of the real home folder: train and evaluate, with no --cache-dir, write to the session's cache.

tests/conftest.py points HOME and $LEANTRAIN_CACHE at temporary folders before anything is imported; without
that every `train()` would write ~/.cache/leantrain/peak.json and an `evaluate` without --cache-dir would
tokenize into ~/.cache/leantrain, in the home of whoever runs the tests.
"""

from __future__ import annotations

import os
import pwd
from pathlib import Path

from leantrain import TrainConfig, evaluate, train
from tests.conftest import SESSION_DIR


def test_train_and_evaluate_without_a_cache_dir_write_only_to_the_session_folders(
    tiny_model_dir, sentiment_csv, tmp_path
):
    real_home = Path(pwd.getpwuid(os.getuid()).pw_dir)
    assert Path.home() != real_home and Path.home().is_relative_to(SESSION_DIR)
    cache = Path(os.environ["LEANTRAIN_CACHE"])
    assert cache.is_relative_to(SESSION_DIR)
    result = train(
        TrainConfig(
            model=str(tiny_model_dir),
            data=str(sentiment_csv),
            output_dir=str(tmp_path / "run"),
            max_steps=1,
            progress=False,
            report=False,
            precision="fp32",
        )
    )
    assert evaluate(str(result.output_dir), str(sentiment_csv))["examples"] == 240
    assert (cache / "peak.json").is_file()  # the MFU denominator's probe
    assert [p for p in cache.iterdir() if p.is_dir()]  # the tokenized data
    assert not (Path.home() / ".cache" / "leantrain").exists()


def test_runs_started_in_the_same_second_without_an_output_dir_each_get_their_own(tmp_path, monkeypatch):
    import time

    from leantrain.paths import default_output_dir

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(time, "strftime", lambda fmt: "20261207-235901")
    first = default_output_dir()
    assert first == Path("runs/20261207-235901")
    first.mkdir(parents=True)  # a run of that second has it
    second = default_output_dir()
    second.mkdir()
    assert second == Path("runs/20261207-235901-2") and default_output_dir() == Path("runs/20261207-235901-3")
