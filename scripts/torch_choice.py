"""Which torch build `scripts/install.sh` installs on this machine (standard library only).

    python scripts/torch_choice.py      # prints the choice (and, for local-cpu, the wheel); the reason on stderr

- keep:      torch is already importable by this Python: leave it alone (the user chose that build).
- cuda:      an NVIDIA GPU is present: torch from the default index, whose Linux wheels carry CUDA.
- cpu-index: no NVIDIA GPU, Linux: the CPU build from PyTorch's own index (without it pip pulls the
             CUDA build and several GB of GPU libraries nobody will use).
- local-cpu: no NVIDIA GPU, the CPU index cannot be reached, but pip's find-links folders hold a CPU
             wheel of torch for this Python (a machine's local wheel cache): install that file.
- default:   no NVIDIA GPU and the CPU index cannot be reached (machines that see only a package
             registry or mirror), or not Linux (macOS and Windows wheels on PyPI are CPU builds already).
             On Linux the default index's torch is the CUDA build: it works on a CPU, but weighs GBs more.

Tests drive it without touching the machine: LEANTRAIN_FAKE_TORCH=0/1 (torch present?),
LEANTRAIN_FAKE_GPU=0/1 (NVIDIA GPU present?), LEANTRAIN_CPU_INDEX (the CPU index URL to probe); the
local wheel folders are pip's own find-links settings (PIP_FIND_LINKS, pip.conf).
"""

from __future__ import annotations

import importlib.util
import os
import platform
import re
import shutil
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

CPU_INDEX = "https://download.pytorch.org/whl/cpu"
PROBE_TIMEOUT_S = 5.0  # an unreachable index must cost seconds, not pip's default 15 s x 5 retries


@dataclass(frozen=True)
class Choice:
    kind: str  # keep, cuda, cpu-index, local-cpu or default
    reason: str
    wheel: str | None = None  # local-cpu: the wheel file to install


def choose(
    *,
    torch_present: bool,
    nvidia_gpu: bool,
    linux: bool,
    cpu_index_reachable: Callable[[], bool],
    local_cpu_wheel: Callable[[], str | None] = lambda: None,
) -> Choice:
    """The decision alone. The last two are callables so the index is probed, and the folders searched,
    only when the answer depends on them."""
    if torch_present:
        return Choice("keep", "torch is already installed here: leaving it as it is")
    if nvidia_gpu:
        return Choice("cuda", "NVIDIA GPU found: the CUDA build of torch from the default index")
    if not linux:
        return Choice("default", "no NVIDIA GPU, not Linux: the default index's torch is a CPU build")
    if cpu_index_reachable():
        return Choice("cpu-index", f"no NVIDIA GPU: the CPU build of torch from {cpu_index_url()}")
    wheel = local_cpu_wheel()
    if wheel is not None:
        why = f"no NVIDIA GPU, {cpu_index_url()} cannot be reached: the local CPU wheel {wheel}"
        return Choice("local-cpu", why, wheel)
    return Choice(
        "default",
        f"no NVIDIA GPU, and {cpu_index_url()} cannot be reached: torch from the default index "
        "(on Linux that may be the larger CUDA build)",
    )


def cpu_index_url() -> str:
    return os.environ.get("LEANTRAIN_CPU_INDEX", CPU_INDEX)


def torch_present() -> bool:
    fake = os.environ.get("LEANTRAIN_FAKE_TORCH")
    if fake is not None:
        return fake == "1"
    return importlib.util.find_spec("torch") is not None


def nvidia_gpu() -> bool:
    fake = os.environ.get("LEANTRAIN_FAKE_GPU")
    if fake is not None:
        return fake == "1"
    if os.path.exists("/proc/driver/nvidia"):
        return True
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return False
    try:
        return subprocess.run([smi, "-L"], capture_output=True, timeout=20).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def url_reachable(url: str, timeout: float = PROBE_TIMEOUT_S) -> bool:
    """Whether the index answers at all (any HTTP status counts: it is there)."""
    try:
        with urllib.request.urlopen(url.rstrip("/") + "/torch/", timeout=timeout):
            return True
    except urllib.error.HTTPError:
        return True
    except (OSError, ValueError):  # refused, DNS failure, timeout, proxy refusal, bad URL
        return False


def find_links_dirs() -> list[Path]:
    """The local folders pip searches for wheels (--find-links from the environment and pip.conf)."""
    try:
        out = subprocess.run(
            [sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True, timeout=60
        ).stdout
    except (OSError, subprocess.TimeoutExpired):
        return []
    dirs = []
    for line in out.splitlines():
        key, _, value = line.partition("=")
        if key.endswith(".find-links"):
            for item in value.strip("'\"").split():
                path = Path(item.removeprefix("file://"))
                if "://" not in item.removeprefix("file://") and path.is_dir() and path not in dirs:
                    dirs.append(path)
    return dirs


def local_cpu_wheel(dirs: list[Path]) -> str | None:
    """The newest CPU build of torch (a `+cpu` wheel) for this Python and machine in `dirs`, or None."""
    python_tag = f"cp{sys.version_info.major}{sys.version_info.minor}"
    found = []
    for folder in dirs:
        for wheel in folder.glob("torch-*.whl"):
            m = re.fullmatch(r"torch-(?P<version>[^-]+)-(?P<py>[^-]+)-[^-]+-(?P<plat>[^-]+)\.whl", wheel.name)
            if (
                m
                and m["version"].endswith("+cpu")
                and python_tag in m["py"].split(".")
                and m["plat"].startswith(("linux", "manylinux"))
                and m["plat"].endswith(platform.machine())
            ):
                release = tuple(int(p) for p in re.findall(r"\d+", m["version"].removesuffix("+cpu"))[:3])
                found.append((release, str(wheel)))
    return max(found)[1] if found else None


def main() -> int:
    choice = choose(
        torch_present=torch_present(),
        nvidia_gpu=nvidia_gpu(),
        linux=sys.platform.startswith("linux"),
        cpu_index_reachable=lambda: url_reachable(cpu_index_url()),
        local_cpu_wheel=lambda: local_cpu_wheel(find_links_dirs()),
    )
    print(f"leantrain install: {choice.reason}", file=sys.stderr)
    print(choice.kind if choice.wheel is None else f"{choice.kind} {choice.wheel}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
