"""The output directory of a run: one run at a time, outputs staged and published atomically and durably,
a finished run never lost to --overwrite until its replacement has finished, no non-finite model published.

    OUTPUT_DIR/.leantrain.lock       flock'd by the run's top-level process for its whole life (the OS releases
                                     it when that process dies, however it dies); holds its pid
    OUTPUT_DIR/.incomplete-PID/      this run's outputs until it has finished (PID: the main process)
    OUTPUT_DIR/.replaced-PID/        with --overwrite: what the run replaces, until the new run has published
    OUTPUT_DIR/metrics.json          the finished marker: published last, set aside first

Publishing fsyncs every staged file and directory, sets the old finished marker aside before anything else
moves and moves the new one in last, so a kill at any instant leaves either the old finished run, the new
finished run, or no finished marker at all; the next run in the directory completes (a staging folder that
holds a finished marker) or undoes (a set-aside folder whose replacement left no checkpoint) what a killed
run left half done. Names carry the process id, so a second run never deletes the first run's files even
where the lock cannot be taken.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import NoReturn

from leantrain.errors import ConfigError, LeantrainError
from leantrain.paths import left_by_dead_run

FINISHED_MARKER = "metrics.json"  # written last: its presence means the run finished
LOCK_NAME = ".leantrain.lock"
STAGING_PREFIX = ".incomplete"
REPLACED_PREFIX = ".replaced-"
#: set by the launcher for the processes it starts: the pid holding the output directory's lock for them
LOCK_HOLDER_ENV = "LEANTRAIN_LOCK_HOLDER"


class OutputDirBusy(ConfigError):
    """Another live run holds the output directory."""


class WriteFailed(LeantrainError):
    """A write failed for want of space or access (`writing`): the message names the path and the space needed."""


class NonFiniteModel(LeantrainError):
    """The weights about to be saved or published hold NaN or infinity."""


def _say(message: str) -> None:
    from leantrain.telemetry.console import Console

    Console().info(message)


def _is_main_process() -> bool:
    """Rank 0 (or no launcher at all): the process that writes the run directory."""
    return int(os.environ.get("RANK", "0")) == 0


# -- the lock ------------------------------------------------------------------------------------------------

_HELD: dict[str, OutputLock] = {}  # locks this process holds, by resolved directory


class OutputLock:
    """An exclusive `flock` on OUTPUT_DIR/.leantrain.lock, held until `release()` or the process's death."""

    def __init__(self, directory: str | Path):
        self.directory = Path(directory)
        self.file = self.directory / LOCK_NAME
        self.fd: int | None = None
        self.made: list[Path] = []  # what acquiring made: the lock file, the folders missing (deepest first)

    def acquire(self) -> OutputLock:
        """Take the lock, or raise OutputDirBusy naming the holder's pid. Re-entrant within one process."""
        key = str(self.directory.resolve())
        if key in _HELD:  # this process holds it already (an earlier run in this process that failed)
            return _HELD[key]
        missing = _missing_folders(self.directory)
        new_file = not self.file.exists()
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.file, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as exc:  # read-only file system, no permission, a file where a folder should be
            raise ConfigError(
                f"--output-dir: cannot write to '{self.directory}' ({exc.strerror or exc}); choose a writable directory"
            ) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise
            holder = self.holder()
            if holder is not None and os.environ.get(LOCK_HOLDER_ENV) == str(holder):
                return self  # our launcher holds it for us (fd stays None): a worker of the run that holds it
            who = f"pid {holder}" if holder is not None else "a process that has not written its pid yet"
            raise OutputDirBusy(
                f"--output-dir: '{self.directory}' is in use by another leantrain run ({who}); wait for it to "
                "finish, or choose another --output-dir"
            ) from None
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self.fd = fd
        self.made = [self.file, *missing] if new_file else missing
        _HELD[key] = self
        return self

    def holder(self) -> int | None:
        try:
            text = self.file.read_text().strip()
        except OSError:
            return None
        return int(text) if text.isdigit() else None

    def release(self, remove_if_bare: bool = False) -> None:
        """Let go. With `remove_if_bare`, a directory that holds nothing but the lock loses what acquiring made:
        the lock file (removed while still held, so a run that opened it meanwhile is refused rather than locking
        a removed file) and the folders made for it (rmdir refuses one another run has written into since)."""
        if self.fd is not None and remove_if_bare and self.made:
            try:
                if [p.name for p in self.directory.iterdir()] == [LOCK_NAME]:
                    for made in self.made:
                        if made == self.file:
                            made.unlink()
                        else:
                            made.rmdir()
            except OSError:
                pass
        if self.fd is not None:
            _HELD.pop(str(self.directory.resolve()), None)
            os.close(self.fd)  # closing the only descriptor releases the flock
            self.fd = None


# -- the run directory -----------------------------------------------------------------------------------------

_ACTIVE: list[RunDir] = []  # run directories this process locked, for `guarded()` to release or roll back


class RunDir:
    def __init__(self, path: str | Path, overwrite: bool = False, resume: str | None = None):
        self.path = Path(path)
        self.overwrite = overwrite
        self.resume = resume  # --resume: a finished run is trained further only with --overwrite too
        self.run_id = str(os.getpid())  # the main process's: only it stages and sets aside
        self.staging = self.path / f"{STAGING_PREFIX}-{self.run_id}"
        self.replaced = self.path / f"{REPLACED_PREFIX}{self.run_id}"
        self.lock: OutputLock | None = None
        self.checkpoints_before: set[str] = set()  # the step folders there before this run (`check`)
        self.owner = False  # this process holds the lock, or its launcher holds it for it
        self.published = False

    @property
    def finished(self) -> bool:
        return (self.path / FINISHED_MARKER).is_file()

    def refuse_early(self) -> None:
        """What `check` refuses without taking the lock: a file in the way, a finished run without --overwrite.
        For callers with work to do before the run starts (--auto prepares the data to plan); `check` follows."""
        self._refuse_file()
        self._refuse_finished()

    def _refuse_file(self) -> None:
        if self.path.exists() and not self.path.is_dir():
            raise ConfigError(f"--output-dir: '{self.path}' is a file; choose a directory")

    def _refuse_finished(self) -> None:
        if self.finished and not self.overwrite:
            if self.resume is not None:
                raise ConfigError(
                    f"--output-dir: '{self.path}' holds a finished run; to train it further from its checkpoint "
                    "add --overwrite to --resume (its outputs are replaced once the longer run succeeds)"
                )
            raise ConfigError(
                f"--output-dir: '{self.path}' holds a finished run; pass --overwrite to replace it "
                "once the new run succeeds (with --resume auto, training on from its last checkpoint), or choose "
                "another --output-dir"
            )

    def check(self) -> None:
        """Fail before any work if the directory is in use, holds a finished run or cannot be written.

        Every process calls it. The main process takes the lock first, then repairs what a killed run left,
        then, with --overwrite, sets the previous run's outputs aside (its checkpoints follow if this run starts
        afresh: `CheckpointDir.discard_all`)."""
        self._refuse_file()
        if _is_main_process():
            self.lock = OutputLock(self.path).acquire()
            self.owner = True
            _ACTIVE.append(self)
            self.recover()
            self.checkpoints_before = _step_dirs(self.path)  # a finished run's own, which a refused resume leaves
            if self.overwrite and self.finished:
                self.set_aside(FINISHED_MARKER)  # first: from here on the directory is not "finished"
                self.set_aside(*[p.name for p in self.path.iterdir() if not _ours(p.name)])
        self._refuse_finished()
        try:
            self.path.mkdir(parents=True, exist_ok=True)
            probe = self.path / f".write-test-{os.getpid()}"
            probe.write_bytes(b"ok")
            probe.unlink()
        except OSError as exc:
            raise ConfigError(
                f"--output-dir: cannot write to '{self.path}' ({exc.strerror}); choose a writable directory"
            ) from None

    # -- what killed runs left ------------------------------------------------------------------------------
    def recover(self) -> None:
        """With the lock held, every other staging and set-aside folder is a dead run's: complete a publish that
        was cut short (its staging holds the finished marker); put back what a run that died before its first
        checkpoint set aside; drop what a publish that completed had yet to delete."""
        for staging in sorted(self.path.glob(f"{STAGING_PREFIX}*")):
            if not left_by_dead_run(staging.name):
                continue
            if staging != self.staging and staging.is_dir() and (staging / FINISHED_MARKER).is_file():
                _say(f"completing the publishing of {self.path}, cut short by a kill")
                self._publish_from(staging)
        for aside in sorted(self.path.glob(f"{REPLACED_PREFIX}*")):
            if aside == self.replaced or not aside.is_dir() or not left_by_dead_run(aside.name):
                continue
            if self.finished:
                shutil.rmtree(aside, ignore_errors=True)  # its replacement published
            elif not _has_checkpoints(self.path):
                _say(f"restoring {self.path}'s previous run, set aside by a run that was killed before finishing")
                self._restore_from(aside)
            # else: the replacement left checkpoints to resume; the old run waits set aside until it publishes

    # -- staging ------------------------------------------------------------------------------------------------
    def begin(self) -> Path:
        """A clean staging directory for this run's outputs (a dead run's staging is dropped: never published)."""
        for old in self.path.glob(f"{STAGING_PREFIX}*"):
            if old != self.staging and old.is_dir() and self.owner and left_by_dead_run(old.name):
                shutil.rmtree(old, ignore_errors=True)
        if self.staging.exists():
            shutil.rmtree(self.staging)
        self.staging.mkdir(parents=True)
        return self.staging

    def set_aside(self, *names: str) -> None:
        """Move these entries into this run's set-aside folder: restored if the run stops without publishing."""
        for name in names:
            item = self.path / name
            if item.exists() or item.is_symlink():
                self.replaced.mkdir(exist_ok=True)
                os.replace(item, self.replaced / name)
        fsync_dir(self.path)

    # -- publishing ---------------------------------------------------------------------------------------------
    def publish(self) -> None:
        """Check the staged model is finite, make every staged byte durable, then move the outputs into place:
        an old finished marker goes first, the new one last; what --overwrite set aside is deleted at the end."""
        check_finite_files(self.staging / "model")
        self._publish_from(self.staging)
        self.published = True

    def _publish_from(self, staging: Path) -> None:
        _fsync_tree(staging)
        items = sorted(staging.iterdir(), key=lambda p: p.name == FINISHED_MARKER)
        old = [p.name for p in items if (self.path / p.name).exists() and p.name != "checkpoints"]
        if FINISHED_MARKER in old:  # the old run stops being "finished" before any of its files is replaced
            self.set_aside(FINISHED_MARKER)
        self.set_aside(*[n for n in old if n != FINISHED_MARKER])
        for item in items:
            if item.name == FINISHED_MARKER:
                fsync_dir(self.path)  # every other output is in place before the marker says "finished"
            os.replace(item, self.path / item.name)
        fsync_dir(self.path)
        staging.rmdir()
        fsync_dir(self.path)
        for aside in self.path.glob(f"{REPLACED_PREFIX}*"):  # the replaced run (and any a killed run left)
            shutil.rmtree(aside, ignore_errors=True)

    # -- failure ---------------------------------------------------------------------------------------------
    def abandon(self) -> None:
        """The run stops without publishing: its staging folder goes (its log is in its checkpoints); put back what
        it set aside, unless it left checkpoints to resume (then the old run waits, set aside, for the resumed run
        to publish)."""
        if not self.owner:
            return
        if self.staging.is_dir() and not (self.staging / FINISHED_MARKER).exists():  # (else: a publish to complete)
            shutil.rmtree(self.staging, ignore_errors=True)
        if not self.replaced.is_dir():
            return
        if _step_dirs(self.path) - self.checkpoints_before:
            _say(
                f"--overwrite: this run stopped with checkpoints of its own; the run it replaces is kept in "
                f"{self.replaced} until this one finishes (--resume auto)"
            )
            return
        self._restore_from(self.replaced)
        _say(f"--overwrite: this run did not finish; the run it was to replace is back in {self.path}")

    def _restore_from(self, aside: Path) -> None:
        """Put set-aside entries back, the finished marker last."""
        items = sorted(aside.iterdir(), key=lambda p: p.name == FINISHED_MARKER)
        for item in items:
            target = self.path / item.name
            if target.is_dir() and not target.is_symlink():
                shutil.rmtree(target)
            elif target.exists() or target.is_symlink():
                target.unlink()
            os.replace(item, target)
        fsync_dir(self.path)
        aside.rmdir()

    def release(self) -> None:
        if self.lock is not None:  # a run refused before it wrote anything leaves nothing it made behind
            self.lock.release(remove_if_bare=not self.published)
            self.lock = None
        self.owner = False


def staging_dir(path: str | Path) -> Path | None:
    """The staging folder of a run in progress (or one that failed), the newest if there are several."""
    found = [p for p in Path(path).glob(f"{STAGING_PREFIX}*") if p.is_dir()]
    return max(found, key=lambda p: p.stat().st_mtime) if found else None


@contextlib.contextmanager
def guarded() -> Iterator[None]:
    """Around a whole run in one process: whatever ends it, release the output directory's lock; if it ends
    without publishing, put back what --overwrite set aside."""
    start = len(_ACTIVE)
    try:
        yield
    finally:
        runs, _ACTIVE[start:] = _ACTIVE[start:], []
        for run in runs:
            try:
                if not run.published:
                    run.abandon()
            finally:
                run.release()


# -- disks and finite weights ------------------------------------------------------------------------------------


def write_failure(exc: BaseException, path: Path, need_bytes: int | None) -> WriteFailed | None:
    """A one-line error for a write that failed for want of space or access; None for any other failure.

    torch.save reports a full disk as a RuntimeError ("unexpected pos", "file write failed") and safetensors as
    a SafetensorError ("os error 28"): neither is an OSError, so their message decides."""
    io_words = ("No space left", "os error 28", "file write failed", "unexpected pos", "Disk quota", "os error 122")
    if isinstance(exc, OSError):
        full = exc.errno in (errno.ENOSPC, errno.EDQUOT)
    elif isinstance(exc, RuntimeError) or type(exc).__name__ == "SafetensorError":
        if not any(w in str(exc) for w in io_words):
            return None
        full = True
    else:
        return None
    where = getattr(exc, "filename", None) or path
    if not full:
        assert isinstance(exc, OSError)
        why = exc.strerror or str(exc)
        return WriteFailed(f"cannot write {where} ({why}); make it writable or choose another --output-dir")
    free = _free_bytes(path)
    mb = 1 / 2**20
    facts = [exc.strerror] if isinstance(exc, OSError) and exc.strerror else []
    facts += [f"{free * mb:,.1f} MB free"] if free is not None else []
    facts += [f"about {need_bytes * mb:,.1f} MB needed"] if need_bytes else []
    return WriteFailed(
        f"cannot write {where}: the disk is full ({'; '.join(facts)}); free some space or point --output-dir at "
        "a bigger disk"
    )


def _free_bytes(path: Path) -> int | None:
    for p in (path, *path.parents):
        try:
            return shutil.disk_usage(p).free
        except OSError:
            continue
    return None


@contextlib.contextmanager
def writing(path: Path, need_bytes: int | None, partial: list[Path] | None = None) -> Iterator[None]:
    """Around a write: a full disk or a refused write becomes a one-line LeantrainError naming the path and the
    space needed, after the `partial` paths (default: `path`) are removed; any other failure passes through."""
    try:
        yield
    except Exception as exc:
        if write_failure(exc, path, need_bytes) is None:
            raise
        remove(*(partial if partial is not None else [path]))
        error = write_failure(exc, path, need_bytes)  # again: the free space once the partial files are gone
        assert error is not None
        raise error from None


def usual_file_modes(folder: Path) -> None:
    """Give every file in `folder` the mode a new file gets here (0644 under the usual umask): transformers writes
    model.safetensors through a temporary file, created 0600, unreadable to the group that reads the rest."""
    mask = os.umask(0)
    os.umask(mask)
    for path in folder.rglob("*"):
        if path.is_file() and not path.is_symlink():
            path.chmod(0o666 & ~mask)


def remove(*paths: Path) -> None:
    for p in paths:
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p, ignore_errors=True)
        elif p.exists() or p.is_symlink():
            p.unlink()


def nonfinite_count(tensors) -> tuple[int, int]:
    """(non-finite values, all values) over floating-point tensors."""
    import torch

    bad = total = 0
    for t in tensors:
        t = t.to_local() if hasattr(t, "to_local") else t  # a sharded parameter: this process's shard
        if t.is_floating_point() or t.is_complex():
            # a finite norm proves every value finite, reading the tensor once; an infinite one (a NaN, an infinity,
            # or squares past the dtype's range) sends it to the exact count
            if t.numel() and not torch.isfinite(torch.linalg.vector_norm(t)).item():
                bad += int(t.numel() - torch.isfinite(t).sum().item())
            total += t.numel()
    return bad, total


def check_finite_files(model_dir: Path) -> None:
    """Refuse to publish a model whose saved weights hold NaN or infinity."""
    bad = total = 0
    for file in sorted(model_dir.glob("*.safetensors")):
        for tensor in _float_tensors(file):
            b, n = nonfinite_count([tensor])
            bad, total = bad + b, total + n
    if bad:
        raise NonFiniteModel(
            f"not publishing the model: {bad:,} of {total:,} weights are NaN or infinite (training diverged; "
            "with --on-nan skip every later step was skipped). Train again with a lower --lr, or resume from a "
            "checkpoint saved before the divergence"
        )


def _float_tensors(file: Path) -> Iterator:
    """The floating-point tensors of a safetensors file, read one at a time. Not mapped (as `safe_open` maps the
    file): the mapped pages it reads stay in the process's resident size until it closes, so checking a model would
    count as much memory as the model, at the end of a run whose training needed less."""
    import json
    import struct

    import torch

    dtypes = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}
    with open(file, "rb") as f:
        (length,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(length))
        for key, info in header.items():
            if key == "__metadata__" or info["dtype"] not in dtypes:
                continue
            start, end = info["data_offsets"]
            f.seek(8 + length + start)
            data = bytearray(f.read(end - start))
            yield torch.frombuffer(data, dtype=dtypes[info["dtype"]]) if data else torch.empty(0)


def _ours(name: str) -> bool:
    """Entries that belong to the directory's machinery, not to a run's outputs."""
    return name in (LOCK_NAME, "checkpoints") or name.startswith((STAGING_PREFIX, REPLACED_PREFIX, ".write-test-"))


def _missing_folders(path: Path) -> list[Path]:
    """`path` and those of its parents that do not exist yet, deepest first."""
    missing = []
    for folder in (path.absolute(), *path.absolute().parents):
        if folder.exists() or folder.is_symlink():
            break
        missing.append(folder)
    return missing


def _has_checkpoints(path: Path) -> bool:
    return bool(_step_dirs(path))


def _step_dirs(path: Path) -> set[str]:
    root = path / "checkpoints"
    return {p.name for p in root.iterdir() if p.name.startswith("step-") and p.is_dir()} if root.is_dir() else set()


def fsync_dir(path: Path) -> None:
    """Make a folder's entries (renames, new files) durable; a no-op where the filesystem cannot."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass  # some filesystems cannot fsync a directory
    finally:
        os.close(fd)


def _fsync_tree(root: Path) -> None:
    """fsync every file under `root`, then every directory, deepest first."""
    for here, _dirs, files in os.walk(root, topdown=False):
        for name in files:
            fd = os.open(os.path.join(here, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        fsync_dir(Path(here))


def output_file(path: str | Path, suffixes: tuple[str, ...], flag: str = "--output") -> Path:
    """A file a command is asked to write, checked before any work: a format it writes (by suffix), and a folder
    that exists or can be made (ConfigError otherwise, naming `flag`). Nothing is made here: `output_folder` makes
    the folder once the work is done, so a command that fails on its input leaves no empty folder behind."""
    target = Path(path)
    if target.suffix.lower() not in suffixes:
        raise ConfigError(
            f"{flag} {path}: unknown format '{target.suffix or '(no suffix)'}'; name a {', '.join(suffixes)} file"
        )
    existing = target.parent.absolute()
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        _cannot_create(path, errno.ENOTDIR, flag)
    if not os.access(existing, os.W_OK | os.X_OK):
        _cannot_create(path, errno.EACCES, flag)
    return target


def output_folder(path: str | Path, flag: str = "--output") -> Path:
    """The folder of `path` (an `output_file`), made now that there is something to write into it."""
    target = Path(path)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        _cannot_create(path, exc.errno or errno.EIO, flag)
    return target


def _cannot_create(path: str | Path, code: int, flag: str) -> NoReturn:
    raise ConfigError(f"{flag} {path}: cannot create its folder ({os.strerror(code)}); choose another path")
