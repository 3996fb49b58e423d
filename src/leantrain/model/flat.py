"""Flat parameters: each optimizer group's small trainable parameters as views into one tensor, and their gradients
as views into another, so that a step's update, its gradient norm and its clearing are one kernel call for them all
instead of one per parameter tensor. Large parameters (over `LARGEST` numbers) stay as they are.

On a CPU torch's fused AdamW spends about 5 microseconds a tensor whatever its size (a parallel region each): for
BERT's 201 tensors at width 32 that is 1.0 ms a step, against 0.06 ms for the same 122 k numbers as one tensor; the
gradients' norm 0.25 against 0.01 ms (`benchmarks/results/host_overhead.md`). The optimizer must update each number
from that number's own gradient and state alone (AdamW, SGD: `OptimizerEntry.flat`), so the weights are those of a
per-tensor step up to the last bits of a few numbers: a tensor's last numbers, fewer than a vector, went through the
kernel's scalar loop and now go through its vector path, which may round them differently (a fused multiply-add);
and the clip's norm sums the same squares in another order.

What it costs and keeps:
- The flat gradients stay allocated between steps, cleared in place (as Megatron's contiguous gradient buffers):
  the planner counts them through backward. `--no-flat-parameters` frees them after each step instead.
- A parameter that gets no gradient in a step is stepped with a zero one (its weight decay applies) where a
  per-tensor step would skip it; such a parameter does not take part in the loss.
- The optimizer's `state_dict()` stays torch's per-parameter format (a pair of hooks translate), so a checkpoint
  resumes whichever way the run that wrote it or the run that reads it keeps its parameters.
- Everything else sees the model's own parameters, as before: only where their numbers live has changed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

#: each parameter starts on a 64-byte boundary: vector kernels then read its numbers as they read a tensor's own
ALIGN_BYTES = 64
#: parameters of more numbers than this stay apart: for them the per-tensor cost saved is less than the flat
#: gradients' clearing and backward's adding into them, which a first backward into no gradient skips (MiniLM held
#: to AVX2, fp32: all flat 1-2% slower a step; its matrices and embeddings apart, as fast as none flat)
LARGEST = 1 << 16


@dataclass
class Group:
    """One optimizer group: its small parameters in one flat tensor (their views' places, the gradients' buffer),
    its large ones kept as they are. The optimizer's group holds the flat tensor first, then the large ones."""

    #: the group's parameters, in their order
    params: list[torch.nn.Parameter]
    #: per parameter: (offset, numel) of its slot in `flat`, or None for one kept apart
    slots: list[tuple[int, int] | None]
    flat: torch.nn.Parameter
    grad: torch.Tensor

    @property
    def apart(self) -> list[torch.nn.Parameter]:
        return [p for p, slot in zip(self.params, self.slots, strict=True) if slot is None]


class FlatParameters:
    """The small trainable parameters of `optimizer` moved into flat tensors, which the optimizer then steps."""

    def __init__(self, optimizer: torch.optim.Optimizer, groups: list[Group | None]):
        self.groups = groups  # None: a group left as it was
        self.grads = [g.grad for g in groups if g is not None]
        # every parameter not in a flat tensor, flattened group or not: cleared as torch's zero_grad clears them
        flats = {id(g.flat) for g in groups if g is not None}
        self.apart = [p for group in optimizer.param_groups for p in group["params"] if id(p) not in flats]
        optimizer.register_state_dict_post_hook(self._per_parameter_state)
        optimizer.register_load_state_dict_pre_hook(self._flat_state)
        # The flat gradients are cleared in place, never to None: the parameters' gradients are views that backward
        # adds into. Every caller (Accelerate's wrapper, the OOM and NaN guards) reaches this through the optimizer.
        optimizer.zero_grad = self.zero_grad  # type: ignore[method-assign]

    @classmethod
    def attach(cls, optimizer: torch.optim.Optimizer, model: torch.nn.Module) -> FlatParameters | None:
        """Flatten `optimizer`'s small parameters (of `model`, already on their device) before its first step; None
        where no group has two small ones, or where that cannot keep every parameter what it was: a group of several
        devices or dtypes, sparse or non-leaf parameters, gradients already there, or storage a parameter shares
        with another tensor of the model."""
        if optimizer.state or not _flattenable(optimizer, model):
            return None
        groups = [_flatten(g["params"]) for g in optimizer.param_groups]
        if not any(groups):
            return None
        for group, layout in zip(optimizer.param_groups, groups, strict=True):
            if layout is not None:
                group["params"] = [layout.flat, *layout.apart]
        return cls(optimizer, groups)

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Clear the flat gradients in place (whatever `set_to_none` asks: backward adds into these buffers), and
        the large parameters' as asked."""
        for g in self.groups:
            if g is not None and g.flat.grad is not g.grad:  # put back what a caller set to None
                g.flat.grad = g.grad
        torch._foreach_zero_(self.grads)
        for p in self.apart:
            if set_to_none:
                p.grad = None
            elif p.grad is not None:
                p.grad.zero_()

    def detached(self) -> list[str]:
        """Small parameters whose gradient is no longer their view of the buffer (something set it to None, such as
        `model.zero_grad()`): their gradients would never reach the optimizer. Checked where the run logs."""
        return [
            f"{tuple(p.shape)}"
            for g in self.groups
            if g is not None
            for p, slot in zip(g.params, g.slots, strict=True)
            if slot is not None
            and (p.grad is None or p.grad.data_ptr() != g.grad.data_ptr() + slot[0] * g.grad.element_size())
        ]

    # -- the state dict, in torch's per-parameter format --------------------------------------------------------
    def _per_parameter_state(self, optimizer, state_dict: dict[str, Any]) -> dict[str, Any]:
        state: dict[int, dict[str, Any]] = {}
        groups, index = [], 0
        for saved, layout in zip(state_dict["param_groups"], self.groups, strict=True):
            if layout is None:  # as torch keeps it, renumbered
                ids = list(range(index, index + len(saved["params"])))
                state.update(
                    {i: state_dict["state"][j] for i, j in zip(ids, saved["params"]) if j in state_dict["state"]}
                )
            else:
                ids = list(range(index, index + len(layout.params)))
                flat = state_dict["state"].get(saved["params"][0])
                apart = iter(saved["params"][1:])
                for i, p, slot in zip(ids, layout.params, layout.slots, strict=True):
                    if slot is None:
                        own = state_dict["state"].get(next(apart))
                        if own is not None:
                            state[i] = own
                    elif flat is not None:
                        state[i] = {k: _slice(v, layout, *slot, p.shape) for k, v in flat.items()}
            index += len(ids)
            groups.append({**saved, "params": ids})
        return {"state": state, "param_groups": groups}

    def _flat_state(self, optimizer, state_dict: dict[str, Any]) -> dict[str, Any]:
        if len(state_dict["param_groups"]) != len(self.groups):
            return state_dict  # torch's own check names the mismatch
        state: dict[int, dict[str, Any]] = {}
        groups, index = [], 0
        for saved, layout in zip(state_dict["param_groups"], self.groups, strict=True):
            per = [state_dict["state"].get(i) for i in saved["params"]]
            if layout is None:
                ids = list(range(index, index + len(per)))
                state.update({i: s for i, s in zip(ids, per) if s is not None})
            else:
                if len(per) != len(layout.params):
                    return state_dict
                ids = list(range(index, index + 1 + len(layout.apart)))
                small = [s if slot is not None else None for s, slot in zip(per, layout.slots, strict=True)]
                first = next((s for s in small if s is not None), None)
                if first is not None:
                    state[ids[0]] = {k: _joined(k, v, small, layout) for k, v in first.items()}
                own = [s for s, slot in zip(per, layout.slots, strict=True) if slot is None]
                state.update({i: s for i, s in zip(ids[1:], own) if s is not None})
            index += len(ids)
            groups.append({**saved, "params": ids})
        return {"state": state, "param_groups": groups}


def _flattenable(optimizer: torch.optim.Optimizer, model: torch.nn.Module) -> bool:
    params = [p for g in optimizer.param_groups for p in g["params"]]
    if not params:
        return False
    for g in optimizer.param_groups:
        kinds = {(p.device, p.dtype) for p in g["params"]}
        if len(kinds) != 1:
            return False
    if any(p.grad is not None or p.is_sparse or not p.is_leaf or hasattr(p, "to_local") for p in params):
        return False
    # A storage shared with any other tensor of the model (two Parameter objects over one storage, a frozen copy of a
    # trainable one) would be split in two by moving the parameter: left as it is.
    mine = {p.untyped_storage().data_ptr() for p in params}
    if len(mine) != len({id(p) for p in params}):
        return False
    trainable = {id(p) for p in params}
    others = [t for t in [*model.parameters(), *model.buffers()] if id(t) not in trainable]
    return not any(t.untyped_storage().data_ptr() in mine for t in others if t.device.type != "meta")


def _flatten(params: list[torch.nn.Parameter]) -> Group | None:
    """Copy the small ones of `params` into one zero-padded tensor and make each a view of its slot; gradients
    likewise. None where fewer than two are small."""
    small = [p for p in params if p.numel() <= LARGEST]
    if len(small) < 2:
        return None
    first = small[0]
    align = max(1, ALIGN_BYTES // first.element_size())
    slots: list[tuple[int, int] | None] = []
    offset = 0
    for p in params:
        if p.numel() > LARGEST:
            slots.append(None)
            continue
        slots.append((offset, p.numel()))
        offset += -(-p.numel() // align) * align
    data = torch.zeros(offset, dtype=first.dtype, device=first.device)
    grad = torch.zeros_like(data)
    with torch.no_grad():
        for p, slot in zip(params, slots, strict=True):
            if slot is not None:
                start, n = slot
                data[start : start + n].copy_(p.reshape(-1))
                p.data = data[start : start + n].view(p.shape)
                p.grad = grad[start : start + n].view(p.shape)
    flat = torch.nn.Parameter(data, requires_grad=True)
    flat.grad = grad
    return Group(list(params), slots, flat, grad)


def _slice(value: Any, layout: Group, offset: int, n: int, shape: torch.Size) -> Any:
    """A parameter's share of one flat state entry: its slot of a flat tensor; a copy of anything else (a step
    count), since a per-tensor optimizer that loads it steps each parameter's own."""
    if isinstance(value, torch.Tensor):
        if value.dim() == 1 and value.numel() == layout.flat.numel() > 1:
            return value[offset : offset + n].view(shape)
        return value.clone()
    return value


def _joined(key: str, value: Any, per: list[dict[str, Any] | None], layout: Group) -> Any:
    """One flat state entry from the parameters' own: their tensors placed in their slots (zeros for a parameter
    that had no state yet, as a fresh one starts); the first parameter's value of anything else (a step count)."""
    params = layout.params
    per_number = key != "step" and all(
        s is None or (isinstance(s[key], torch.Tensor) and s[key].shape == p.shape) for s, p in zip(per, params)
    )
    if not per_number:
        return value.clone() if isinstance(value, torch.Tensor) else value
    flat = torch.zeros(layout.flat.numel(), dtype=value.dtype, device=value.device)
    for s, slot in zip(per, layout.slots, strict=True):
        if s is not None and slot is not None:
            flat[slot[0] : slot[0] + slot[1]].copy_(s[key].reshape(-1))
    return flat


class WholeTensors(torch.nn.Module):
    """`model` as safetensors' `save_model` and `load_model` may read it: they refuse a tensor that covers part of
    its storage (a flat parameter's view), so each such tensor is handed over as a copy of its own; tied ones (one
    parameter under two names) stay one tensor, which those functions store once. Loading writes into the model's
    own parameters. (A module only by type: `model` is not its submodule, so the names are the model's own.)"""

    wrapped: torch.nn.Module

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        object.__setattr__(self, "wrapped", model)

    def state_dict(self, *args, **kwargs) -> dict[str, torch.Tensor]:  # type: ignore[override]
        copies: dict[tuple, torch.Tensor] = {}
        state = {}
        for name, t in self.wrapped.state_dict().items():
            if t.device.type != "meta" and t.untyped_storage().nbytes() != t.numel() * t.element_size():
                key = (t.data_ptr(), tuple(t.shape), t.stride())
                t = copies.setdefault(key, t.clone())
            state[name] = t
        return state

    def load_state_dict(self, state_dict, strict: bool = True, assign: bool = False):  # type: ignore[override]
        return self.wrapped.load_state_dict(state_dict, strict=strict, assign=assign)
