"""The step timer: parts add up to the wall time, and each part gets its own time."""

from __future__ import annotations

import pytest

from leantrain.telemetry.timing import PHASES, StepTimer, fractions_from_row, row_key


class FakeClock:
    """A clock that moves only when told to: `sleep` advances it exactly, so the parts are exact too
    (sleeping for real made these tests depend on how busy the machine was)."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def slow_loader(n: int, wait: float, clock: FakeClock):
    for i in range(n):
        clock.sleep(wait)
        yield i


def test_parts_sum_to_the_wall_time_in_a_synthetic_loop():
    clock = FakeClock()
    timer = StepTimer(clock=clock)
    sleeps = {"data": 0.012, "forward_backward": 0.02, "optimizer": 0.008, "eval": 0.015, "comm": 0.004, "other": 0.004}
    steps = 8
    clock.sleep(5.0)  # before start(): not counted
    started = clock()
    timer.start()
    for step, _ in enumerate(timer.timed(slow_loader(steps, sleeps["data"], clock)), start=1):
        with timer.phase("forward_backward"):
            clock.sleep(sleeps["forward_backward"])
        with timer.phase("optimizer"):
            clock.sleep(sleeps["optimizer"])
        with timer.phase("comm"):
            clock.sleep(sleeps["comm"])
        clock.sleep(sleeps["other"])  # bookkeeping outside any phase
        if step % 4 == 0:
            with timer.phase("eval"):
                clock.sleep(sleeps["eval"])
    parts = timer.read()
    assert parts["wall"] == pytest.approx(clock() - started)
    assert sum(parts[p] for p in PHASES) == pytest.approx(parts["wall"])
    expected = {p: s * steps for p, s in sleeps.items()}
    expected["eval"] = sleeps["eval"] * (steps // 4)
    for p, e in expected.items():
        assert parts[p] == pytest.approx(e), p
    assert parts["checkpoint"] == 0.0


def test_a_nested_phase_takes_its_time_from_the_outer_one():
    clock = FakeClock()
    timer = StepTimer(clock=clock)
    with timer.phase("checkpoint"):
        clock.sleep(0.01)
        with timer.phase("comm"):
            clock.sleep(0.02)
        clock.sleep(0.005)
    parts = timer.read()
    assert parts["comm"] == pytest.approx(0.02) and parts["checkpoint"] == pytest.approx(0.015)
    assert parts["wall"] == pytest.approx(sum(parts[p] for p in PHASES)) == pytest.approx(0.035)


def test_windows_cover_the_time_since_the_previous_window():
    clock = FakeClock()
    timer = StepTimer(clock=clock)
    timer.start()
    with timer.phase("data"):
        clock.sleep(0.01)
    first = timer.window()
    with timer.phase("optimizer"):
        clock.sleep(0.03)
    second = timer.window_row()
    assert first["data"] == pytest.approx(0.01) and first["optimizer"] == 0.0
    assert second[row_key("data")] == 0.0 and second[row_key("optimizer")] == pytest.approx(0.03)
    assert second["time_wall_seconds"] == pytest.approx(sum(second[row_key(p)] for p in PHASES))
    total = timer.total_row()
    assert total["time_wall_seconds"] == pytest.approx(first["wall"] + second["time_wall_seconds"])
    assert total["time_wall_seconds"] == pytest.approx(0.04)


def test_a_fake_clock_gives_exact_parts():
    ticks = iter([0.0, 1.0, 3.0, 3.5, 7.0, 7.0])
    timer = StepTimer(clock=lambda: next(ticks))
    timer.start()  # 0.0
    with timer.phase("data"):  # other 0 -> 1.0
        pass  # data 1.0 -> 3.0
    with timer.phase("forward_backward"):  # other 3.0 -> 3.5
        pass  # forward_backward 3.5 -> 7.0
    parts = timer.read()  # 7.0
    assert parts["data"] == 2.0 and parts["forward_backward"] == 3.5 and parts["other"] == 1.5
    assert parts["wall"] == 7.0
    assert timer.fractions(parts)["forward_backward"] == 0.5


def test_cpu_timer_never_synchronises_a_device():
    assert StepTimer("cpu")._sync_fn is None
    assert StepTimer(None)._sync_fn is None


def test_fractions_from_a_metrics_row():
    row = {"step": 4, row_key("data"): 1.0, row_key("forward_backward"): 3.0, row_key("wall"): 4.0}
    assert fractions_from_row(row) == {"data": 0.25, "forward_backward": 0.75}
    assert fractions_from_row({"step": 4, "loss": 1.0}) == {}
