"""The Python API as a notebook uses it: many calls in one long-lived process. A call takes its settings as the
config's fields, refuses bad ones with a `LeantrainError`, and leaves the process as it found it (random states,
logging, open files), whether it returns or raises."""

from __future__ import annotations

import pytest

from leantrain import TrainConfig, train
from leantrain.errors import ConfigError
from tests.conftest import EXACT_JOB


@pytest.fixture()
def job(tiny_model_dir, sentiment_csv, cache_dir, tmp_path):
    def make(name: str = "run", **changes) -> dict:
        base = dict(
            model=str(tiny_model_dir),
            data=str(sentiment_csv),
            cache_dir=str(cache_dir),
            output_dir=str(tmp_path / name),
            batch_size=16,
            max_steps=1,
            report=False,
            **EXACT_JOB,
        )
        return {**base, **changes}

    return make


# -- settings ------------------------------------------------------------------------------------------------------


def test_the_task_by_name_is_the_configs_field(job):
    result = train(**job(), task="text-classification")
    assert result.model_dir.is_dir()
    with pytest.raises(ConfigError, match="--task must be one of"):
        train(**job("bad"), task="no-such-task")


def test_an_unknown_keyword_is_refused_as_a_dicts_unknown_key(job):
    with pytest.raises(ConfigError, match="unknown key 'lora_rank'"):
        train(TrainConfig(**job()), lora_rank=4)
    with pytest.raises(ConfigError, match="a TrainConfig, a dict of its fields or None; got a str"):
        train("config.yaml")  # type: ignore[arg-type]
