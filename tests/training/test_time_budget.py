"""--max-time: a run sized once, at the end of its warm-up, to what its own steps say fits in a time; the run it then
is equals the same run given that many steps, resumed or not."""

from __future__ import annotations

import json
import math

import pytest
import torch
import yaml
from safetensors.torch import load_file

from leantrain import TrainConfig, train
from leantrain.training.hooks import Hooks
from leantrain.training.metrics_logger import MetricsLogger
from leantrain.training.time_budget import READ_AGAIN_AT, TimeBudget
from tests.conftest import EXACT_JOB


class StepClock(Hooks):
    """The run's clock as a test sets it: `seconds(step)` after each optimizer step (no sleeping, no machine's
    noise); a resumed run reads the same time at the same step, as its restored clock would."""

    def __init__(self):
        self.seconds, self.now = (lambda step: float(step)), 0.0

    def before_optimizer_step(self, step: int) -> None:
        self.now = self.seconds(step)  # read after the step


def paced(first: float, then: float = 0.0, after: int = 10**9):
    """`first` seconds a step, `then` seconds a step after step `after`."""
    return lambda step: first * min(step, after) + then * max(0, step - after)


@pytest.fixture()
def run(tiny_model_dir, sentiment_csv, cache_dir, tmp_path, monkeypatch):
    """A tiny exact job of 81 optimizer steps (216 rows, batch 8, 3 epochs) on the clock given."""
    clock = StepClock()
    monkeypatch.setattr(MetricsLogger, "elapsed", lambda self: clock.now)

    def go(name: str, seconds=None, **changes):
        clock.seconds, clock.now = seconds or paced(1.0), 0.0
        base = dict(
            model=str(tiny_model_dir), data=str(sentiment_csv), cache_dir=str(cache_dir),
            output_dir=str(tmp_path / name), report=False, batch_size=8, epochs=3, **EXACT_JOB,
        )  # fmt: skip
        result = train(TrainConfig(**{**base, **changes}), hooks=clock)
        return result, load_file(result.model_dir / "model.safetensors")

    return go


def read(budget: TimeBudget, step: int, elapsed: float) -> int | None:
    """One reading, as the trainer takes it on one process."""
    assert budget.due(step), (step, budget.read_at)
    return budget.apply(step, elapsed, budget.propose(step, elapsed))


def test_the_budget_sizes_the_run_at_the_warm_ups_end_from_the_pace_of_its_own_steps():
    budget = TimeBudget(100.0, planned=500, warmup=30, first_step=0)
    assert [s for s in range(40) if budget.due(s)] == [3, 30]
    assert read(budget, 3, 5.0) is None  # the first steps' own costs are left out of the timing
    assert read(budget, 30, 5.0 + 27 * 0.5) == 30 + int((100 - 18.5) / 0.5)  # 0.5 s a step from here on
    said = budget.decision(30, 18.5, 16)
    assert "0.500 s a step over steps 4-30" in said and "193 optimizer steps (3,088 examples)" in said, said
    assert "about 100 s of training" in said and "--max-steps 193 --warmup-steps 30 trains the same run" in said
    # read again where three tenths, ... of the time should have passed at that pace (a twentieth apart at least)
    assert budget.read_at == [30 + math.ceil((share * 100 - 18.5) / 0.5) for share in READ_AGAIN_AT[1:]]
    assert budget.read_at[:2] == [53, 73]
    assert read(budget, 53, 30.0) is None  # the same pace: the run keeps its size
    assert read(budget, 73, 50.0) == 73 + 50  # twice as slow since step 53 (read over a fifth of the time): fewer
    said = budget.decision(73, 50.0, 16)
    assert "1.000 s a step since step 53, so 123 optimizer steps" in said and "instead of 193" in said, said
    assert budget.read_at == [83, 93, 103, 113, 118]  # the next tenths of the time at the new pace
    assert read(budget, 83, 60.0) is None
    assert budget.sizes == [(30, 193), (73, 123)]
    steady = TimeBudget(1000.0, planned=5000, warmup=30, first_step=0)
    read(steady, 3, 0.0)
    assert read(steady, 30, 13.5) == 2003 and steady.read_at[0] == 403
    assert read(steady, 403, 201.0) is None  # 1,992 steps: a re-size under a hundredth of the time is not made


def test_the_budget_keeps_to_its_bounds_and_resumes_where_it_left_off():
    fits = TimeBudget(100.0, planned=120, warmup=30, first_step=0)
    read(fits, 3, 0.0)
    assert read(fits, 30, 13.5) == 120 and "all 120 optimizer steps" in fits.decision(30, 13.5, 16)
    assert fits.read_at == [] or all(s < 120 for s in fits.read_at)
    late = TimeBudget(10.0, planned=500, warmup=30, first_step=0)
    read(late, 3, 0.0)
    assert read(late, 30, 27.0) == 30 and "took the time" in late.decision(30, 27.0, 16)
    short = TimeBudget(100.0, planned=500, warmup=2, first_step=0)  # a warm-up too short to time: 10 steps past it
    read(short, 3, 0.0)
    assert [s for s in range(40) if short.due(s)] == [13]
    read(short, 13, 10.0)
    assert "--max-steps 103 --warmup-steps 2 repeats it to within that" in short.decision(13, 10.0, 16)
    fresh = TimeBudget(100.0, planned=500, warmup=30, first_step=200)  # resumed before any timing: its own steps
    assert [s for s in range(300) if fresh.due(s)] == [203, 213]
    saved = TimeBudget(100.0, planned=500, warmup=30, first_step=0)
    read(saved, 3, 5.0)
    read(saved, 30, 18.5)
    again = TimeBudget(100.0, planned=500, warmup=30, first_step=60, saved=saved.state())
    assert (again.sizes, again.marks, again.read_at) == (saved.sizes, saved.marks, saved.read_at)


def test_a_warped_schedule_keeps_its_rate_so_far_and_ends_at_the_new_last_step():
    from leantrain.model.schedules import build_scheduler, warp

    for name in ("linear", "cosine"):
        optimizer = torch.optim.SGD([torch.zeros(1)], lr=1.0)
        scheduler = build_scheduler(optimizer, name, 100, 0.0, 10)
        before = [scheduler.lr_lambdas[0](s) for s in range(101)]
        warp(scheduler, 40, 100, 70)  # squeezed: what step 100 reached, step 70 reaches
        after = [scheduler.lr_lambdas[0](s) for s in range(71)]
        assert after[:41] == before[:41] and after[70] == pytest.approx(before[100], abs=1e-12)
        assert after[55] == pytest.approx(before[70])  # halfway through the rest, the rest's halfway rate
        warp(scheduler, 50, 70, 90)  # then stretched again: warps compose
        assert [scheduler.lr_lambdas[0](s) for s in range(51)] == after[:51]
        assert scheduler.lr_lambdas[0](90) == pytest.approx(before[100], abs=1e-12)


def test_a_sized_run_is_the_run_its_steps_and_warm_up_train(run, capsys):
    sized, w_sized = run("sized", max_time="40s", warmup_steps=15)
    said = capsys.readouterr().err
    assert sized.metrics["optimizer_steps"] == 40  # 1 s a step: 40 of the 81 planned
    assert "--max-steps 40 --warmup-steps 15 trains the same run" in said, said
    assert sized.metrics["time_budget"]["sizes"] == [[15, 40]]  # read again at 20, 30 and 36 s: the same pace
    recorded = yaml.safe_load((sized.output_dir / "config.yaml").read_text())
    assert (recorded["max_steps"], recorded["warmup_steps"], recorded["max_time"]) == (40, 15, "40s")
    counted, w_counted = run("counted", max_steps=40, warmup_steps=15)
    assert counted.metrics["optimizer_steps"] == 40
    assert all(torch.equal(w_sized[k], w_counted[k]) for k in w_counted)  # bit for bit: the schedule decays over 40
    _, w_planned = run("planned", max_steps=81, warmup_steps=15)
    fast, w_fast = run("fits", paced(0.1), max_time="40s", warmup_steps=15)  # fast: nothing cut
    assert fast.metrics["optimizer_steps"] == 81 and all(torch.equal(w_fast[k], w_planned[k]) for k in w_planned)


def test_a_run_whose_pace_changes_is_re_sized_and_resumes_as_the_run_left_alone(run, capsys):
    from leantrain.run import checkpoint

    slower = paced(1.0, 2.0, after=30)  # a neighbour takes a core at step 30
    whole, w_whole = run("whole", slower, max_time="60s", warmup_steps=15, save_every=20)
    said = capsys.readouterr().err
    # sized to 60 steps at 1 s a step; read again at 18, 24 and 30 s (the same pace), then at 42 s (step 36): 2 s a
    # step since step 30, so 45 steps, which end at 60 s
    assert whole.metrics["time_budget"]["sizes"] == [[15, 60], [36, 45]], whole.metrics["time_budget"]
    assert whole.metrics["optimizer_steps"] == 45 and "so 45 optimizer steps (360 examples) instead of 60" in said
    rows = [json.loads(x) for x in (whole.output_dir / "metrics.jsonl").read_text().splitlines() if '"lr"' in x]
    assert rows[-1]["step"] == 45 and rows[-1]["lr"] == 0.0  # the schedule's end moved with the run's
    ckpt = whole.output_dir / "checkpoints" / "step-000040"  # saved after the re-size
    assert checkpoint.verify(ckpt).progress.time_budget["sizes"] == [[15, 60], [36, 45]]
    resumed, w_resumed = run("resumed", slower, max_time="60s", warmup_steps=15, save_every=20, resume=str(ckpt))
    assert resumed.metrics["optimizer_steps"] == 45 and resumed.metrics["resumed_from"] == str(ckpt)
    assert all(torch.equal(w_whole[k], w_resumed[k]) for k in w_whole)
    early = whole.output_dir / "checkpoints" / "step-000020"  # saved before it: sized at 60, re-sized as the whole
    again, w_again = run("again", slower, max_time="60s", warmup_steps=15, save_every=20, resume=str(early))
    assert again.metrics["time_budget"]["sizes"] == [[15, 60], [36, 45]]
    assert all(torch.equal(w_whole[k], w_again[k]) for k in w_whole)
