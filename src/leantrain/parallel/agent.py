"""`python -m leantrain.parallel.agent MODULE ARGS...`: run a launcher module (`accelerate.commands.launch`,
`torch.distributed.run`) as `python -m MODULE ARGS...` would, with two differences:

* when a signal stops the job, the launcher's agent exits 128 + the signal's number instead of printing its own
  SignalException traceback (each process has already said what it saved and how to resume; training/interrupt.py);
* when a process fails, the job's failure is told in a few lines, the first failure first (the process killed, by
  which signal; or the one that raised) and the others as its consequences (a process that lost its connection
  to the failed one, or that the agent stopped), with the agent's own log, its failure report and each process's
  traceback in the log folder that `leantrain train` names (LEANTRAIN_FAILURE_LOGS, OUTPUT_DIR/logs).
"""

from __future__ import annotations

import logging
import os
import runpy
import shutil
import signal
import sys
from pathlib import Path
from typing import Any

#: what the agent's log (torch.distributed.elastic) is written to, in the log folder, instead of the terminal
AGENT_LOG = "launcher.log"
#: OUTPUT_DIR/logs, where a launched job's processes and its launcher write what failed in full (tracebacks)
FAILURE_LOGS_ENV = "LEANTRAIN_FAILURE_LOGS"
#: what a collective says when the process at the other end is gone: a consequence, not a cause
PEER_LOST = (
    "Connection closed by peer",
    "Connection reset by peer",
    "Broken pipe",
    "remote process exited",
    "NCCL communicator was aborted",
    "Connection refused",
)
#: what a collective says when another process did not come in time (gloo, NCCL's watchdog): --collective-timeout
COLLECTIVE_TIMEOUT = ("Timed out waiting", "Watchdog caught collective operation timeout")


def main() -> int:
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    logs = Path(os.environ[FAILURE_LOGS_ENV]) if os.environ.get(FAILURE_LOGS_ENV) else None
    fresh = logs is not None and not logs.exists()  # made by this job: gone again after a refusal told in full
    if logs is not None:
        _log_to_file(logs / AGENT_LOG)
    module, sys.argv = sys.argv[1], [sys.argv[1], *sys.argv[2:]]
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    except SignalException as exc:
        return 128 + int(exc.sigval)
    except ChildFailedError as exc:
        if logs is None:
            raise
        try:
            logs.mkdir(parents=True, exist_ok=True)  # made on the first line written: none may have been yet
            with (logs / AGENT_LOG).open("a") as f:
                f.write(f"{exc}\n")  # torch elastic's own report: every failure, its exit code, signal and pid
        except OSError:
            pass
        first = first_failure(exc.failures, logs)
        told = told_already(exc.failures, logs, first)
        line = None if told else refused_elsewhere(exc.failures, logs, first)
        if line:  # the main process was stopped before it could say it
            print(f"leantrain train: error: {line}", file=sys.stderr, flush=True)
        if told or line:
            if fresh:  # one line said all: the others' logs repeat it
                _remove_logs(logs)
            return 2
        lines = describe_failures(exc.failures, logs, _world(module), first)
        for line in lines:
            print(f"leantrain train: {line}", file=sys.stderr, flush=True)
        return 2 if exc.failures[first].exitcode == 2 else 1
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    return 0


def _remove_logs(logs: Path) -> None:
    logging.shutdown()  # the agent's log file closed first
    shutil.rmtree(logs, ignore_errors=True)


def _world(module: str) -> int | None:
    """The job's number of processes, from the launcher's flags (--num_processes, --nproc-per-node)."""
    for flag in ("--num_processes", "--nproc-per-node", "--nproc_per_node"):
        if flag in sys.argv[1:]:
            try:
                return int(sys.argv[sys.argv.index(flag) + 1])
            except (IndexError, ValueError):
                return None
    return None


class _FolderOnFirstLine(logging.FileHandler):
    """A file handler that makes its folder when it first writes: a job without failures leaves no logs/."""

    def _open(self):
        Path(self.baseFilename).parent.mkdir(parents=True, exist_ok=True)
        return super()._open()


def _log_to_file(path: Path) -> None:
    """The elastic agent's own log lines ("Sending process 123 closing signal SIGTERM", "failed (exitcode: -9)")
    into `path`: the job's failure is told once, in leantrain's words."""
    import torch.distributed.elastic.agent.server.api  # their loggers exist once imported
    import torch.distributed.elastic.multiprocessing.api
    import torch.distributed.run  # noqa: F401

    handler: logging.Handler = _FolderOnFirstLine(path, delay=True)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    for name, logger in list(logging.Logger.manager.loggerDict.items()):
        if name.startswith("torch.distributed") and isinstance(logger, logging.Logger):
            logger.propagate = False
            logger.addHandler(handler)


def describe_failures(
    failures: dict[int, Any], logs: Path, world: int | None = None, first: int | None = None
) -> list[str]:
    """A job's failures (torch elastic's `ProcessFailure`s by global rank) in a few lines: the first failure
    (`first_failure`, unless given), then the others as its consequences."""
    if first is None:
        first = first_failure(failures, logs)
    of = f" of {world}" if world else ""
    lines = [f"error: process {first}{of} {_how(failures[first], logs / f'process-{first}.log')} (the first failure)"]
    then = [
        f"process {r} {_then(failures[r], _lost_a_peer(logs / f'process-{r}.log'))}"
        for r in sorted(failures)
        if r != first
    ]
    if then:
        lines.append("then: " + "; ".join(then))
    lines.append(f"the launcher's report and each failed process's traceback: {logs}")
    return lines


def first_failure(failures: dict[int, Any], logs: Path) -> int:
    """The rank whose failure caused the others: not stopped by the agent (SIGTERM) nor by a lost connection to
    another process (its traceback in `logs` says so); the earliest of those."""
    causes = [r for r in failures if not _consequence(failures, r, logs)] or list(failures)
    return min(causes, key=lambda r: (failures[r].timestamp, r))


def told_already(failures: dict[int, Any], logs: Path, first: int) -> bool:
    """The main process refused the input (exit 2: its one line is on the terminal), and every other process
    refused it too or was stopped for it (a slower one is stopped before it reads the input): nothing to add."""
    if 0 not in failures or failures[0].exitcode != 2:  # refused, whichever process refused first: on the screen
        return False
    return all(failures[r].exitcode == 2 or _consequence(failures, r, logs) for r in failures if r != 0)


def refused_elsewhere(failures: dict[int, Any], logs: Path, first: int) -> str | None:
    """Input that another process refused first (exit 2, its line in its log) while every other process refused it
    too or was stopped for it, the main process before it could say so on the terminal (a loaded machine): that
    line, to be told as the main process's would be; None otherwise."""
    log = logs / f"process-{first}.log"
    if first == 0 or failures[first].exitcode != 2 or not log.is_file():
        return None
    if not all(failures[r].exitcode == 2 or _consequence(failures, r, logs) for r in failures if r != first):
        return None
    return (log.read_text().strip().splitlines() or [""])[-1].removeprefix("leantrain train: ") or None


def _consequence(failures: dict[int, Any], rank: int, logs: Path) -> bool:
    return failures[rank].exitcode == -signal.SIGTERM or _lost_a_peer(logs / f"process-{rank}.log")


def _lost_a_peer(log: Path) -> bool:
    try:
        text = log.read_text()
    except OSError:
        return False
    return any(words in text for words in PEER_LOST)


def _how(failure: Any, log: Path) -> str:
    if failure.exitcode < 0:
        name = _signal(-failure.exitcode)
        why = " (the kernel's out-of-memory killer, or a kill -9)" if name == "SIGKILL" else ""
        return f"was killed by {name}{why}, pid {failure.pid}"
    if failure.exitcode == 2 and log.is_file():  # input it refused, said in its log (`launch.report_failure`)
        line = (log.read_text().strip().splitlines() or [""])[-1].removeprefix("leantrain train: ")
        return f"exited with code 2: {line}"
    said = " (its error is above)" if log.is_file() or failure.exitcode == 2 else ""
    return f"exited with code {failure.exitcode}{said}"


def _then(failure: Any, lost_a_peer: bool) -> str:
    if lost_a_peer:
        return "lost its connection to it and stopped"
    if failure.exitcode == -signal.SIGTERM:
        return "was stopped by the launcher (SIGTERM)"
    if failure.exitcode < 0:
        return f"was killed by {_signal(-failure.exitcode)}"
    return f"exited with code {failure.exitcode}"


def _signal(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


if __name__ == "__main__":
    sys.exit(main())
