"""Optimizers: parameter groups, each optimizer learning, exact resume from a saved state, state size."""

from __future__ import annotations

import copy
import sys

import pytest
import torch

from leantrain.errors import ConfigError
from leantrain.model.optimizers import (
    OPTIMIZERS,
    build_optimizer,
    parameter_groups,
    state_bytes,
    state_bytes_per_param,
)

# Learning rates at which each optimizer makes clear progress on the toy regression in a few steps.
LR = {"adamw": 1e-2, "adafactor": 1e-2, "adamw8bit": 1e-2, "sgd": 0.2}


def needs_backend(name: str) -> None:
    if name == "adamw8bit":
        pytest.importorskip("bitsandbytes")


def small_net(width: int = 64, hidden: int = 128) -> torch.nn.Module:
    """Both matrices have >= 4,096 elements, so bitsandbytes quantises them (its 8-bit path runs)."""
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(width, hidden), torch.nn.LayerNorm(hidden), torch.nn.Tanh(), torch.nn.Linear(hidden, width)
    )


def batches(n: int, width: int = 64, seed: int = 1) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    target = torch.randn(width, width, generator=g) / width**0.5
    out = []
    for _ in range(n):
        x = torch.randn(16, width, generator=g)
        out.append((x, torch.tanh(x @ target)))
    return out


def train(model, opt, data) -> list[float]:
    losses = []
    for x, y in data:
        opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def tiny_bert():
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    return BertModel(
        BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64)
    )


def test_parameter_groups_decay_matrices_only():
    model = tiny_bert()
    decay, no_decay = parameter_groups(model, 0.01)
    assert decay["weight_decay"] == 0.01 and no_decay["weight_decay"] == 0.0
    decay_ids = {id(p) for p in decay["params"]}
    no_decay_ids = {id(p) for p in no_decay["params"]}
    names = dict(model.named_parameters())
    assert len(decay_ids) + len(no_decay_ids) == len(names)
    for name, p in names.items():
        if name.endswith("bias") or "LayerNorm" in name:
            assert id(p) in no_decay_ids, name
        else:
            assert p.ndim == 2 and id(p) in decay_ids, name
    assert any("LayerNorm.weight" in n for n in names) and any(n.endswith("dense.weight") for n in names)


def test_parameter_groups_skip_frozen():
    model = small_net()
    model[0].weight.requires_grad_(False)
    decay, no_decay = parameter_groups(model, 0.1)
    assert [p.shape for p in decay["params"]] == [model[3].weight.shape]
    assert len(no_decay["params"]) == 4  # two biases, LayerNorm weight and bias


@pytest.mark.parametrize("name", OPTIMIZERS)
def test_every_optimizer_uses_the_groups_weight_decay(name):
    needs_backend(name)
    model = small_net()
    opt = build_optimizer(model, name, lr=1e-3, weight_decay=0.05)
    assert [g["weight_decay"] for g in opt.param_groups] == [0.05, 0.0]
    assert all(g["lr"] == 1e-3 for g in opt.param_groups)
    assert [len(g["params"]) for g in opt.param_groups] == [2, 4]


def test_adamw_is_fused_on_cpu():
    opt = build_optimizer(small_net(), "adamw", lr=1e-3)
    assert isinstance(opt, torch.optim.AdamW) and opt.defaults["fused"] is True


def test_sgd_is_plain():
    opt = build_optimizer(small_net(), "sgd", lr=0.1)
    assert isinstance(opt, torch.optim.SGD) and opt.defaults["momentum"] == 0.0


def test_default_is_adamw():
    assert isinstance(build_optimizer(small_net()), torch.optim.AdamW)


def test_unknown_optimizer_names_flag_and_choices():
    with pytest.raises(ConfigError) as e:
        build_optimizer(small_net(), "lion", lr=1e-3)
    msg = str(e.value)
    assert "--optimizer" in msg and "lion" in msg and all(n in msg for n in OPTIMIZERS)


def test_no_trainable_parameters_is_a_config_error():
    model = small_net().requires_grad_(False)
    with pytest.raises(ConfigError):
        build_optimizer(model, "adamw")


def test_adamw8bit_without_bitsandbytes(monkeypatch):
    # A None entry in sys.modules makes `import bitsandbytes.optim` raise ImportError.
    monkeypatch.setitem(sys.modules, "bitsandbytes", None)
    monkeypatch.setitem(sys.modules, "bitsandbytes.optim", None)
    with pytest.raises(ConfigError) as e:
        build_optimizer(small_net(), "adamw8bit", lr=1e-3)
    assert str(e.value) == "--optimizer adamw8bit needs bitsandbytes: pip install 'leantrain[8bit]'"


@pytest.mark.parametrize("name", OPTIMIZERS)
def test_every_optimizer_reduces_the_loss(name):
    needs_backend(name)
    model = small_net()
    opt = build_optimizer(model, name, lr=LR[name], weight_decay=0.01)
    data = batches(1, seed=2) * 15  # the same batch: the loss must fall
    losses = train(model, opt, data)
    assert losses[-1] < 0.6 * losses[0], losses


def test_adamw8bit_quantises_matrices_only():
    pytest.importorskip("bitsandbytes")
    model = small_net()
    opt = build_optimizer(model, "adamw8bit", lr=1e-3)
    train(model, opt, batches(1))
    for p in model.parameters():
        expected = torch.uint8 if p.numel() >= 4096 else torch.float32
        assert opt.state[p]["state1"].dtype == expected and opt.state[p]["state2"].dtype == expected


@pytest.mark.parametrize("name", OPTIMIZERS)
def test_resume_from_saved_state_is_exact(name, tmp_path):
    """state_dict -> torch.save -> torch.load(weights_only=True) -> load_state_dict into a fresh optimizer
    on a fresh model, then continuing, gives bitwise the parameters of never stopping."""
    needs_backend(name)
    data = batches(6)
    model = small_net()
    opt = build_optimizer(model, name, lr=LR[name], weight_decay=0.1)
    train(model, opt, data[:3])
    torch.save(opt.state_dict(), tmp_path / "optimizer.pt")
    saved_params = copy.deepcopy(model.state_dict())
    train(model, opt, data[3:])

    resumed = small_net()
    torch.manual_seed(123)  # nothing may depend on the RNG
    resumed.load_state_dict(saved_params)
    opt2 = build_optimizer(resumed, name, lr=LR[name], weight_decay=0.1)
    opt2.load_state_dict(torch.load(tmp_path / "optimizer.pt", weights_only=True))
    train(resumed, opt2, data[3:])

    for (k, a), b in zip(model.state_dict().items(), resumed.state_dict().values()):
        assert torch.equal(a, b), f"{name}: {k} differs after resuming (max {float((a - b).abs().max())})"


def test_state_bytes_zero_before_first_step():
    opt = build_optimizer(small_net(), "adamw")
    assert state_bytes(opt) == 0 and state_bytes_per_param(opt) == 0.0


def test_adamw_state_bytes_are_two_fp32_moments():
    model = small_net()
    opt = build_optimizer(model, "adamw")
    train(model, opt, batches(1))
    n = sum(p.numel() for p in model.parameters())
    n_tensors = len(list(model.parameters()))
    assert state_bytes(opt) == 8 * n + 4 * n_tensors  # exp_avg, exp_avg_sq, fp32 step per tensor
    assert 8.0 <= state_bytes_per_param(opt) < 8.01


def test_sgd_without_momentum_holds_no_state_tensors():
    model = small_net()
    opt = build_optimizer(model, "sgd", lr=0.1)
    train(model, opt, batches(1))
    assert state_bytes(opt) == 0


@pytest.mark.parametrize("name", ["adafactor", "adamw8bit"])
def test_memory_saving_optimizers_hold_70_percent_less_than_adamw(name):
    needs_backend(name)
    data = batches(1, width=256)
    sizes = {}
    for n in ("adamw", name):
        model = small_net(width=256, hidden=512)  # matrices of 131,072 elements; 1,792 other parameters
        opt = build_optimizer(model, n, lr=1e-3)
        train(model, opt, data)
        sizes[n] = state_bytes(opt)
    assert sizes[name] <= 0.30 * sizes["adamw"], sizes


@pytest.mark.parametrize("name", ["linear", "cosine", "constant"])
@pytest.mark.parametrize("total, warmup_ratio", [(50, 0.0), (50, 0.1), (7, 0.5), (1, 0.0)])
def test_the_common_schedules_give_transformers_learning_rates_step_by_step(name, total, warmup_ratio):
    """linear, cosine and constant are built without importing transformers.optimization (several seconds of
    start-up); they must give get_scheduler's learning rate at every step, bit for bit."""
    from transformers import get_scheduler

    from leantrain.model.schedules import build_scheduler

    def rates(make):
        optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.3)
        scheduler = make(optimizer)
        out = []
        for _ in range(total + 2):
            out.append(scheduler.get_last_lr()[0])
            optimizer.step()
            scheduler.step()
        return out

    warmup = round(warmup_ratio * total)
    hf_name = "constant_with_warmup" if name == "constant" else name
    mine = rates(lambda o: build_scheduler(o, name, total, warmup_ratio))
    theirs = rates(lambda o: get_scheduler(hf_name, o, num_warmup_steps=warmup, num_training_steps=total))
    assert mine == theirs


@pytest.mark.slow  # launches a Python process: 5.3-6.5 s of imports
def test_a_default_schedule_does_not_load_transformers_optimization():
    code = (
        "import sys, torch; from leantrain.model.schedules import build_scheduler; "
        "o = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1); build_scheduler(o, 'linear', 10, 0.1); "
        "print('transformers.optimization' in sys.modules)"
    )
    import subprocess

    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "False", out.stderr
