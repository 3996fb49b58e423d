"""`--shard fsdp` on CPU processes: torch's FSDP2 (`fully_shard`) applied directly, over gloo.

Accelerate runs its FSDP plugin on accelerators only (on a MULTI_CPU state it would silently train plain DDP), but
torch's FSDP2 itself shards on CPU: each process keeps 1/N of every parameter, gradient and optimizer state as a
DTensor, all-gathers one transformer layer at a time for forward and backward, and reduce-scatters the gradients
(averaged, as DDP's all-reduce averages them, so the loop's loss normalisation is the same). So on CPU leantrain
shards the model here and hands Accelerate the optimizer, loaders and schedule only; on GPUs Accelerate's FSDP2
plugin does the same (`parallel.fsdp_plugin`), one transformer layer per unit in both.

Checkpoints of a sharded run gather the whole state on the main process (torch.distributed.checkpoint's
`get_state_dict` with full_state_dict) and keep the unsharded layout, so a checkpoint loads as a model and resumes
with or without sharding; each process takes its shards back on resume. Per-process shard files (DCP's own
format, for models whose whole state does not fit one process) are not done. Not yet: LoRA and local SGD with
sharding.
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


def own_class(model: torch.nn.Module) -> type:
    """The model's own class: `fully_shard` swaps it for a subclass (`FSDP<Name>`) that refuses deepcopy and whose
    constructor would build an unsharded model that takes itself for sharded."""
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:  # a torch built without distributed
        return type(model)
    return next(c for c in type(model).__mro__ if not issubclass(c, FSDPModule))


def frozen_copy(model: torch.nn.Module, dtype: torch.dtype) -> torch.nn.Module:
    """A frozen copy of a sharded model in `dtype`, in evaluation mode and sharded alike (FSDP2 refuses deepcopy):
    its whole weights gathered on every process (a collective), loaded into the model's own class, then sharded,
    so that each process holds its part of the copy too. Its forward is a collective like the model's."""
    import copy

    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    whole = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))
    with torch.device("meta"):
        clone = own_class(model)(copy.deepcopy(model.config))
    missing, unexpected = clone.load_state_dict(whole, strict=False, assign=True)
    aliases = tied_aliases(model)
    if set(missing) - set(aliases) or unexpected:
        raise RuntimeError(f"a frozen copy of {type(clone).__name__}: missing {missing}, unexpected {unexpected}")
    for alias, name in aliases.items():  # shared as in the model (each name was given its own tensor)
        _set(clone, alias, clone.get_parameter(name))
    for name, buffer in model.named_buffers():  # buffers are whole on every process; some are in no state dict
        _set(clone, name, buffer.detach().clone())
    clone.to(dtype).eval().requires_grad_(False)
    return shard(clone)


def _set(model: torch.nn.Module, name: str, tensor: torch.Tensor) -> None:
    owner, _, leaf = name.rpartition(".")
    module = model.get_submodule(owner)
    if isinstance(tensor, torch.nn.Parameter):
        setattr(module, leaf, tensor)
    else:
        module.register_buffer(leaf, tensor, persistent=leaf not in module._non_persistent_buffers_set)


def full_state_dict(model: torch.nn.Module) -> dict[str, Any]:
    """Every parameter and buffer whole, gathered from the shards; a collective: every process must call it. The
    main process receives the tensors (on CPU), the others an empty dict. Tied aliases are left out, as
    `save_pretrained` leaves them out of an unsharded model (gathered, they are two tensors it would store twice)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    whole = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    for alias in tied_aliases(model):
        whole.pop(alias, None)
    return whole


def local_tensor(value: Any) -> torch.Tensor:
    """A scalar that may be a DTensor (the gradient norm of sharded parameters): its full value, on the device."""
    full = getattr(value, "full_tensor", None)
    return full() if full is not None else torch.as_tensor(value)


# -- checkpoints: a sharded run's state gathered whole, in the layout of an unsharded checkpoint -----------------
def is_sharded(model: torch.nn.Module) -> bool:
    return any(hasattr(p, "to_local") for p in model.parameters())


def tied_aliases(model: torch.nn.Module) -> dict[str, str]:
    """{second name: first name} of parameters shared under two names (a causal LM's embeddings and output layer):
    stored once, as `save_pretrained` and safetensors store them."""
    first: dict[int, str] = {}
    aliases = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        if id(p) in first:
            aliases[name] = first[id(p)]
        else:
            first[id(p)] = name
    return aliases


def _unwrapped(optimizer):
    return getattr(optimizer, "optimizer", optimizer)  # inside Accelerate's AcceleratedOptimizer


def full_state(model: torch.nn.Module, optimizer) -> tuple[dict[str, Any], dict[str, Any]]:
    """The model's and the optimizer's state, whole, gathered from every process's shards on the main one (on CPU;
    the others get empty dicts); a collective. Tied aliases are left out of the model's."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    weights, state = get_state_dict(model, _unwrapped(optimizer), options=options)
    for alias in tied_aliases(model):
        weights.pop(alias, None)
    return weights, state


def load_full_state(model: torch.nn.Module, optimizer, weights: dict[str, Any], state: dict[str, Any] | None) -> None:
    """Each process takes its shards of whole state (`full_state`'s, read back by every process); every parameter
    must be there (tied aliases are filled in). `state` None: the weights alone."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict, set_state_dict

    weights = dict(weights)
    for alias, name in tied_aliases(model).items():
        weights.setdefault(alias, weights[name])
    options = StateDictOptions(full_state_dict=True, strict=True)
    if state is None:
        set_model_state_dict(model, weights, options=options)
    else:
        set_state_dict(model, _unwrapped(optimizer), model_state_dict=weights, optim_state_dict=state, options=options)
