"""Rotary position embedding in fewer operators, with the model's own results.

transformers' `apply_rotary_pos_emb` (Llama's, and the many models that copy it) turns each query and key with
`rotate_half`: two slices, a negation and a concatenation, seven operators a tensor forward and twelve backward, for
the query and the key of every layer. Rotating half is rolling by half with the first half negated, and the negation
can move onto sin: `rotate_half(x) * sin == x.roll(d / 2, -1) * sin'`, where sin' is sin with its first half negated
(`(-x2) * s1` and `x2 * (-s1)` are the same number, to the bit). So `x * cos + x.roll(d / 2, -1) * sin'` gives the
same bits in four operators, and its backward takes no slices, zeros or copies. On a host-bound model (a 12-layer
Llama 32 wide) that is 5% of a training step, 11.6 -> 11.0 ms (`benchmarks/results/host_overhead.md`).

Where it applies: a model whose modeling module's `apply_rotary_pos_emb` gives, on random tensors of the model's
head size in fp32 and bf16, the same bits as this one (`modules_for`); a model that rotates interleaved pairs
(Cohere's) differs there and keeps its own. A call whose cos and sin are narrower than the query (a partial
rotation) goes to the model's own function. Within `rolled(modules)` those modules' `apply_rotary_pos_emb` is this
one; outside it, theirs. It must hold the backward as well as the forward: activation checkpointing recomputes
layers in the backward, and a recomputation through the other function would pair the forward's saved tensors
wrongly (wrong gradients).
Not under `--compile` (its graph fuses the rotation anyway) or Liger's kernels (which replace the function).
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator
from types import ModuleType
from typing import Any

import torch

_NAME = "apply_rotary_pos_emb"
#: (size, dtype, device) -> the signs that turn sin into sin': -1 over the first half, 1 over the second
_SIGNS: dict[tuple[int, torch.dtype, torch.device], torch.Tensor] = {}


def _signs(sin: torch.Tensor) -> torch.Tensor:
    key = (sin.shape[-1], sin.dtype, sin.device)
    if key not in _SIGNS:
        half = sin.shape[-1] // 2
        _SIGNS[key] = torch.cat((sin.new_full((half,), -1.0), sin.new_ones(sin.shape[-1] - half)))
    return _SIGNS[key]


def _rolled(own: Callable[..., Any]) -> Callable[..., Any]:
    """`own`'s contract (q, k, cos, sin, unsqueeze_dim) with the rotation as a roll; other calls go to `own`."""

    def apply_rotary_pos_emb(q, k, cos, sin, *args, **kwargs):
        size = q.shape[-1]
        same = size == k.shape[-1] == cos.shape[-1] == sin.shape[-1]
        if args or set(kwargs) - {"unsqueeze_dim"} or not same or size % 2:  # odd: rotate_half's halves differ
            return own(q, k, cos, sin, *args, **kwargs)
        unsqueeze_dim, half = kwargs.get("unsqueeze_dim", 1), size // 2
        cos = cos.unsqueeze(unsqueeze_dim)
        sin = (sin * _signs(sin)).unsqueeze(unsqueeze_dim)
        return q * cos + q.roll(half, -1) * sin, k * cos + k.roll(half, -1) * sin

    apply_rotary_pos_emb.own = own  # type: ignore[attr-defined]
    return apply_rotary_pos_emb


def _same_bits(module: ModuleType, heads: int, head_dim: int) -> bool:
    """Whether the module's function and the rolled one give the same bits on random queries, keys, cos and sin of
    this head size, in fp32 and in bf16 (queries in bf16, cos and sin in fp32: as under autocast)."""
    own = getattr(module, _NAME)
    ours = _rolled(own)
    g = torch.Generator().manual_seed(0)
    try:
        for q_dtype, cs_dtype in ((torch.float32, torch.float32), (torch.bfloat16, torch.float32)):
            q = torch.randn(2, heads, 5, head_dim, generator=g).to(q_dtype)
            k = torch.randn(2, 1, 5, head_dim, generator=g).to(q_dtype)
            cos, sin = (torch.randn(2, 5, head_dim, generator=g).to(cs_dtype) for _ in range(2))
            for theirs, mine in zip(own(q, k, cos, sin), ours(q, k, cos, sin), strict=True):
                if theirs.dtype != mine.dtype or not torch.equal(theirs, mine):
                    return False
    except Exception:  # another signature or shape contract: leave it alone
        return False
    return True


def modules_for(model: torch.nn.Module) -> tuple[ModuleType, ...]:
    """The modeling modules of `model`'s layers whose rotary function the rolled one reproduces to the bit."""
    config = getattr(model, "config", None)
    heads = getattr(config, "num_attention_heads", None)
    hidden = getattr(config, "hidden_size", None)
    head_dim = getattr(config, "head_dim", None) or (hidden // heads if heads and hidden else None)
    if not heads or not head_dim or head_dim % 2:
        return ()
    found: dict[str, ModuleType] = {}
    for layer in model.modules():
        name = type(layer).__module__
        module = sys.modules.get(name)
        if name in found or module is None or not name.startswith("transformers.models."):
            continue
        own = getattr(module, _NAME, None)
        if callable(own) and not hasattr(own, "own") and _same_bits(module, heads, head_dim):
            found[name] = module
    return tuple(found.values())


@contextlib.contextmanager
def rolled(modules: tuple[ModuleType, ...]) -> Iterator[None]:
    """Within: these modules rotate queries and keys by a roll (`_rolled`); their own function again after."""
    owns = [getattr(module, _NAME) for module in modules]
    for module, own in zip(modules, owns, strict=True):
        setattr(module, _NAME, _rolled(own))
    try:
        yield
    finally:
        for module, own in zip(modules, owns, strict=True):
            setattr(module, _NAME, own)
