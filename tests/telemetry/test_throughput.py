"""The throughput meter's steady window on a device that runs behind the host (CUDA): the clock is read only after
the device has drained, at the steady mark and at each pause."""

from __future__ import annotations

from leantrain.telemetry import Throughput


def test_the_steady_window_holds_the_devices_time_not_the_hosts_launches(monkeypatch):
    """The host launches each step in 1 s and the device takes 3 s: read without draining, the window would hold the
    host's launches (a third of the real time) and overstate samples/s three times."""
    now = [0.0]
    pending = [0.0]  # device work queued behind the host

    def drain():
        now[0] += pending[0]
        pending[0] = 0.0

    monkeypatch.setattr("leantrain.telemetry.metrics.time.perf_counter", lambda: now[0])
    meter = Throughput(warmup_steps=2, sync=drain)
    meter.start()
    for _ in range(10):
        now[0] += 1.0  # the host's launches
        pending[0] += 2.0  # what the device still has to do after them
        meter.add(8, 100, 100)
        meter.step_done()
    meter.pause()
    assert meter.steady_samples_per_second == 8 * 8 / (8 * 3.0)
    assert meter.samples_per_second == 80 / 30.0


def test_with_nothing_to_drain_the_meter_reads_the_clock_as_is(monkeypatch):
    """A CPU (no device queue): the warm-up step is left out of the steady window, a pause stops the clock, and the
    time paused out (an evaluation) counts nowhere."""
    now = [0.0]
    monkeypatch.setattr("leantrain.telemetry.metrics.time.perf_counter", lambda: now[0])
    meter = Throughput(warmup_steps=1)
    meter.start()
    for seconds, rows, tokens in ((5.0, 4, 40), (2.0, 4, 30), (2.0, 8, 50)):
        now[0] += seconds
        meter.add(rows, tokens, tokens)
        meter.step_done()
        if rows == 4 and tokens == 30:  # an evaluation of 100 s after the second step
            meter.pause()
            now[0] += 100.0
            meter.start()
    meter.pause()
    assert meter.examples == 16 and meter.elapsed() == 9.0
    assert meter.steady_samples_per_second == 12 / 4.0  # the two steps after the warm-up
    assert meter.steady_tokens_per_second == 80 / 4.0
    assert meter.samples_per_second == 16 / 9.0
