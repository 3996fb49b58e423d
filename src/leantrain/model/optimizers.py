"""Optimizers: one registry entry each (its builder, what its state costs, how fast it steps, the names the HF
Trainer knows it by), parameter groups, and the bytes an optimizer's state holds.

The registry is the one table the rest reads: the config's `--optimizer` choices, the planner's memory and speed
models, `leantrain bench`, checkpoint sizing and the TrainingArguments `optim=` names. A new optimizer is one
`register(OptimizerEntry(...))`; nothing else changes. torch is imported inside the builders, so reading the
table (`--help`, the config's checks) costs nothing.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from leantrain.errors import ConfigError

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class OptimizerEntry:
    """One optimizer leantrain can train with."""

    #: the `--optimizer` name
    name: str
    #: builds it: (model, its parameter groups with weight decay set per group, the learning rate, the run's
    #: settings: any object with the config's optimization fields) -> the optimizer
    build: Callable[[Any, list[dict], float, Any], Any]
    #: bytes of state it keeps for one parameter tensor of this shape once it has stepped (its state is lazy)
    state_bytes: Callable[[tuple[int, ...]], int]
    #: one line for `--help`, `plan` and `bench`: what it is and when to use it
    summary: str
    #: state shared by every parameter (bitsandbytes' quantisation maps), counted once
    shared_state_bytes: int = 0
    #: the step's temporaries, in fp32 copies of the largest parameter tensor (the planner's optimizer workspace)
    temporaries: float = 0.0
    #: seconds a step takes per parameter on a CPU core pair and on a GPU (the planner's speed model)
    cpu_seconds_per_param: float = 0.0
    gpu_seconds_per_param: float = 0.0
    #: TrainingArguments `optim=` values that mean this optimizer
    hf_names: tuple[str, ...] = ()
    #: whether `--auto --auto-optimizer` may pick it (it changes results, so only the usual memory-savers)
    planned: bool = False
    #: what its `state_dict()` holds, which an exact resume restores (documentation and tests read it)
    resume_state: str = ""


#: name -> entry, in registration order (the order of `--help` and `bench`)
OPTIMIZERS: dict[str, OptimizerEntry] = {}


def register(entry: OptimizerEntry) -> OptimizerEntry:
    """Add an optimizer (or replace the one of the same name); returns it."""
    OPTIMIZERS[entry.name] = entry
    return entry


def names() -> tuple[str, ...]:
    return tuple(OPTIMIZERS)


def entry(name: str) -> OptimizerEntry:
    """The registered optimizer `name`, refused in one line when unknown."""
    try:
        return OPTIMIZERS[name]
    except KeyError:
        raise ConfigError(f"--optimizer {name!r} is unknown; choose one of: {', '.join(OPTIMIZERS)}") from None


def predicted_state_bytes(shapes: tuple[tuple[int, ...], ...], name: str) -> int:
    """Bytes of optimizer state for trainable parameters of these shapes, once the first step has run: the
    registry's count, which `state_bytes` of a real optimizer equals (tests/planner checks it)."""
    opt = entry(name)
    return sum(opt.state_bytes(tuple(s)) for s in shapes) + (opt.shared_state_bytes if shapes else 0)


def parameter_groups(model: torch.nn.Module, weight_decay: float) -> list[dict]:
    """Decay matrices; never biases, norms (LayerNorm/RMSNorm weights) or other 1-D parameters."""
    import torch

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


def build_optimizer(model: Any, name: str = "adamw", lr: float = 5e-5, weight_decay: float = 0.0, settings=None):
    """The optimizer `name` over `parameter_groups(model, weight_decay)`; `settings`: the run's config (or any object
    with its optimization fields), for optimizers with settings of their own.

    Every optimizer takes its weight decay from the groups, so biases and norm weights never decay.
    Empty groups (e.g. a model with no matrices left trainable) are dropped.
    """
    chosen = entry(name)
    groups = [g for g in parameter_groups(model, weight_decay) if g["params"]]
    if not groups:
        raise ConfigError("the model has no trainable parameters: nothing to optimize")
    return chosen.build(model, groups, lr, settings)


def _adamw(model, groups: list[dict], lr: float, settings) -> torch.optim.Optimizer:
    import torch

    # The fused kernel is about 4x faster than foreach on this CPU (25 ms vs 112 ms a step, 22.7 M params).
    if _fused_supported(groups[0]["params"][0].device):
        try:
            return torch.optim.AdamW(groups, lr=lr, fused=True)
        except (RuntimeError, TypeError, ValueError):
            pass
    return torch.optim.AdamW(groups, lr=lr, foreach=True)


def _sgd(model, groups: list[dict], lr: float, settings) -> torch.optim.Optimizer:
    import torch

    # Plain SGD (no momentum): the equivalence tests rely on its update being exactly p -= lr * g.
    return torch.optim.SGD(groups, lr=lr, momentum=0.0)


def _adafactor(model, groups: list[dict], lr: float, settings) -> torch.optim.Optimizer:
    from transformers.optimization import Adafactor

    # An explicit learning rate (so schedules apply as for AdamW); factored second moments, no first
    # moment: state is O(rows + cols) per matrix instead of AdamW's 2 x numel.
    return Adafactor(groups, lr=lr, scale_parameter=False, relative_step=False, warmup_init=False)


def _adamw8bit(model, groups: list[dict], lr: float, settings) -> torch.optim.Optimizer:
    # bitsandbytes rather than torchao: both keep 8-bit blockwise-quantised moments (about 2 bytes a parameter
    # instead of 8), but on this CPU bitsandbytes 0.50 steps in 480-540 ms for 22.7 M params while torchao's
    # AdamW8bit takes ~780 ms and compiles for 60-70 s on its first step (docs/measurements.md).
    try:
        import bitsandbytes.optim as bnb_optim
    except Exception as e:  # ImportError, or a broken native library raising something else on import
        raise ConfigError("--optimizer adamw8bit needs bitsandbytes: pip install 'leantrain[8bit]'") from e
    return bnb_optim.AdamW8bit(groups, lr=lr)


#: bitsandbytes keeps fp32 state for tensors under this many elements (its `min_8bit_size`)
BNB_MIN_8BIT_SIZE = 4096
#: bitsandbytes' blockwise quantisation block: one fp32 absmax per block and moment
BNB_BLOCK = 256


def _adamw8bit_bytes(shape: tuple[int, ...]) -> int:
    n = math.prod(shape)
    if n < BNB_MIN_8BIT_SIZE:
        return 8 * n
    return 2 * n + 2 * 4 * math.ceil(n / BNB_BLOCK)  # two uint8 moments, two fp32 absmax per block


def _adafactor_bytes(shape: tuple[int, ...]) -> int:
    # transformers' Adafactor without beta1: factored second moments for matrices, full for vectors (and a 0-dim
    # fp32 RMS tensor per parameter)
    if len(shape) >= 2:
        return 4 * (math.prod(shape[:-1]) + math.prod(shape[:-2] + shape[-1:])) + 4
    return 4 * math.prod(shape) + 4


# Step costs: docs/measurements.md, 22.7 M parameters on 2 Sapphire Rapids cores; on a GPU memory-bound elementwise
# kernels, about 16 bytes read and written per parameter for AdamW at about 1 TB/s. Temporaries: a one-time fit to
# measurements of MiniLM and a tiny BERT (benchmarks/planner_accuracy.py): Adafactor builds its update and its
# factored estimate; bitsandbytes on CPU dequantises both moments of a tensor to fp32 (5.0 on both models).
register(
    OptimizerEntry(
        "adamw",
        _adamw,
        lambda shape: 8 * math.prod(shape) + 4,  # exp_avg, exp_avg_sq (fp32) and a fp32 step tensor
        "AdamW (fused kernel where torch has one): 8 bytes of state a parameter; the default",
        cpu_seconds_per_param=0.025 / 22.7e6,
        gpu_seconds_per_param=2e-11,
        hf_names=("adamw_torch", "adamw_torch_fused", "adamw_hf"),
        planned=True,
        resume_state="step, exp_avg, exp_avg_sq per parameter",
    )
)
register(
    OptimizerEntry(
        "adafactor",
        _adafactor,
        _adafactor_bytes,
        "Adafactor (transformers'): factored second moments, far less state than AdamW, a slower step",
        temporaries=2.0,
        cpu_seconds_per_param=0.150 / 22.7e6,
        gpu_seconds_per_param=5e-11,
        hf_names=("adafactor",),
        planned=True,
        resume_state="step, exp_avg_sq_row, exp_avg_sq_col (or exp_avg_sq), RMS per parameter",
    )
)
register(
    OptimizerEntry(
        "adamw8bit",
        _adamw8bit,
        _adamw8bit_bytes,
        "AdamW with 8-bit blockwise moments (bitsandbytes): about 2 bytes a parameter, a slower step on CPU",
        shared_state_bytes=2 * 256 * 4,  # the two dynamic quantisation maps
        temporaries=5.0,
        cpu_seconds_per_param=0.500 / 22.7e6,
        gpu_seconds_per_param=2e-11,
        hf_names=("adamw_bnb_8bit", "adamw_8bit"),
        planned=True,
        resume_state="step, state1, state2, absmax1, absmax2, qmap1, qmap2 per parameter",
    )
)
register(
    OptimizerEntry(
        "sgd",
        _sgd,
        lambda shape: 0,
        "plain SGD without momentum: no state (the equivalence tests' exact update)",
        cpu_seconds_per_param=0.008 / 22.7e6,
        gpu_seconds_per_param=1e-11,
        hf_names=("sgd",),
        resume_state="nothing",
    )
)


def _state_tensors(value):
    import torch

    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, dict):
        for v in value.values():
            yield from _state_tensors(v)
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _state_tensors(v)


def state_bytes(optimizer: torch.optim.Optimizer) -> int:
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


def state_bytes_per_param(optimizer: torch.optim.Optimizer) -> float:
    """`state_bytes` divided by the number of parameter elements the optimizer updates."""
    n = sum(p.numel() for g in optimizer.param_groups for p in g["params"])
    return state_bytes(optimizer) / n if n else 0.0
