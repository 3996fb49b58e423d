"""Optimizers: parameter groups, each optimizer learning, exact resume from a saved state, state size."""

from __future__ import annotations

import copy
import sys
from types import SimpleNamespace

import pytest
import torch

from leantrain.errors import ConfigError
from leantrain.model.optimizers import (
    OPTIMIZERS,
    build_optimizer,
    model_state_bytes,
    parameter_groups,
    state_bytes,
    state_bytes_per_param,
    use_weights,
)

# Learning rates at which each optimizer makes clear progress on the toy regression in a few steps.
LR = {
    "adamw": 1e-2,
    "adafactor": 1e-2,
    "adamw8bit": 1e-2,
    "sgd": 0.2,
    "muon": 1e-2,
    "schedule-free-adamw": 1e-2,
    "schedule-free-sgd": 0.2,
    "lion": 2e-3,
    "galore-adamw": 1e-2,
    "apollo-adamw": 1e-2,
}
#: small enough for small_net's 64 x 128 hidden matrices; refreshed every 2 steps, so a refresh falls in every span
SETTINGS = SimpleNamespace(projection_rank=8, projection_update_interval=2)


def needs_backend(name: str) -> None:
    if name == "adamw8bit":
        pytest.importorskip("bitsandbytes")


class SmallNet(torch.nn.Module):
    """An input layer, two repeated blocks (the hidden matrices: 64 x 128 and 128 x 64, each >= 4,096 elements, so
    bitsandbytes quantises them) and an output layer."""

    def __init__(self, width: int, hidden: int):
        super().__init__()
        self.embed = torch.nn.Linear(width, hidden)
        self.blocks = torch.nn.ModuleList(
            torch.nn.Sequential(torch.nn.LayerNorm(hidden), torch.nn.Linear(hidden, hidden // 2),
                                torch.nn.Tanh(), torch.nn.Linear(hidden // 2, hidden))
            for _ in range(2)
        )  # fmt: skip
        self.head = torch.nn.Linear(hidden, width)

    def forward(self, x):
        h = self.embed(x)
        for block in self.blocks:
            h = h + block(h)
        return self.head(h)


def small_net(width: int = 64, hidden: int = 128) -> torch.nn.Module:
    torch.manual_seed(0)
    return SmallNet(width, hidden)


def build(model, name: str, lr: float = 1e-3, weight_decay: float = 0.0):
    """The optimizer as the trainer builds it, in training mode (schedule-free starts in evaluation mode)."""
    opt = build_optimizer(model, name, lr=lr, weight_decay=weight_decay, settings=SETTINGS)
    use_weights(name, opt, "train")
    return opt


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
    model.embed.weight.requires_grad_(False)
    decay, no_decay = parameter_groups(model, 0.1)
    assert {id(p) for p in decay["params"]} == {id(model.head.weight)} | {
        id(b[i].weight) for b in model.blocks for i in (1, 3)
    }
    assert len(no_decay["params"]) == 2 + 2 * 4  # embed and head biases; per block LayerNorm's two, two biases


@pytest.mark.parametrize("name", OPTIMIZERS)
def test_every_optimizer_holds_each_parameter_once_and_decays_matrices_only(name):
    needs_backend(name)
    model = small_net()
    opt = build(model, name, lr=1e-3, weight_decay=0.05)
    held = [p for g in opt.param_groups for p in g["params"]]
    assert len(held) == len({id(p) for p in held}) == len(list(model.parameters()))
    decays = {id(p): g["weight_decay"] for g in opt.param_groups for p in g["params"]}
    for p in model.parameters():
        assert decays[id(p)] == (0.05 if p.ndim == 2 else 0.0)
    assert all(g["lr"] == 1e-3 for g in opt.param_groups)  # (muon's hidden matrices too: --muon-lr defaults to --lr)


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
        build_optimizer(small_net(), "lamb", lr=1e-3)
    msg = str(e.value)
    assert "--optimizer" in msg and "lamb" in msg and all(n in msg for n in OPTIMIZERS)


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
    opt = build(model, name, lr=LR[name], weight_decay=0.01)
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
    opt = build(model, name, lr=LR[name], weight_decay=0.1)
    train(model, opt, data[:3])
    torch.save(opt.state_dict(), tmp_path / "optimizer.pt")
    saved_params = copy.deepcopy(model.state_dict())
    train(model, opt, data[3:])  # (GaLore and APOLLO refresh their projections at steps 4 and 6)

    resumed = small_net()
    torch.manual_seed(123)  # nothing may depend on the RNG
    resumed.load_state_dict(saved_params)
    opt2 = build_optimizer(resumed, name, lr=LR[name], weight_decay=0.1, settings=SETTINGS)
    opt2.load_state_dict(torch.load(tmp_path / "optimizer.pt", weights_only=True))
    use_weights(name, opt2, "train")
    train(resumed, opt2, data[3:])

    for (k, a), b in zip(model.state_dict().items(), resumed.state_dict().values()):
        assert torch.equal(a, b), f"{name}: {k} differs after resuming (max {float((a - b).abs().max())})"


@pytest.mark.parametrize("name", OPTIMIZERS)
def test_state_bytes_zero_before_first_step_then_the_registrys_count(name):
    needs_backend(name)
    model = small_net()
    opt = build(model, name, lr=1e-3)
    assert state_bytes(opt) == 0 and state_bytes_per_param(opt) == 0.0
    train(model, opt, batches(2))
    assert state_bytes(opt) == model_state_bytes(model, name, SETTINGS) > 0 or name == "sgd"


def test_adamw_state_bytes_are_two_fp32_moments():
    model = small_net()
    opt = build(model, "adamw")
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


@pytest.mark.parametrize("name, most", [("adafactor", 0.30), ("adamw8bit", 0.30), ("galore-adamw", 0.55),
                                        ("apollo-adamw", 0.55), ("lion", 0.5), ("muon", 0.75)])  # fmt: skip
def test_memory_saving_optimizers_hold_less_than_adamw(name, most):
    needs_backend(name)
    data = batches(1, width=256)
    sizes = {}
    for n in ("adamw", name):
        model = small_net(width=256, hidden=512)  # hidden matrices of 131,072 elements; embed, head as many
        opt = build(model, n, lr=1e-3)
        train(model, opt, data)
        sizes[n] = state_bytes(opt)
    assert sizes[name] <= most * sizes["adamw"], sizes


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
