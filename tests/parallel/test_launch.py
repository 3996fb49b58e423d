"""The launcher's decisions and command lines, without starting any process."""

from __future__ import annotations

import pytest

from leantrain.commands import cli, launch
from leantrain.config import TrainConfig
from leantrain.errors import ConfigError


def cfg(**kw) -> TrainConfig:
    return TrainConfig(**{"model": "m", "data": "d.csv", "output_dir": "out", **kw})


def test_a_launched_process_is_recognised_by_its_environment():
    assert not launched({})
    assert not launched({"SLURM_PROCID": "0", "OMP_NUM_THREADS": "1"})
    for env in (
        {"RANK": "0"},
        {"LOCAL_RANK": "1"},
        {"WORLD_SIZE": "2"},
        {"LEANTRAIN_LAUNCHED": "1"},
        {"ACCELERATE_DYNAMO_BACKEND": "NO"},
    ):
        assert launched(env), env


def launched(env):
    return launch.launched(env)


@pytest.mark.parametrize(
    "changes, expected",
    [
        ({}, False),
        ({"num_processes": 1}, False),
        ({"num_processes": 2}, True),
        ({"num_machines": 2, "main_process_ip": "10.0.0.1"}, True),
        ({"launcher": "ray", "ray_workers": 2}, True),
    ],
)
def test_launches_only_for_several_processes_machines_or_ray(changes, expected):
    assert launch.needs_launch(cfg(**changes), environ={}) is expected


def test_never_launches_again_inside_a_launched_process():
    env = {"RANK": "1", "LOCAL_RANK": "1", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2"}
    assert not launch.needs_launch(cfg(num_processes=2), environ=env)
    assert not launch.needs_launch(cfg(launcher="ray", ray_workers=2), environ=env)
    launch.check_launched(cfg(num_processes=2), environ=env)  # agrees with the launcher: fine
    launch.check_launched(cfg(), environ=env)  # under the user's own torchrun: fine
    with pytest.raises(ConfigError, match="--num-processes 4, but the launcher"):
        launch.check_launched(cfg(num_processes=4), environ=env)
    with pytest.raises(ConfigError, match="--num-machines 2"):
        launch.check_launched(cfg(num_machines=2, main_process_ip="h"), environ=env)


def test_torchrun_on_one_machine_is_standalone_with_one_thread_per_core(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    cmd, env = launch.launch_command(cfg(num_processes=2, launcher="torchrun", lr=3e-5), cores=2, python="py")
    assert cmd[:3] == ["py", "-m", "torch.distributed.run"]
    assert "--standalone" in cmd and _after(cmd, "--nproc-per-node") == "2"
    tail = cmd[cmd.index("leantrain") - 1 :]
    assert tail[:3] == ["-m", "leantrain", "train"]
    assert _after(tail, "--lr") == "3e-05" and _after(tail, "--num-processes") == "2"
    assert env == {"LEANTRAIN_LAUNCHED": "1", "OMP_NUM_THREADS": "1"}
    _, env = launch.launch_command(cfg(num_processes=2, launcher="torchrun"), cores=16)
    assert env["OMP_NUM_THREADS"] == "8"
    monkeypatch.setenv("OMP_NUM_THREADS", "3")  # the user's choice stands
    _, env = launch.launch_command(cfg(num_processes=2, launcher="torchrun"), cores=16)
    assert "OMP_NUM_THREADS" not in env
    _, env = launch.launch_command(cfg(num_processes=2, launcher="torchrun"), gpus=2)
    assert "OMP_NUM_THREADS" not in env  # GPU ranks keep torch's default


def test_cpu_launches_cpu_processes_on_a_machine_with_gpus(monkeypatch):
    """--cpu: the launcher is given Accelerate's switch (its processes never claim a GPU) and CPU ranks' threads;
    every process also reads --cpu itself."""
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    cmd, env = launch.launch_command(cfg(num_processes=2, cpu=True), gpus=2, cores=4)
    assert env["ACCELERATE_USE_CPU"] == "true" and env["OMP_NUM_THREADS"] == "2"
    assert "--gpu_ids" not in cmd and "--cpu" in cmd[cmd.index("leantrain") :]
    with pytest.raises(ConfigError, match="--num-processes 3"):  # the GPUs' count no longer bounds CPU ranks
        launch.launch_command(cfg(num_processes=3), gpus=2)
    launch.launch_command(cfg(num_processes=3, cpu=True), gpus=2)


def test_torchrun_on_several_machines_names_the_main_machine():
    c = cfg(
        num_processes=4,
        num_machines=2,
        machine_rank=1,
        main_process_ip="10.0.0.1",
        main_process_port=29600,
        launcher="torchrun",
    )
    cmd, _ = launch.launch_command(c, gpus=4)
    assert "--standalone" not in cmd
    assert [
        _after(cmd, f) for f in ("--nproc-per-node", "--nnodes", "--node-rank", "--master-addr", "--master-port")
    ] == ["4", "2", "1", "10.0.0.1", "29600"]


def test_accelerate_launch_starts_every_rank_with_multi_gpu_also_on_cpu():
    c = cfg(num_processes=2, num_machines=2, machine_rank=0, main_process_ip="10.0.0.1")
    cmd, _ = launch.launch_command(c, cores=2, python="py")
    assert cmd[:4] == ["py", "-m", "accelerate.commands.launch", "--multi_gpu"]  # --cpu would start one
    assert [
        _after(cmd, f)
        for f in (
            "--num_processes",
            "--num_machines",
            "--machine_rank",
            "--main_process_ip",
            "--main_process_port",
            "--rdzv_backend",
        )
    ] == ["4", "2", "0", "10.0.0.1", "29500", "static"]
    assert "--same_network" in cmd
    one, _ = launch.launch_command(cfg(num_processes=2), port=41234)
    assert _after(one, "--main_process_port") == "41234"  # a free port, not 29500 that another job may hold
    assert "--gpu_ids" not in one
    gpu, _ = launch.launch_command(cfg(num_processes=2), gpus=2)
    assert _after(gpu, "--gpu_ids") == "all"


def test_bad_launch_requests_fail_in_one_line():
    with pytest.raises(ConfigError, match="needs --main-process-ip"):
        launch.launch_command(cfg(num_machines=2, machine_rank=1))
    with pytest.raises(ConfigError, match="this machine has 1 GPU"):
        launch.launch_command(cfg(num_processes=2), gpus=1)
    with pytest.raises(ConfigError, match="does not start processes with a command line"):
        launch.launch_command(cfg(launcher="ray"))


def test_flags_rebuild_the_same_config():
    c = cfg(
        num_processes=2,
        lr=1e-4,
        epochs=0.5,
        progress=False,
        activation_checkpointing=True,
        limit=7,
        text_column="my text",
        grad_accum=3,
        local_sgd_steps=2,
        launcher="torchrun",
    )
    argv = ["train", *c.to_argv()]
    assert cli.config_from_args(cli.build_parser().parse_args(argv)) == c
    assert TrainConfig().to_argv() == []
    # a YAML file may set --eval-fraction beside --eval-data (unread): the processes are not handed the pair, which
    # flags refuse together
    both = TrainConfig(data="d.csv", eval_data="e.csv", eval_fraction=0.2)
    argv = ["train", *both.to_argv()]
    assert "--eval-fraction" not in argv and cli.config_from_args(cli.build_parser().parse_args(argv)).eval_data


def test_train_hands_off_to_the_launcher(monkeypatch):
    seen = []
    monkeypatch.setattr(launch, "launch", lambda c: seen.append(c) or 0)
    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LEANTRAIN_LAUNCHED", "ACCELERATE_DYNAMO_BACKEND"):
        monkeypatch.delenv(name, raising=False)
    assert cli.main(["train", "--num-processes", "2", "--model", "m", "--data", "d.csv"]) == 0
    assert seen and seen[0].num_processes == 2


def test_fsdp_needs_two_processes_and_is_refused_before_anything_starts(capsys, monkeypatch):
    """--shard fsdp runs on CPU processes too (torch's FSDP2, parallel.sharding), but shards across processes:
    one process is refused in one line, before any work."""
    monkeypatch.setattr(launch, "gpu_count", lambda: 0)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert cli.main(["train", "--shard", "fsdp", "--model", "m", "--data", "d"]) == 2
    assert "--shard fsdp shards across processes" in capsys.readouterr().err
    seen: list = []
    monkeypatch.setattr(launch, "launch", lambda c: seen.append(c) or 0)
    assert cli.main(["train", "--shard", "fsdp", "--num-processes", "2", "--model", "m", "--data", "d"]) == 0
    assert seen and seen[0].shard == "fsdp"


def _after(cmd: list[str], flag: str) -> str:
    return cmd[cmd.index(flag) + 1]


def test_a_jobs_failures_are_told_first_failure_first_and_the_survivors_as_consequences(tmp_path):
    from types import SimpleNamespace

    from leantrain.parallel.agent import describe_failures

    def failure(exitcode: int, timestamp: int, pid: int) -> SimpleNamespace:
        return SimpleNamespace(exitcode=exitcode, timestamp=timestamp, pid=pid)

    # rank 0 failed first by the clock (a second's resolution) but only lost its peer; rank 1 was killed
    (tmp_path / "process-0.log").write_text("RuntimeError: ... Connection reset by peer\n")
    lines = describe_failures({0: failure(1, 10, 100), 1: failure(-9, 10, 101)}, tmp_path, 2)
    assert lines[0].startswith("error: process 1 of 2 was killed by SIGKILL") and "pid 101" in lines[0]
    assert lines[1] == "then: process 0 lost its connection to it and stopped"
    assert str(tmp_path) in lines[2] and len(lines) == 3
    # the agent's own SIGTERM to the others is a consequence too; a rank that raised is the cause
    (tmp_path / "process-2.log").write_text("ValueError: bad shapes\n")
    lines = describe_failures({1: failure(-15, 10, 101), 2: failure(1, 11, 102)}, tmp_path, 4)
    assert lines[0] == "error: process 2 of 4 exited with code 1 (its error is above) (the first failure)"
    assert lines[1] == "then: process 1 was stopped by the launcher (SIGTERM)"


def test_input_every_process_refuses_is_told_once_and_a_refusal_elsewhere_names_its_process(tmp_path, capsys):
    """Bad input refused by every process of a job: the main process's line alone reaches the terminal (the others'
    go to their logs) and the job exits 2; a refusal by another process alone is told with its line."""
    from types import SimpleNamespace

    from leantrain.commands.launch import report_failure
    from leantrain.errors import DataError
    from leantrain.parallel.agent import describe_failures

    for rank in (0, 1):
        with pytest.raises(DataError) as refused, report_failure(rank, 2, tmp_path):
            raise DataError("pairs.jsonl: no 'label' column")
        assert (getattr(refused.value, "told_in", None) is not None) == (rank == 1)
    assert capsys.readouterr().err == ""  # (the CLI prints the main process's line)
    assert (
        tmp_path / "process-1.log"
    ).read_text() == "leantrain train: process 1 of 2 failed: pairs.jsonl: no 'label' column\n"
    lines = describe_failures({1: SimpleNamespace(exitcode=2, timestamp=10, pid=7)}, tmp_path, 2)
    assert lines[0] == (
        "error: process 1 of 2 exited with code 2: process 1 of 2 failed: pairs.jsonl: no 'label' column "
        "(the first failure)"
    )


def test_a_refusal_by_the_main_process_is_told_once_whether_the_others_refused_or_were_stopped_first(tmp_path):
    """On a loaded machine a slower process is stopped by the launcher before it reads the input the main process
    refused: still the main process's line alone (it read four lines then). A process that failed on its own, or a
    refusal by another process alone, is told."""
    from types import SimpleNamespace

    from leantrain.parallel.agent import first_failure, told_already

    def told(failures: dict[int, tuple[int, int]]) -> bool:
        failures = {r: SimpleNamespace(exitcode=code, timestamp=t, pid=r) for r, (code, t) in failures.items()}
        return told_already(failures, tmp_path, first_failure(failures, tmp_path))

    assert told({0: (2, 10), 1: (2, 10)})  # every process refused
    assert told({0: (2, 10), 1: (-15, 10)})  # the other was stopped before it could
    assert not told({0: (2, 10), 1: (1, 11)})  # the other failed on its own: told as a consequence or not
    assert not told({0: (-15, 11), 1: (2, 10)})  # another process refused: its line is in its log, not on screen
    assert not told({0: (1, 10), 1: (-15, 10)})


def test_a_refusal_by_another_process_before_the_main_process_says_it_is_told_in_its_one_line(tmp_path):
    """On a loaded machine process 1 can refuse the input and the launcher stop process 0 before it says it: the
    refusal is told in one line as the main process's would be; a process stopped for another reason is not."""
    from types import SimpleNamespace

    from leantrain.parallel.agent import first_failure, refused_elsewhere, told_already

    both = {0: SimpleNamespace(exitcode=2, timestamp=11, pid=0), 1: SimpleNamespace(exitcode=2, timestamp=10, pid=1)}
    both_refused = (both, tmp_path, first_failure(both, tmp_path))

    def line(failures: dict[int, tuple[int, int]]) -> str | None:
        failures = {r: SimpleNamespace(exitcode=code, timestamp=t, pid=r) for r, (code, t) in failures.items()}
        return refused_elsewhere(failures, tmp_path, first_failure(failures, tmp_path))

    assert line({0: (-15, 11), 1: (2, 10)}) is None  # no log of process 1's: nothing to tell it with
    (tmp_path / "process-1.log").write_text("leantrain train: process 1 of 2 failed: train.csv: no 'prompt' column\n")
    assert line({0: (-15, 11), 1: (2, 10)}) == "process 1 of 2 failed: train.csv: no 'prompt' column"
    assert told_already(*both_refused) and line({0: (2, 11), 1: (2, 10)})  # both: the main's line is on screen
    assert line({0: (1, 11), 1: (2, 10)}) is None  # the main process failed on its own: told as two failures
    assert line({0: (2, 10), 1: (-15, 11)}) is None  # the main process refused first: its line is on screen


def test_a_process_that_lost_its_peer_says_so_and_keeps_its_traceback_in_the_log_folder(tmp_path):
    from leantrain.commands.launch import ProcessFailed, report_failure

    with pytest.raises(ProcessFailed) as lost, report_failure(0, 2, tmp_path):
        raise RuntimeError("[pair.cc:553] Connection closed by peer [127.0.0.1]:5287. This is typically caused ...")
    assert str(lost.value).startswith("process 0 of 2 stopped after another process failed: it lost its connection")
    assert "Traceback" in (tmp_path / "process-0.log").read_text() and lost.value.exit_code == 1
    with pytest.raises(ProcessFailed) as waited, report_failure(0, 2, tmp_path):
        raise RuntimeError("[../gloo/transport/tcp/unbound_buffer.cc:78] Timed out waiting 5000ms for recv operation")
    assert str(waited.value).startswith("process 0 of 2 gave up waiting for another process at a collective")
    failed = r"process 1 of 2 failed: KeyError: 'x'; its traceback is in"
    with pytest.raises(ProcessFailed, match=failed), report_failure(1, 2, tmp_path):
        raise KeyError("x")
    with pytest.raises(KeyError), report_failure(0, 1, tmp_path):  # one process: a bug keeps its traceback
        raise KeyError("y")
