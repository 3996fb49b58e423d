"""Ctrl-C and SIGTERM in every phase of a `leantrain train` run, in this process (the CLI's own handlers).

Each test sends the signal to this process from inside the phase it tries, then lets the phase go on working in
small slices: the run must stop in that phase (no slice after the signal, no later phase), say which phase, exit
128 + the signal's number, and leave no staging folder and no partial cache behind.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from leantrain import TrainConfig
from leantrain.commands.cli import main
from leantrain.run import checkpoint


@pytest.fixture()
def job(tiny_model_dir, sentiment_csv, cache_dir, tmp_path):
    def make(name="run", **changes) -> TrainConfig:
        base = dict(
            model=str(tiny_model_dir),
            data=str(sentiment_csv),
            cache_dir=str(cache_dir),
            output_dir=str(tmp_path / name),
            batch_size=24,
            max_steps=6,
            lr=3e-3,
            precision="fp32",
            log_every=1,
            progress=False,
            seed=5,
            report=False,
        )
        return TrainConfig(**{**base, **changes})

    return make


def run(cfg: TrainConfig, capsys) -> tuple[int, str]:
    capsys.readouterr()
    rc = main(["train", *cfg.to_argv()])
    return rc, capsys.readouterr().err


class SlicedWork:
    """Send `signum` to this process, then work on in `slices` slices of 20 ms; counts the slices done."""

    def __init__(self, signum: int = signal.SIGINT, slices: int = 100):
        self.signum, self.slices, self.done, self.sent = signum, slices, 0, False

    def __call__(self) -> None:
        if self.sent:
            return
        self.sent = True
        os.kill(os.getpid(), self.signum)
        for _ in range(self.slices):
            time.sleep(0.02)  # the handler runs between two slices
            self.done += 1


def leftovers(cfg: TrainConfig) -> list[str]:
    """Staging folders, temporary checkpoints and partial cache entries the run left."""
    out, cache = Path(cfg.output_dir), Path(cfg.cache_dir)
    found = [p for p in out.glob(".incomplete*")] + [p for p in out.glob("checkpoints/.step-*")]
    found += [p for p in cache.rglob("*.tmp")] if cache.is_dir() else []
    return [str(p) for p in found]


def spy(monkeypatch, target, name: str, before=None, calls: list | None = None):
    real = getattr(target, name)

    def wrapped(*args, **kwargs):
        if calls is not None:
            calls.append(name)
        if before is not None:
            before()
        return real(*args, **kwargs)

    monkeypatch.setattr(target, name, wrapped)


def test_ctrl_c_while_tokenizing_stops_there_leaving_no_cache_and_no_staging(job, monkeypatch, capsys):
    from leantrain.data import prepare
    from leantrain.model import loading as models

    work, loaded = SlicedWork(), []
    spy(monkeypatch, prepare, "tokenize", before=work)
    spy(monkeypatch, models, "load_for_classification", calls=loaded)
    cfg = job()
    rc, err = run(cfg, capsys)
    assert rc == 130 and "Traceback" not in err
    assert "stopped by SIGINT while preparing the data (reading, repairing, tokenizing" in err
    assert work.done <= 1 and not loaded  # no tokenizing after the signal, and no model loaded
    assert not leftovers(cfg) and not list(Path(cfg.cache_dir).rglob("*.npz"))


def test_ctrl_c_while_the_cache_is_written_leaves_no_partial_entry(job, monkeypatch, capsys):
    import numpy as np

    real = np.savez

    def savez_then_signal(file, **arrays):
        real(file, **arrays)  # the temporary holds the bytes, not yet renamed into place
        SlicedWork()()

    monkeypatch.setattr(np, "savez", savez_then_signal)
    cfg = job()
    rc, err = run(cfg, capsys)
    assert rc == 130 and "while preparing the data" in err
    assert not leftovers(cfg) and not list(Path(cfg.cache_dir).rglob("*.npz"))


def test_ctrl_c_while_loading_the_model_stops_there(job, monkeypatch, capsys):
    from leantrain.model import loading as models
    from leantrain.training import trainer

    work, built = SlicedWork(), []
    spy(monkeypatch, models, "load_for_classification", before=work)
    spy(monkeypatch, trainer.Trainer, "_build_loop_parts", calls=built)
    cfg = job()
    rc, err = run(cfg, capsys)
    assert rc == 130 and "stopped by SIGINT while loading the model; nothing was saved" in err
    assert work.done <= 1 and not built and not leftovers(cfg)


@pytest.mark.parametrize("when", ["mid-run", "final"])
def test_ctrl_c_while_evaluating_stops_at_the_next_batch_with_a_checkpoint(job, monkeypatch, capsys, when):
    from leantrain.training.hooks import Hooks

    work, batches = SlicedWork(slices=0), []

    def on_eval_batch(self, batch):
        batches.append(1)
        if len(batches) == 2:  # in the middle of the evaluation (16 examples a batch: 3 batches)
            work()

    monkeypatch.setattr(Hooks, "on_eval_batch", on_eval_batch)
    evaluate_at = {"mid-run": dict(eval_every=3), "final": {}}[when]
    cfg = job(save_on_interrupt=True, eval_batch_size=8, **evaluate_at)
    rc, err = run(cfg, capsys)
    step = 3 if when == "mid-run" else 6
    assert rc == 130 and "Traceback" not in err
    assert f"stopped by SIGINT while evaluating, after step {step} of 6" in err
    assert len(batches) == 2  # no batch evaluated after the signal
    saved = Path(cfg.output_dir) / "checkpoints" / f"step-{step:06d}"
    assert checkpoint.verify(saved).manifest["reason"] == "interrupted by SIGINT"
    assert not leftovers(cfg) and not (Path(cfg.output_dir) / "metrics.json").exists()


def test_ctrl_c_while_saving_the_model_stops_there_and_publishes_nothing(job, monkeypatch, capsys):
    from leantrain.run import model_card

    work = SlicedWork()
    spy(monkeypatch, model_card, "write_model_card", before=work)
    cfg = job(save_every=3)
    rc, err = run(cfg, capsys)
    assert rc == 130 and "Traceback" not in err
    assert "stopped by SIGINT while saving the model after the last step; nothing was published" in err
    assert "the newest checkpoint is" in err and "step-000006" in err and "resume with: leantrain train" in err
    assert work.done <= 1 and not leftovers(cfg)
    out = Path(cfg.output_dir)
    assert not (out / "metrics.json").exists() and not (out / "model").exists()


def test_sigterm_with_save_on_interrupt_saves_at_the_step_and_the_command_resumes_it_bitwise(job, monkeypatch, capsys):
    """Preemption: SIGTERM mid-run with --save-on-interrupt and no --save-every; exit 143 and a checkpoint of the
    step it came in; the printed command resumes it to the very weights of the run left alone."""
    from leantrain.training.trainer import Trainer

    whole = job("whole", max_steps=8)
    assert run(whole, capsys)[0] == 0
    real, steps = Trainer.train_step, []

    def train_step(self, batches):
        done = real(self, batches)
        steps.append(self.state.step)
        if self.state.step == 3:
            os.kill(os.getpid(), signal.SIGTERM)
        return done

    monkeypatch.setattr(Trainer, "train_step", train_step)
    cfg = job("preempted", max_steps=8, save_on_interrupt=True)
    rc, err = run(cfg, capsys)
    assert rc == 143 and "Traceback" not in err
    assert "stopped by SIGTERM after step 3 of 8" in err and steps == [1, 2, 3]
    out = Path(cfg.output_dir)
    assert [p.name for p in (out / "checkpoints").iterdir()] == ["step-000003"]
    assert checkpoint.verify(out / "checkpoints" / "step-000003").manifest["reason"] == "interrupted by SIGTERM"
    assert not leftovers(cfg)
    command = err.split("resume with: ")[1].strip().splitlines()[0].split()
    assert command[:2] == ["leantrain", "train"] and "--resume" in command
    monkeypatch.setattr(Trainer, "train_step", real)
    capsys.readouterr()
    assert main(command[1:]) == 0
    resumed = json.loads((out / "metrics.json").read_text())
    assert resumed["resumed_from"].endswith("step-000003") and resumed["optimizer_steps"] == 8
    a = load_file(Path(whole.output_dir) / "model" / "model.safetensors")
    b = load_file(out / "model" / "model.safetensors")
    assert all(torch.equal(a[k], b[k]) for k in a)
