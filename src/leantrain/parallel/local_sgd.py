"""Local SGD, optionally with a DiLoCo outer optimizer.

Each process takes `local_sgd_steps` optimizer steps on its own (no per-step gradient all-reduce), then
the parameters are averaged across processes. Modelled on `accelerate.local_sgd.LocalSGD`, plus:

* an optional outer optimizer (DiLoCo, Douillard et al. 2023, arXiv:2311.08105): an fp32 copy of the
  parameters at the last sync (the "anchor") is kept; at each sync the averaged delta
  `anchor - mean(params)` is the outer gradient, SGD with Nesterov momentum updates the anchor, and the
  anchor is copied into the model. `outer_lr=1, outer_momentum=0` is plain averaging;
* a single-process no-op that says so (`.enabled`, `.reason`);
* a count of the bytes handed to all-reduce (`bytes_communicated`) and of the time spent syncing.

What is averaged: every floating-point parameter that requires grad, and every floating-point buffer
(BatchNorm running statistics drift apart between syncs). Frozen parameters are skipped (no optimizer
moves them, and DDP made them equal at wrap time; `sync_frozen=True` averages them as well); integer
buffers (e.g. `num_batches_tracked`) are left alone. The outer optimizer acts on trainable parameters
only; buffers are plainly averaged.

Preconditions: all processes start from the same parameters (DDP broadcasts them when it wraps the
model) and take the same number of optimizer steps, so that they reach each sync together.
"""

from __future__ import annotations

import contextlib
import time
from collections import defaultdict
from typing import cast

import torch
import torch.distributed as dist
from torch import nn


def _unwrap(model: nn.Module) -> tuple[nn.Module, nn.Module | None]:
    """(the innermost module, the DDP wrapper if any), looking through torch.compile and DDP."""
    ddp = None
    while True:
        if isinstance(model, nn.parallel.DistributedDataParallel):
            ddp, model = model, model.module
        elif hasattr(model, "_orig_mod"):  # torch.compile's OptimizedModule
            model = cast(nn.Module, model._orig_mod)
        else:
            return model, ddp


def _is_sharded(model: nn.Module) -> bool:
    try:
        from torch.distributed.fsdp import FSDPModule, FullyShardedDataParallel
    except ImportError:  # pragma: no cover
        return False
    return any(isinstance(m, (FSDPModule, FullyShardedDataParallel)) for m in model.modules())


class LocalSGD:
    """Average parameters every `local_sgd_steps` optimizer steps; use as a context manager.

    with LocalSGD(model, local_sgd_steps=K) as local_sgd:
        for batch in loader:
            with local_sgd.no_sync():          # no gradient all-reduce under DDP
                loss = model(**batch).loss
                loss.backward()
            optimizer.step(); optimizer.zero_grad()
            local_sgd.step()                   # once per optimizer step; syncs every K
    # leaving the block syncs the last partial round (not when an exception is propagating)
    """

    def __init__(
        self,
        model: nn.Module,
        local_sgd_steps: int,
        outer_lr: float | None = None,
        outer_momentum: float = 0.0,
        enabled: bool = True,
        *,
        process_group=None,
        sync_frozen: bool = False,
        bucket_bytes: int = 64 << 20,
    ):
        _check_settings(local_sgd_steps, outer_lr, outer_momentum)
        self.model = model
        self.local_sgd_steps = local_sgd_steps
        self.outer_lr = outer_lr
        self.outer_momentum = outer_momentum
        self.process_group = process_group
        self.bucket_bytes = bucket_bytes
        self.num_steps = 0  # optimizer steps seen
        self.steps_since_sync = 0
        self.num_syncs = 0
        self.bytes_communicated = 0  # payload handed to all_reduce by this process
        self.sync_seconds = 0.0
        self.module, self._ddp = _unwrap(model)
        grouped = dist.is_available() and dist.is_initialized()
        self.world_size = world = dist.get_world_size(process_group) if grouped else 1
        if not enabled:
            self.enabled, self.reason = False, "local SGD off: disabled by configuration"
        elif not grouped:
            self.enabled, self.reason = False, "local SGD off: single process (no process group), nothing to average"
        elif world == 1:
            self.enabled, self.reason = False, "local SGD off: world size is 1, nothing to average"
        else:
            self.enabled = True
            self.reason = (
                f"local SGD on: averaging every {local_sgd_steps} optimizer steps across {world} processes "
                f"({_describe_outer(outer_lr, outer_momentum)})"
            )
        if self.enabled and _is_sharded(self.module):
            raise NotImplementedError("LocalSGD needs whole replicas on every process (no FSDP / sharding)")

        self._params = [
            p for p in self.module.parameters() if p.is_floating_point() and (p.requires_grad or sync_frozen)
        ]
        self._outer_params = [p for p in self._params if p.requires_grad]
        self._anchor: list[torch.Tensor] | None = None
        self._outer: torch.optim.Optimizer | None = None
        if self.enabled and outer_lr is not None:
            self._snapshot_anchor()

    # -- the loop's interface -------------------------------------------------------------------------------
    def __enter__(self) -> LocalSGD:
        if self._anchor is not None and self.num_steps == 0:
            self._snapshot_anchor()  # parameters may have been loaded or wrapped since __init__
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        # With an exception in flight other processes may never reach the collective: don't sync.
        if exc_type is None:
            self.sync()

    def no_sync(self):
        """DDP's `no_sync()` when local SGD is on and the model is DDP-wrapped, else a null context."""
        if self.enabled and self._ddp is not None:
            return self._ddp.no_sync()
        return contextlib.nullcontext()

    def step(self) -> bool:
        """Call once after each optimizer step. Returns True when this call synced."""
        self.num_steps += 1
        if not self.enabled:
            return False
        self.steps_since_sync += 1
        if self.steps_since_sync >= self.local_sgd_steps:
            return self.sync()
        return False

    def sync(self) -> bool:
        """Sync now if any step was taken since the last sync (e.g. before evaluating or saving).

        Collective: every process must call it at the same point. Returns True when it synced.
        """
        if not self.enabled or self.steps_since_sync == 0:
            return False
        start = time.perf_counter()
        with torch.no_grad():
            buffers = [b for b in self.module.buffers() if b.is_floating_point()]
            self._all_reduce_mean(self._params + buffers)
            if self._outer is not None:
                assert self._anchor is not None  # the outer optimizer steps the anchor
                for p, a in zip(self._outer_params, self._anchor):
                    a.grad = a - p.to(a.dtype)  # outer gradient: anchor - mean(params)
                self._outer.step()
                for p, a in zip(self._outer_params, self._anchor):
                    p.copy_(a)
                    a.grad = None
        self.steps_since_sync = 0
        self.num_syncs += 1
        self.sync_seconds += time.perf_counter() - start
        return True

    # -- checkpointing: call sync() before saving, so the anchor equals the parameters -----------------------
    def state_dict(self) -> dict:
        return {
            "num_steps": self.num_steps,
            "steps_since_sync": self.steps_since_sync,
            "num_syncs": self.num_syncs,
            "bytes_communicated": self.bytes_communicated,
            "outer": self._outer.state_dict() if self._outer is not None else None,
        }

    def load_state_dict(self, state: dict) -> None:
        """Restore counters and outer momentum; the anchor is taken from the (loaded) parameters."""
        for key in ("num_steps", "steps_since_sync", "num_syncs", "bytes_communicated"):
            setattr(self, key, state[key])
        if self._anchor is not None:
            self._snapshot_anchor()
            if state.get("outer") is not None:
                assert self._outer is not None  # _snapshot_anchor made it
                self._outer.load_state_dict(state["outer"])

    # -- internals ---------------------------------------------------------------------------------------------
    def _snapshot_anchor(self) -> None:
        self._anchor = [
            p.detach().to(torch.promote_types(p.dtype, torch.float32), copy=True) for p in self._outer_params
        ]
        m = self.outer_momentum
        assert self.outer_lr is not None  # an anchor exists only with an outer optimizer
        self._outer = torch.optim.SGD(self._anchor, lr=self.outer_lr, momentum=m, nesterov=m > 0)

    def _all_reduce_mean(self, tensors: list[torch.Tensor]) -> None:
        """In place: each tensor becomes its mean over processes. Flattened into buckets per device/dtype."""
        groups: dict[tuple, list[torch.Tensor]] = defaultdict(list)
        for t in tensors:
            groups[(t.device, t.dtype)].append(t)
        for group in groups.values():
            bucket: list[torch.Tensor] = []
            size = 0
            for t in group:
                nbytes = t.numel() * t.element_size()
                if bucket and size + nbytes > self.bucket_bytes:
                    self._reduce_bucket(bucket)
                    bucket, size = [], 0
                bucket.append(t)
                size += nbytes
            if bucket:
                self._reduce_bucket(bucket)

    def _reduce_bucket(self, bucket: list[torch.Tensor]) -> None:
        flat = torch.cat([t.reshape(-1) for t in bucket])
        dist.all_reduce(flat, op=dist.ReduceOp.SUM, group=self.process_group)  # gloo has no AVG
        flat.div_(self.world_size)
        self.bytes_communicated += flat.numel() * flat.element_size()
        offset = 0
        for t in bucket:
            t.copy_(flat[offset : offset + t.numel()].view_as(t))
            offset += t.numel()


def _check_settings(local_sgd_steps: int, outer_lr: float | None, outer_momentum: float) -> None:
    if local_sgd_steps < 1:
        raise ValueError(f"local_sgd_steps must be at least 1, got {local_sgd_steps}")
    if outer_lr is None and outer_momentum:
        raise ValueError("outer_momentum needs outer_lr (the outer optimizer is off without it)")
    if outer_lr is not None and outer_lr <= 0:
        raise ValueError(f"outer_lr must be positive, got {outer_lr}")
    if not 0.0 <= outer_momentum < 1.0:
        raise ValueError(f"outer_momentum must be in [0, 1), got {outer_momentum}")


def _describe_outer(outer_lr: float | None, outer_momentum: float) -> str:
    if outer_lr is None:
        return "plain averaging"
    if outer_momentum:
        return f"outer Nesterov SGD lr={outer_lr} momentum={outer_momentum}"
    return f"outer SGD lr={outer_lr}"
