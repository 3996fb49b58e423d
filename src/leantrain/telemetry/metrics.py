"""Per-step metrics log (JSON lines), throughput counters and the end-of-run summary table."""

from __future__ import annotations

import io
import json
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any


class MetricsLog:
    """Appends one JSON object per line; flushed each row so a crash keeps what was logged."""

    def __init__(self, path: Path | None):
        self.path = path
        self._file = path.open("a", encoding="utf-8") if path is not None else None

    def write(self, row: dict[str, Any]) -> None:
        if self._file is not None:
            self._file.write(json.dumps(plain_json(row)) + "\n")
            self._file.flush()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


class TeeLog:
    """Writes every row to each log given (MetricsLog, the trackers' TrackerLog); None entries are skipped."""

    def __init__(self, *logs: Any):
        self.logs = [log for log in logs if log is not None]

    def write(self, row: dict[str, Any]) -> None:
        for log in self.logs:
            log.write(row)

    def close(self) -> None:
        for log in self.logs:
            log.close()


class Throughput:
    """Counts examples and tokens over training time only (evaluation and saving are paused out)."""

    def __init__(self, warmup_steps: int = 0, sync: Callable[[], None] | None = None) -> None:
        self.warmup_steps = warmup_steps  # the first steps pay one-off costs; "steady" figures skip them
        # A GPU runs behind the host: its clock is read after the device drains, at the steady mark and at each
        # pause (evaluation, saving, the end), so the window holds the device's time, not the host's launches.
        self._sync = sync or (lambda: None)
        self.steps = 0
        self._steady_mark: tuple[int, int, float] | None = None
        self.examples = 0
        self.tokens = 0  # real tokens, padding excluded
        self.padded_tokens = 0  # what the model computed on, padding included
        self.seconds = 0.0
        self._started: float | None = None

    def start(self) -> None:
        self._started = time.perf_counter()

    def pause(self) -> None:
        if self._started is not None:
            self._sync()
            self.seconds += time.perf_counter() - self._started
            self._started = None

    def elapsed(self) -> float:
        running = time.perf_counter() - self._started if self._started is not None else 0.0
        return self.seconds + running

    def add(self, examples: int, tokens: int, padded_tokens: int) -> None:
        self.examples += examples
        self.tokens += tokens
        self.padded_tokens += padded_tokens

    def snapshot(self) -> tuple[int, int, int, float]:
        """The counts and training time now: `discard(snapshot)` takes back everything since."""
        return self.examples, self.tokens, self.padded_tokens, self.elapsed()

    def discard(self, since: tuple[int, int, int, float]) -> float:
        """Leave out the work and time since `since` (a step that recompiled the model); returns those seconds."""
        seconds = self.elapsed() - since[3]
        self.examples, self.tokens, self.padded_tokens = since[:3]
        self.seconds -= seconds
        return seconds

    def step_done(self) -> None:
        self.steps += 1
        if self.steps == self.warmup_steps:
            self._sync()
            self._steady_mark = (self.examples, self.tokens, self.elapsed())

    def _steady(self, count_index: int) -> float:
        if self._steady_mark is None:
            return self.samples_per_second if count_index == 0 else self.tokens_per_second
        t = self.elapsed() - self._steady_mark[2]
        done = (self.examples, self.tokens)[count_index] - self._steady_mark[count_index]
        return done / t if t > 0 else 0.0

    @property
    def steady_seconds(self) -> float:
        """Training time since the warm-up steps ended (all of it when they have not)."""
        return self.elapsed() - self._steady_mark[2] if self._steady_mark is not None else self.elapsed()

    @property
    def steady_samples_per_second(self) -> float:
        return self._steady(0)

    @property
    def steady_tokens_per_second(self) -> float:
        return self._steady(1)

    @property
    def samples_per_second(self) -> float:
        t = self.elapsed()
        return self.examples / t if t > 0 else 0.0

    @property
    def tokens_per_second(self) -> float:
        t = self.elapsed()
        return self.tokens / t if t > 0 else 0.0


def plain_json(value: Any) -> Any:
    """`value` as strict JSON takes it: tensors and numpy scalars as numbers, NaN and infinities as the strings
    'nan', 'inf', '-inf' (JSON has no such numbers; `run.report` reads them back), in nested dicts and lists too."""
    if hasattr(value, "item") and getattr(value, "ndim", 0) == 0:
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {k: plain_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain_json(v) for v in value]
    return value


def summary_table(title: str, rows: list[tuple[str, str]]) -> str:
    """A two-column table as text (rich renders it; plain text when output is not a terminal)."""
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title, show_header=False, title_justify="left")
    table.add_column(style="bold")
    table.add_column()
    for k, v in rows:
        table.add_row(k, v)
    buffer = io.StringIO()
    console = Console(width=100, file=buffer)
    console.print(table)
    return buffer.getvalue()
