"""`leantrain.model.losses.head_cross_entropy_sum`: a causal LM's output head and cross-entropy in one chunked pass.

The class-weighted losses of classifiers are tested with the trainer (tests/training/test_weighted_loss.py).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

import leantrain.model.losses
from leantrain.model.losses import head_cross_entropy_sum

ROWS, HIDDEN, VOCAB = 23, 16, 50


@pytest.fixture(autouse=True)
def small_chunks(monkeypatch):
    monkeypatch.setattr(leantrain.model.losses, "HEAD_CHUNK_ROWS", 5)  # 23 rows: four chunks and a short one


def head(bias: bool, frozen: bool = False):
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(ROWS, HIDDEN, generator=g, requires_grad=True)
    weight = (torch.randn(VOCAB, HIDDEN, generator=g) * 0.3).requires_grad_(not frozen)
    b = (torch.randn(VOCAB, generator=g) * 0.3).requires_grad_() if bias else None
    targets = torch.randint(0, VOCAB, (ROWS,), generator=g)
    return hidden, weight, b, targets


def loss_and_grads(loss_fn, hidden, weight, bias, targets, autocast: torch.dtype | None = None):
    inputs = [t for t in (hidden, weight, bias) if t is not None and t.requires_grad]
    with torch.autocast("cpu", dtype=autocast, enabled=autocast is not None):
        loss = loss_fn(hidden, weight, bias, targets)
    return loss.detach(), torch.autograd.grad(loss * 3.0, inputs)  # an upstream factor, as the trainer's divisor


def unfused(hidden, weight, bias, targets):
    return F.cross_entropy(F.linear(hidden, weight, bias).float(), targets, reduction="sum")


@pytest.mark.parametrize("bias", [False, True], ids=["no-bias", "bias"])
@pytest.mark.parametrize("frozen", [False, True], ids=["trained-head", "frozen-head"])
def test_the_fused_head_loss_equals_the_heads_logits_cross_entropy_in_fp32(bias, frozen):
    """The loss and the gradients of the hidden states, the weight and the bias are those of the head's logits
    through `cross_entropy`, up to rounding; a frozen weight gets none."""
    args = head(bias, frozen)
    want_loss, want = loss_and_grads(unfused, *args)
    loss, got = loss_and_grads(head_cross_entropy_sum, *args)
    assert float(loss) == pytest.approx(float(want_loss), rel=1e-6)
    assert len(got) == len(want) == 1 + (not frozen) + bias
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and torch.allclose(g, w, rtol=1e-5, atol=1e-6 * float(w.abs().max()))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_under_autocast_the_matmuls_run_in_its_dtype_as_the_heads_would(dtype):
    """Under autocast the loss is the head's low-precision logits' (rounding of that dtype, not of fp32) and every
    gradient comes back in its input's dtype, within that dtype's rounding of the unfused ones."""
    args = head(bias=True)
    want_loss, want = loss_and_grads(unfused, *args, autocast=dtype)
    loss, got = loss_and_grads(head_cross_entropy_sum, *args, autocast=dtype)
    fp32_loss, _ = loss_and_grads(unfused, *args)
    assert float(loss) == pytest.approx(float(want_loss), rel=1e-5)
    assert float(loss) != pytest.approx(float(fp32_loss), rel=1e-5)  # it did run in the low precision
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and torch.allclose(g, w, rtol=0, atol=2e-2 * float(w.abs().max()))


class LogitRows(TorchDispatchMode):
    """The most rows any operator's (rows, vocabulary) output held: how many rows of logits existed at once."""

    def __init__(self):
        super().__init__()
        self.most = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, tuple | list) else (out,):
            # (rows, vocabulary); the weight's transpose is (hidden, vocabulary)
            if isinstance(t, torch.Tensor) and t.dim() == 2 and t.shape[-1] == VOCAB and t.shape[0] != HIDDEN:
                self.most = max(self.most, t.shape[0])
        return out


def test_the_logits_never_exist_whole():
    """Forward and backward never hold more than a chunk's rows of logits (the unfused loss holds every row's)."""
    args = head(bias=False)
    for loss_fn, most in ((head_cross_entropy_sum, 5), (unfused, ROWS)):
        with LogitRows() as seen:
            loss_and_grads(loss_fn, *args)
        assert seen.most == most, loss_fn
