"""Dropout on a CPU from 16-bit draws (`model.dropout`): a dropout's distribution (kept fraction 1 - p, the kept
numbers scaled by the exact inverse, gradients through the kept ones), drawn from torch's generator (a seed and a
saved generator state give the same masks), and what a CPU training run draws with."""

from __future__ import annotations

import math

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from leantrain import TrainConfig, train
from leantrain.model.dropout import LEVELS, dropout, fast_dropout


@pytest.mark.parametrize("p", [0.1, 0.5, 0.9])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_dropout_keeps_one_minus_p_and_scales_by_the_exact_inverse(p, dtype):
    torch.manual_seed(0)
    n = 1 << 22
    out = dropout(torch.ones(n, dtype=dtype), p)
    kept = out != 0
    dropped = round(p * LEVELS)
    keep = 1 - dropped / LEVELS
    # each of the four numbers a 64-bit draw decides, apart: a lane that repeated another would show here
    for lane in range(4):
        share = kept.view(-1, 4)[:, lane].double().mean().item()
        assert abs(share - keep) < 5 * math.sqrt(keep * (1 - keep) / (n // 4)), (lane, share)
    scale = torch.tensor(LEVELS / (LEVELS - dropped), dtype=dtype)
    assert torch.equal(out[kept].unique(), scale.view(1))
    assert abs(out.double().mean().item() - 1) < 5 * math.sqrt((1 - keep) / keep / n) + 4e-3 * (dtype != torch.float32)


def test_the_draws_follow_torchs_generator_and_gradients_flow_through_the_kept_numbers():
    x = torch.randn(1000, requires_grad=True)
    torch.manual_seed(5)
    state = torch.get_rng_state()
    first = dropout(x, 0.3)
    torch.set_rng_state(state)  # as a resumed run or activation checkpointing's replay
    assert torch.equal(dropout(x, 0.3), first)
    assert not torch.equal(dropout(x, 0.3), first)  # the generator moved on
    first.sum().backward()
    assert x.grad is not None
    assert torch.equal(x.grad, (first != 0).float() / (1 - round(0.3 * LEVELS) / LEVELS))


def test_outside_training_and_at_p_zero_it_is_torchs_own():
    x = torch.randn(64)
    assert dropout(x, 0.5, training=False) is x or torch.equal(dropout(x, 0.5, training=False), x)
    assert torch.equal(dropout(x, 0.0), x)
    assert torch.equal(dropout(x, 1.0), torch.zeros_like(x))


class Bernoullis(TorchDispatchMode):
    """Counts torch's bernoulli draws (what its CPU dropout makes each mask with)."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.calls += "bernoulli" in func.__name__
        return func(*args, **(kwargs or {}))


def test_within_the_context_modules_and_functional_calls_draw_16_bits():
    layer = torch.nn.Dropout(0.2).train()
    x = torch.randn(256)
    with Bernoullis() as inside, fast_dropout():
        layer(x)
        torch.nn.functional.dropout(x, 0.2)
    assert inside.calls == 0
    with Bernoullis() as outside:
        layer(x)  # torch's own again
    assert outside.calls == 1


@pytest.mark.parametrize("fast", [True, False])
def test_a_cpu_training_run_draws_its_dropout_as_set(dropout_model_dir, sentiment_csv, tmp_path, fast):
    """--fast-dropout (the default) on a CPU: no bernoulli in the run (eager attention, whose dropout goes through
    it); --no-fast-dropout: torch's dropout in every layer."""
    with Bernoullis() as drawn:
        result = train(
            TrainConfig(
                model=str(dropout_model_dir), data=str(sentiment_csv), cache_dir=str(tmp_path / "cache"),
                output_dir=str(tmp_path / "run"), batch_size=8, max_steps=3, progress=False, report=False,
                fast_dropout=fast, precision="fp32",
            )
        )  # fmt: skip
    assert result.metrics["optimizer_steps"] == 3
    assert (drawn.calls == 0) == fast, drawn.calls
    config = (result.output_dir / "config.yaml").read_text()
    assert f"fast_dropout: {str(fast).lower()}" in config
