"""CPU threads on a shared machine (issue #16): the usable CPUs honour a container's quota, a `leantrain`
command's training gives a thread back for each core other processes hold, and a user's own settings are kept."""

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


def test_the_environment_gets_the_quota_as_threads_or_else_the_governor(tmp_path, monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3})
    environ: dict[str, str] = {}
    chosen = threads.prepare_environment(environ, cgroup(tmp_path, v2="200000 100000"))
    assert environ == chosen == {"OMP_NUM_THREADS": "2", threads.CHOSEN_THREADS_ENV: "1"}
    assert not threads.threads_are_users(environ)  # a launcher still splits the quota's CPUs among its ranks
    mine = {"OMP_WAIT_POLICY": "PASSIVE", "OMP_NUM_THREADS": "3"}  # the user's own settings win
    assert threads.prepare_environment(mine, tmp_path) == {} and mine["OMP_WAIT_POLICY"] == "PASSIVE"
    assert threads.threads_are_users(mine)
    no_quota: dict[str, str] = {}
    threads.prepare_environment(no_quota, tmp_path / "none")
    # OpenMP already counts the affinity mask; spinning waits stay (passive ones cost a quiet run 12-27%)
    assert no_quota == {threads.GOVERNOR_ENV: "1"}
    off = {threads.GOVERNOR_ENV: "0"}
    assert threads.prepare_environment(off, tmp_path / "none") == {} and off == {threads.GOVERNOR_ENV: "0"}


@pytest.mark.slow  # launches `leantrain env`: about 8 s here
def test_the_leantrain_command_hands_the_thread_count_to_the_governor():
    env = {k: v for k, v in os.environ.items() if not k.startswith("OMP_") and k != threads.GOVERNOR_ENV}
    out = subprocess.run(
        [sys.executable, "-m", "leantrain", "env"], env=env, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    row = next(line for line in out.stdout.splitlines() if "CPU threads governor" in line)
    assert "available: with --thread-governor" in row


class Machine:
    """A fake clock and CPU counters: `others` cores of other processes and `own` cores of this one."""

    def __init__(self):
        self.now = self.busy = self.mine = 0.0
        self.set: list[int] = []

    def run(self, seconds: float, others: float, own: float = 2.0) -> None:
        self.now += seconds
        self.busy += seconds * (others + own)
        self.mine += seconds * own

    def governor(self, threads_: int = 2, **kw) -> threads.ThreadGovernor:
        return threads.ThreadGovernor(
            threads_, {0, 1}, set_threads=self.set.append, busy=lambda: self.busy, own=lambda: self.mine,
            clock=lambda: self.now, **kw,
        )  # fmt: skip


def test_the_governor_gives_a_thread_back_while_another_process_holds_a_core_and_takes_it_again():
    m = Machine()
    g = m.governor()
    m.run(3, others=0.05)
    assert g.update() is None and g.threads == 2  # quiet: background noise is within the slack
    m.run(3, others=0.9)
    assert g.update() == 1 and m.set == [1] and g.others == pytest.approx(0.9)
    m.run(1, others=0.0)
    assert g.update() is None and m.set == [1]  # within the interval: not measured yet
    m.run(2, others=0.0, own=1.0)
    assert g.update() == 2 and m.set == [1, 2]  # the neighbour left


@pytest.mark.parametrize("others, expected", [(0.2, 4), (0.3, 3), (1.2, 3), (1.3, 2), (2.5, 1), (7.0, 1)])
def test_the_governor_keeps_one_thread_less_per_core_held_beyond_the_slack(others, expected):
    m = Machine()
    g = m.governor(4)
    m.run(2, others=others)
    g.update()
    assert g.threads == expected and m.set == ([] if expected == 4 else [expected])


def test_busy_seconds_read_the_given_cpus_of_proc_stat(tmp_path, monkeypatch):
    monkeypatch.setattr(os, "sysconf", lambda name: 100)
    stat = tmp_path / "stat"
    stat.write_text(
        "cpu  900 0 900 9000 0 0 0 0 0 0\n"
        "cpu0 100 0 100 1000 50 0 0 0 0 0\n"
        "cpu1 200 5 100 1000 50 10 10 25 0 0\n"  # user nice system idle iowait irq softirq steal
        "cpu2 300 0 100 1000 50 0 0 0 0 0\n"
        "intr 1 2 3\n\n"
    )
    assert threads.busy_seconds({1}, stat) == pytest.approx(3.5)  # 200+5+100+10+10+25 ticks at 100 per second
    assert threads.busy_seconds({0, 2}, stat) == pytest.approx(6.0)
    assert threads.busy_seconds({1, 5}, stat) is None  # a CPU it cannot see: no measurement rather than a wrong one
    assert threads.busy_seconds({0}, tmp_path / "none") is None


def test_the_neighbour_load_is_what_other_processes_used_of_this_processs_cpus(tmp_path, monkeypatch):
    """Their busy time less this process's own, over the wall time: 3 s of the CPUs busy in 2 s, 1 s of it this
    process's, is 1 core of others'; a /proc/stat that cannot be read tells nothing."""
    clock, own = iter([10.0, 12.0]), iter([5.0, 6.0])
    monkeypatch.setattr(threads.time, "monotonic", lambda: next(clock))
    monkeypatch.setattr(threads, "own_cpu_seconds", lambda: next(own))
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    monkeypatch.setattr(os, "sysconf", lambda name: 100)
    stat = tmp_path / "stat"
    stat.write_text("cpu0 100 0 0 1000 0 0 0 0\ncpu1 100 0 0 1000 0 0 0 0\n")
    since = threads.neighbour_load(stat)
    stat.write_text("cpu0 250 0 0 1000 0 0 0 0\ncpu1 250 0 0 1000 0 0 0 0\n")
    assert since() == pytest.approx(1.0)
    clock, own = iter([10.0, 12.0]), iter([5.0, 6.0])
    assert threads.neighbour_load(tmp_path / "none")() is None


def test_the_governor_runs_only_when_asked_and_where_the_thread_count_is_leantrains_to_choose(monkeypatch):
    import torch

    monkeypatch.setattr(torch, "get_num_threads", lambda: 2)
    monkeypatch.setenv(threads.GOVERNOR_ENV, "1")
    assert threads.thread_governor(False, 1, 0, "cpu") == (None, None)  # off unless --thread-governor
    governor, why = threads.thread_governor(True, 1, 0, "cpu")
    assert isinstance(governor, threads.ThreadGovernor) and why is None
    assert threads.thread_governor(True, 2, 0, "cpu")[0] is None  # ranks of a launch share the CPUs already
    assert threads.thread_governor(True, 1, 2, "cpu")[0] is None  # loader workers' CPU would count as a neighbour's
    assert threads.thread_governor(True, 1, 0, "cuda") == (None, None)
    monkeypatch.setattr(torch, "get_num_threads", lambda: 1)
    assert threads.thread_governor(True, 1, 0, "cpu")[0] is None
    monkeypatch.setattr(torch, "get_num_threads", lambda: 2)
    monkeypatch.delenv(threads.GOVERNOR_ENV)  # the Python API, or the user's OMP_NUM_THREADS
    governor, why = threads.thread_governor(True, 1, 0, "cpu")
    assert governor is None and "OMP_NUM_THREADS" in why


def test_a_training_run_asks_the_governor_every_step_and_says_when_the_count_changes(
    tiny_model_dir, sentiment_csv, cache_dir, tmp_path, monkeypatch, capsys
):
    from leantrain import TrainConfig, train

    m = Machine()
    g = m.governor()
    calls = []

    def clock():  # each step takes a second, beside a neighbour holding a core
        calls.append(g.threads)
        m.run(1, others=1.0)
        return m.now

    g.clock = clock
    monkeypatch.setattr(threads, "thread_governor", lambda asked, *a: (g if asked else None, None))
    cfg = TrainConfig(
        model=str(tiny_model_dir), data=str(sentiment_csv), output_dir=str(tmp_path / "run"), cache_dir=str(cache_dir),
        batch_size=16, max_steps=3, progress=False, report=False, precision="fp32", thread_governor=True,
    )  # fmt: skip
    train(cfg)
    assert calls == [2, 2, 1] and m.set == [1]  # asked after each of the 3 steps; measured after two seconds
    assert "step 2: 1 of 2 CPU threads (other processes used 1.0 cores" in capsys.readouterr().err


def test_a_launcher_splits_the_quotas_cpus_among_its_ranks(monkeypatch):
    """Under a quota of 4 CPUs of 8 the CLI sets 4 threads; two launched ranks then get 2 each, not 4 each."""
    from leantrain import TrainConfig
    from leantrain.commands import launch

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(8)))
    monkeypatch.setattr(threads, "cgroup_cpu_quota", lambda root=None: 4.0)
    environ: dict[str, str] = {}
    threads.prepare_environment(environ)
    assert environ["OMP_NUM_THREADS"] == "4"
    for key, value in environ.items():
        monkeypatch.setenv(key, value)
    _, env = launch.launch_command(TrainConfig(num_processes=2, data="x.csv"), gpus=0)
    assert env["OMP_NUM_THREADS"] == "2"


#: a neighbour that holds one core from its start to its end
BURNER = "while True:\n    pass\n"


@pytest.mark.slow  # two `leantrain train` runs of MiniLM, 40 steps each beside a burning neighbour: 110-150 s here
def test_the_same_job_twice_beside_a_cpu_burning_neighbour_gives_the_same_bits(minilm_dir, sentiment_csv, tmp_path):
    """The neighbour burns from the start of the first run, and from a few seconds into the second one's training:
    a thread count that followed it would change at other steps in the two runs (as the governor's did)."""
    import hashlib
    import time

    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMP_", "LEANTRAIN_THREAD"))}
    env.update(HF_HUB_OFFLINE="1")
    digests, errors = [], []
    for run, burn_after in (("a", None), ("b", 4.0)):
        out = tmp_path / run
        burner = subprocess.Popen([sys.executable, "-c", BURNER]) if burn_after is None else None
        job = subprocess.Popen(
            [sys.executable, "-m", "leantrain", "train", "--model", str(minilm_dir), "--data", str(sentiment_csv),
             "--max-steps", "40", "--batch-size", "16", "--log-every", "1", "--precision", "fp32", "--no-report",
             "--no-progress", "--cache-dir", str(tmp_path / "cache"), "--output-dir", str(out)],
            env=env, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        try:
            if burner is None:  # a few seconds into training (its first logged step)
                while not any(p.stat().st_size for p in out.glob(".incomplete-*/metrics.jsonl")) and job.poll() is None:
                    time.sleep(0.05)
                time.sleep(burn_after)
                burner = subprocess.Popen([sys.executable, "-c", BURNER])
            _, err = job.communicate(timeout=600)
        finally:
            burner.kill()
            burner.wait()
        assert job.returncode == 0, err[-3000:]
        digests.append(hashlib.sha256((out / "model" / "model.safetensors").read_bytes()).hexdigest())
        errors.append(err)
    assert not any("CPU threads (other processes used" in err for err in errors)  # the count never moved
    assert digests[0] == digests[1]


def test_the_governor_is_off_unless_asked(tiny_model_dir, sentiment_csv, cache_dir, tmp_path, monkeypatch):
    """Bitwise repeatability is the default: a run that does not ask for --thread-governor gets none."""
    from leantrain import TrainConfig, train

    asked = []
    monkeypatch.setattr(threads, "thread_governor", lambda wanted, *a: (asked.append(wanted), (None, None))[1])
    assert TrainConfig().thread_governor is False
    cfg = TrainConfig(
        model=str(tiny_model_dir), data=str(sentiment_csv), output_dir=str(tmp_path / "run"), cache_dir=str(cache_dir),
        batch_size=16, max_steps=1, progress=False, report=False, precision="fp32",
    )  # fmt: skip
    train(cfg)
    assert asked == [False]


def test_without_the_governor_a_watch_says_once_what_a_neighbours_load_costs(
    tiny_model_dir, sentiment_csv, cache_dir, tmp_path, monkeypatch, capsys
):
    """Off by default, the governor still watches: a run slowed by a neighbour says once that its threads wait on
    the neighbour's cores and what --thread-governor would do."""
    from leantrain import TrainConfig, train

    m = Machine()
    watch = m.governor(interval=2.0, slack=0.5)

    def clock():  # each step takes a second, beside a neighbour holding a core
        m.run(1, others=1.0)
        return m.now

    watch.clock = clock
    monkeypatch.setattr(threads, "busy_watch", lambda *a: watch)
    cfg = TrainConfig(
        model=str(tiny_model_dir), data=str(sentiment_csv), output_dir=str(tmp_path / "run"), cache_dir=str(cache_dir),
        batch_size=8, max_steps=5, progress=False, report=False, precision="fp32",
    )  # fmt: skip
    train(cfg)
    said = capsys.readouterr().err
    assert said.count("other processes used 1.0 of this run's 2 cores") == 1 and "--thread-governor gives" in said


def test_the_watch_runs_where_the_governor_could_and_sets_no_threads(monkeypatch):
    import torch

    monkeypatch.setattr(torch, "get_num_threads", lambda: 2)
    monkeypatch.setenv(threads.GOVERNOR_ENV, "1")
    set_threads = []
    monkeypatch.setattr(torch, "set_num_threads", set_threads.append)
    watch = threads.busy_watch(1, 0, "cpu")
    assert isinstance(watch, threads.ThreadGovernor) and watch.interval == 10.0
    watch.set_threads(1)
    assert set_threads == []
    assert threads.busy_watch(2, 0, "cpu") is None and threads.busy_watch(1, 2, "cpu") is None
    assert threads.busy_watch(1, 0, "cuda") is None
    monkeypatch.delenv(threads.GOVERNOR_ENV)  # the user's OMP_NUM_THREADS: the flag would not run, so no hint
    assert threads.busy_watch(1, 0, "cpu") is None
