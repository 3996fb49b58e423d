"""Checkpoints that never lose work: exact resume (also after SIGKILL), atomic saves, safe loading, refusing
a changed config, pruning and the best checkpoint, the NaN guard, and a full disk.

The tiny BERT here has dropout on, so exactness also covers the RNG; fp32 on CPU, where resuming must give
bitwise the weights and per-step losses of the same run left alone.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from leantrain import TrainConfig, train
from leantrain.data.batching import GlobalBatchSampler
from leantrain.errors import ConfigError, LeantrainError
from leantrain.run import checkpoint
from tests.conftest import make_sentiment_rows, write_csv
from tests.hooks import DieAt, Killed

HELPER = Path(__file__).with_name("checkpoint_helper.py")


@pytest.fixture()
def job(dropout_model_dir, sentiment_csv, cache_dir, tmp_path):
    def make(name="run", **changes) -> TrainConfig:
        base = dict(
            model=str(dropout_model_dir),
            data=str(sentiment_csv),
            cache_dir=str(cache_dir),
            output_dir=str(tmp_path / name),
            batch_size=24,
            max_steps=8,
            lr=3e-3,
            precision="fp32",
            log_every=1,
            progress=False,
            seed=5,
            # report.html is 3 of the 5 s of each of these runs (tiny BERT, load 3); the SIGKILL tests below
            # write it after a resume, tests/telemetry/test_report.py checks what it holds
            report=False,
        )
        return TrainConfig(**{**base, **changes})

    return make


def weights(run_dir: Path) -> dict[str, torch.Tensor]:
    return load_file(Path(run_dir) / "model" / "model.safetensors")


def assert_same_weights(a: Path, b: Path) -> None:
    wa, wb = weights(a), weights(b)
    assert wa.keys() == wb.keys()
    different = [k for k in wa if not torch.equal(wa[k], wb[k])]
    assert not different, f"{len(different)} tensors differ, e.g. {different[0]}"


def loss_log(run_dir: Path) -> list[tuple[int, float]]:
    rows = [json.loads(line) for line in (Path(run_dir) / "metrics.jsonl").read_text().splitlines()]
    return [(r["step"], r["loss"]) for r in rows if "loss" in r]


def step_dir(run_dir: Path, step: int) -> Path:
    return Path(run_dir) / "checkpoints" / f"step-{step:06d}"


# -- the sampler seeks ---------------------------------------------------------------------------------------


def test_sampler_starts_at_a_global_batch_without_building_the_skipped_ones(monkeypatch):
    lengths = np.random.default_rng(0).integers(3, 40, size=203)
    full = GlobalBatchSampler(lengths, micro_batch=4, accumulation=3, num_processes=2, seed=1)
    full.set_epoch(2)
    micro = list(full)
    per_step = full.accumulation * full.num_processes
    seek = GlobalBatchSampler(lengths, micro_batch=4, accumulation=3, num_processes=2, seed=1)
    seek.start_at(2, 5)
    seek.set_epoch(2)
    assert list(seek) == micro[5 * per_step :]
    assert len(seek) == len(micro) - 5 * per_step
    seek.set_epoch(3)  # other epochs start at their beginning
    full.set_epoch(3)
    assert list(seek) == list(full)
    # a seek, not a replay: global_batches() is computed once per pass, its skipped batches never sliced
    calls = []
    original = GlobalBatchSampler.global_batches
    monkeypatch.setattr(GlobalBatchSampler, "global_batches", lambda self: calls.append(1) or original(self))
    seek.set_epoch(2)
    first = next(iter(seek))
    assert calls == [1] and first == micro[5 * per_step]


# -- exact resume, in process ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "changes",
    [
        dict(optimizer="adamw"),
        dict(optimizer="adafactor"),
        dict(optimizer="adamw8bit"),
        # the loss scaler's state; fp16 is emulated (slow) on CPUs without AVX-512 FP16
        pytest.param(dict(optimizer="adamw", precision="fp16", grad_accum=2, batch_size=12), marks=pytest.mark.slow),
        # a warm-up of 6 steps spans the resumption at step 4; GaLore's SVD refreshes at steps 6 and APOLLO's random
        # projection at 4 and 7 (every 3), inside the resumed span; schedule-free switches to its average at each
        # evaluation (3, 6) and save (2, 4, 6, 8) and back
        dict(optimizer="muon", warmup_steps=6),
        dict(optimizer="schedule-free-adamw", scheduler="constant", warmup_steps=6),
        # (elementwise state like AdamW's; 14-18 s each at load 10)
        pytest.param(dict(optimizer="schedule-free-sgd", scheduler="constant", warmup_steps=6, lr=0.05),
                     marks=pytest.mark.slow),
        pytest.param(dict(optimizer="lion", warmup_steps=6, lr=5e-4), marks=pytest.mark.slow),
        dict(optimizer="galore-adamw", warmup_steps=6, projection_rank=4, projection_update_interval=3,
             projection_embeddings=True),  # the input embeddings' projector too
        dict(optimizer="apollo-adamw", warmup_steps=6, projection_rank=4, projection_update_interval=3),
        dict(optimizer="adamw", static_shapes="on"),  # lengths padded up to buckets
        dict(optimizer="adamw", neftune_noise_alpha=5.0),  # its noise drawn from the generator the checkpoint keeps
    ],
    ids=["adamw", "adafactor", "adamw8bit", "fp16-accum", "muon", "schedule-free-adamw", "schedule-free-sgd", "lion",
         "galore", "apollo", "static-shapes", "neftune"],
)  # fmt: skip
def test_resuming_a_checkpoint_gives_bitwise_the_same_run(job, changes):
    if changes["optimizer"] == "adamw8bit":
        pytest.importorskip("bitsandbytes")
    whole = train(job("whole", save_every=2, eval_every=3, **changes))
    ckpt = step_dir(whole.output_dir, 4)
    assert checkpoint.verify(ckpt).step == 4
    resumed = train(job("resumed", save_every=2, eval_every=3, resume=str(ckpt), **changes))
    assert resumed.metrics["resumed_from"] == str(ckpt)
    # the checkpoint was used: the resumed run trained only the last 4 of 8 steps (a rerun from scratch
    # would equal the whole run too, so equality alone proves nothing)
    assert whole.metrics["train_examples"] == 8 * 24 and resumed.metrics["train_examples"] == 4 * 24
    assert_same_weights(whole.output_dir, resumed.output_dir)
    assert loss_log(resumed.output_dir) == loss_log(whole.output_dir)
    assert [s for s, _ in loss_log(resumed.output_dir)] == list(range(1, 9))
    # and the resumed span trained: every weight matrix moved from the checkpoint's (a run whose optimizer never
    # stepped, such as one whose learning rate stayed at the warm-up's 0, would also resume "exactly")
    at4, end = load_file(ckpt / "model.safetensors"), weights(resumed.output_dir)
    still = [k for k, v in end.items() if v.ndim == 2 and torch.equal(v, at4[k])]
    assert not still, f"{len(still)} matrices never moved after step 4, e.g. {still[0]}"


def test_a_resumed_mixture_equals_the_run_left_alone_across_a_sources_restart(job, tmp_path):
    """A mixture of 0.6/0.4 whose small source (27 training rows, about 10 a step) is used up and restarts twice:
    resumed at step 4 (mid log row: rows every 3 steps), the run ends bitwise where the uninterrupted one does, each
    source's logged loss, examples, tokens and passes alike."""
    small = write_csv(tmp_path / "small.csv", make_sentiment_rows(30, seed=8))
    mixture = dict(data=[f"{job().data}@0.6", f"{small}@0.4"], save_every=2, log_every=3, eval_every=4)
    whole = train(job("whole", **mixture))
    ckpt = step_dir(whole.output_dir, 4)
    resumed = train(job("resumed", resume=str(ckpt), **mixture))
    assert resumed.metrics["resumed_from"] == str(ckpt) and resumed.metrics["train_examples"] == 4 * 24
    assert_same_weights(whole.output_dir, resumed.output_dir)

    def rows(run_dir: Path) -> list[dict]:
        keep = ("step", "loss", "sources", "eval_loss", "eval_accuracy")
        lines = (Path(run_dir) / "metrics.jsonl").read_text().splitlines()
        return [{k: v for k, v in json.loads(line).items() if k in keep} for line in lines]

    assert rows(resumed.output_dir) == rows(whole.output_dir)
    passes = [r["sources"]["small"]["epochs"] for r in rows(whole.output_dir) if "loss" in r]
    # passes over the small source at steps 3, 6 and 8: its third pass begins after step 6, inside the resumed span
    assert passes[0] < 1 < passes[1] < 2 < passes[2]
    assert resumed.metrics["sources"] == whole.metrics["sources"]


def logged_rows(run_dir: Path) -> list[dict]:
    """metrics.jsonl without its timings: every step's loss, each source's figures, every evaluation."""
    keep = ("step", "micro_step", "epoch", "loss", "lr", "grad_norm", "skipped_steps", "sources", "eval_")
    rows = [json.loads(line) for line in (Path(run_dir) / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if k.startswith(keep)} for r in rows]


@pytest.mark.parametrize("mix_by", ["examples", "tokens"])
def test_a_weighted_mixture_killed_mid_epoch_resumes_as_the_run_left_alone(job, tmp_path, mix_by):
    """0.7/0.3 (by examples or by tokens), the small source (27 training rows) restarting every few steps: killed
    before step 8, resumed from step 6 (mid epoch: 243 rows are 11 steps of 24) into the second epoch, the run logs
    each step's loss, each source's figures and evaluation scores, and ends with the weights of the run left alone."""
    small = write_csv(tmp_path / "small.csv", make_sentiment_rows(30, seed=8))
    mixture = dict(data=[f"{job().data}@0.7", f"{small}@0.3"], mix_by=mix_by, save_every=3, eval_every=4, max_steps=14)
    whole = train(job("whole", **mixture))
    cfg = job("killed", **mixture)
    with pytest.raises(Killed):
        train(cfg, hooks=DieAt(8))
    resumed = train(cfg.replace(resume="auto"))
    assert resumed.metrics["resumed_from"] == str(step_dir(cfg.output_dir, 6))
    # only the steps after the checkpoint (the first epoch ends in a step of 3 rows)
    assert resumed.metrics["train_examples"] == whole.metrics["train_examples"] - 6 * 24
    assert_same_weights(whole.output_dir, resumed.output_dir)
    rows = logged_rows(whole.output_dir)
    assert logged_rows(resumed.output_dir) == rows
    assert [r["step"] for r in rows if "loss" in r] == list(range(1, 15))
    evals = [r for r in rows if "eval_loss" in r]
    assert [r["step"] for r in evals] == [4, 8, 12, 14] and all(r["sources"]["small"]["eval_loss"] for r in evals)
    assert resumed.metrics["sources"] == whole.metrics["sources"]
    assert whole.metrics["sources"]["small"]["epochs"] > 3  # the small source restarted inside the resumed span


def test_resuming_a_mixture_with_other_weights_is_refused_and_the_same_files_resume(job, tmp_path, monkeypatch):
    """Other weights or another --mix-by change every step's examples: refused, naming them; the same sources named
    by relative paths are the same mixture (files are compared, not spellings)."""
    big = Path(job().data)
    small = write_csv(tmp_path / "small.csv", make_sentiment_rows(30, seed=8))
    whole = train(job("whole", data=[f"{big}@0.7", f"{small}@0.3"], save_every=2, max_steps=2))
    ckpt = str(step_dir(whole.output_dir, 2))
    with pytest.raises(
        LeantrainError, match=r"data differs \(.*'weight': 0\.7.* in the checkpoint, .*'weight': 0\.5.* now\)"
    ):
        train(job("other", data=[f"{big}@0.5", f"{small}@0.5"], resume=ckpt, max_steps=3))
    with pytest.raises(LeantrainError, match=r"mix_by differs \('examples' in the checkpoint, 'tokens' now\)"):
        train(job("other", data=[f"{big}@0.7", f"{small}@0.3"], mix_by="tokens", resume=ckpt, max_steps=3))
    monkeypatch.chdir(tmp_path)
    relative = [f"{os.path.relpath(big)}@0.7", "small.csv@0.3"]
    assert train(job("same", data=relative, resume=ckpt, max_steps=3)).metrics["resumed_from"] == ckpt


@pytest.mark.parametrize(("first", "then"), [((7, 3), (0.7, 0.3)), ((0.7, 0.3), (7, 3))])
def test_resuming_a_mixture_with_its_weights_scaled_resumes(job, tmp_path, first, then):
    """7/3 and 0.7/0.3 are the same shares, so the same mixture: resumed, either way round."""
    big = Path(job().data)
    small = write_csv(tmp_path / "small.csv", make_sentiment_rows(30, seed=8))
    data = [f"{big}@{first[0]}", f"{small}@{first[1]}"]
    ckpt = str(step_dir(train(job("whole", data=data, save_every=2, max_steps=2)).output_dir, 2))
    again = job("same", data=[f"{big}@{then[0]}", f"{small}@{then[1]}"], resume=ckpt, max_steps=3)
    assert train(again).metrics["resumed_from"] == ckpt


def test_resuming_starts_from_the_checkpoints_weights(job, tmp_path):
    """A checkpoint whose weights were changed (its manifest fixed to match) resumes from the changed weights:
    proof that resume loads them rather than retraining from the start."""
    from safetensors.torch import load_file, save_file

    whole = train(job("whole", save_every=4))
    ckpt = tmp_path / "tampered"
    shutil.copytree(step_dir(whole.output_dir, 4), ckpt)
    state = load_file(ckpt / "model.safetensors")
    name = next(k for k in state if k.endswith("classifier.weight"))
    # +0.5 on one class and -0.5 on the other: the same shift on every class would cancel in the softmax
    state[name] = state[name] + torch.tensor([[0.5], [-0.5]])
    save_file(state, ckpt / "model.safetensors")
    manifest = json.loads((ckpt / "checkpoint.json").read_text())
    manifest["files"]["model.safetensors"] = {
        "bytes": (ckpt / "model.safetensors").stat().st_size,
        "crc32": checkpoint._crc32(ckpt / "model.safetensors"),
    }
    (ckpt / "checkpoint.json").write_text(json.dumps(manifest))
    resumed = train(job("resumed", save_every=4, resume=str(ckpt)))
    before, after = weights(whole.output_dir), weights(resumed.output_dir)
    assert (after[name] - before[name]).abs().min() > 0.1  # the +0.5 carried through 4 more steps
    assert loss_log(resumed.output_dir)[:4] == loss_log(whole.output_dir)[:4]  # the log up to the checkpoint
    assert loss_log(resumed.output_dir)[4:] != loss_log(whole.output_dir)[4:]


def test_checkpoint_contents_load_safely(job):
    result = train(job(save_every=4, max_steps=4))
    ckpt = step_dir(result.output_dir, 4)
    names = {p.name for p in ckpt.iterdir()}
    assert names >= {
        "model.safetensors",
        "optimizer.pt",
        "training_state.pt",
        "rank-0.pt",
        "metrics.jsonl",
        "checkpoint.json",
    }
    # the save_pretrained layout beside them (issue #17): the model's config and the tokenizer, as text
    loadable = names - {"optimizer.pt", "training_state.pt", "rank-0.pt", "metrics.jsonl", "checkpoint.json"}
    assert {"config.json", "tokenizer.json", "model.safetensors"} <= loadable
    assert all(n.endswith((".json", ".txt", ".safetensors")) for n in loadable)  # nothing that runs code
    for name in ("optimizer.pt", "training_state.pt", "rank-0.pt"):
        torch.load(ckpt / name, weights_only=True)  # no pickled code anywhere
    manifest = json.loads((ckpt / "checkpoint.json").read_text())
    assert manifest["progress"]["step"] == 4 and manifest["config"]["lr"] == 3e-3
    assert set(manifest["files"]) == names - {"checkpoint.json"}
    assert set(torch.load(ckpt / "rank-0.pt", weights_only=True)["rng"]) >= {"python", "numpy", "torch"}


# -- resume auto, pruning, the best checkpoint -------------------------------------------------------------------


def test_resume_auto_takes_the_newest_complete_checkpoint(job, monkeypatch, capsys):
    whole = train(job("whole", save_every=2))
    cfg = job("broken", save_every=2)
    with pytest.raises(Killed):
        train(cfg, hooks=DieAt(7))
    root = Path(cfg.output_dir) / "checkpoints"
    assert sorted(p.name for p in root.iterdir()) == ["step-000002", "step-000004", "step-000006"]
    with pytest.raises(ConfigError, match="--resume auto"):  # a fresh start would lose the checkpoints
        train(cfg)
    # what a kill mid-save or a damaged newer copy leaves: nothing that resume auto may pick
    partial = root / ".step-000008.tmp"
    partial.mkdir()
    shutil.copy(root / "step-000006" / "model.safetensors", partial)
    no_manifest = root / "step-000010"
    shutil.copytree(root / "step-000006", no_manifest)
    (no_manifest / "checkpoint.json").unlink()
    resumed = train(cfg.replace(resume="auto"))
    err = capsys.readouterr().err
    assert "step-000010: not a complete checkpoint" in err and "resuming from" in err and "step-000006" in err
    assert resumed.metrics["resumed_from"].endswith("step-000006")
    assert not partial.exists()  # the dead save's leftovers are cleaned up
    assert_same_weights(whole.output_dir, resumed.output_dir)
    assert loss_log(resumed.output_dir) == loss_log(whole.output_dir)


def test_resume_auto_without_checkpoints_starts_from_scratch(job, capsys):
    result = train(job(resume="auto", max_steps=2))
    assert result.metrics["resumed_from"] is None
    assert "no checkpoint" in capsys.readouterr().err


def test_total_limit_prunes_the_oldest_and_keeps_the_best(job, monkeypatch):
    from leantrain.training.evaluator import Evaluator

    # evaluations at steps 3, 6 and 9 (and the end): the first is the best, whatever the tiny model learns
    accuracies = iter([0.9, 0.6, 0.7, 0.5])
    monkeypatch.setattr(Evaluator, "evaluate", lambda *a: {"accuracy": next(accuracies), "macro_f1": 0.5, "loss": 0.5})
    result = train(job(save_every=2, save_total_limit=2, eval_every=3, max_steps=10))
    root = result.output_dir / "checkpoints"
    assert sorted(p.name for p in root.iterdir()) == ["step-000003", "step-000008", "step-000010"]
    assert result.metrics["best_checkpoint"] == str(root / "step-000003")
    manifest = checkpoint.verify(root / "step-000010").manifest
    assert manifest["progress"]["best_step"] == 3 and manifest["progress"]["best_value"] == 0.9
    assert checkpoint.verify(root / "step-000003").manifest["reason"] == "best eval accuracy"


def test_loss_as_the_best_metric_means_lower_is_better():
    progress = checkpoint.TrainState(best_metric="eval_loss")
    assert progress.update_best({"loss": 0.5, "accuracy": 0.5}, 1)
    assert not progress.update_best({"loss": 0.6, "accuracy": 0.9}, 2)
    assert progress.update_best({"loss": 0.4, "accuracy": 0.1}, 3) and progress.best_step == 3
    with pytest.raises(ConfigError, match="metric-for-best"):
        checkpoint.TrainState(best_metric="f1").update_best({"loss": 1.0}, 1)


@pytest.mark.parametrize("name", ["perplexity", "error_rate", "mean_absolute_error", "val_loss"])
def test_perplexity_and_a_users_error_or_loss_are_best_lowest(name):
    """A language model's perplexity, and a compute_metrics name saying error or loss (docs/metrics-and-losses.md's
    own example is `error_rate`): the best checkpoint is the lowest, not the worst."""
    progress = checkpoint.TrainState(best_metric=name)
    assert progress.update_best({"loss": 1.0, name: 117.0}, 2)
    assert progress.update_best({"loss": 1.0, name: 46.0}, 6)
    assert not progress.update_best({"loss": 1.0, name: 60.0}, 8)
    assert progress.best_step == 6 and progress.best_value == 46.0


def test_a_finished_run_is_not_resumed_and_overwrite_discards_its_checkpoints(job):
    first = train(job(save_every=4, max_steps=4))
    with pytest.raises(ConfigError, match="finished run"):
        train(job(save_every=4, max_steps=4, resume="auto"))
    train(job(save_every=3, max_steps=3, overwrite=True))
    assert sorted(p.name for p in (first.output_dir / "checkpoints").iterdir()) == ["step-000003"]


# -- a changed config is refused ----------------------------------------------------------------------------------


def test_how_long_processes_wait_for_each_other_may_change_on_resume(job):
    whole = train(job("whole", save_every=2, max_steps=4, collective_timeout="5m"))
    ckpt = str(step_dir(whole.output_dir, 2))
    resumed = train(job("resumed", save_every=2, max_steps=4, collective_timeout="10m", resume=ckpt))
    assert resumed.metrics["resumed_from"] == ckpt


def test_resuming_with_a_result_changing_config_is_refused_naming_the_keys(job, sentiment_csv, tmp_path):
    data = tmp_path / "data.csv"
    shutil.copy(sentiment_csv, data)
    whole = train(job("whole", data=str(data), save_every=4, max_steps=4))
    ckpt = str(step_dir(whole.output_dir, 4))
    with pytest.raises(LeantrainError) as err:
        train(job("other", data=str(data), resume=ckpt, lr=1e-3, batch_size=16, seed=6))
    message = str(err.value)
    assert (
        "batch_size differs (24 in the checkpoint, 16 now), lr differs (0.003 in the checkpoint, 0.001 now) "
        "and seed differs (5 in the checkpoint, 6 now), which would change the result" in message
    )
    assert "\n" not in message
    # the same file name holding other data
    data.write_text("\n".join(data.read_text().splitlines()[:-30]) + "\n")
    with pytest.raises(LeantrainError, match=r"train_examples differs \(216 in the checkpoint, 189 now\)"):
        train(job("other", data=str(data), resume=ckpt))
    # harmless changes: longer, another output dir, another saving, logging and evaluation cadence
    shutil.copy(sentiment_csv, data)
    longer = train(job("longer", data=str(data), resume=ckpt, max_steps=6, save_every=3, log_every=2, eval_every=5))
    assert longer.metrics["optimizer_steps"] == 6


def test_resuming_a_checkpoint_past_the_runs_last_step_is_refused(job, capsys):
    """A shorter run resumed from a later checkpoint would publish that checkpoint's model, trained longer than
    asked, after saying it trains the shorter length."""
    first = train(job("first", save_every=3, max_steps=6))
    ckpt = step_dir(first.output_dir, 6)
    for changes, length in ((dict(max_steps=4), "4 optimizer steps (--max-steps 4)"),
                            (dict(max_steps=None, epochs=0.5), "5 optimizer steps (--epochs 0.5)")):  # fmt: skip
        with pytest.raises(ConfigError) as err:
            train(job("shorter", resume=str(ckpt), **changes))
        message = str(err.value)
        assert f"cannot resume from {ckpt}: it is at step 6, past this run's {length}; give --max-steps 6" in message
        assert "\n" not in message and not (first.output_dir.parent / "shorter" / "metrics.json").exists()
    # its own length, and an earlier checkpoint, resume
    assert train(job("same", resume=str(ckpt), max_steps=6)).metrics["optimizer_steps"] == 6
    assert train(job("earlier", resume=str(step_dir(first.output_dir, 3)), max_steps=4)).metrics["optimizer_steps"] == 4


def test_the_runs_own_config_yaml_resumes_its_checkpoint_and_another_task_is_refused(job, tmp_path):
    # config.yaml records the task the run inferred; the checkpoint the task as asked (none)
    first = train(job("first", save_every=2, max_steps=4))
    ckpt = str(step_dir(first.output_dir, 2))
    saved = TrainConfig.from_yaml(first.output_dir / "config.yaml")
    assert saved.task == "text-classification"
    again = train(saved.replace(output_dir=str(tmp_path / "again"), resume=ckpt))
    assert_same_weights(first.output_dir, again.output_dir)
    with pytest.raises(
        LeantrainError, match=r"task differs \('text-classification' in the checkpoint, 'token-classification' now\)"
    ):
        train(job("other", resume=ckpt, task="token-classification"))


def test_an_older_checkpoint_recording_stride_32_resumes_with_the_stride_left_out_where_it_is_the_same(tmp_path):
    """Older versions recorded --stride 32 in every run's config, and a token classifier's facts had no stride: a
    stride left out now (None) is compared as the stride the run windows with, against the 32 the config held; a
    task that reads no stride compares none."""
    facts = {"precision": "fp32", "num_processes": 1, "task": "token-classification"}
    older = checkpoint.Checkpoint(tmp_path, {"config": {"stride": 32, "max_length": 64}, "facts": facts})
    older.check_matches({"stride": None, "max_length": 64}, facts)  # the config: no stride compared
    older.check_matches({}, {"train_examples": 8, "stride": 32})  # --max-length 64 windows share 32 as before
    with pytest.raises(checkpoint.CheckpointError, match=r"stride differs \(32 in the checkpoint, 16 now\)"):
        older.check_matches({}, {"train_examples": 8, "stride": 16})
    text = {**facts, "task": "text-classification"}
    checkpoint.Checkpoint(tmp_path, {"config": {"stride": 32}, "facts": text}).check_matches({"stride": None}, text)
    newer = checkpoint.Checkpoint(tmp_path, {"config": {"stride": None}, "facts": {**facts, "stride": 16}})
    with pytest.raises(checkpoint.CheckpointError, match=r"stride differs \(16 in the checkpoint, 12 now\)"):
        newer.check_matches({}, {"stride": 12})


# -- damaged checkpoints give one clear line -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def pristine_checkpoint(dropout_model_dir, sentiment_csv, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("source") / "run"
    train(
        TrainConfig(
            model=str(dropout_model_dir),
            data=str(sentiment_csv),
            output_dir=str(out),
            batch_size=24,
            max_steps=2,
            lr=3e-3,
            precision="fp32",
            log_every=1,
            progress=False,
            seed=5,
            save_every=2,
            cache_dir=str(tmp_path_factory.mktemp("cache")),
            report=False,
        )
    )
    return step_dir(out, 2)


@pytest.fixture()
def saved_checkpoint(pristine_checkpoint, tmp_path) -> Path:
    return Path(shutil.copytree(pristine_checkpoint, tmp_path / "copy" / pristine_checkpoint.name))


@pytest.mark.parametrize(
    "damage",
    [
        "truncate model.safetensors",
        "truncate optimizer.pt",
        "flip training_state.pt",
        "drop rank-0.pt",
        "garble checkpoint.json",
    ],
)
def test_a_damaged_checkpoint_is_refused_in_one_line_naming_the_file(saved_checkpoint, job, damage, capsys):
    from leantrain.commands.cli import main

    how, name = damage.split()
    path = saved_checkpoint / name
    data = path.read_bytes()
    if how == "truncate":
        path.write_bytes(data[: len(data) // 2])
    elif how == "flip":
        path.write_bytes(data[:100] + bytes([data[100] ^ 0xFF]) + data[101:])
    elif how == "drop":
        path.unlink()
    else:
        path.write_text(data.decode()[:40])
    cfg = job("resumed", resume=str(saved_checkpoint))
    with pytest.raises(LeantrainError, match=name.replace(".", r"\.")):
        train(cfg)
    args = [
        "train",
        "--model",
        cfg.model,
        "--data",
        cfg.data,
        "--cache-dir",
        cfg.cache_dir,
        "--output-dir",
        cfg.output_dir,
        "--batch-size",
        "24",
        "--max-steps",
        "8",
        "--lr",
        "3e-3",
        "--precision",
        "fp32",
        "--log-every",
        "1",
        "--seed",
        "5",
        "--no-progress",
        "--resume",
        str(saved_checkpoint),
    ]
    capsys.readouterr()
    assert main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("leantrain train: error: ") and name in err[-1] and "Traceback" not in "".join(err)


def test_a_checkpoint_file_with_pickled_code_is_refused(saved_checkpoint, job):
    """Even with a matching checksum (a checkpoint made by someone else), loading runs no code."""

    class Evil:
        def __reduce__(self):
            return (os.system, ("echo pwned",))

    path = saved_checkpoint / "training_state.pt"
    torch.save({"scheduler": Evil()}, path)
    manifest = json.loads((saved_checkpoint / "checkpoint.json").read_text())
    manifest["files"]["training_state.pt"] = {"bytes": path.stat().st_size, "crc32": checkpoint._crc32(path)}
    (saved_checkpoint / "checkpoint.json").write_text(json.dumps(manifest))
    with pytest.raises(LeantrainError, match=r"training_state\.pt: cannot be loaded"):
        train(job("resumed", resume=str(saved_checkpoint)))


# -- a full disk ---------------------------------------------------------------------------------------------


def test_a_full_disk_at_save_time_is_one_error_and_the_previous_checkpoint_survives(job, monkeypatch):
    cfg = job(save_every=2)
    real_save = torch.save
    calls = iter(range(10**6))

    def save(obj, f, *a, **kw):
        if next(calls) >= 3:  # the first checkpoint's three torch files go through, then the disk is full
            raise OSError(errno.ENOSPC, "No space left on device", str(getattr(f, "name", f)))
        return real_save(obj, f, *a, **kw)

    monkeypatch.setattr(checkpoint.torch, "save", save)
    with pytest.raises(LeantrainError) as err:
        train(cfg)
    message = str(err.value)
    assert "No space left on device" in message and ".step-000004.tmp" in message
    assert "step-000002 is intact" in message
    root = Path(cfg.output_dir) / "checkpoints"
    assert sorted(p.name for p in root.iterdir()) == ["step-000002"]  # no partial save left behind
    assert checkpoint.verify(root / "step-000002").step == 2


def test_too_little_disk_for_one_checkpoint_is_reported_before_training(job, monkeypatch):
    from collections import namedtuple

    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(checkpoint.shutil, "disk_usage", lambda p: usage(10**9, 10**9 - 10**5, 10**5))
    with pytest.raises(LeantrainError, match="MB free, but one checkpoint needs"):
        train(job(save_every=2))
    assert not (Path(job().output_dir) / "checkpoints").exists()


def test_an_unwritable_checkpoints_folder_is_reported_before_training(tmp_path, monkeypatch):
    (tmp_path / "checkpoints").mkdir()
    real = Path.write_bytes

    def write_bytes(self, data):
        if "write-test" in self.name:
            raise PermissionError(errno.EACCES, "Permission denied", str(self))
        return real(self, data)

    monkeypatch.setattr(Path, "write_bytes", write_bytes)
    with pytest.raises(LeantrainError, match=r"cannot write checkpoints to .*checkpoints \(Permission denied\)"):
        checkpoint.free_space_check(tmp_path, 1000, None)


def test_sharding_one_process_is_refused_in_one_line(job):
    """--shard fsdp shards across processes (its checkpoints are tested with two in tests/parallel); the Python API
    refuses one process as the CLI does, before fully_shard fails for want of a process group."""
    with pytest.raises(ConfigError, match="--shard fsdp shards across processes"):
        train(job(shard="fsdp", save_every=2))


# -- the NaN guard ------------------------------------------------------------------------------------------------


def inject_nan(monkeypatch, step: int, where: str) -> None:
    """Make optimizer step `step` non-finite: its loss, or one gradient (the loss staying finite)."""
    from leantrain.training.trainer import Trainer

    real = Trainer.forward_backward_step
    count = iter(range(1, 10**6))

    def forward_backward_step(self, batch):
        loss = real(self, batch)
        if next(count) == step:  # one micro-batch per step here
            if where == "loss":
                return loss * float("nan")
            next(p for p in self.model.parameters() if p.grad is not None).grad.view(-1)[0] = float("inf")
        return loss

    monkeypatch.setattr(Trainer, "forward_backward_step", forward_backward_step)


@pytest.mark.parametrize("where, log_every", [("loss", 1), ("grad", 1), ("loss", 3), ("grad", 3)])
def test_on_nan_stop_saves_the_last_good_state_which_resumes_exactly(job, monkeypatch, where, log_every):
    """log_every 3: the bad step 5 is read only at step 6's log row, after step 6 ran on the device (moving nothing):
    the state put back and saved is still step 4's, exactly."""
    whole = train(job("whole", log_every=log_every))
    cfg = job("broken", log_every=log_every)  # no --save-every: the stop saves anyway
    inject_nan(monkeypatch, 5, where)
    with pytest.raises(LeantrainError) as err:
        train(cfg)
    monkeypatch.undo()
    message = str(err.value)
    assert message.startswith("step 5: non-finite")
    assert ("loss (nan)" if where == "loss" else "gradient norm (inf)") in message
    assert "learning rate is too high" in message and "step-000004" in message and "--on-nan skip" in message
    ckpt = step_dir(cfg.output_dir, 4)
    assert checkpoint.verify(ckpt).manifest["reason"].startswith("last good state")
    resumed = train(cfg.replace(resume="auto"))
    assert_same_weights(whole.output_dir, resumed.output_dir)
    assert loss_log(resumed.output_dir) == loss_log(whole.output_dir)


def test_on_nan_stop_under_fp16_points_at_bf16(job, monkeypatch):
    inject_nan(monkeypatch, 2, "loss")
    with pytest.raises(LeantrainError, match=r"fp16 overflow.*--precision bf16"):
        train(job(precision="fp16"))


def test_under_fp16_an_overflowing_gradient_is_the_scalers_to_skip_not_a_stop(job, monkeypatch):
    """fp16 loss scaling overflows the gradients now and then by design: the scaler skips that step and lowers its
    scale; the NaN guard looks at the loss only (a mutant checking the gradient norm too survived the NaN tests)."""
    inject_nan(monkeypatch, 3, "grad")
    result = train(job(precision="fp16", max_steps=5))  # --on-nan stop, the default: it must not stop
    assert result.metrics["optimizer_steps"] == 5 and result.metrics["nan_skipped_steps"] == 0
    assert all(torch.isfinite(t).all() for t in weights(result.output_dir).values())


def test_an_fp16_run_resumes_with_its_loss_scale_and_skipped_steps(job, monkeypatch):
    """The loss scaler's state is part of the checkpoint: an overflow at step 2 halves the scale and skips the step;
    resumed from step 3, the run logs the halved scale and the skip as the uninterrupted one does. (A mutation pass
    found the scaler's restore untested: every other resume test runs fp32.)"""
    import json

    inject_nan(monkeypatch, 2, "grad")
    whole = train(job("fp16-whole", precision="fp16", max_steps=5, save_every=3))
    monkeypatch.undo()
    resumed = train(job("fp16-resumed", precision="fp16", max_steps=5, resume=str(step_dir(whole.output_dir, 3))))

    def rows(run):
        lines = (Path(run.output_dir) / "metrics.jsonl").read_text().splitlines()
        return {r["step"]: (r["loss_scale"], r["skipped_steps"]) for r in map(json.loads, lines) if "loss" in r}

    before, after = rows(whole), rows(resumed)
    assert before[1][0] == 2 * before[2][0] and before[2][1] == 1  # the overflow halved the scale, skipped a step
    assert {s: after[s] for s in (4, 5)} == {s: before[s] for s in (4, 5)}


@pytest.mark.parametrize("where", ["loss", "grad"])
def test_on_nan_skip_drops_the_step_and_goes_on(job, monkeypatch, where):
    inject_nan(monkeypatch, 3, where)
    result = train(job(on_nan="skip", max_steps=6))
    assert result.metrics["nan_skipped_steps"] == 1 and result.metrics["optimizer_steps"] == 6
    assert all(torch.isfinite(t).all() for t in weights(result.output_dir).values())
    rows = dict(loss_log(result.output_dir))
    assert rows[3] is None and all(np.isfinite(rows[s]) for s in (1, 2, 4, 5, 6))


def test_a_huge_learning_rate_stops_with_the_cause(job):
    with pytest.raises(LeantrainError, match=r"non-finite .*learning rate is too high \(--lr 1e\+06\)"):
        train(job(lr=1e6, optimizer="adamw", max_steps=30))


# -- SIGKILL: real processes ----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def cli_job(dropout_model_dir, sentiment_csv, tmp_path_factory):
    """`leantrain train` arguments for two epochs of 6 steps (216 rows, batch 36), saving every 2 steps."""
    cache = tmp_path_factory.mktemp("cli-cache")
    return [
        "train",
        "--model",
        str(dropout_model_dir),
        "--data",
        str(sentiment_csv),
        "--cache-dir",
        str(cache),
        "--batch-size",
        "36",
        "--epochs",
        "2",
        "--lr",
        "3e-3",
        "--precision",
        "fp32",
        "--log-every",
        "1",
        "--seed",
        "5",
        "--save-every",
        "2",
        "--eval-every",
        "5",
        "--no-progress",
    ]


def run_cli(
    args: list[str], output_dir: Path, env: dict | None = None, helper: bool = False, wait: bool = True
) -> subprocess.Popen:
    command = [sys.executable, str(HELPER)] if helper else [sys.executable, "-m", "leantrain"]
    full_env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", **(env or {})}
    proc = subprocess.Popen(
        command + args + ["--output-dir", str(output_dir)],
        env=full_env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    if wait:
        out, err = proc.communicate(timeout=300)
        proc.stdout_text, proc.stderr_text = out, err
    return proc


@pytest.fixture(scope="module")
def left_alone(cli_job, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("cli") / "left-alone"
    proc = run_cli(cli_job, out)
    assert proc.returncode == 0, proc.stderr_text
    return out


def resume_and_compare(cli_job, out: Path, left_alone: Path) -> str:
    assert not (out / "metrics.json").exists()  # the killed run did not finish
    proc = run_cli([*cli_job, "--resume", "auto"], out)
    assert proc.returncode == 0, proc.stderr_text
    assert_same_weights(left_alone, out)
    assert loss_log(out) == loss_log(left_alone)
    assert [s for s, _ in loss_log(out)] == list(range(1, 13))
    return proc.stderr_text


def sigkill_after_the_first_checkpoint(args: list[str], out: Path) -> checkpoint.Checkpoint:
    """Run `args` with slow steps (0.3 s) and SIGKILL it about half a step after step 2's checkpoint appears:
    mid-step, before the next checkpoint. Returns the newest checkpoint it left."""
    proc = run_cli(args, out, env={"LT_TEST_STEP_SLEEP": "0.3"}, helper=True, wait=False)
    try:
        deadline = time.monotonic() + 120
        while not step_dir(out, 2).is_dir():
            assert proc.poll() is None, proc.stderr.read()
            assert time.monotonic() < deadline, "no checkpoint appeared"
            time.sleep(0.02)
        time.sleep(0.15)
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.kill()
        proc.communicate()
    assert proc.returncode == -signal.SIGKILL
    newest = checkpoint.CheckpointDir(out / "checkpoints").latest()
    assert newest is not None
    return newest


@pytest.mark.slow  # real processes killed mid-run
def test_sigkill_mid_epoch_then_resume_auto_is_exact(cli_job, left_alone, tmp_path):
    out = tmp_path / "killed"
    newest = sigkill_after_the_first_checkpoint(cli_job, out)
    assert 2 <= newest.step < 6, "killed in the first epoch, after its first checkpoint"
    err = resume_and_compare(cli_job, out, left_alone)
    assert f"resuming from {newest.path}" in err


@pytest.mark.slow  # real processes killed mid-run: 3 runs of up to 14 steps, about 30 s at load 3
def test_sigkill_mid_epoch_of_a_mixture_by_tokens_then_resume_auto_is_exact(cli_job, tmp_path):
    """0.7/0.3 by tokens (243 rows: 7 steps of 36 an epoch; the small source restarts every few steps), SIGKILLed
    mid-step after its first checkpoint and resumed: the weights, each step's loss, each source's figures and
    evaluations of the run left alone."""
    small = write_csv(tmp_path / "small.csv", make_sentiment_rows(30, seed=8))
    i = cli_job.index("--data")
    mixture = ["--data", f"{cli_job[i + 1]}@0.7", "--data", f"{small}@0.3", "--mix-by", "tokens"]
    args = [*cli_job[:i], *mixture, *cli_job[i + 2 :]]
    alone, out = tmp_path / "alone", tmp_path / "killed"
    proc = run_cli(args, alone)
    assert proc.returncode == 0, proc.stderr_text
    newest = sigkill_after_the_first_checkpoint(args, out)
    assert 2 <= newest.step < 7 and not (out / "metrics.json").exists()
    proc = run_cli([*args, "--resume", "auto"], out)
    assert proc.returncode == 0, proc.stderr_text
    assert f"resuming from {newest.path}" in proc.stderr_text
    assert_same_weights(alone, out)
    rows = logged_rows(alone)
    assert logged_rows(out) == rows and [r["step"] for r in rows if "loss" in r] == list(range(1, 15))
    assert any("eval_loss" in r and r["step"] > newest.step for r in rows)


@pytest.mark.slow  # real processes killed mid-run
def test_sigkill_at_the_end_of_an_epoch_then_resume_auto_is_exact(cli_job, left_alone, tmp_path):
    out = tmp_path / "killed"
    proc = run_cli(cli_job, out, env={"LT_KILL_AFTER_SAVE": "6"}, helper=True)
    assert proc.returncode == -signal.SIGKILL
    newest = checkpoint.CheckpointDir(out / "checkpoints").latest()
    assert newest.step == 6 and newest.progress.epoch == 0 and newest.progress.steps_in_epoch == 6
    resume_and_compare(cli_job, out, left_alone)


@pytest.mark.slow  # real processes killed mid-run
def test_sigkill_while_saving_keeps_the_previous_checkpoint(cli_job, left_alone, tmp_path):
    out = tmp_path / "killed"
    proc = run_cli(cli_job, out, env={"LT_KILL_MID_SAVE": "4"}, helper=True)
    assert proc.returncode == -signal.SIGKILL
    root = out / "checkpoints"
    assert (next(root.glob(".step-000004.tmp-*")) / "model.safetensors").is_file()  # the save was cut short
    assert not step_dir(out, 4).exists()
    assert checkpoint.CheckpointDir(root).latest().step == 2
    err = resume_and_compare(cli_job, out, left_alone)
    assert "step-000002" in err
    assert not list(root.glob(".step-000004.tmp*"))


@pytest.mark.parametrize("load_best_at_end", [False, True])
def test_a_final_evaluation_that_is_the_best_is_the_best_checkpoint(job, monkeypatch, load_best_at_end):
    from safetensors.torch import load_file

    from leantrain.training.evaluator import Evaluator

    # evaluations at step 4 and at the end (step 6): the final one is the best
    accuracies = iter([0.5, 0.9])
    monkeypatch.setattr(Evaluator, "evaluate", lambda *a: {"accuracy": next(accuracies), "macro_f1": 0.5, "loss": 0.5})
    result = train(job(save_every=4, eval_every=4, max_steps=6, load_best_at_end=load_best_at_end))
    m, root = result.metrics, result.output_dir / "checkpoints"
    assert (m["best_step"], m["best_value"], m["model_step"]) == (6, 0.9, 6)
    assert m["best_checkpoint"] == str(root / "step-000006")  # was step-000004: the newest checkpoint's record
    saved = load_file(root / "step-000006" / "model.safetensors")
    published = load_file(result.model_dir / "model.safetensors")
    assert all(torch.equal(saved[k], published[k]) for k in published)
    assert sorted(p.name for p in root.iterdir()) == ["step-000004", "step-000006"]


def test_without_checkpoints_no_best_checkpoint_is_named(job):
    result = train(job(eval_every=2, max_steps=4))
    assert result.metrics["best_checkpoint"] is None and result.metrics["best_step"] in (2, 4)


# -- the final evaluation belongs to the last checkpoint's record (a run trained further goes on from it) --------


def score_evaluations(monkeypatch, *accuracies: float) -> None:
    """The evaluations score `accuracies` in turn, then 0 (a --load-best-at-end re-evaluation of the best)."""
    import itertools

    from leantrain.training.evaluator import Evaluator

    scores = itertools.chain(accuracies, itertools.repeat(0.0))
    monkeypatch.setattr(Evaluator, "evaluate", lambda *a: {"accuracy": next(scores), "macro_f1": 0.5, "loss": 0.5})


def checkpoint_names(run_dir: Path) -> list[str]:
    return sorted(p.name for p in (Path(run_dir) / "checkpoints").iterdir())


def assert_the_best_agrees_with_the_model(result, last_step: int, load_best_at_end: bool) -> None:
    """metrics.json's best_step, best_checkpoint and model_step describe the weights in model/ and on disk."""
    m = result.metrics
    best = step_dir(result.output_dir, m["best_step"])
    assert m["best_checkpoint"] == str(best)
    progress = checkpoint.verify(best).manifest["progress"]
    assert (progress["step"], progress["best_step"], progress["best_value"]) == (m["best_step"],) * 2 + (
        m["best_value"],
    )
    model_step = m["best_step"] if load_best_at_end else last_step
    assert m["model_step"] == model_step
    published = load_file(result.model_dir / "model.safetensors")
    saved = load_file(step_dir(result.output_dir, model_step) / "model.safetensors")
    assert all(torch.equal(saved[k], published[k]) for k in published)


def test_the_last_checkpoint_records_the_final_evaluation(job, monkeypatch):
    # evaluations at step 3 and at the end (step 6, saved by --save-every): the final one is the best
    score_evaluations(monkeypatch, 0.5, 0.9)
    result = train(job(save_every=3, eval_every=3, max_steps=6, save_total_limit=1))
    last = step_dir(result.output_dir, 6)
    progress = checkpoint.verify(last).manifest["progress"]
    assert (progress["best_step"], progress["best_value"]) == (6, 0.9)  # was step 3's 0.5: saved before evaluating
    rows = [json.loads(line) for line in (last / "metrics.jsonl").read_text().splitlines()]
    assert {"step": 6, "eval_accuracy": 0.9} in [{k: r.get(k) for k in ("step", "eval_accuracy")} for r in rows]
    # --save-total-limit 1: the newest is the best, so it is the only one (was step 3 too, named best by step 6)
    assert checkpoint_names(result.output_dir) == ["step-000006"]
    assert_the_best_agrees_with_the_model(result, 6, load_best_at_end=False)


@pytest.mark.parametrize("load_best_at_end", [False, True])
@pytest.mark.parametrize("further_best", [False, True])
def test_a_run_trained_further_keeps_its_best_and_publishes_it(job, monkeypatch, load_best_at_end, further_best):
    # the first run's final evaluation (step 6) is the best; the longer run's end (step 12) beats it or not
    score_evaluations(monkeypatch, 0.5, 0.9, 0.6, 0.95 if further_best else 0.7)
    cfg = job(save_every=3, eval_every=3, max_steps=6, save_total_limit=1, load_best_at_end=load_best_at_end)
    train(cfg)
    further = train(cfg.replace(max_steps=12, resume="auto", overwrite=True))
    m, best = further.metrics, 12 if further_best else 6
    assert m["resumed_from"].endswith("step-000006")
    assert (m["best_step"], m["best_value"]) == (best, 0.95 if further_best else 0.9)  # was 12, 0.7: 6 forgotten
    # the best is never pruned (was: step 6 pruned, the record naming step 9 then 12 instead)
    assert checkpoint_names(further.output_dir) == (["step-000012"] if further_best else ["step-000006", "step-000012"])
    # --load-best-at-end publishes the best (was step 12's worse weights)
    assert_the_best_agrees_with_the_model(further, 12, load_best_at_end)


def test_pruning_keeps_the_runs_best_not_the_one_a_newer_abandoned_checkpoint_names(job, monkeypatch):
    # a run killed at step 10 leaves steps 3, 6 and 9, step 9 its best; resumed from step 3 instead, step 4 is best
    score_evaluations(monkeypatch, 0.5, 0.6, 0.7, 0.8)
    cfg = job(save_every=3, eval_every=3, max_steps=10)
    with pytest.raises(Killed):
        train(cfg, hooks=DieAt(10))
    step_3 = str(step_dir(cfg.output_dir, 3))
    result = train(cfg.replace(resume=step_3, save_every=2, eval_every=2, save_total_limit=1, load_best_at_end=True))
    assert (result.metrics["best_step"], result.metrics["best_value"]) == (4, 0.8)
    # step 4 was pruned as soon as it was saved: step 9's record (best: 9) judged it
    assert checkpoint_names(result.output_dir) == ["step-000004", "step-000010"]
    assert_the_best_agrees_with_the_model(result, 10, load_best_at_end=True)


@pytest.mark.parametrize("settings", [dict(save_every=4, eval_every=2), dict(load_best_at_end=True, eval_every=2)])
def test_a_run_that_keeps_checkpoints_saves_its_last_step_and_is_trained_further_from_it(job, monkeypatch, settings):
    """As the HF Trainer: the last step is saved when a run keeps checkpoints, so a run trained further goes on from
    its end (it went on from step 4, or from its best at step 2, and trained those steps again)."""
    score_evaluations(monkeypatch, 0.9, 0.5, 0.5, 0.5)  # with --load-best-at-end: the best is step 2's
    cfg = job(max_steps=6, **settings)
    first = train(cfg)
    assert checkpoint_names(first.output_dir)[-1] == "step-000006"
    manifest = checkpoint.verify(step_dir(first.output_dir, 6)).manifest
    assert manifest["reason"] == "the last step"
    further = train(cfg.replace(max_steps=8, resume="auto", overwrite=True))
    assert further.metrics["resumed_from"].endswith("step-000006")


def test_a_state_dict_that_does_not_fit_names_its_keys(tmp_path):
    """torch's load_state_dict error is a header line and the keys below it: the one line keeps the keys (a LoRA
    checkpoint whose trained modules differ said only "Error(s) in loading state_dict for WholeTensors:")."""
    from leantrain.run.checkpoint import CheckpointError, _load

    def load(path):
        raise RuntimeError('Error(s) in loading state_dict for WholeTensors:\n\tMissing key(s) in state_dict: "a.b".')

    with pytest.raises(CheckpointError, match=r'WholeTensors: Missing key\(s\) in state_dict: "a\.b"\.\); it is'):
        _load(tmp_path / "model.safetensors", load)
