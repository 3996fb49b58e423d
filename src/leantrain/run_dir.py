"""The output directory of a run: refuse to clobber a finished run, stage outputs, publish atomically.

A run writes its outputs into `OUTPUT_DIR/.incomplete/` and moves them up only once it has
succeeded, each move a rename. A run that fails or is killed therefore never damages what a
finished run left in the same directory, even with --overwrite.
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

from leantrain.errors import ConfigError

FINISHED_MARKER = "metrics.json"  # written last: its presence means the run finished


def default_output_dir() -> Path:
    return Path("runs") / time.strftime("%Y%m%d-%H%M%S")


class RunDir:
    def __init__(self, path: str | Path, overwrite: bool = False):
        self.path = Path(path)
        self.overwrite = overwrite
        self.staging = self.path / ".incomplete"

    @property
    def finished(self) -> bool:
        return (self.path / FINISHED_MARKER).is_file()

    def check(self) -> None:
        """Fail before any work if the directory holds a finished run or cannot be written."""
        if self.path.exists() and not self.path.is_dir():
            raise ConfigError(f"--output-dir: '{self.path}' is a file; choose a directory")
        if self.finished and not self.overwrite:
            raise ConfigError(
                f"--output-dir: '{self.path}' holds a finished run; pass --overwrite to replace it "
                "once the new run succeeds, or choose another --output-dir"
            )
        try:
            self.path.mkdir(parents=True, exist_ok=True)
            probe = self.path / f".write-test-{os.getpid()}"
            probe.write_bytes(b"ok")
            probe.unlink()
        except OSError as exc:
            raise ConfigError(
                f"--output-dir: cannot write to '{self.path}' ({exc.strerror}); choose a writable directory"
            ) from None

    def begin(self) -> Path:
        """A clean staging directory for this run's outputs."""
        if self.staging.exists():
            shutil.rmtree(self.staging)  # left by a run that died: never published, safe to drop
        self.staging.mkdir(parents=True)
        return self.staging

    def publish(self) -> None:
        """Move staged outputs into place; the finished marker goes last."""
        items = sorted(self.staging.iterdir(), key=lambda p: p.name == FINISHED_MARKER)
        for item in items:
            target = self.path / item.name
            if target.is_dir() and not target.is_symlink():
                old = self.path / f".{item.name}.old-{os.getpid()}"
                os.replace(target, old)
                os.replace(item, target)
                shutil.rmtree(old, ignore_errors=True)
            else:
                os.replace(item, target)
        self.staging.rmdir()
