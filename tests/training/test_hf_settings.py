"""Settings a Trainer user brings (issue #17), in real runs: data-loader workers change nothing but speed, the eval
batch size is a real setting, and an HF-named YAML (as a Trainer user writes it) trains through the CLI."""

from __future__ import annotations

import json

import pytest
import torch
import yaml
from safetensors.torch import load_file

from leantrain import TrainConfig, train
from leantrain.commands import cli
from leantrain.training import Hooks
from tests.conftest import EXACT_JOB


@pytest.fixture()
def run(dropout_model_dir, sentiment_csv, cache_dir, tmp_path):
    count = iter(range(100))

    def go(hooks=None, **changes):
        base = dict(
            model=str(dropout_model_dir),
            data=str(sentiment_csv),
            cache_dir=str(cache_dir),
            output_dir=str(tmp_path / f"run{next(count)}"),
            report=False,
            max_steps=6,
            batch_size=12,
            **EXACT_JOB,
        )
        return train(TrainConfig(**{**base, **changes}), hooks=hooks)

    return go


def loss_log(result) -> list[float]:
    rows = [json.loads(x) for x in (result.output_dir / "metrics.jsonl").read_text().splitlines()]
    return [r["loss"] for r in rows if "loss" in r]


def test_dataloader_workers_train_bitwise_like_the_main_process(run):
    # dropout on: the workers must draw nothing from the training process's RNG, and batch in the same order
    alone, with_workers = run(), run(dataloader_num_workers=2)
    a, b = (load_file(r.model_dir / "model.safetensors") for r in (alone, with_workers))
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert loss_log(alone) == loss_log(with_workers) and len(loss_log(alone)) == 6


class EvalBatches(Hooks):
    def __init__(self):
        self.sizes: list[int] = []

    def on_eval_batch(self, batch) -> None:
        self.sizes.append(len(batch["index"]))


@pytest.mark.parametrize("eval_batch_size, largest", [(5, 5), (None, 24)])  # default: 2 x --batch-size
def test_the_eval_batch_size_is_a_real_setting(run, eval_batch_size, largest):
    seen = EvalBatches()
    result = run(hooks=seen, eval_batch_size=eval_batch_size, max_steps=1)
    assert max(seen.sizes) == largest and sum(seen.sizes) == 24  # the 10% held out of 240 rows, each once
    assert result.metrics["eval_accuracy"] is not None


def test_a_trainer_users_yaml_trains(tiny_model_dir, sentiment_csv, tmp_path):
    out = tmp_path / "hf-run"
    config = {  # TrainingArguments names as a Trainer user writes them, plus what leantrain needs to find the job
        "model": str(tiny_model_dir),
        "data": str(sentiment_csv),
        "cache_dir": str(tmp_path / "cache"),
        "output_dir": str(out),
        "overwrite_output_dir": True,
        "do_train": True,
        "do_eval": True,
        "learning_rate": 3.0e-3,
        "num_train_epochs": 2,
        "per_device_train_batch_size": 16,
        "per_device_eval_batch_size": 8,
        "gradient_accumulation_steps": 2,
        "warmup_steps": 0.1,
        "lr_scheduler_type": "cosine",
        "weight_decay": 0.01,
        "eval_strategy": "epoch",
        "save_strategy": "epoch",
        "save_total_limit": 1,
        "logging_steps": 2,
        "load_best_model_at_end": True,
        "metric_for_best_model": "eval_loss",
        "early_stopping_patience": 3,
        "bf16": False,
        "fp16": False,
        "dataloader_num_workers": 0,
        "seed": 7,
    }
    path = tmp_path / "trainer.yaml"
    path.write_text(yaml.safe_dump(config))
    assert cli.main(["train", "--config", str(path), "--no-progress", "--no-report"]) == 0
    saved = yaml.safe_load((out / "config.yaml").read_text())
    assert (saved["lr"], saved["epochs"], saved["batch_size"], saved["eval_batch_size"]) == (3e-3, 2.0, 16, 8)
    assert (saved["grad_accum"], saved["warmup_steps"], saved["scheduler"]) == (2, 0.1, "cosine")
    assert (saved["eval_every"], saved["save_every"], saved["log_every"]) == ("epoch", "epoch", 2)
    assert saved["precision"] == "fp32" and saved["load_best_at_end"] and saved["metric_for_best"] == "loss"
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["optimizer_steps"] == 14  # 216 training rows, 32 a step: 7 steps an epoch
    assert metrics["best_metric"] == "loss" and metrics["model_step"] == metrics["best_step"]
    evals = [json.loads(x)["step"] for x in (out / "metrics.jsonl").read_text().splitlines() if "eval_loss" in x]
    assert evals == [7, 14]  # at the end of each epoch
    assert (out / "model" / "model.safetensors").is_file()
