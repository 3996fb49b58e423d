"""--max-time: a run sized once, at the end of its warm-up, to what its own steps say fits in a time; the run it then
is equals the same run given that many steps, resumed or not."""

from __future__ import annotations

import pytest
import torch
import yaml
from safetensors.torch import load_file

from leantrain import TrainConfig, train
from leantrain.training.hooks import Hooks
from leantrain.training.metrics_logger import MetricsLogger
from leantrain.training.time_budget import TimeBudget
from tests.conftest import EXACT_JOB


class StepClock(Hooks):
    """The run's clock as a test sets it: `seconds` for each optimizer step (no sleeping, no machine's noise)."""

    def __init__(self, seconds: float):
        self.seconds, self.now = seconds, 0.0

    def before_optimizer_step(self, step: int) -> None:
        self.now = step * self.seconds  # read after the step: `step` steps' time


@pytest.fixture()
def run(tiny_model_dir, sentiment_csv, cache_dir, tmp_path, monkeypatch):
    """A tiny exact job of 81 optimizer steps (216 rows, batch 8, 3 epochs) on the clock given."""
    clock = StepClock(1.0)
    monkeypatch.setattr(MetricsLogger, "elapsed", lambda self: clock.now)

    def go(name: str, seconds_per_step: float = 1.0, **changes):
        clock.seconds, clock.now = seconds_per_step, 0.0
        base = dict(
            model=str(tiny_model_dir), data=str(sentiment_csv), cache_dir=str(cache_dir),
            output_dir=str(tmp_path / name), report=False, batch_size=8, epochs=3, **EXACT_JOB,
        )  # fmt: skip
        result = train(TrainConfig(**{**base, **changes}), hooks=clock)
        return result, load_file(result.model_dir / "model.safetensors")

    return go


def test_the_budget_sizes_the_run_from_the_speed_of_its_own_steps():
    budget = TimeBudget(100.0, planned=500, warmup=30, first_step=0)
    assert [s for s in range(40) if budget.reads_time(s)] == [3, 30]
    assert budget.after_step(3, 5.0) is None  # the first steps' own costs are left out of the timing
    assert budget.after_step(30, 5.0 + 27 * 0.5) == 30 + int((100 - 18.5) / 0.5)  # 0.5 s a step from here on
    said = budget.decision(30, 16)
    assert "0.500 s a step over steps 4-30" in said and "193 optimizer steps (3,088 examples)" in said, said
    assert "about 100 s of training" in said and "--max-steps 193 --warmup-steps 30 trains the same run" in said
    assert budget.after_step(31, 19.0) is None  # decided once
    fits = TimeBudget(100.0, planned=120, warmup=30, first_step=0)
    fits.after_step(3, 0.0)
    assert fits.after_step(30, 13.5) == 120 and "all 120 optimizer steps" in fits.decision(30, 16)
    late = TimeBudget(10.0, planned=500, warmup=30, first_step=0)
    late.after_step(3, 0.0)
    assert late.after_step(30, 27.0) == 30  # the time is spent: the run ends at the step that decided
    short = TimeBudget(100.0, planned=500, warmup=2, first_step=0)  # a warm-up too short to time: 10 steps past it
    assert [s for s in range(40) if short.reads_time(s)] == [3, 13]
    short.after_step(3, 0.0)
    short.after_step(13, 10.0)
    assert "--max-steps 103 --warmup-steps 2 repeats it to within that" in short.decision(13, 16)
    resumed = TimeBudget(100.0, planned=500, warmup=30, first_step=200)  # a resumed run times its own steps
    assert [s for s in range(300) if resumed.reads_time(s)] == [203, 213]


def test_a_sized_run_is_the_run_its_steps_and_warm_up_train(run, capsys):
    sized, w_sized = run("sized", max_time="40s", warmup_steps=15)
    said = capsys.readouterr().err
    assert sized.metrics["optimizer_steps"] == 40  # 15 s for the first 15 steps, then 1 s a step: 40 of the 81 planned
    assert "--max-steps 40 --warmup-steps 15 trains the same run" in said, said
    recorded = yaml.safe_load((sized.output_dir / "config.yaml").read_text())
    assert (recorded["max_steps"], recorded["warmup_steps"], recorded["max_time"]) == (40, 15, "40s")
    counted, w_counted = run("counted", max_steps=40, warmup_steps=15)
    assert counted.metrics["optimizer_steps"] == 40
    assert all(torch.equal(w_sized[k], w_counted[k]) for k in w_counted)  # bit for bit: the schedule decays over 40
    planned, w_planned = run("planned", max_steps=81, warmup_steps=15, seconds_per_step=0.1)  # fast: nothing cut
    assert planned.metrics["optimizer_steps"] == 81
    again, w_again = run("fits", max_time="40s", warmup_steps=15, seconds_per_step=0.1)
    assert again.metrics["optimizer_steps"] == 81 and all(torch.equal(w_again[k], w_planned[k]) for k in w_planned)


def test_a_sized_run_resumed_keeps_its_size_and_ends_as_the_run_left_alone(run):
    from leantrain.run import checkpoint

    whole, w_whole = run("whole", max_time="40s", warmup_steps=15, save_every=20)
    ckpt = whole.output_dir / "checkpoints" / "step-000020"
    assert checkpoint.verify(ckpt).progress.sized_steps == 40
    # ten times slower after the resume: were it sized again, it would stop at once
    resumed, w_resumed = run("resumed", 10.0, max_time="40s", warmup_steps=15, save_every=20, resume=str(ckpt))
    assert resumed.metrics["optimizer_steps"] == 40 and resumed.metrics["resumed_from"] == str(ckpt)
    assert all(torch.equal(w_whole[k], w_resumed[k]) for k in w_whole)
