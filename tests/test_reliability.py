"""Never lose or mix a run (issue #19): the output directory's lock, a full disk, --overwrite, non-finite weights,
orphaned workers, Ctrl-C and preemption, durable and atomic publishing, checkpoint integrity, false refusals
on resume, and `--resume` at the wrong folder.

Faults are real where the machine allows: a small tmpfs for a full disk (skipped where mounting is refused),
real signals, real concurrent processes. Every test that tries a fault or a bad input is registered with
`@fault(...)`; docs/reliability.md lists them and `test_the_docs_table_lists_every_fault_the_suite_tries`
keeps the two equal.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from leantrain import TrainConfig, train
from leantrain.errors import ConfigError, LeantrainError
from leantrain.run import checkpoint, directory

REPO = Path(__file__).resolve().parents[1]
HELPER = Path(__file__).with_name("reliability_helper.py")
DOCS = REPO / "docs" / "reliability.md"
JOB_TIMEOUT = 240

#: test name -> (what breaks, what leantrain does); docs/reliability.md's table is checked against it
FAULTS: dict[str, tuple[str, str]] = {}


def fault(what: str, outcome: str) -> Callable:
    def register(test: Callable) -> Callable:
        FAULTS[test.__name__] = (what, outcome)
        return test

    return register


# -- fixtures and helpers ---------------------------------------------------------------------------------------


@pytest.fixture()
def job(tiny_model_dir, sentiment_csv, cache_dir, tmp_path):
    def make(name="run", **changes) -> TrainConfig:
        base = dict(
            model=str(tiny_model_dir),
            data=str(sentiment_csv),
            cache_dir=str(cache_dir),
            output_dir=str(tmp_path / name),
            batch_size=24,
            max_steps=4,
            lr=3e-3,
            precision="fp32",
            log_every=1,
            progress=False,
            seed=5,
            report=False,
        )
        return TrainConfig(**{**base, **changes})

    return make


def flags(cfg: TrainConfig) -> list[str]:
    return ["train", *cfg.to_argv()]


def env(**extra) -> dict[str, str]:
    keep = {
        k: v
        for k, v in os.environ.items()
        if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
        and not k.startswith(("ACCELERATE_", "LEANTRAIN_"))
    }
    return {**keep, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "1", **extra}


def start(args: list[str], helper: bool = False, **extra) -> subprocess.Popen:
    command = [sys.executable, str(HELPER)] if helper else [sys.executable, "-m", "leantrain"]
    return subprocess.Popen(
        command + args,
        env=env(**extra),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group: a test can signal the whole job, as a terminal does
    )


def finish(proc: subprocess.Popen, timeout: float = JOB_TIMEOUT) -> tuple[int, str, str]:
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"job hung for {timeout} s; stderr tail:\n{err[-3000:]}")
    return proc.returncode, out, err


def logged_a_step(out: Path) -> bool:
    """Training has begun: the run's log has a step's row (the file itself is opened while setting up, when a
    signal stops the run at once, nothing saved)."""
    return any(p.stat().st_size > 0 for p in out.glob(".incomplete-*/metrics.jsonl"))


def wait_for(condition: Callable[[], bool], proc: subprocess.Popen, what: str, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if proc.poll() is not None:
            _, err = proc.communicate()
            pytest.fail(f"the job ended (rc {proc.returncode}) before {what}:\n{err[-3000:]}")
        if time.monotonic() > deadline:
            os.killpg(proc.pid, signal.SIGKILL)
            pytest.fail(f"no {what} within {timeout} s")
        time.sleep(0.05)


def one_line_error(err: str) -> str:
    """The last line of stderr, checked to be leantrain's one-line error and no traceback."""
    assert "Traceback" not in err, err[-3000:]
    last = err.strip().splitlines()[-1]
    assert last.startswith("leantrain train: error: "), err[-2000:]
    return last


def digest(directory: Path) -> dict[str, str]:
    """Every file under `directory` (hidden machinery aside) with its content's hash."""
    out = {}
    for p in sorted(directory.rglob("*")):
        rel = p.relative_to(directory)
        if p.is_file() and not rel.parts[0].startswith(".") and "tensorboard" not in rel.parts:
            out[str(rel)] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def live_processes() -> dict[int, int]:
    """pid -> parent pid of every live (not zombie) process."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            state, ppid = (entry / "stat").read_text().rsplit(")", 1)[1].split()[:2]
        except (OSError, ValueError):
            continue
        if state != "Z":
            found[int(entry.name)] = int(ppid)
    return found


def descendants(pid: int) -> set[int]:
    """The live processes below `pid`: a launcher's agent and its workers (which run in sessions of their own)."""
    parents, found, frontier = live_processes(), set(), {pid}
    while frontier:
        frontier = {child for child, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found


@pytest.fixture()
def small_disk(tmp_path):
    """A real small file system (tmpfs) of the given size in MiB; skipped where mounting is not allowed."""
    mounted: list[Path] = []

    def make(mib: float) -> Path:
        where = tmp_path / f"disk-{len(mounted)}"
        where.mkdir()
        try:
            done = subprocess.run(
                ["mount", "-t", "tmpfs", "-o", f"size={int(mib * 1024)}k", "tmpfs", str(where)],
                capture_output=True,
                text=True,
            )
        except FileNotFoundError:
            pytest.skip("no mount command here")
        if done.returncode != 0:
            pytest.skip(f"cannot mount a small tmpfs here ({done.stderr.strip()})")
        mounted.append(where)
        return where

    yield make
    for where in mounted:
        subprocess.run(["umount", "-l", str(where)], capture_output=True)


# -- 1. one run per output directory ------------------------------------------------------------------------------


@fault(
    "a second run started into the output directory of a run in progress",
    "refused in one line naming the holder's pid, before it touches anything; the first run's staging and "
    "temporary checkpoint survive",
)
def test_a_second_run_into_a_busy_output_dir_is_refused_and_touches_nothing(job, tmp_path):
    cfg = job()
    out = Path(cfg.output_dir)
    out.mkdir()
    holder = subprocess.Popen(  # the first run's top-level process: it holds the lock and owns these files
        [
            sys.executable,
            "-c",
            "import sys, time; from leantrain.run.directory import OutputLock; OutputLock(sys.argv[1]).acquire(); "
            "print('held', flush=True); time.sleep(120)",
            str(out),
        ],
        stdout=subprocess.PIPE,
        text=True,
        env=env(),
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        staging, partial = out / f".incomplete-{holder.pid}", out / "checkpoints" / f".step-000002.tmp-{holder.pid}"
        staging.mkdir()
        (staging / "metrics.jsonl").write_text('{"step": 1}\n')
        partial.mkdir(parents=True)
        (partial / "model.safetensors").write_bytes(b"half")
        before = sorted(str(p.relative_to(out)) for p in out.rglob("*"))
        with pytest.raises(ConfigError, match=rf"in use by another leantrain run \(pid {holder.pid}\)"):
            train(cfg.replace(resume="auto"))
        with pytest.raises(ConfigError, match=rf"pid {holder.pid}"):
            train(cfg.replace(overwrite=True))
        assert sorted(str(p.relative_to(out)) for p in out.rglob("*")) == before
        assert (partial / "model.safetensors").read_bytes() == b"half"
    finally:
        holder.kill()
        holder.wait()
    # the OS released the lock with its holder's death: the directory is free, and its leftovers are a dead run's
    result = train(cfg.replace(overwrite=True, save_every=2))
    assert result.metrics["optimizer_steps"] == 4
    assert not staging.exists() and not partial.exists()


@fault(
    "a live run's staging and temporary checkpoint where the file system gives no lock (simulated: lock removed)",
    "a second run's start-up cleaning spares them: names carry the pid, and only dead runs' leftovers go",
)
def test_per_run_names_spare_a_live_runs_files_without_the_lock(job, monkeypatch):
    cfg = job(save_every=2)
    out = Path(cfg.output_dir)
    alive = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    try:
        live_files = [out / f".incomplete-{alive.pid}", out / "checkpoints" / f".step-000002.tmp-{alive.pid}"]
        dead_files = [out / f".incomplete-{dead.pid}", out / "checkpoints" / f".step-000002.tmp-{dead.pid}"]
        for d in live_files + dead_files:
            d.mkdir(parents=True)
            (d / "model.safetensors").write_bytes(b"half")
        (out / "checkpoints" / ".step-000002.tmp").mkdir()  # an older leantrain's name: no pid
        monkeypatch.setattr(directory.fcntl, "flock", lambda fd, how: None)  # a file system that cannot lock
        train(cfg.replace(overwrite=True))
        assert all((d / "model.safetensors").read_bytes() == b"half" for d in live_files)
        assert not any(d.exists() for d in dead_files) and not (out / "checkpoints" / ".step-000002.tmp").exists()
    finally:
        alive.kill()
        alive.wait()


@pytest.mark.slow  # 80 s measured on the 2 shared cores (load ~7)
@fault(
    "two `leantrain train` commands into one --output-dir, the second while the first trains",
    "the second exits 2 naming the first's pid; the first finishes with all its rows and its own checkpoints",
)
def test_two_real_runs_into_one_output_dir(job, tmp_path):
    cfg = job(max_steps=60, save_every=5, eval_every=30)
    out = Path(cfg.output_dir)
    first = start(flags(cfg), helper=True, LT_TEST_STEP_SLEEP="0.5")  # 30 s of training: the second starts meanwhile
    wait_for(lambda: (out / "checkpoints" / "step-000005").is_dir(), first, "first checkpoint")
    rc, _, err = finish(start(flags(cfg.replace(overwrite=True))))
    assert rc == 2 and f"pid {first.pid}" in one_line_error(err)
    assert first.poll() is None  # refused while the first was training
    rc, _, err = finish(first)
    assert rc == 0, err[-3000:]
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "loss" in r] == list(range(1, 61))
    assert sum("eval_accuracy" in r for r in rows) == 2  # at step 30, and the final evaluation
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == [f"step-{s:06d}" for s in range(5, 61, 5)]


@fault(
    "--output-dir on a read-only file system (a tmpfs remounted read-only), the folder new or already there",
    "one line naming the folder and the reason, exit 2, before any data is read",
)
@pytest.mark.parametrize("exists", [False, True], ids=["new", "existing"])
def test_a_read_only_output_dir_is_one_line_before_any_work(job, small_disk, exists, capsys):
    from leantrain.commands.cli import main

    disk = small_disk(1)
    if exists:
        (disk / "run").mkdir()
    done = subprocess.run(["mount", "-o", "remount,ro", str(disk)], capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot remount read-only here ({done.stderr.strip()})")
    cfg = job(output_dir=str(disk / "run"))
    capsys.readouterr()
    assert main(flags(cfg)) == 2
    line = one_line_error(capsys.readouterr().err)
    assert f"--output-dir: cannot write to '{disk / 'run'}' (Read-only file system)" in line
    assert not (Path(cfg.cache_dir) / "tokenized").exists()  # refused before the data was read


@fault(
    "the reader of the console goes away mid-run (`leantrain train 2>&1` piped into `head -1`)",
    "the run goes on without its console to its end: exit 0, the run folder complete, no staging left",
)
def test_a_console_reader_that_goes_away_does_not_stop_the_run(job):
    cfg = job()
    proc = subprocess.Popen(
        [sys.executable, "-m", "leantrain", *flags(cfg)], env=env(), stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    assert proc.stdout is not None
    proc.stdout.readline()  # the first line, as `head -1` reads it; then the pipe closes
    proc.stdout.close()
    try:
        code = proc.wait(timeout=JOB_TIMEOUT)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        pytest.fail(f"job hung for {JOB_TIMEOUT} s")
    out = Path(cfg.output_dir)
    assert code == 0
    assert (out / "model" / "model.safetensors").is_file() and (out / "metrics.json").is_file()
    assert not list(out.glob(".incomplete-*"))


def test_the_lock_is_released_when_train_fails_in_this_process(job, tmp_path):
    cfg = job(data=str(tmp_path / "missing.csv"))
    with pytest.raises(LeantrainError):
        train(cfg)
    assert not directory._HELD and not directory._ACTIVE
    # nothing holds it now: another process takes it at once
    probe = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from leantrain.run.directory import OutputLock; OutputLock(sys.argv[1]).acquire()",
            cfg.output_dir,
        ],
        env=env(),
        capture_output=True,
        text=True,
    )
    assert probe.returncode == 0, probe.stderr


def test_a_run_refused_before_training_leaves_no_folder_it_made(job, tmp_path):
    missing = str(tmp_path / "missing.csv")
    made = job(data=missing, output_dir=str(tmp_path / "runs" / "x"))
    with pytest.raises(LeantrainError):
        train(made)
    assert not (tmp_path / "runs").exists()  # the run made runs/ and runs/x: both go
    existing = tmp_path / "existing"
    existing.mkdir()
    with pytest.raises(LeantrainError):
        train(made.replace(output_dir=str(existing)))
    assert existing.is_dir() and not any(existing.iterdir())  # a folder that was there stays, without a lock file
    (existing / directory.LOCK_NAME).write_text("")  # one an earlier run left: not this run's to remove
    with pytest.raises(LeantrainError):
        train(made.replace(output_dir=str(existing)))
    assert [p.name for p in existing.iterdir()] == [directory.LOCK_NAME]
    assert not directory._HELD and not directory._ACTIVE


# -- 2. a full disk -------------------------------------------------------------------------------------------------


@fault(
    "the disk fills up during a checkpoint save (tmpfs): safetensors fails (SGD) or torch.save fails (AdamW)",
    "one line naming the path and the space needed, exit 2; the partial save removed, the previous checkpoint "
    "intact and resumable",
)
@pytest.mark.parametrize("optimizer", ["sgd", "adamw"])
def test_a_full_disk_during_a_checkpoint_is_one_line_and_keeps_the_previous(job, small_disk, optimizer, capsys):
    from leantrain.commands.cli import main

    model_mib = 8.0  # the tiny BERT's fp32 weights: 7.9 MiB; AdamW adds two moments per weight
    size = model_mib * 1.5 if optimizer == "sgd" else model_mib * 3 + model_mib * 1.5  # one checkpoint, not two
    disk = small_disk(size)
    cfg = job(output_dir=str(disk / "run"), optimizer=optimizer, save_every=2, max_steps=6)
    capsys.readouterr()
    assert main(flags(cfg)) == 2
    err = capsys.readouterr().err
    line = one_line_error(err)
    assert "the disk is full" in line and "MB needed" in line and "step-000002 is intact" in line
    assert str(disk / "run" / "checkpoints") in line
    root = disk / "run" / "checkpoints"
    assert sorted(p.name for p in root.iterdir()) == ["step-000002"]  # the partial step-4 save is gone
    assert checkpoint.verify(root / "step-000002").step == 2


@fault(
    "a disk too small for the final model, without --save-every (tmpfs)",
    "refused before any data is read, in one line naming the free space and the space the model needs, exit 2",
)
def test_a_disk_too_small_for_the_final_model_is_refused_before_training(job, small_disk, capsys):
    from leantrain.commands.cli import main

    disk = small_disk(5)  # less than the 7.9 MiB of weights
    cfg = job(output_dir=str(disk / "run"), max_steps=2)
    capsys.readouterr()
    assert main(flags(cfg)) == 2
    err = capsys.readouterr().err
    line = one_line_error(err)
    assert re.search(r"--output-dir .*/run: \d\.\d MB free, but the final model needs about \d+\.\d MB", line), line
    assert "optimizer steps (global batch" not in err  # refused before training began
    assert not (disk / "run" / "metrics.json").exists() and not any((disk / "run").glob(".incomplete*"))


@fault(
    "the disk fills up during training, so that the final model cannot be written (tmpfs)",
    "one line naming the path and the space needed, exit 2; nothing published; the trained state saved as a "
    "checkpoint in the cache folder, named with the command that resumes it into the same model",
)
def test_a_disk_that_fills_during_training_keeps_the_trained_state_elsewhere(job, small_disk, monkeypatch, capsys):
    import shutil as sh

    from leantrain.commands.cli import main
    from leantrain.training.trainer import Trainer

    alone = job("alone", max_steps=4)
    assert main(flags(alone)) == 0
    disk = small_disk(24)  # room for the model when the run starts
    cfg = job(output_dir=str(disk / "run"), max_steps=4)
    real = Trainer.train_step

    def train_step(self, batches):  # another process fills the disk during training
        done = real(self, batches)
        if self.state.step == 1:
            (disk / "ballast").write_bytes(b"\0" * (sh.disk_usage(disk).free - (64 << 10)))
        return done

    monkeypatch.setattr(Trainer, "train_step", train_step)
    capsys.readouterr()
    assert main(flags(cfg)) == 2
    line = one_line_error(capsys.readouterr().err)
    assert "the disk is full" in line and "the trained state is kept in" in line, line
    saved = Path(line.split("the trained state is kept in ")[1].split(";")[0])
    assert saved.is_relative_to(Path(cfg.cache_dir)) and checkpoint.verify(saved).step == 4
    assert not (disk / "run" / "metrics.json").exists() and not any((disk / "run").glob(".incomplete*"))
    command = shlex.split(line.split("(or with --output-dir elsewhere): ")[1])
    assert command[command.index("--resume") + 1] == str(saved)
    monkeypatch.setattr(Trainer, "train_step", real)
    (disk / "ballast").unlink()
    assert main(command[1:]) == 0
    a, b = (
        load_file(Path(alone.output_dir) / "model/model.safetensors"),
        load_file(disk / "run/model/model.safetensors"),
    )
    assert all(torch.equal(a[k], b[k]) for k in a)


# -- 3. --overwrite --------------------------------------------------------------------------------------------------


@fault(
    "--overwrite over a finished run, the new run failing on its data before its first step",
    "the finished run (model, metrics, checkpoints) is back, byte for byte",
)
def test_overwrite_that_fails_restores_the_finished_run(job, tmp_path):
    cfg = job(save_every=2)
    train(cfg)
    out = Path(cfg.output_dir)
    before = digest(out)
    assert "checkpoints/step-000004/model.safetensors" in before and "metrics.json" in before
    broken = tmp_path / "broken.csv"
    broken.write_text("text,label\n")  # no rows
    with pytest.raises(LeantrainError):
        train(cfg.replace(overwrite=True, data=str(broken)))
    assert digest(out) == before
    assert not list(out.glob(".replaced-*"))
    # and one that succeeds replaces it whole: the old checkpoints go only now
    result = train(cfg.replace(overwrite=True, max_steps=3, save_every=None))
    assert result.metrics["optimizer_steps"] == 3 and not (out / "checkpoints").exists()
    assert not list(out.glob(".replaced-*")) and not list(out.glob(".incomplete*"))


@pytest.mark.slow  # 37 s measured (load ~7)
@fault(
    "SIGKILL of an --overwrite run before its first checkpoint",
    "the next command in the directory puts the finished run back before anything else",
)
def test_overwrite_killed_before_its_first_checkpoint_is_undone_by_the_next_run(job):
    cfg = job(save_every=2)
    train(cfg)
    out = Path(cfg.output_dir)
    before = digest(out)
    proc = start(
        flags(cfg.replace(overwrite=True, save_every=100, max_steps=50)), helper=True, LT_TEST_STEP_SLEEP="0.3"
    )
    wait_for(lambda: logged_a_step(out), proc, "training")
    os.killpg(proc.pid, signal.SIGKILL)
    proc.communicate()
    assert not (out / "metrics.json").exists()  # set aside, not yet restored: nobody was there to do it
    with pytest.raises(ConfigError, match="holds a finished run"):
        train(cfg)
    assert digest(out) == before


# -- 4. non-finite values -----------------------------------------------------------------------------------------


@fault("--lr inf, --weight-decay nan, --max-grad-norm nan, --warmup-ratio nan", "one line naming the flag, exit 2")
@pytest.mark.parametrize(
    "flag, value", [("--lr", "inf"), ("--weight-decay", "nan"), ("--max-grad-norm", "nan"), ("--warmup-ratio", "nan")]
)
def test_non_finite_settings_are_refused(flag, value, capsys):
    from leantrain.commands.cli import main

    assert main(["train", flag, value]) == 2
    line = capsys.readouterr().err.strip()
    assert line == f"leantrain train: error: {flag} must be a finite number, got {float(value)}"


def corrupt_weights_after_step(monkeypatch, at: int) -> None:
    """Step `at` leaves one weight infinite while its loss and gradient norm were finite (as --lr inf did)."""
    from leantrain.training.trainer import Trainer

    real = Trainer._close_step
    count = iter(range(1, 10**6))

    def close_step(self, *args, **kwargs):
        out = real(self, *args, **kwargs)
        if next(count) == at:
            with torch.no_grad():
                next(self.model.parameters()).view(-1)[0] = float("inf")
        return out

    monkeypatch.setattr(Trainer, "_close_step", close_step)


@fault(
    "the weights become infinite while the loss and gradient norm are still finite (then every step is NaN)",
    "never saved as a checkpoint, never published, even with --on-nan skip; exit 2",
)
@pytest.mark.parametrize("on_nan", ["stop", "skip"])
def test_non_finite_weights_are_never_saved_or_published(job, monkeypatch, on_nan):
    cfg = job(save_every=2, max_steps=6, on_nan=on_nan)
    corrupt_weights_after_step(monkeypatch, 3)
    with pytest.raises(directory.NonFiniteModel, match=r"of [\d,]+ weights are NaN or infinite") as err:
        train(cfg)
    out = Path(cfg.output_dir)
    assert not (out / "metrics.json").exists() and not (out / "model").exists()
    saved = [p.name for p in (out / "checkpoints").iterdir()]
    assert saved == ["step-000002"], saved  # the one from before the divergence; step 4's refused
    for name in saved:
        weights = load_file(out / "checkpoints" / name / "model.safetensors")
        assert all(torch.isfinite(t).all() for t in weights.values())
    assert "step-000002" in str(err.value)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_a_non_finite_staged_model_is_not_published(tmp_path, dtype):
    from safetensors.torch import save_file

    run = directory.RunDir(tmp_path / "run")
    run.check()
    staging = run.begin()
    (staging / "model").mkdir()
    weights = {"a": torch.arange(5), "w": torch.tensor([1.0, float("nan"), 2.0], dtype=dtype), "z": torch.ones(0)}
    save_file(weights, staging / "model" / "model.safetensors")  # (integers have no NaN: not counted)
    (staging / "metrics.json").write_text("{}")
    with pytest.raises(directory.NonFiniteModel, match="1 of 3 weights"):
        run.publish()
    assert not (tmp_path / "run" / "metrics.json").exists()
    run.release()


def test_non_finite_weights_are_counted_exactly_whatever_their_norm():
    """A finite norm clears a tensor in one read; an infinite one is counted value by value: NaN and infinities
    found, and large finite weights whose squares overflow (fp32, bf16, fp16) not taken for them."""
    nan_and_inf = torch.randn(1000)
    nan_and_inf[[5, 7]] = torch.tensor([float("nan"), float("-inf")])
    tensors = [
        nan_and_inf,
        torch.full((10,), 1e30),
        torch.full((4,), 1e30, dtype=torch.bfloat16),
        torch.tensor([6e4, 6e4], dtype=torch.float16),
        torch.zeros(0),
        torch.arange(3),  # not floating point: not counted
    ]
    assert directory.nonfinite_count(tensors) == (2, 1016)


# -- 5. SIGKILL of the launcher -------------------------------------------------------------------------------------


@pytest.mark.slow  # 57-69 s measured (load ~7)
@fault(
    "SIGKILL of the top-level `leantrain train --num-processes 2`",
    "the launcher's agent and both workers die with it; no checkpoint appears afterwards",
)
def test_killing_the_launcher_kills_its_workers(job):
    cfg = job(max_steps=5000, save_every=5, batch_size=4, num_processes=2, optimizer="sgd")
    out = Path(cfg.output_dir)
    proc = start(flags(cfg))
    wait_for(lambda: (out / "checkpoints" / "step-000005").is_dir(), proc, "the first checkpoint")
    job_pids = descendants(proc.pid)
    assert len(job_pids) >= 3, job_pids  # the launcher's agent and two workers
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()  # not communicate(): orphans would hold its pipes open
    deadline = time.monotonic() + 30
    while job_pids & set(live_processes()) and time.monotonic() < deadline:
        time.sleep(0.2)
    left = job_pids & set(live_processes())
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    proc.communicate()
    assert not left, f"processes kept running after their launcher was killed: {left}"
    newest = checkpoint.CheckpointDir(out / "checkpoints").step_dirs()
    time.sleep(1.0)
    assert checkpoint.CheckpointDir(out / "checkpoints").step_dirs() == newest  # nothing trains unobserved


# -- 8. Ctrl-C and preemption ---------------------------------------------------------------------------------------


def resume_from_message(err: str) -> tuple[Path, list[str]]:
    saved = Path(re.search(r"checkpoint: (\S+)", err).group(1))
    command = shlex.split(re.search(r"resume with: (.+)", err).group(1))
    assert command[:2] == ["leantrain", "train"]
    assert command[command.index("--resume") + 1] == "auto" and "--overwrite" not in command
    return saved, command[1:]


@pytest.mark.slow  # 47-76 s measured (load ~7): the interrupted run and its resumption
@fault(
    "Ctrl-C (SIGINT) during a single-process run with --save-every",
    "a checkpoint at the next step boundary, its path and the exact resume command printed, exit 130; the "
    "command resumes from it",
)
def test_ctrl_c_saves_and_prints_the_resume_command_that_works(job):
    cfg = job(max_steps=40, save_every=10, eval_every=100)
    proc = start(flags(cfg), helper=True, LT_TEST_STEP_SLEEP="0.15")
    out = Path(cfg.output_dir)
    wait_for(lambda: logged_a_step(out), proc, "training")
    time.sleep(0.5)
    os.killpg(proc.pid, signal.SIGINT)  # as a terminal's Ctrl-C: to the whole group
    rc, _, err = finish(proc)
    assert rc == 130, err[-3000:]
    assert "Traceback" not in err
    saved, command = resume_from_message(err)
    ckpt = checkpoint.verify(saved)
    assert 1 <= ckpt.step < 40 and ckpt.manifest["reason"] == "interrupted by SIGINT"
    assert f"stopped by SIGINT after step {ckpt.step} of 40" in err
    rc, _, err = finish(start(command))
    assert rc == 0, err[-3000:]
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["resumed_from"] == str(saved) and metrics["optimizer_steps"] == 40


@pytest.mark.slow  # 43 s measured (load ~7)
@fault(
    "SIGTERM (preemption) with --save-on-interrupt and no --save-every",
    "a checkpoint at the next step boundary, exit 143",
)
def test_sigterm_with_save_on_interrupt_saves_and_exits_143(job):
    cfg = job(max_steps=60, save_on_interrupt=True)
    proc = start(flags(cfg), helper=True, LT_TEST_STEP_SLEEP="0.15")
    out = Path(cfg.output_dir)
    wait_for(lambda: logged_a_step(out), proc, "training")
    proc.send_signal(signal.SIGTERM)
    rc, _, err = finish(proc)
    assert rc == 143, err[-3000:]
    saved, _ = resume_from_message(err)
    assert checkpoint.verify(saved).manifest["reason"] == "interrupted by SIGTERM"
    assert [p.name for p in (out / "checkpoints").iterdir()] == [saved.name]


@pytest.mark.slow  # 73-101 s each measured (load ~7)
@fault(
    "Ctrl-C to every process of a 2-process run; SIGTERM to its top-level command only (a scheduler)",
    "every process stops at the same step after one checkpoint and exits 130 (SIGINT) or 143 (SIGTERM); the "
    "top-level command exits the same",
)
@pytest.mark.parametrize("how", ["SIGINT to the group", "SIGTERM to the launcher"])
def test_two_processes_stop_together_with_a_checkpoint(job, how):
    cfg = job(max_steps=5000, save_every=1000, batch_size=4, num_processes=2, optimizer="sgd", log_every=5)
    out = Path(cfg.output_dir)
    proc = start(flags(cfg))
    wait_for(lambda: logged_a_step(out), proc, "training")
    job_pids = descendants(proc.pid)
    if how.startswith("SIGINT"):
        os.killpg(proc.pid, signal.SIGINT)
    else:
        os.kill(proc.pid, signal.SIGTERM)
    rc, _, err = finish(proc)
    signum = signal.SIGINT if how.startswith("SIGINT") else signal.SIGTERM
    assert rc == 128 + signum, err[-3000:]
    assert f"process 1 of 2 stopped by {signal.Signals(signum).name}" in err
    assert "the job failed" not in err and "Traceback" not in err, err[-3000:]
    saved, _ = resume_from_message(err)
    ckpt = checkpoint.verify(saved)
    assert ckpt.manifest["num_processes"] == 2 and {"rank-0.pt", "rank-1.pt"} <= set(ckpt.manifest["files"])
    assert not job_pids & set(live_processes())  # the agent and both workers exited


def test_handlers_belong_to_the_cli_not_to_the_python_api(job, monkeypatch):
    from leantrain.commands.cli import main
    from leantrain.training import interrupt
    from leantrain.training.trainer import Trainer

    seen = []
    real = Trainer.train_step

    def train_step(self, *args, **kwargs):
        seen.append((signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)))
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Trainer, "train_step", train_step)
    before = (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM))
    train(job("api", max_steps=1))
    assert seen[-1] == before  # leantrain.train installs nothing
    assert main(flags(job("cli", max_steps=1))) == 0
    assert seen[-1] == (interrupt._handle, interrupt._handle)  # the CLI does, for the run
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before  # and puts them back


# -- 9. publishing ----------------------------------------------------------------------------------------------


@pytest.mark.slow  # 35-45 s each measured (load ~7)
@fault(
    "SIGKILL in the middle of publishing an --overwrite run, after each of its first outputs moves into place",
    "never a finished marker over a mix of two runs; the next command completes the publish",
)
@pytest.mark.parametrize("after", [1, 3])
def test_a_kill_mid_publish_never_leaves_a_finished_mix(job, after):
    cfg = job(max_steps=2)
    train(cfg)
    out = Path(cfg.output_dir)
    old = digest(out)
    rc, _, err = finish(
        start(flags(cfg.replace(overwrite=True, max_steps=3)), helper=True, LT_KILL_AFTER_PUBLISHED=str(after))
    )
    assert rc == -signal.SIGKILL, err[-3000:]
    assert not (out / "metrics.json").exists()  # neither run is "finished" mid-publish
    with pytest.raises(ConfigError, match="holds a finished run"):  # the next command completed the publish
        train(cfg)
    new = json.loads((out / "metrics.json").read_text())
    assert new["optimizer_steps"] == 3
    files = digest(out)
    assert files["model/model.safetensors"] != old["model/model.safetensors"]
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "loss" in r] == [1, 2, 3]  # the new run's log, not the old one's
    assert not list(out.glob(".replaced-*")) and not list(out.glob(".incomplete*"))


def test_publishing_fsyncs_every_file_before_it_moves(tmp_path, monkeypatch):
    run = directory.RunDir(tmp_path / "run")
    run.check()
    staging = run.begin()
    (staging / "model").mkdir()
    (staging / "model" / "weights.bin").write_bytes(b"w")
    (staging / "metrics.json").write_text("{}")
    synced: list[str] = []
    real_fsync, real_replace = os.fsync, os.replace
    moved: list[str] = []
    monkeypatch.setattr(os, "fsync", lambda fd: synced.append(os.readlink(f"/proc/self/fd/{fd}")) or real_fsync(fd))
    monkeypatch.setattr(os, "replace", lambda a, b: moved.append(str(a)) or real_replace(a, b))
    run.publish()
    run.release()
    for name in ("model/weights.bin", "model", "metrics.json"):
        first_move = next(i for i, m in enumerate(moved) if m.startswith(str(staging / name.split("/")[0])))
        assert str(staging / name) in synced, name
        assert moved[first_move].endswith(name.split("/")[0])
    assert moved[-1] == str(staging / "metrics.json")  # the finished marker last
    assert str(tmp_path / "run") in synced  # the directory itself, so the renames are durable


# -- 10. checkpoint integrity ---------------------------------------------------------------------------------------


@pytest.fixture()
def two_checkpoints(job) -> Path:
    result = train(job(save_every=2))
    return result.output_dir / "checkpoints"


@fault(
    "a checkpoint whose manifest leaves out a file restore() loads (optimizer.pt deleted, its entry removed)",
    "verify() refuses it, naming the file; resume auto passes over it to the older checkpoint",
)
def test_a_manifest_that_leaves_out_a_required_file_is_refused(two_checkpoints):
    newest = two_checkpoints / "step-000004"
    manifest = json.loads((newest / "checkpoint.json").read_text())
    del manifest["files"]["optimizer.pt"]
    (newest / "optimizer.pt").unlink()
    (newest / "checkpoint.json").write_text(json.dumps(manifest))
    with pytest.raises(checkpoint.CheckpointError, match=r"does not list optimizer\.pt"):
        checkpoint.verify(newest)
    warnings: list[str] = []
    assert checkpoint.CheckpointDir(two_checkpoints).latest(warn=warnings.append).step == 2
    assert "optimizer.pt" in warnings[0]


@fault(
    "a crash between the two renames that re-save a step",
    "the next run puts the old copy back instead of deleting it",
)
def test_a_crash_between_the_renames_of_a_re_save_keeps_the_step(job, two_checkpoints, monkeypatch):
    step4 = two_checkpoints / "step-000004"
    before = checkpoint.verify(step4).manifest["files"]
    real = os.replace

    def crash_on_promote(src, dst):
        if ".tmp-" in str(src) and Path(dst) == step4:
            raise KeyboardInterrupt("killed between the two renames")
        return real(src, dst)

    resumed = job(save_every=2, resume=str(two_checkpoints / "step-000002"), overwrite=True)
    monkeypatch.setattr(checkpoint.os, "replace", crash_on_promote)
    with pytest.raises(KeyboardInterrupt):
        train(resumed)
    monkeypatch.undo()
    assert not step4.exists() and list(two_checkpoints.glob(".step-000004.old-*"))
    checkpoint.CheckpointDir(two_checkpoints).clean()
    assert checkpoint.verify(step4).manifest["files"] == before
    assert not list(two_checkpoints.glob(".step-*"))


@fault(
    "a checkpoint file holding pickled code, its checksum fixed up",
    "refused in one whole sentence in leantrain's words; nothing runs",
)
def test_a_refused_pickle_is_explained_in_one_sentence(two_checkpoints, job, tmp_path):
    class Evil:
        def __reduce__(self):
            return (os.system, (f"touch {tmp_path / 'pwned'}",))

    ckpt = two_checkpoints / "step-000004"
    path = ckpt / "training_state.pt"
    torch.save({"scheduler": Evil()}, path)
    manifest = json.loads((ckpt / "checkpoint.json").read_text())
    manifest["files"]["training_state.pt"] = {"bytes": path.stat().st_size, "crc32": checkpoint._crc32(path)}
    (ckpt / "checkpoint.json").write_text(json.dumps(manifest))
    with pytest.raises(checkpoint.CheckpointError) as err:
        train(job("resumed", save_every=2, resume=str(ckpt)))
    message = str(err.value)
    assert "\n" not in message and "Weights only load failed" not in message and "WeightsUnpickler" not in message
    assert "runs code" in message or "run as code" in message
    assert message.endswith("--resume PATH")
    assert not (tmp_path / "pwned").exists()


# -- 11. false refusals on resume ------------------------------------------------------------------------------------


@fault(
    "resuming with the same data file named by a relative path instead of an absolute one",
    "accepted: files are compared, not spellings",
)
def test_the_same_file_by_another_path_resumes(job, sentiment_csv, monkeypatch):
    first = train(job(save_every=2))
    monkeypatch.chdir(sentiment_csv.parent)
    ckpt = first.output_dir / "checkpoints" / "step-000002"
    resumed = train(job("resumed", save_every=2, data=sentiment_csv.name, resume=str(ckpt)))
    assert resumed.metrics["resumed_from"] == str(ckpt)


@fault(
    "resuming an `auto`-precision run with the precision it resolved to named explicitly; then with another one",
    "the first is accepted; the second refused once, naming the resolved precisions",
)
def test_precision_is_compared_as_resolved(job):
    from leantrain import parallel

    resolved, _ = parallel.choose_precision("auto")
    first = train(job(save_every=2, precision="auto"))
    ckpt = first.output_dir / "checkpoints" / "step-000002"
    resumed = train(job("same", save_every=2, precision=resolved, resume=str(ckpt)))
    assert resumed.metrics["resumed_from"] == str(ckpt)
    other = "bf16" if resolved == "fp32" else "fp32"
    with pytest.raises(checkpoint.CheckpointError) as err:
        train(job("other", save_every=2, precision=other, resume=str(ckpt)))
    message = str(err.value)
    assert (
        message.count("precision differs") == 1
        and f"precision differs ('{resolved}' in the checkpoint, '{other}' now)" in message
    )


# -- #20 item 13, #19 item 12: --resume at the wrong folder ---------------------------------------------------------


@fault(
    "--resume at a missing path, a file, a folder that is not a checkpoint, and RUN/checkpoints itself",
    "one line saying which folder to give, exit 2",
)
def test_resume_at_the_wrong_folder_is_one_line(job, two_checkpoints, tmp_path, capsys):
    from leantrain.commands.cli import main

    (tmp_path / "notes.txt").write_text("hello")
    (tmp_path / "empty").mkdir()
    (tmp_path / "model").mkdir()  # a finished run's model/: weights and config, no training state
    (tmp_path / "model" / "config.json").write_text("{}")
    (tmp_path / "model" / "model.safetensors").write_bytes(b"")
    cases = {
        str(tmp_path / "nowhere"): "no such checkpoint folder",
        str(tmp_path / "notes.txt"): "a file, not a checkpoint folder",
        str(tmp_path / "empty"): "not a leantrain checkpoint",
        str(tmp_path / "model"): "a model folder (a run's published model/), not a checkpoint",
        str(two_checkpoints): f"not one checkpoint; give one of its step-NNNNNN folders (newest: {two_checkpoints}",
    }
    for where, says in cases.items():
        capsys.readouterr()
        assert main(flags(job("resumed", resume=where))) == 2, where
        line = one_line_error(capsys.readouterr().err)
        assert f"--resume {where}: " in line and says in line, line


# -- docs ---------------------------------------------------------------------------------------------------------


def docs_table() -> dict[str, tuple[str, str]]:
    """Rows of the fault table in docs/reliability.md: test name -> (fault, outcome)."""
    rows = {}
    for line in DOCS.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 3 and cells[2].startswith("`test_"):
            rows[cells[2].strip("`")] = (cells[0], cells[1])
    return rows


def test_the_docs_table_lists_every_fault_the_suite_tries():
    """docs/reliability.md's table is FAULTS, row for row (regenerate it with `python tests/test_reliability.py`)."""
    assert docs_table() == {name: (what, outcome) for name, (what, outcome) in FAULTS.items()}


def render_table() -> str:
    lines = ["| Fault or bad input | What leantrain does | Test (tests/test_reliability.py) |", "|---|---|---|"]
    lines += [f"| {what} | {outcome} | `{name}` |" for name, (what, outcome) in FAULTS.items()]
    return "\n".join(lines)


if __name__ == "__main__":
    print(render_table())
