"""Where leantrain and the Hugging Face libraries keep what they download and cache (`leantrain env`)."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO


def leantrain_cache() -> Path:
    """leantrain's own cache (tokenized data, the CPU peak probe, converted GGUF models): $LEANTRAIN_CACHE, else
    ~/.cache/leantrain."""
    return Path(os.environ.get("LEANTRAIN_CACHE") or Path.home() / ".cache" / "leantrain")


def default_output_dir() -> Path:
    """Where a run goes when --output-dir is not given: runs/<timestamp> in the current folder, or runs/<timestamp>-2,
    -3... where a run started in the same second has it (a sweep's jobs, started together, each get their own)."""
    first = Path("runs") / time.strftime("%Y%m%d-%H%M%S")
    path, n = first, 1
    while path.exists():
        n += 1
        path = first.with_name(f"{first.name}-{n}")
    return path


def cache_paths() -> list[tuple[str, str]]:
    """(name, "path  (what; the variable that moves it)") for each cache a run fills."""
    from huggingface_hub import constants

    rows = [
        ("leantrain cache", f"{leantrain_cache()}  (tokenized data, CPU peak probe, GGUF models; $LEANTRAIN_CACHE)"),
        ("hub cache", f"{constants.HF_HUB_CACHE}  (downloaded models; $HF_HUB_CACHE or $HF_HOME)"),
    ]
    try:
        from datasets import config as datasets_config

        rows.append(("datasets cache", f"{datasets_config.HF_DATASETS_CACHE}  (hub data sets; $HF_DATASETS_CACHE)"))
    except ImportError:
        pass
    return rows


@contextlib.contextmanager
def written_atomically(path: Path, mode: str = "wb") -> Iterator[IO]:
    """A file to write `path` through: a temporary beside it, renamed into place when the block ends. Whatever
    stops the block (an error, Ctrl-C) removes the temporary, so a cache never keeps a partial entry."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with tmp.open(mode) as f:
            yield f
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def left_by_dead_run(name: str) -> bool:
    """Whether a staging, set-aside or temporary name (`...-PID`) belongs to a process that is gone.

    Belt and braces with the lock: where a file system cannot lock, a live run's files are still spared (on
    one machine; a name without a pid is an older leantrain's, and taken as dead). This process's own names
    count as left over: the callers pass over the current run's, and an earlier run in this process is over."""
    tail = name.rsplit("-", 1)[-1]
    if not tail.isdigit() or int(tail) == os.getpid():
        return True
    try:
        os.kill(int(tail), 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False  # alive, someone else's
    return False
