"""CPU threads on a shared machine (issue #16): the usable CPUs honour a container's quota, the `leantrain`
command makes OpenMP threads sleep rather than spin at barriers, and a user's own settings are kept."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from leantrain.parallel import threads


def cgroup(tmp_path, v2: str | None = None, v1: tuple[int, int] | None = None):
    if v2 is not None:
        (tmp_path / "cpu.max").write_text(v2 + "\n")
    if v1 is not None:
        (tmp_path / "cpu").mkdir()
        (tmp_path / "cpu" / "cpu.cfs_quota_us").write_text(f"{v1[0]}\n")
        (tmp_path / "cpu" / "cpu.cfs_period_us").write_text(f"{v1[1]}\n")
    return tmp_path


@pytest.mark.parametrize(
    "v2, v1, quota",
    [
        ("150000 100000", None, 1.5),  # cgroup v2: 1.5 CPUs
        ("max 100000", None, None),  # v2, no limit
        (None, (50000, 100000), 0.5),  # cgroup v1
        (None, (-1, 100000), None),  # v1, no limit
        (None, None, None),  # no cgroup files
    ],
)
def test_the_cgroup_cpu_quota_is_read_from_v2_or_v1(tmp_path, v2, v1, quota):
    assert threads.cgroup_cpu_quota(cgroup(tmp_path, v2, v1)) == quota


def test_usable_cpus_are_the_affinity_capped_by_the_quota(tmp_path, monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3})
    for name, quota, cpus in (("a", "150000 100000", 2), ("b", "50000 100000", 1), ("c", "800000 100000", 4)):
        (tmp_path / name).mkdir()
        assert threads.usable_cpus(cgroup(tmp_path / name, v2=quota)) == cpus
    assert threads.usable_cpus(tmp_path / "none") == 4


def test_the_environment_gets_passive_waits_and_the_quota_as_threads(tmp_path, monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3})
    environ: dict[str, str] = {}
    chosen = threads.prepare_environment(environ, cgroup(tmp_path, v2="200000 100000"))
    assert environ == chosen == {"OMP_WAIT_POLICY": "PASSIVE", "OMP_NUM_THREADS": "2", threads.CHOSEN_THREADS_ENV: "1"}
    assert not threads.threads_are_users(environ)  # a launcher still splits the quota's CPUs among its ranks
    mine = {"OMP_WAIT_POLICY": "ACTIVE", "OMP_NUM_THREADS": "3"}  # the user's own settings win
    assert threads.prepare_environment(mine, tmp_path) == {} and mine["OMP_WAIT_POLICY"] == "ACTIVE"
    assert threads.threads_are_users(mine)
    no_quota: dict[str, str] = {}
    threads.prepare_environment(no_quota, tmp_path / "none")
    assert "OMP_NUM_THREADS" not in no_quota  # OpenMP already counts the affinity mask


@pytest.mark.slow  # launches `leantrain env`: about 8 s here
def test_the_leantrain_command_sets_them_before_torch_loads():
    env = {k: v for k, v in os.environ.items() if not k.startswith("OMP_")}
    out = subprocess.run(
        [sys.executable, "-m", "leantrain", "env"], env=env, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    row = next(line for line in out.stdout.splitlines() if "OpenMP wait policy" in line)
    assert "PASSIVE" in row


def test_a_launcher_splits_the_quotas_cpus_among_its_ranks(monkeypatch):
    """Under a quota of 4 CPUs of 8 the CLI sets 4 threads; two launched ranks then get 2 each, not 4 each."""
    from leantrain import TrainConfig, launch

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(8)))
    monkeypatch.setattr(threads, "cgroup_cpu_quota", lambda root=None: 4.0)
    environ: dict[str, str] = {}
    threads.prepare_environment(environ)
    assert environ["OMP_NUM_THREADS"] == "4"
    for key, value in environ.items():
        monkeypatch.setenv(key, value)
    _, env = launch.launch_command(TrainConfig(num_processes=2, data="x.csv"), gpus=0)
    assert env["OMP_NUM_THREADS"] == "2"
