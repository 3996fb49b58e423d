"""Techniques change cost, not the result: exact equivalences on a tiny dropout-free BERT in fp32."""

import pytest
import torch
from safetensors.torch import load_file

from leantrain import TrainConfig, train
from tests.conftest import EXACT_JOB, max_diff

TOL = 1e-5


@pytest.fixture()
def run(tiny_model_dir, sentiment_csv, cache_dir, tmp_path):
    count = iter(range(100))

    def go(**changes):
        base = dict(
            model=str(tiny_model_dir),
            data=str(sentiment_csv),
            cache_dir=str(cache_dir),
            output_dir=str(tmp_path / f"run{next(count)}"),
            report=False,
            **EXACT_JOB,
        )
        result = train(TrainConfig(**{**base, **changes}))
        return result, load_file(result.model_dir / "model.safetensors")

    return go


def loss_log(result) -> list[float]:
    import json

    rows = [json.loads(x) for x in (result.output_dir / "metrics.jsonl").read_text().splitlines()]
    return [r["loss"] for r in rows if "loss" in r]


def test_gradient_accumulation_equals_the_big_batch(run):
    big, w_big = run(batch_size=24, grad_accum=1, max_steps=6)
    small, w_small = run(batch_size=6, grad_accum=4, max_steps=6)
    assert small.metrics["micro_steps"] == 4 * big.metrics["micro_steps"]
    assert max_diff(w_big, w_small) <= TOL
    assert loss_log(small) == pytest.approx(loss_log(big), abs=TOL)


def test_uneven_micro_batches_and_the_short_last_step_are_exact(run):
    # 216 training rows, global batch 28: seven full steps, then a step of 20 examples that the split
    # run takes as three micro-batches of 7, 7 and 6 (not four)
    big, w_big = run(batch_size=28, grad_accum=1, epochs=1)
    small, w_small = run(batch_size=7, grad_accum=4, epochs=1)
    assert big.metrics["optimizer_steps"] == small.metrics["optimizer_steps"] == 8
    assert small.metrics["micro_steps"] == 7 * 4 + 3
    assert max_diff(w_big, w_small) <= TOL


def test_gradient_accumulation_with_clipping_and_adamw_stays_close(run):
    _big, w_big = run(batch_size=16, grad_accum=1, max_steps=4, optimizer="adamw", lr=1e-3, max_grad_norm=1.0)
    _small, w_small = run(batch_size=4, grad_accum=4, max_steps=4, optimizer="adamw", lr=1e-3, max_grad_norm=1.0)
    # Adam divides by sqrt(v): rounding differences near zero gradients are magnified, so not 1e-5
    assert max_diff(w_big, w_small) <= 1e-3


def test_activation_checkpointing_trains_identically(run):
    plain, w_plain = run(batch_size=16, max_steps=5)
    ckpt, w_ckpt = run(batch_size=16, max_steps=5, activation_checkpointing=True)
    assert loss_log(ckpt) == pytest.approx(loss_log(plain), abs=TOL)
    assert max_diff(w_plain, w_ckpt) <= TOL


def test_local_sgd_with_one_process_is_a_no_op_that_says_so(run, capsys):
    _plain, w_plain = run(batch_size=16, max_steps=4)
    _local, w_local = run(batch_size=16, max_steps=4, local_sgd_steps=2)
    assert "local SGD off" in capsys.readouterr().err
    assert max_diff(w_plain, w_local) == 0.0


@pytest.mark.parametrize(
    "changes",
    [
        dict(precision="bf16"),
        dict(precision="fp16"),
        dict(grad_accum=2, batch_size=8),
        dict(activation_checkpointing=True),
        dict(optimizer="adafactor"),
        dict(optimizer="adamw8bit"),
        dict(precision="bf16", grad_accum=2, batch_size=8, activation_checkpointing=True, optimizer="adafactor"),
    ],
)
def test_every_technique_trains_close_to_the_baseline(run, changes):
    if changes.get("optimizer") == "adamw8bit":
        pytest.importorskip("bitsandbytes")
    common = dict(optimizer="adamw", lr=3e-3, epochs=4, batch_size=16, max_grad_norm=1.0)
    base, _ = run(**common)
    other, _ = run(**{**common, **changes})
    assert other.metrics["eval_loss"] == pytest.approx(base.metrics["eval_loss"], abs=0.1)
    assert other.metrics["eval_accuracy"] >= base.metrics["eval_accuracy"] - 0.1
    assert torch.isfinite(torch.tensor(other.metrics["train_loss"]))
