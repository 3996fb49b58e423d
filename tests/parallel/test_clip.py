"""Gradient clipping: with a fused optimizer the clip factor rides in the optimizer's kernel (its `grad_scale`), so the
gradients are not rewritten in a pass of their own; the update must still be the clip-then-step of torch."""

from __future__ import annotations

import pytest
import torch
from accelerate import Accelerator
from torch.utils._python_dispatch import TorchDispatchMode

from leantrain.parallel.precision import MixedPrecision


def _model_and_grads(seed: int, scale: float):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 4))
    grads = [scale * torch.randn_like(p) for p in model.parameters()]
    return model, grads


def _steps(leantrain: bool, fused: bool, scale: float, bound: float = 1.0, steps: int = 3):
    """The weights after `steps` AdamW steps on the same gradients: through MixedPrecision (leantrain) or through
    torch's clip_grad_norm_ then step; and the norms each reported."""
    model, grads = _model_and_grads(0, scale)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, fused=fused or None, foreach=None if fused else False)
    amp = MixedPrecision(Accelerator(cpu=True), "fp32")
    norms = []
    for _ in range(steps):
        for p, g in zip(model.parameters(), grads):
            p.grad = g.clone()
        if leantrain:
            norms.append(amp.unscale_and_clip(model, optimizer, bound))
            amp.step(optimizer)
        else:
            norms.append(torch.nn.utils.clip_grad_norm_(model.parameters(), bound))
            optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return [p.detach().clone() for p in model.parameters()], torch.stack(norms)


@pytest.mark.parametrize("fused", [True, False])
def test_a_clipped_step_equals_torchs_clip_then_step(fused):
    ours, our_norms = _steps(True, fused, scale=10.0)  # a norm far above the bound: every step clipped
    theirs, their_norms = _steps(False, fused, scale=10.0)
    assert float(their_norms.min()) > 10  # the clip acts
    torch.testing.assert_close(our_norms, their_norms, rtol=1e-6, atol=0)
    for a, b in zip(ours, theirs):  # the factor divides instead of multiplying: a rounding apart, no more
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("fused", [True, False])
def test_an_unclipped_step_is_bitwise_torchs(fused):
    ours, _ = _steps(True, fused, scale=1e-3)  # a norm below the bound: the factor is exactly 1
    theirs, _ = _steps(False, fused, scale=1e-3)
    assert all(torch.equal(a, b) for a, b in zip(ours, theirs))


class _Ops(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.names: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.append(func.__name__)
        return func(*args, **(kwargs or {}))


def test_with_a_fused_optimizer_the_gradients_are_not_rewritten_before_the_step():
    model, grads = _model_and_grads(0, 10.0)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, fused=True)
    for p, g in zip(model.parameters(), grads):
        p.grad = g.clone()
    amp = MixedPrecision(Accelerator(cpu=True), "fp32")
    with _Ops() as ops:
        amp.unscale_and_clip(model, optimizer, 1.0)
    assert not [n for n in ops.names if "mul" in n and n.endswith("_")], ops.names  # no in-place multiply
    assert all(torch.equal(p.grad, g) for p, g in zip(model.parameters(), grads))  # not yet clipped ...
    amp.step(optimizer)
    assert not hasattr(optimizer, "grad_scale")  # ... the factor was the step's, and only that step's


def test_only_accelerates_pass_through_wrapper_is_skipped():
    """The step goes to torch's optimizer past Accelerate's plain wrapper; a subclass (DeepSpeed's, Megatron's,
    whose step is their engine's) is always called itself."""
    from accelerate.optimizer import AcceleratedOptimizer

    accelerator = Accelerator(cpu=True)
    model = torch.nn.Linear(4, 2)
    optimizer = accelerator.prepare(torch.optim.AdamW(model.parameters(), fused=True))
    amp = MixedPrecision(accelerator, "fp32")
    assert type(optimizer) is AcceleratedOptimizer and amp._unwrapped(optimizer) is optimizer.optimizer

    class EngineWrapper(AcceleratedOptimizer):
        pass

    engine = EngineWrapper(torch.optim.AdamW(model.parameters()))
    assert amp._unwrapped(engine) is engine
