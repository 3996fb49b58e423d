"""Flat parameters (`model.flat`): a run whose optimizer steps one flat tensor per group trains the weights of the
run that steps tensor by tensor (to the last bits: a tensor's last numbers, fewer than a vector, go through torch's
vector kernel instead of its scalar loop), keeps torch's per-parameter state format (checkpoints resume either way),
and clears its gradients in place whoever asks."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from leantrain import TrainConfig, train
from leantrain.model.flat import FlatParameters


def close(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal but for the last bits of a few numbers (the vector kernel's rounding for a tensor's tail)."""
    return a.shape == b.shape and torch.allclose(a, b, rtol=1e-5, atol=1e-8)


def _run(cfg: TrainConfig, name: str, **changes):
    result = train(cfg.replace(output_dir=str(cfg.output_dir) + name, **changes))
    rows = [json.loads(line) for line in (result.output_dir / "metrics.jsonl").read_text().splitlines()]
    losses = [r["loss"] for r in rows if "loss" in r]
    return result, losses, load_file(result.output_dir / "model" / "model.safetensors")


@pytest.fixture
def cfg(tiny_model_dir, sentiment_csv, tmp_path):
    return TrainConfig(
        model=str(tiny_model_dir), data=str(sentiment_csv), cache_dir=str(tmp_path / "cache"),
        output_dir=str(tmp_path / "run"), batch_size=8, grad_accum=2, max_steps=6, log_every=1, seed=3,
        precision="fp32", progress=False, report=False, weight_decay=0.01,
    )  # fmt: skip


def _attached(monkeypatch) -> list:
    made: list = []
    real = FlatParameters.attach.__func__

    def attach(cls, optimizer, model):
        made.append(real(cls, optimizer, model))
        return made[-1]

    monkeypatch.setattr(FlatParameters, "attach", classmethod(attach))
    return made


@pytest.mark.parametrize("optimizer", ["adamw", "sgd"])
def test_flat_parameters_train_the_same_weights(cfg, monkeypatch, optimizer):
    """The same arithmetic on the same numbers, up to the rounding of tensors' tails; with clipping, also the norm's
    order of summation."""
    made = _attached(monkeypatch)
    cfg = cfg.replace(optimizer=optimizer, lr=1e-3)
    _, losses, weights = _run(cfg, "-flat", max_grad_norm=0.0)
    assert made and made[-1] is not None, "not flattened: the comparison would prove nothing"
    _, own_losses, own = _run(cfg, "-own", max_grad_norm=0.0, flat_parameters=False)
    assert losses == pytest.approx(own_losses, rel=1e-6, abs=1e-7)
    assert weights.keys() == own.keys() and all(close(weights[k], own[k]) for k in weights)

    _, losses, weights = _run(cfg, "-flat-clip", max_grad_norm=0.05)
    _, own_losses, own = _run(cfg, "-own-clip", max_grad_norm=0.05, flat_parameters=False)
    assert losses == pytest.approx(own_losses, rel=1e-6, abs=1e-7)
    assert all(torch.allclose(weights[k], own[k], rtol=0, atol=1e-6) for k in weights)


@pytest.mark.parametrize("largest", [None, 6])
def test_the_state_dict_is_torch_per_parameter_format_and_loads_either_way(monkeypatch, largest):
    """Small parameters flat; with largest 6 the first layer's 15 weights kept apart beside its flat bias."""
    from leantrain.model import flat as flat_module

    if largest is not None:
        monkeypatch.setattr(flat_module, "LARGEST", largest)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 5), torch.nn.LayerNorm(5), torch.nn.Linear(5, 1))
    twin = torch.nn.Sequential(torch.nn.Linear(3, 5), torch.nn.LayerNorm(5), torch.nn.Linear(5, 1))
    twin.load_state_dict(model.state_dict())
    x = torch.randn(7, 3)

    def groups(m):  # the last group's one parameter is left as it is: nothing to gather
        return [
            {"params": [m[0].weight, m[0].bias, m[2].weight]},
            {"params": [m[1].weight, m[1].bias], "weight_decay": 0.0},
            {"params": [m[2].bias], "weight_decay": 0.0},
        ]

    flat_opt = torch.optim.AdamW(groups(model), lr=1e-2, weight_decay=0.1, fused=True)
    own_opt = torch.optim.AdamW(groups(twin), lr=1e-2, weight_decay=0.1, fused=True)
    flat = FlatParameters.attach(flat_opt, model)
    assert flat is not None
    assert len(flat.apart) == (1 if largest is None else 2)  # the last group's bias; and the 15 weights
    assert [len(g["params"]) for g in flat_opt.param_groups] == [1 if largest is None else 2, 1, 1]
    for _ in range(3):
        for m, opt in ((model, flat_opt), (twin, own_opt)):
            m(x).square().mean().backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
    for a, b in zip(model.parameters(), twin.parameters()):
        assert close(a, b)
    flat_state, own_state = flat_opt.state_dict(), own_opt.state_dict()
    assert [g["params"] for g in flat_state["param_groups"]] == [g["params"] for g in own_state["param_groups"]]
    assert flat_state["state"].keys() == own_state["state"].keys()
    for i, own in own_state["state"].items():
        assert all(close(flat_state["state"][i][k], v) for k, v in own.items())
    steps = [s["step"] for s in flat_state["state"].values()]
    assert len({id(s) for s in steps}) == len(steps), "one step count shared: a per-tensor optimizer would add N"

    # a per-tensor run resumed flat, and a flat one resumed per tensor: both go on as the uninterrupted runs
    resumed_model = torch.nn.Sequential(torch.nn.Linear(3, 5), torch.nn.LayerNorm(5), torch.nn.Linear(5, 1))
    resumed_model.load_state_dict(twin.state_dict())
    resumed = torch.optim.AdamW(groups(resumed_model), lr=1e-2, weight_decay=0.1, fused=True)
    assert FlatParameters.attach(resumed, resumed_model) is not None
    resumed.load_state_dict(_saved_and_loaded(own_opt.state_dict()))
    plain_model = torch.nn.Sequential(torch.nn.Linear(3, 5), torch.nn.LayerNorm(5), torch.nn.Linear(5, 1))
    plain_model.load_state_dict(model.state_dict())
    plain = torch.optim.AdamW(groups(plain_model), lr=1e-2, weight_decay=0.1, fused=True)
    plain.load_state_dict(_saved_and_loaded(flat_opt.state_dict()))
    for m, opt in ((twin, own_opt), (resumed_model, resumed), (plain_model, plain)):
        m(x).square().mean().backward()
        opt.step()
        opt.zero_grad()
    for a, b, c in zip(twin.parameters(), resumed_model.parameters(), plain_model.parameters()):
        assert close(a, b) and close(a, c)


def _saved_and_loaded(state: dict) -> dict:
    """Through a file, as a checkpoint keeps it (a live state dict shares its tensors with its optimizer)."""
    import io

    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=True)


def test_gradients_are_cleared_in_place_and_a_detached_one_is_found():
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    flat = FlatParameters.attach(opt, model)
    assert flat is not None
    model(torch.ones(2, 3)).sum().backward()
    assert flat.grads[0].abs().sum() > 0
    opt.zero_grad(set_to_none=True)  # as Accelerate's wrapper asks
    assert all(p.grad is not None for p in model.parameters())
    assert flat.grads[0].abs().sum() == 0 and flat.detached() == []
    model.zero_grad()  # sets every parameter's gradient to None: they would not reach the optimizer
    assert len(flat.detached()) == 4


def test_parameters_sharing_storage_are_left_as_they_are():
    model = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.Linear(3, 3))
    model[1].weight = torch.nn.Parameter(model[0].weight.data)  # two parameters over one storage
    assert FlatParameters.attach(torch.optim.SGD(model.parameters(), lr=0.1), model) is None
    frozen = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.Linear(3, 3))
    frozen[1].weight = torch.nn.Parameter(frozen[0].weight.data, requires_grad=False)
    trainable = [p for p in frozen.parameters() if p.requires_grad]
    assert FlatParameters.attach(torch.optim.SGD(trainable, lr=0.1), frozen) is None


def test_a_run_whose_gradients_are_detached_stops_with_one_line(cfg):
    """A hook calling `model.zero_grad()` (gradients to None) would leave the flat buffer unfed: the run stops."""
    from leantrain.errors import LeantrainError
    from leantrain.training import Hooks

    class Clears(Hooks):
        def on_micro_batch(self, model, batch):
            model.zero_grad()

    with pytest.raises(LeantrainError, match=r"the gradients of \d+ parameters were set to None .* zero_grad"):
        train(cfg.replace(output_dir=str(cfg.output_dir) + "-cleared"), hooks=Clears())
    train(cfg.replace(output_dir=str(cfg.output_dir) + "-off", flat_parameters=False), hooks=Clears())
