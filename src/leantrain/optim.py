"""Optimizers, parameter groups, learning-rate schedules and optimizer-state accounting."""

from __future__ import annotations

import functools
import math

import torch

from leantrain.config import OPTIMIZERS  # the choices, defined once
from leantrain.errors import ConfigError


def parameter_groups(model: torch.nn.Module, weight_decay: float) -> list[dict]:
    """Decay matrices; never biases, norms (LayerNorm/RMSNorm weights) or other 1-D parameters."""
    norm_types = (torch.nn.LayerNorm, torch.nn.GroupNorm, torch.nn.BatchNorm1d)
    no_decay_ids = set()
    for module in model.modules():
        is_norm = isinstance(module, norm_types) or "norm" in type(module).__name__.lower()
        for name, p in module.named_parameters(recurse=False):
            if is_norm or name.endswith("bias") or p.ndim < 2:
                no_decay_ids.add(id(p))
    decay: list[torch.nn.Parameter] = []
    no_decay: list[torch.nn.Parameter] = []
    for p in model.parameters():
        if p.requires_grad:
            (no_decay if id(p) in no_decay_ids else decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def _fused_supported(device: torch.device) -> bool:
    try:
        from torch.utils._foreach_utils import _get_fused_kernels_supported_devices

        return device.type in _get_fused_kernels_supported_devices()
    except ImportError:  # private helper moved: fall back to the devices torch 2.4+ is known to fuse on
        return device.type in ("cpu", "cuda")


def build_optimizer(
    model: torch.nn.Module, name: str = "adamw", lr: float = 5e-5, weight_decay: float = 0.0
) -> torch.optim.Optimizer:
    """The optimizer `name` (one of OPTIMIZERS) over `parameter_groups(model, weight_decay)`.

    Every optimizer takes its weight decay from the groups, so biases and norm weights never decay.
    Empty groups (e.g. a model with no matrices left trainable) are dropped.
    """
    if name not in OPTIMIZERS:
        raise ConfigError(f"--optimizer {name!r} is unknown; choose one of: {', '.join(OPTIMIZERS)}")
    groups = [g for g in parameter_groups(model, weight_decay) if g["params"]]
    if not groups:
        raise ConfigError("the model has no trainable parameters: nothing to optimize")
    device = groups[0]["params"][0].device

    if name == "adamw":
        # The fused kernel is about 4x faster than foreach on this CPU (25 ms vs 112 ms a step, 22.7 M params).
        if _fused_supported(device):
            try:
                return torch.optim.AdamW(groups, lr=lr, fused=True)
            except (RuntimeError, TypeError, ValueError):
                pass
        return torch.optim.AdamW(groups, lr=lr, foreach=True)

    if name == "sgd":
        # Plain SGD (no momentum): the equivalence tests rely on its update being exactly p -= lr * g.
        return torch.optim.SGD(groups, lr=lr, momentum=0.0)

    if name == "adafactor":
        from transformers.optimization import Adafactor

        # An explicit learning rate (so schedules apply as for AdamW); factored second moments, no first
        # moment: state is O(rows + cols) per matrix instead of AdamW's 2 x numel.
        return Adafactor(groups, lr=lr, scale_parameter=False, relative_step=False, warmup_init=False)

    # adamw8bit. bitsandbytes rather than torchao: both keep 8-bit blockwise-quantised moments (about 2 bytes
    # a parameter instead of 8), but on this CPU bitsandbytes 0.50 steps in 480-540 ms for 22.7 M params while
    # torchao's AdamW8bit takes ~780 ms and compiles for 60-70 s on its first step (docs/measurements.md).
    # bitsandbytes keeps fp32 state for tensors under 4,096 elements (min_8bit_size).
    try:
        import bitsandbytes.optim as bnb_optim
    except Exception as e:  # ImportError, or a broken native library raising something else on import
        raise ConfigError("--optimizer adamw8bit needs bitsandbytes: pip install 'leantrain[8bit]'") from e
    return bnb_optim.AdamW8bit(groups, lr=lr)


def _state_tensors(value):
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, dict):
        for v in value.values():
            yield from _state_tensors(v)
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _state_tensors(v)


def optimizer_state_bytes(optimizer: torch.optim.Optimizer) -> int:
    """Bytes held by the tensors in `optimizer.state`: moments, step counters, and for bitsandbytes the
    quantisation maps and per-block absmax. A tensor shared between parameters (bitsandbytes' qmaps) counts
    once. Zero until the first step, since optimizers create their state lazily."""
    seen = set()
    total = 0
    for param_state in optimizer.state.values():
        for t in _state_tensors(param_state):
            t = t.to_local() if hasattr(t, "to_local") else t  # sharded (--shard fsdp): this process's shard
            key = (t.device, t.data_ptr(), t.dtype, tuple(t.shape), t.stride()) if t.data_ptr() else id(t)
            if key in seen:
                continue
            seen.add(key)
            total += t.numel() * t.element_size()
    return total


def optimizer_state_bytes_per_param(optimizer: torch.optim.Optimizer) -> float:
    """`optimizer_state_bytes` divided by the number of parameter elements the optimizer updates."""
    n = sum(p.numel() for g in optimizer.param_groups for p in g["params"])
    return optimizer_state_bytes(optimizer) / n if n else 0.0


def build_scheduler(
    optimizer: torch.optim.Optimizer,
    name: str,
    total_steps: int,
    warmup_ratio: float,
    warmup_steps: float | None = None,
    kwargs: str | None = None,
):
    """transformers' schedule `name` over `total_steps`; the warm-up from `warmup_steps` when given (steps, or a
    ratio below 1 as transformers 5 has it), else `warmup_ratio`; `kwargs`: --scheduler-kwargs (JSON)."""
    import json

    hf_name = "constant_with_warmup" if name == "constant" else name  # leantrain's constant keeps the warm-up
    if warmup_steps is not None:
        warmup = int(warmup_steps) if warmup_steps >= 1 else round(warmup_steps * total_steps)
    else:
        warmup = round(warmup_ratio * total_steps)
    specific = json.loads(kwargs) if kwargs else None
    if hf_name in _COMMON and not specific:
        return torch.optim.lr_scheduler.LambdaLR(
            optimizer, functools.partial(_COMMON[hf_name], warmup=warmup, total=max(total_steps, 1))
        )
    from transformers import get_scheduler

    try:
        return get_scheduler(
            hf_name,
            optimizer,
            num_warmup_steps=warmup,
            num_training_steps=max(total_steps, 1),
            scheduler_specific_kwargs=specific,
        )
    except (TypeError, ValueError) as exc:  # an argument the schedule does not take, or a bad value
        first = str(exc).strip().splitlines()[0][:200]
        raise ConfigError(f"--scheduler {name} --scheduler-kwargs {kwargs}: {first}") from None


# The three most used schedules, with transformers' formulas (tests/test_optim.py checks them step by step against
# get_scheduler): importing transformers.optimization loads peft, bitsandbytes and inductor through
# transformers.trainer_utils, several seconds of every run's start-up. The others come from transformers.
def _warming(step: int, warmup: int) -> float | None:
    return float(step) / float(max(1, warmup)) if step < warmup else None


def _linear(step: int, *, warmup: int, total: int) -> float:
    up = _warming(step, warmup)
    return up if up is not None else max(0.0, float(total - step) / float(max(1, total - warmup)))


def _cosine(step: int, *, warmup: int, total: int) -> float:
    up = _warming(step, warmup)
    if up is not None:
        return up
    progress = float(step - warmup) / float(max(1, total - warmup))
    return max(0.0, 0.5 * (1.0 + math.cos(math.pi * 0.5 * 2.0 * progress)))  # transformers' order: same floats


def _constant(step: int, *, warmup: int, total: int) -> float:
    up = _warming(step, warmup)
    return up if up is not None else 1.0


_COMMON = {"linear": _linear, "cosine": _cosine, "constant_with_warmup": _constant}
