"""Ctrl-C and preemption: stop at the next optimizer-step boundary with a checkpoint, and say how to resume.

The CLI and the processes a launcher starts install handlers for SIGINT and SIGTERM for the length of a run
(`handling()`) and put the previous ones back afterwards; `leantrain.train` called from a program installs none,
so there Ctrl-C is Python's KeyboardInterrupt as usual.

What a signal does depends on the run's phase (`phase()`, set by the trainer). Where there is nothing to save
yet or nothing worth finishing (starting, reading and tokenizing the data, loading the model, setting up, writing
the final model) it stops the process at once, in that phase: `Interrupted` is raised from the handler, and what
the phase was writing is removed as the error unwinds (caches are written to temporaries renamed into place; the
run's staging folder goes with the run). Where the run has state worth keeping it is noted, and the run stops at
its next boundary, within about a second: the end of the optimizer step, the next evaluation batch, the end of
the checkpoint being written, the end of the publishing renames. There every process agrees to stop at the same
point (one all-reduce per step, or per evaluation batch, only with handlers installed and several processes),
saves a checkpoint when --save-every or --save-on-interrupt is set, and raises `Interrupted`: the CLI prints its
message (the phase, the checkpoint and the exact command that resumes it) and exits 128 + the signal's number,
130 for SIGINT and 143 for SIGTERM, from every process. A second signal stops a single process at once; in a
launched job the launcher's agent stops what has not stopped 30 s after passing the signal on.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Interrupted(KeyboardInterrupt):
    """The run stopped on SIGINT or SIGTERM; `message` says what was saved and how to resume."""

    def __init__(self, signum: int, message: str):
        super().__init__(message)
        self.signum, self.message = signum, message

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


class _State:
    installed = False
    launched = False  # one of a launcher's processes: the launcher repeats signals, so repeats are not "again"
    received: int | None = None
    phase = "starting the run"  # what the run does now, for the message
    at_once = True  # a signal in this phase stops the process at once
    stopping = "at once"  # else, where it stops: "at the end of this optimizer step"


_state = _State()


def signal_name(signum: int) -> str:
    return signal.Signals(signum).name


@contextlib.contextmanager
def handling(launched: bool = False) -> Iterator[None]:
    """Install the SIGINT/SIGTERM handlers for one run; restore the previous ones after it."""
    if threading.current_thread() is not threading.main_thread():
        yield  # signal handlers can only be set from the main thread
        return
    previous = {s: signal.getsignal(s) for s in SIGNALS}
    _state.installed, _state.launched, _state.received = True, launched, None
    _state.phase, _state.at_once, _state.stopping = _State.phase, True, _State.stopping
    for s in SIGNALS:
        signal.signal(s, _handle)
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        _state.installed = False


@contextlib.contextmanager
def phase(name: str, stopping: str | None = None) -> Iterator[None]:
    """The run is `name` ("tokenizing the data") for the block. Without `stopping` a signal in it stops the process
    at once; with it, the signal is noted and the run stops where `stopping` says ("at the end of this optimizer
    step"), which the caller checks with `requested()`. A signal noted before an at-once phase stops it as it
    begins."""
    before = (_state.phase, _state.at_once, _state.stopping)
    _state.phase, _state.at_once, _state.stopping = name, stopping is None, stopping or "at once"
    try:
        if _state.installed and _state.at_once and _state.received is not None:
            raise Interrupted(_state.received, _stopped_at_once(_state.received))
        yield
    finally:
        _state.phase, _state.at_once, _state.stopping = before


def _stopped_at_once(signum: int) -> str:
    return f"stopped by {signal_name(signum)} while {_state.phase}; nothing was saved"


def received() -> int | None:
    """The signal noted during the run (None if none): the CLI reports one that came after the last step."""
    return _state.received


def _handle(signum: int, _frame: Any) -> None:
    if _state.at_once:
        _state.received = signum
        raise Interrupted(signum, _stopped_at_once(signum))
    if _state.received is None:
        _state.received = signum
        if int(os.environ.get("RANK", "0")) == 0:
            again = "" if _state.launched else " (again to stop at once)"
            print(
                f"leantrain: {signal_name(signum)} received while {_state.phase}: stopping {_state.stopping}{again}",
                file=sys.stderr,
                flush=True,
            )
    elif not _state.launched:
        raise Interrupted(signum, f"stopped at once by a second {signal_name(signum)}; nothing more was saved")


def requested(accelerator) -> int | None:
    """At a step boundary: the signal that stops every process here, or None.

    Collective when there are several processes (every process calls it at every step boundary); free, and
    always None, where no handlers are installed (`leantrain.train` called from a program)."""
    if not _state.installed:
        return None
    got = _state.received
    if accelerator.num_processes > 1:
        import torch

        votes = torch.tensor([float(got == signal.SIGINT), float(got == signal.SIGTERM)], device=accelerator.device)
        sigint, sigterm = accelerator.reduce(votes, reduction="sum").tolist()
        got = signal.SIGTERM if sigterm else signal.SIGINT if sigint else None  # preemption outranks Ctrl-C
    return got


def stop(
    signum: int, cfg, step: int, total_steps: int, checkpoints, saved_now: bool, save, during: str | None = None
) -> Interrupted:
    """Save (if asked and not just done), and the Interrupted that says what was saved and how to resume.

    `save()` writes a checkpoint of the run as it stands (collective); `saved_now`: this step's was just saved;
    `during`: the phase it stopped in, when not between two steps ("evaluating")."""
    name = signal_name(signum)
    where = f"stopped by {name} {f'while {during}, ' if during else ''}after step {step:,} of {total_steps:,}"
    path: Path | None = None
    if cfg.save_every or cfg.save_on_interrupt:
        path = checkpoints.root / f"step-{step:06d}" if saved_now else save(f"interrupted by {name}")
    else:
        newest = next(iter(checkpoints.step_dirs()), None)
        if newest is None:
            return Interrupted(
                signum,
                f"{where}; no checkpoint saved (--save-every N or --save-on-interrupt would have saved one)",
            )
        path = newest
        where += f"; no checkpoint saved at this step (--save-on-interrupt saves one), the newest is {newest.name}"
    return Interrupted(signum, f"{where}; checkpoint: {path}\nresume with: {resume_command(cfg)}")


def resume_command(cfg, resume: str = "auto") -> str:
    """The command that continues this run from its newest checkpoint (or `resume`): every setting spelled out."""
    # --auto chose its settings once (they are spelled out); --overwrite would set the checkpoints aside
    flags = cfg.replace(resume=resume, overwrite=False, auto=False).to_argv()
    return shlex.join(["leantrain", "train", *flags])
