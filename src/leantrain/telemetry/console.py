"""Messages for the user: on stderr, from the main process only, so stdout stays for results."""

from __future__ import annotations

import sys


def counted(n: int, noun: str, plural: str | None = None) -> str:
    """`1 row`, `2,000 rows`: a count and its noun, agreeing."""
    return f"{n:,} {noun if n == 1 else plural or noun + 's'}"


class Console:
    def __init__(self, enabled: bool = True, stream=None):
        self.enabled = enabled
        self.stream = stream or sys.stderr

    def info(self, message: str) -> None:
        if self.enabled:
            from tqdm import tqdm  # a line in the middle of a progress bar: the bar is cleared, then drawn below it

            tqdm.write(f"leantrain: {message}", file=self.stream)
            self.stream.flush()
