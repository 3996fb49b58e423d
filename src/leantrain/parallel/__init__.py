"""The one place that touches Accelerate and torch.distributed.

Everything else asks this module for an `Accelerator`, the device facts and the precision choice,
so that swapping or upgrading the distributed engine changes one folder.
"""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path


@functools.lru_cache(maxsize=1)
def cpuinfo() -> dict[str, str]:
    """The first processor's fields in /proc/cpuinfo (empty where there is none)."""
    fields: dict[str, str] = {}
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return fields
    for line in text.splitlines():
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
    return fields


def cpu_flags() -> frozenset[str]:
    return frozenset(cpuinfo().get("flags", "").split())


#: the instruction sets that decide a CPU's matmul speed by precision (AVX-512 BF16 and AMX run bf16 natively)
MATMUL_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_fp16")


def cpu_model() -> str:
    """The CPU's name with its family, model and matmul instruction sets: 'AMD EPYC' alone names several
    generations (an AVX2 one and an AVX-512 BF16 one measure differently)."""
    fields = cpuinfo()
    flags = [f for f in MATMUL_FLAGS if f in cpu_flags()]
    family = f"family {fields['cpu family']} model {fields.get('model', '?')}" if "cpu family" in fields else ""
    return ", ".join(filter(None, [cpu_name(), family, " ".join(flags) or "no AVX2"]))


def cpu_name() -> str:
    if name := cpuinfo().get("model name"):
        return name
    import platform

    return platform.processor() or platform.machine()


@dataclass(frozen=True)
class PrecisionSupport:
    supported: bool
    fast: bool
    why: str


def precision_support(device_type: str) -> dict[str, PrecisionSupport]:
    """Whether bf16/fp16 run at all, and whether they run faster than fp32, on this device."""
    import torch

    if device_type == "cuda":
        major, minor = torch.cuda.get_device_capability()
        cap = f"compute capability {major}.{minor}"
        bf16 = torch.cuda.is_bf16_supported()
        return {
            "bf16": PrecisionSupport(bf16, bf16 and major >= 8, f"{cap}: bf16 tensor cores need 8.0 (Ampere) or newer"),
            "fp16": PrecisionSupport(True, major >= 7, f"{cap}: fp16 tensor cores need 7.0 (Volta) or newer"),
        }
    flags = cpu_flags()
    amx_bf16 = "amx_bf16" in flags
    avx_bf16 = "avx512_bf16" in flags
    bf16_why = (
        "AMX-BF16 matrix units"
        if amx_bf16
        else "AVX-512 BF16 instructions"
        if avx_bf16
        else "no AVX-512 BF16 or AMX: bf16 is emulated, many times slower than fp32"
    )
    fp16_why = (
        "AMX-FP16 matrix units"
        if "amx_fp16" in flags
        else "AVX-512 FP16 but no AMX-FP16: fp16 runs no faster than fp32 on this CPU"
        if "avx512_fp16" in flags
        else "no AVX-512 FP16 or AMX-FP16: fp16 is emulated, its matmuls about 100x slower than fp32's"
    )
    return {
        "bf16": PrecisionSupport(True, amx_bf16 or avx_bf16, bf16_why),
        "fp16": PrecisionSupport(True, "amx_fp16" in flags, fp16_why),
    }


#: Accelerate's switch to the CPU where a GPU is visible (`accelerate launch --cpu` sets it; so does --cpu)
CPU_ENV = "ACCELERATE_USE_CPU"


def cpu_forced() -> bool:
    return os.environ.get(CPU_ENV, "").lower() in ("1", "true")


@contextlib.contextmanager
def cpu_only(on: bool = True) -> Iterator[None]:
    """A run on the CPU while it lasts (--cpu), through Accelerate's own switch: every choice of device, its
    Accelerator's included, and the processes it launches read it."""
    if not on:
        yield
        return
    before = os.environ.get(CPU_ENV)
    os.environ[CPU_ENV] = "true"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(CPU_ENV, None)
        else:
            os.environ[CPU_ENV] = before


def device_type() -> str:
    import torch

    if torch.cuda.is_available() and not cpu_forced():
        return "cuda"
    return "cpu"


def choose_precision(requested: str, device: str | None = None) -> tuple[str, str]:
    """Resolve `auto`: the user's Accelerate config when it sets a precision, else bf16 where the device runs it
    fast, else fp32; say why (which source won)."""
    device = device or device_type()
    if requested != "auto":
        return requested, "set by --precision" + _not_faster(requested, device)
    from leantrain.parallel.precision import accelerate_precision

    configured = accelerate_precision()  # the user's Accelerate config, when --precision is left to auto
    if configured is not None:
        return configured[0], configured[1] + _not_faster(configured[0], device)
    bf16 = precision_support(device)["bf16"]
    if bf16.fast:
        return "bf16", f"auto: bf16 runs fast here ({bf16.why})"
    return "fp32", f"auto: fp32, since bf16 would not be faster here ({bf16.why})"


def _not_faster(precision: str, device: str) -> str:
    """Why a half precision someone chose runs no faster than fp32 on this device (bf16 on a CPU without AVX-512 BF16
    or AMX is emulated, several times slower), as a clause; empty where it is fast or fp32."""
    support = precision_support(device).get(precision)
    return f"; {support.why}" if support is not None and support.supported and not support.fast else ""


def make_accelerator(
    precision: str, shard: str = "none", log_with: list[str] | None = None, timeout_seconds: float | None = None
):
    """One Accelerator per run. Mixed precision maps to Accelerate's autocast ('no' for fp32).

    shard="fsdp" shards parameters, gradients and optimizer state with FSDP2, one transformer layer per unit:
    on GPUs through Accelerate's FSDP plugin; on CPU processes the trainer shards the model itself
    (`parallel.sharding`) and this Accelerator places the rest. `log_with` names the experiment
    trackers (`--report-to`, started by `parallel.trackers.start_trackers` once the run's folder exists).
    `timeout_seconds`: how long a collective waits (--collective-timeout), set where the processes first connect
    (a process that has run a job before keeps its group, and the group's timeout).
    """
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState

    # AcceleratorState is a process-wide singleton that refuses a second precision; a process that runs
    # several jobs (the Python API, tests, `leantrain bench`) resets it. The process group is kept.
    AcceleratorState._reset_state(reset_partial_state=False)
    mixed = {"fp32": "no", "bf16": "bf16", "fp16": "fp16"}[precision]
    cpu = device_type() == "cpu"
    kwargs = {}
    if shard == "fsdp":
        if not cpu:
            kwargs["fsdp_plugin"] = fsdp_plugin()
    elif shard != "none":
        from leantrain.errors import ConfigError

        raise ConfigError(f"--shard must be none or fsdp; got '{shard}'")
    # The schedule counts global optimizer steps, so the scheduler steps once per optimizer step.
    # cpu=True on a host without CUDA: under torchrun, Accelerate otherwise reports a single process
    # and leaves the model unwrapped, though torch.distributed runs with several ranks.
    if log_with:  # trackers write under the run's folder, set when they start (a placeholder now)
        kwargs.update(log_with=log_with, project_dir=os.getcwd())
    if not cpu:  # batches copied from pinned memory without the host waiting for the device
        from accelerate import DataLoaderConfiguration

        kwargs["dataloader_config"] = DataLoaderConfiguration(non_blocking=True)
    if timeout_seconds is not None:
        from datetime import timedelta

        from accelerate.utils import InitProcessGroupKwargs

        kwargs["kwargs_handlers"] = [InitProcessGroupKwargs(timeout=timedelta(seconds=timeout_seconds))]
    return Accelerator(mixed_precision=mixed, step_scheduler_with_optimizer=False, cpu=cpu, **kwargs)


def fsdp_plugin():
    """Accelerate's FSDP2 plugin, for GPUs: Accelerate turns it on only for accelerator states (on MULTI_CPU, gloo,
    it would silently train plain DDP), so CPU processes shard through `parallel.sharding` instead."""
    from accelerate.utils import FullyShardedDataParallelPlugin

    return FullyShardedDataParallelPlugin(
        fsdp_version=2,
        auto_wrap_policy="transformer_based_wrap",
        reshard_after_forward=True,
        state_dict_type="FULL_STATE_DICT",
        cpu_ram_efficient_loading=False,
    )


def seed_everything(seed: int) -> None:
    from accelerate.utils import set_seed

    set_seed(seed)


@contextlib.contextmanager
def callers_random_states() -> Iterator[None]:
    """Within, a call may seed and draw from the process's generators (Python's, NumPy's, torch's CPU one, and the
    GPUs' where the caller has used them); after it, returned or raised, they are as the caller left them."""
    import random

    import numpy as np
    import torch

    python, numpy = random.getstate(), np.random.get_state()
    gpus = list(range(torch.cuda.device_count())) if torch.cuda.is_initialized() else []
    with torch.random.fork_rng(devices=gpus):
        try:
            yield
        finally:
            random.setstate(python)
            np.random.set_state(numpy)


def environment_report() -> list[tuple[str, str]]:
    """What Accelerate detects here, and what it means for training: rows for `leantrain env`."""
    import platform

    import accelerate
    import torch
    import transformers
    from accelerate import PartialState

    from leantrain._version import __version__
    from leantrain.paths import cache_paths

    state = PartialState()
    device = device_type()
    rows = [
        ("leantrain", __version__),
        ("device", f"{state.device} ({device})"),
        ("device count", str(torch.cuda.device_count() if device == "cuda" else 1)),
        ("device name", torch.cuda.get_device_name(0) if device == "cuda" else cpu_name()),
        ("distributed type", str(state.distributed_type).split(".")[-1]),
        ("processes", f"{state.num_processes} (this is process {state.process_index})"),
        ("CPU threads (torch)", str(torch.get_num_threads())),
        ("OpenMP wait policy", os.environ.get("OMP_WAIT_POLICY", "libgomp's default (spin, then sleep)")),
        ("CPU threads governor", _governor_row()),
    ]
    for name, support in precision_support(device).items():
        verdict = (
            ("fast" if support.fast else "supported, not faster than fp32") if support.supported else "unsupported"
        )
        rows.append((name, f"{verdict}: {support.why}"))
    chosen, why = choose_precision("auto", device)
    rows.append(("--precision auto", f"{chosen} ({why.removeprefix('auto: ')})"))
    rows += [
        ("python", platform.python_version()),
        ("torch", torch.__version__),
        ("transformers", transformers.__version__),
        ("accelerate", accelerate.__version__),
        ("datasets", package_version("datasets")),
    ]
    return rows + cache_paths()


def package_version(name: str) -> str:
    """An installed distribution's version, without importing it (datasets is needed only for some inputs)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return "not installed"


def broadcast_from_main(value):
    """The main process's `value` on every process (a no-op with one process)."""
    from accelerate import PartialState
    from accelerate.utils import broadcast_object_list

    if PartialState().num_processes == 1:
        return value
    return broadcast_object_list([value], from_process=0)[0]


def any_process(accelerator, flag: bool) -> bool:
    """Whether `flag` is true on any process: one all-reduce with several processes, none with one.

    Every process must call it at the same point (the OOM fallback calls it after every micro-step)."""
    if accelerator.num_processes == 1:
        return flag
    import torch

    t = torch.tensor([1.0 if flag else 0.0], device=accelerator.device)
    return float(accelerator.reduce(t, reduction="sum")) > 0


def rank_info(environ: Mapping[str, str] | None = None) -> tuple[int, int]:
    """(global rank, world size) of this process as its launcher set them; (0, 1) when not launched."""
    env = os.environ if environ is None else environ
    return int(env.get("RANK", 0)), int(env.get("WORLD_SIZE", 1))


def _governor_row() -> str:
    from leantrain.parallel.threads import GOVERNOR_ENV

    if os.environ.get(GOVERNOR_ENV) == "1":
        return (
            "available: with --thread-governor a training run gives a thread back for each core other processes "
            "hold (not bitwise repeatable); off by default"
        )
    return "off (OMP_NUM_THREADS set by you or a CPU quota, LEANTRAIN_THREAD_GOVERNOR=0, or not the CLI)"
