"""`--shard fsdp` on CPU processes: torch's FSDP2 (`fully_shard`) applied directly, over gloo.

Accelerate runs its FSDP plugin on accelerators only (on a MULTI_CPU state it would silently train plain DDP), but
torch's FSDP2 itself shards on CPU: each process keeps 1/N of every parameter, gradient and optimizer state as a
DTensor, all-gathers one transformer layer at a time for forward and backward, and reduce-scatters the gradients
(averaged, as DDP's all-reduce averages them, so the loop's loss normalisation is the same). So on CPU leantrain
shards the model here and hands Accelerate the optimizer, loaders and schedule only; on GPUs Accelerate's FSDP2
plugin does the same (`parallel.fsdp_plugin`), one transformer layer per unit in both.

Not yet: checkpoints of a sharded run (they need `torch.distributed.checkpoint`'s per-rank shards; refused in
one line), LoRA and local SGD with sharding.
"""

from __future__ import annotations

from typing import Any

import torch


def shards_here(shard: str, device: torch.device) -> bool:
    """Whether this run shards through `fully_shard` here (CPU processes) rather than Accelerate's plugin."""
    return shard == "fsdp" and device.type == "cpu"


def layer_classes(model: torch.nn.Module) -> set[type]:
    """The transformer layer classes: the model's `_no_split_modules` (what Accelerate's transformer_based_wrap
    reads), found among its modules."""
    names = set(getattr(model, "_no_split_modules", None) or [])
    found = {type(m) for m in model.modules() if type(m).__name__ in names}
    if not found:
        from leantrain.errors import ConfigError

        raise ConfigError(
            f"--shard fsdp: {type(model).__name__} names no transformer layer class (_no_split_modules) to shard "
            "by; use --shard none"
        )
    return found


def shard(model: torch.nn.Module) -> torch.nn.Module:
    """Shard `model` in place: each transformer layer one FSDP2 unit, the rest (embeddings, head) the root's."""
    from torch.distributed.fsdp import fully_shard

    classes = layer_classes(model)
    for module in list(model.modules()):
        if type(module) in classes:
            fully_shard(module)
    fully_shard(model)
    return model


def full_state_dict(model: torch.nn.Module) -> dict[str, Any]:
    """Every parameter and buffer whole, gathered from the shards; a collective: every process must call it. The
    main process receives the tensors (on CPU), the others an empty dict."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def to_float(value: Any) -> float:
    """A scalar that may be a DTensor (the gradient norm of sharded parameters): its full value."""
    full = getattr(value, "full_tensor", None)
    return float(full() if full is not None else value)
