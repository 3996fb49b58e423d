"""Start the processes of a data-parallel job, or notice that we are already one of them.

`leantrain train --num-processes N` (or `--num-machines M`) runs itself again through a launcher,
which starts the processes that train:

* `--launcher accelerate` (default): `accelerate launch --multi_gpu`, which runs torchrun in turn.
  On a CPU host this still starts N gloo ranks (plain `accelerate launch --cpu` would start one);
* `--launcher torchrun`: `torch.distributed.run` (torchrun) directly;
* `--launcher ray`: Ray Train's `TorchTrainer` with `--ray-workers` workers, each running the same
  training function (`pip install "leantrain[ray]"`).

Each started process trains, through Accelerate: gloo between CPU processes, NCCL between GPUs.
A process started by any launcher (ours, or the user's own `torchrun`/`accelerate launch`, or Ray)
carries `RANK`/`LOCAL_RANK`/`WORLD_SIZE` in its environment, and never launches again.

Failures: torchrun's agent watches its processes; when one exits non-zero or is killed, it stops the
others and exits non-zero, and every process reports its own error on stderr, naming its rank.

Reliability: the command that launches holds the output directory's lock for the whole job and
tells its processes so (`LEANTRAIN_LOCK_HOLDER`). Each process dies with its parent (a parent-death signal), so
killing the top-level `leantrain train`, even with SIGKILL, leaves nothing training unobserved. SIGTERM sent to
it is passed on; Ctrl-C reaches every process of the terminal's group; either way the processes save a
checkpoint at the next step boundary and every one exits 128 + the signal's number.
"""

from __future__ import annotations

import math
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from leantrain.config import TrainConfig
from leantrain.errors import ConfigError, LeantrainError
from leantrain.parallel import rank_info
from leantrain.telemetry.console import Console, counted

#: set in each process our launchers start; with the variables below it marks "already launched"
LAUNCHED_ENV = "LEANTRAIN_LAUNCHED"
#: present in every process that torchrun, `accelerate launch --multi_gpu` or Ray Train starts
TORCH_LAUNCH_ENV = ("RANK", "LOCAL_RANK", "WORLD_SIZE")
#: set by every `accelerate launch`, also the single-process one that sets no RANK
ACCELERATE_LAUNCH_ENV = "ACCELERATE_DYNAMO_BACKEND"
DEFAULT_PORT = 29500


# -- where are we ------------------------------------------------------------------------------------


def launched(environ: Mapping[str, str] | None = None) -> bool:
    """True in a process that a launcher started: it trains, it does not launch again."""
    env = os.environ if environ is None else environ
    return LAUNCHED_ENV in env or ACCELERATE_LAUNCH_ENV in env or any(k in env for k in TORCH_LAUNCH_ENV)


def needs_launch(cfg: TrainConfig, environ: Mapping[str, str] | None = None) -> bool:
    """Should `leantrain train` start processes (rather than train in this one)?"""
    if launched(environ):
        return False
    return cfg.launcher == "ray" or (cfg.num_processes or 1) > 1 or cfg.num_machines > 1


def check_launched(cfg: TrainConfig, environ: Mapping[str, str] | None = None) -> None:
    """Inside a launched process: refuse flags that disagree with what the launcher started."""
    env = os.environ if environ is None else environ
    if not launched(env) or env.get("LEANTRAIN_RAY_WORKER"):
        return
    local_world = int(env.get("LOCAL_WORLD_SIZE", env.get("WORLD_SIZE", 1)))
    world = int(env.get("WORLD_SIZE", 1))
    if cfg.num_processes is not None and cfg.num_processes != local_world:
        raise ConfigError(
            f"--num-processes {cfg.num_processes}, but the launcher that started this process "
            f"started {local_world} on this machine; drop --num-processes, or run plain "
            f"`leantrain train --num-processes {cfg.num_processes}` and let leantrain launch"
        )
    if cfg.num_machines > 1 and world != local_world * cfg.num_machines:
        raise ConfigError(
            f"--num-machines {cfg.num_machines}, but the launcher started {world} processes in all "
            f"({local_world} on this machine)"
        )


def check_shard(cfg: TrainConfig) -> None:
    """Fail before launching anything when --shard asks for what the run cannot do."""
    processes = max((cfg.num_processes or 1) * cfg.num_machines, int(os.environ.get("WORLD_SIZE", "1")))
    if cfg.shard == "fsdp" and processes < 2 and cfg.launcher != "ray":
        raise ConfigError("--shard fsdp shards across processes; give --num-processes 2 or more")


# -- the launch commands -------------------------------------------------------------------------------


def cpu_count() -> int:
    """The CPUs this process may use (affinity, capped by a container's CPU quota)."""
    from leantrain.parallel.threads import usable_cpus

    return usable_cpus()


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def gpu_count() -> int:
    import torch

    from leantrain.parallel import cpu_forced

    if cpu_forced():
        return 0
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def launch_command(
    cfg: TrainConfig, *, gpus: int = 0, cores: int | None = None, python: str = sys.executable, port: int | None = None
) -> tuple[list[str], dict[str, str]]:
    """The launcher command line that runs `python -m leantrain train` with `cfg` in every process,
    and the environment variables to add for it."""
    from leantrain.parallel import CPU_ENV
    from leantrain.parallel.threads import threads_are_users

    nproc = cfg.num_processes or 1
    if cfg.cpu:  # the launcher and its processes off the GPUs, before each process reads its own --cpu
        gpus = 0
    if cfg.num_machines > 1 and not cfg.main_process_ip:
        raise ConfigError(
            f"--num-machines {cfg.num_machines} needs --main-process-ip: the address of machine rank 0, "
            "which every machine can reach"
        )
    if gpus and nproc > gpus:
        raise ConfigError(
            f"--num-processes {nproc}, but this machine has {gpus} GPU(s): start at most one process per GPU"
        )
    env = {LAUNCHED_ENV: "1"} | ({CPU_ENV: "true"} if cfg.cpu else {})
    if not gpus and not threads_are_users():
        # CPU ranks share the cores: one rank per core beats oversubscribed thread pools
        env["OMP_NUM_THREADS"] = str(max(1, (cores or cpu_count()) // nproc))
    train = ["-m", "leantrain", "train", *cfg.to_argv()]
    if cfg.launcher == "torchrun":
        return [python, "-m", "torch.distributed.run", *_torchrun_flags(cfg, nproc), *train], env
    if cfg.launcher == "accelerate":
        return [python, "-m", "accelerate.commands.launch", *_accelerate_flags(cfg, nproc, gpus, port), *train], env
    raise ConfigError(f"--launcher {cfg.launcher} does not start processes with a command line")


def _torchrun_flags(cfg: TrainConfig, nproc: int) -> list[str]:
    flags = ["--nproc-per-node", str(nproc)]
    if cfg.num_machines == 1 and not cfg.main_process_ip and cfg.main_process_port is None:
        flags.append("--standalone")  # a private rendezvous on a free local port
    else:
        flags += ["--nnodes", str(cfg.num_machines), "--node-rank", str(cfg.machine_rank)]
        flags += ["--master-addr", cfg.main_process_ip or "127.0.0.1"]
        flags += ["--master-port", str(cfg.main_process_port or DEFAULT_PORT)]
    return [*flags, "--max-restarts", "0", "--monitor-interval", "0.5"]


def _accelerate_flags(cfg: TrainConfig, nproc: int, gpus: int, port: int | None) -> list[str]:
    given_port = cfg.main_process_port
    if cfg.num_machines == 1 and given_port is None:
        given_port = port or free_port()  # accelerate would take 29500, which another job may hold
    flags = ["--multi_gpu", "--num_processes", str(nproc * cfg.num_machines)]
    if gpus:
        flags += ["--gpu_ids", "all"]
    flags += ["--num_machines", str(cfg.num_machines), "--machine_rank", str(cfg.machine_rank)]
    flags += ["--main_process_ip", cfg.main_process_ip or "127.0.0.1"]
    flags += ["--main_process_port", str(given_port or DEFAULT_PORT)]
    # static rendezvous: machine rank 0 holds global rank 0 (the one that writes)
    flags += ["--same_network", "--rdzv_backend", "static"]
    flags += ["--mixed_precision", "no", "--dynamo_backend", "no"]  # the loop chooses these itself
    return [*flags, "--max_restarts", "0", "--monitor_interval", "0.5"]


def launch(cfg: TrainConfig) -> int:
    """Start the job's processes on this machine and wait for them. Returns the job's exit code."""
    from leantrain.run.directory import LOCK_HOLDER_ENV, OutputLock

    if note := cfg.scheduler_note():  # the processes are given the resolved schedule: said here
        Console().info(note)
    # Every process must agree on the output directory: fix the timestamped default here, once.
    cfg = cfg.resolved()
    assert cfg.output_dir is not None
    held = None
    if cfg.machine_rank == 0:  # the machine whose rank 0 writes the run; held until this process ends
        held = OutputLock(cfg.output_dir).acquire()
    holder = {LOCK_HOLDER_ENV: str(os.getpid())} if held is not None else {}
    try:
        return launch_ray(cfg, holder) if cfg.launcher == "ray" else _launch_here(cfg, holder)
    finally:
        if held is not None:  # a job refused before it wrote anything leaves no folder it made
            held.release(remove_if_bare=True)


def _launch_here(cfg: TrainConfig, holder: dict[str, str]) -> int:
    """Run torchrun or `accelerate launch` for this machine's processes and wait."""
    assert cfg.output_dir is not None
    cmd, extra = launch_command(cfg, gpus=gpu_count())
    extra.update(holder)
    extra[FAILURE_LOGS_ENV] = str(Path(cfg.output_dir).resolve() / "logs")
    nproc = cfg.num_processes or 1
    where = "this machine"
    if cfg.num_machines > 1:
        where = (
            f"machine {cfg.machine_rank} of {cfg.num_machines}, main process at "
            f"{cfg.main_process_ip}:{cfg.main_process_port or DEFAULT_PORT}"
        )
    Console().info(f"starting {counted(nproc, 'process', 'processes')} on {where} with {cfg.launcher}")
    return run_and_wait(cmd, {**os.environ, **extra})


def run_and_wait(cmd: list[str], env: dict[str, str]) -> int:
    """Run the launcher and wait. SIGTERM/SIGHUP are passed on to it; Ctrl-C (SIGINT) already reaches every
    process of the terminal's group, so it is only noted. A job stopped by a signal exits 128 + its number."""
    if cmd[1:2] == ["-m"] and cmd[2] in ("accelerate.commands.launch", "torch.distributed.run"):
        cmd = [cmd[0], "-m", "leantrain.parallel.agent", *cmd[2:]]  # the same launcher, quiet when signalled
    proc = subprocess.Popen(cmd, env=env, preexec_fn=die_with_parent)
    received: list[int] = []

    def forward(signum, _frame):
        received.append(signum)
        if proc.poll() is None:
            proc.send_signal(signum)

    def note(signum, _frame):
        received.append(signum)

    previous = {s: signal.signal(s, forward) for s in (signal.SIGTERM, signal.SIGHUP)}
    previous[signal.SIGINT] = signal.signal(signal.SIGINT, note)  # the launcher stops its processes
    try:
        rc = proc.wait()
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    if received and rc != 0:  # the processes said what they saved and how to resume
        return 128 + received[0]
    if rc < 0:  # the launcher itself was killed (a job that failed says so through the agent)
        print(f"leantrain train: error: the job failed (its launcher: signal {-rc})", file=sys.stderr, flush=True)
    return 1 if rc < 0 else rc


# -- Ray Train ------------------------------------------------------------------------------------------


def launch_ray(cfg: TrainConfig, holder: dict[str, str] | None = None) -> int:
    """Run the training function in `--ray-workers` Ray Train workers (a TorchTrainer) and wait."""
    import json
    import shutil
    import tempfile

    try:
        import ray
        from ray.train import RunConfig, ScalingConfig
        from ray.train.torch import TorchConfig, TorchTrainer
    except ImportError:
        raise ConfigError('--launcher ray needs Ray Train: pip install "leantrain[ray]" (or "ray[train]")') from None
    workers = cfg.ray_workers or cfg.num_processes or 1
    storage = tempfile.mkdtemp(prefix="leantrain-ray-")
    Console().info(f"starting {workers} Ray Train worker(s) ({'one GPU' if cfg.use_gpu else 'CPU'} each)")
    init: dict[str, Any] = {"log_to_driver": True, "include_dashboard": False}
    if not os.environ.get("RAY_ADDRESS"):
        init["_temp_dir"] = os.environ.get("LEANTRAIN_RAY_TMPDIR") or None
    try:
        ray.init(**{k: v for k, v in init.items() if v is not None})
        timeout = cfg.collective_timeout_seconds  # Ray starts the process group: its timeout is set here
        trainer = TorchTrainer(
            _ray_worker,
            torch_config=TorchConfig(timeout_s=math.ceil(timeout)) if timeout is not None else None,
            train_loop_config={"config": cfg.to_dict(), "env": holder or {}},
            scaling_config=ScalingConfig(num_workers=workers, use_gpu=cfg.use_gpu),
            run_config=RunConfig(name="leantrain", storage_path=storage),
        )
        try:
            trainer.fit()
        except Exception as exc:  # ray.train.TrainingFailedError and kin: a worker failed
            print(
                f"leantrain train: error: a Ray Train worker failed: {_first_lines(exc)}", file=sys.stderr, flush=True
            )
            return 1
    finally:
        if ray.is_initialized():
            ray.shutdown()
        shutil.rmtree(storage, ignore_errors=True)
    assert cfg.output_dir is not None  # launch() resolved the config
    metrics = json.loads((Path(cfg.output_dir) / "metrics.json").read_text())
    print_result(metrics, Path(cfg.output_dir) / "model")
    return 0


def _ray_worker(loop_config: dict) -> None:
    """One Ray Train worker: Ray has set RANK/WORLD_SIZE/LOCAL_RANK/MASTER_* and the process group."""
    from leantrain.api import train

    os.environ["LEANTRAIN_RAY_WORKER"] = "1"
    os.environ.update(loop_config.get("env") or {})  # the driver holds the output directory's lock for them
    rank, world = rank_info()
    cfg = TrainConfig.from_dict(loop_config["config"])
    with report_failure(rank, world, failure_logs(cfg.output_dir)):
        train(cfg)


def _first_lines(exc: BaseException, n: int = 6) -> str:
    text = str(exc).strip()
    lines = [x for x in text.splitlines() if x.strip()]
    return " | ".join(lines[-n:]) if lines else type(exc).__name__


# -- inside a launched process --------------------------------------------------------------------------

from leantrain.parallel.agent import COLLECTIVE_TIMEOUT, FAILURE_LOGS_ENV, PEER_LOST  # noqa: E402 - beside its use


class ProcessFailed(LeantrainError):
    """A process of a launched job failed; the message says how, its traceback is in the job's log folder."""

    exit_code = 1


def failure_logs(output_dir: str | Path | None = None) -> Path | None:
    """The folder a launched job writes its failures into: the launcher's choice, else OUTPUT_DIR/logs."""
    where = os.environ.get(FAILURE_LOGS_ENV) or (Path(output_dir) / "logs" if output_dir else None)
    return Path(where) if where else None


class report_failure:
    """Context manager: in a job of several processes, a process that fails says so in one line naming its rank
    (a lost connection to another process as the consequence it is), its traceback written to the job's log
    folder rather than the terminal."""

    def __init__(self, rank: int, world: int, logs: Path | None = None):
        self.rank, self.world, self.logs = rank, world, logs

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None or self.world <= 1 or issubclass(exc_type, (SystemExit, KeyboardInterrupt)):
            return
        who = f"process {self.rank} of {self.world}"
        if issubclass(exc_type, LeantrainError):  # the user's to fix: the main process's line says it once
            if self.rank != 0:  # every process refuses the same input: its line goes to its log, not the terminal
                log = self._write(f"leantrain train: {who} failed: {exc}\n")
                exc.told_in = log  # type: ignore[union-attr]
            return
        import traceback

        first = (str(exc).strip().splitlines() or [""])[0][:300]
        log = self._write("".join(traceback.format_exception(exc_type, exc, tb)))
        kept = f"; its traceback is in {log}" if log is not None else ""
        lost = next((words for words in PEER_LOST if words in str(exc)), None)
        if lost is not None:
            raise ProcessFailed(
                f"{who} stopped after another process failed: it lost its connection to it ({exc_type.__name__}: "
                f"{lost}){kept}"
            ) from None
        if any(words in str(exc) for words in COLLECTIVE_TIMEOUT):
            raise ProcessFailed(
                f"{who} gave up waiting for another process at a collective (--collective-timeout, else torch's "
                f"default): {exc_type.__name__}: {first}{kept}"
            ) from None
        raise ProcessFailed(f"{who} failed: {exc_type.__name__}: {first}{kept}") from None

    def _write(self, text: str) -> Path | None:
        if self.logs is None:
            return None
        try:
            self.logs.mkdir(parents=True, exist_ok=True)
            path = self.logs / f"process-{self.rank}.log"
            path.write_text(text)
            return path
        except OSError:
            return None


PR_SET_PDEATHSIG = 1  # linux/prctl.h


def die_with_parent() -> None:
    """Have the kernel SIGKILL this process when its parent dies (Linux; elsewhere nothing happens).

    Called in each launched process and, through Popen's preexec_fn, in the launcher the top-level command
    starts: killing the top-level `leantrain train` then takes the whole job with it."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    parent = os.getppid()
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:  # the parent died before the request took effect
        os.kill(os.getpid(), signal.SIGKILL)


def print_result(metrics: dict[str, Any], model_dir: Path) -> None:
    # every evaluation score the run reports (--metrics), the loss left to metrics.json
    names = {"eval_macro_f1": "macro-F1"}
    scores = "  ".join(
        f"{names.get(k, k.removeprefix('eval_'))} {v:.4f}"
        for k, v in metrics.items()
        if k.startswith("eval_") and k != "eval_loss" and isinstance(v, (int, float))
    )
    print(f"{scores}  ({metrics['train_samples_per_second']:.1f} samples/s)  model: {model_dir}")
