"""The Python API as a notebook uses it: many calls in one long-lived process. A call takes its settings as the
config's fields, refuses bad ones with a `LeantrainError`, and leaves the process as it found it (random states,
logging, open files), whether it returns or raises."""

from __future__ import annotations

import contextlib
import gc
import os
import weakref
from pathlib import Path

import pytest

from leantrain import TrainConfig, train
from leantrain.errors import ConfigError, LeantrainError
from leantrain.training.hooks import Hooks
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


# -- a call that raises ----------------------------------------------------------------------------------------------


class StopAt(Hooks):
    """Raises `error` before optimizer step `step`, as a bug in a callback or a Ctrl-C would stop the run there."""

    def __init__(self, error: BaseException, step: int = 1):
        self.error, self.step = error, step

    def before_optimizer_step(self, step: int) -> None:
        if step == self.step:
            raise self.error


def open_files_under(folder: Path) -> list[str]:
    """The files this process holds open under `folder` (deleted ones too: a failed run's staging is removed)."""
    fds = Path("/proc/self/fd")
    if not fds.is_dir():
        pytest.skip("no /proc/self/fd to list open files (not Linux)")
    held = []
    for fd in fds.iterdir():
        with contextlib.suppress(OSError):  # the listing's own descriptor is gone by now
            target = os.readlink(fd)
            if target.startswith(str(folder)):
                held.append(target)
    return held


@pytest.mark.parametrize("error", [RuntimeError("a bug in a callback"), KeyboardInterrupt()])
def test_a_run_that_raises_leaves_no_file_open(job, tmp_path, error):
    with pytest.raises(type(error)) as raised:
        train(**job(max_steps=2), hooks=StopAt(error, step=2))
    # held as a notebook holds the last exception: its traceback keeps the run's frames alive
    assert raised.value is error
    assert open_files_under(tmp_path) == []


# -- the process as the call found it ------------------------------------------------------------------------------


def random_states() -> tuple:
    """Python's, NumPy's and torch's generators, comparable."""
    import random

    import numpy as np
    import torch

    legacy = np.random.get_state()
    return random.getstate(), (legacy[0], legacy[1].tolist(), *legacy[2:]), torch.get_rng_state().tolist()


def seed_as_a_notebook_does(seed: int) -> None:
    import random

    import numpy as np
    import torch

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


@pytest.mark.parametrize("fails", [False, True])
def test_a_run_leaves_the_callers_random_states_as_they_were(job, fails):
    seed_as_a_notebook_does(1234)
    before = random_states()
    with pytest.raises(RuntimeError) if fails else contextlib.nullcontext():
        train(**job(max_steps=2), hooks=StopAt(RuntimeError("stop"), step=2) if fails else None)
    assert random_states() == before


def test_generating_predictions_leave_the_callers_random_states_as_they_were(tmp_path):
    from leantrain import predict
    from tests.tasks.test_causal_lm import tiny_llama_job

    model, _ = tiny_llama_job(tmp_path)
    seed_as_a_notebook_does(99)
    before = random_states()
    rows = predict(str(model), texts=["the sun"], max_new_tokens=2, temperature=1.0)
    assert len(rows) == 1 and random_states() == before


def test_rouge_leaves_the_root_logger_without_a_handler(monkeypatch):
    import logging

    from leantrain.tasks.scoring import generation_scores

    monkeypatch.setattr(logging.root, "handlers", [])  # as a fresh process has it, before the program configures it
    assert generation_scores(("rouge1",), ["the cat sat"], ["the cat sat down"])["rouge1"] > 0
    assert logging.root.handlers == []  # the program's own logging.basicConfig(...) still takes effect


def test_predict_takes_one_text_as_a_string(tiny_model_dir):
    from leantrain import predict

    one = predict(str(tiny_model_dir), texts="a lovely film")
    assert [r["text"] for r in one] == ["a lovely film"]
    assert one == predict(str(tiny_model_dir), texts=["a lovely film"])


class Watch(StopAt):
    """StopAt that also keeps a weak reference to the model it trains."""

    model: weakref.ref | None = None

    def on_micro_batch(self, model, batch) -> None:
        self.model = weakref.ref(model)


@pytest.mark.parametrize("error", [KeyboardInterrupt(), LeantrainError("a problem the user fixes and retries")])
def test_an_exception_to_retry_after_holds_no_model_in_memory(job, error):
    hooks = Watch(error, step=2)
    with pytest.raises(type(error)) as raised:
        train(**job(max_steps=2), hooks=hooks)
    gc.collect()
    # the exception is still held, as a notebook holds the last one, but not the run's model through it
    assert raised.value is error and hooks.model is not None and hooks.model() is None


def test_a_bug_keeps_its_frames_for_the_debugger(job):
    hooks = Watch(RuntimeError("a bug"), step=2)
    with pytest.raises(RuntimeError):
        train(**job(max_steps=2), hooks=hooks)
    assert hooks.model is not None and hooks.model() is not None  # %debug finds the model in the frames
