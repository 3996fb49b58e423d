"""The NaN guard: a step whose loss or gradient norm is not finite on any process never moves the weights."""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch


@dataclass
class Before:
    """What a step changes on the host, as it was before the step: what `--on-nan stop` puts back."""

    state: Any
    rng: dict
    scheduler: dict
    lrs: list[float]


#: the most steps the flag goes unread under --on-nan stop (each keeps a copy of the host's state)
KEEP = 64


class NanGuard:
    """`--on-nan stop` (save the last good state, then stop with the likely cause) or `skip` (drop the step).

    Without a host sync: the check runs on the device, and the optimizer's fused kernel is handed the verdict as its
    `found_inf` (the flag torch's loss scaler hands it), so a bad step leaves weights and optimizer state untouched
    with no read of the flag. Under `stop` the flag is sticky: after the first bad step no later step moves anything,
    and the host reads the flag only where the run would show or keep its state (a log row, an evaluation, a
    checkpoint, local SGD's averaging, the end). What a step changes on the host (the counters, the RNG, the
    schedule) is kept from before each unread step, so the stop saves exactly the state before the first bad step.
    Keeping a copy of the weights instead would double their memory; reading the flag every step would make the GPU
    wait for the host once a step. An optimizer without a fused kernel (or fp16 loss scaling, whose scaler reads its
    own flag) reads the flag every step.

    Under fp16 loss scaling an overflowing gradient norm is routine (the scaler skips that step and lowers its
    scale), so only the loss is checked there.
    """

    def __init__(self, accelerator, policy: str, scales_loss: bool, optimizer=None):
        self.accelerator, self.policy, self.scales_loss = accelerator, policy, scales_loss
        inner = getattr(optimizer, "optimizer", optimizer)  # Accelerate's wrapper holds torch's
        groups = getattr(inner, "param_groups", [])
        fused = bool(groups) and all(g.get("fused") for g in groups)
        # sharded parameters (DTensors) take no plain-tensor flag: they read it
        sharded = any(hasattr(p, "to_local") for g in groups for p in g["params"][:1])
        self.inner = inner if fused and not scales_loss and not sharded else None
        self.halted: torch.Tensor | None = None  # stop: a bad step since the last read (device)
        self.first: torch.Tensor | None = None  # stop: the first bad step's loss and gradient norm (device)
        self.back: torch.Tensor | None = None  # stop: steps since the first bad one, counting it (device)
        self.pending: list[Before] = []
        self.last_take: Any = True  # the latest step's verdict

    def before_step(self, state, scheduler, optimizer) -> None:
        """Under stop: remember what the step is about to change on the host."""
        if self.policy == "stop":
            from leantrain.run import checkpoint

            lrs = [g["lr"] for g in optimizer.param_groups]
            self.pending.append(Before(copy.deepcopy(state), checkpoint.rng_state(), scheduler.state_dict(), lrs))

    def forget_step(self) -> None:
        """The step is redone (out of memory): what was kept before it is kept again when it starts over."""
        if self.pending:
            self.pending.pop()

    def full(self) -> bool:
        """Whether as many states are kept as the guard will keep (`KEEP`): the flag must be read now."""
        return len(self.pending) >= KEEP

    def verdict(self, loss: torch.Tensor, grad_norm: torch.Tensor) -> torch.Tensor:
        """Whether the step may move the weights: a device bool, the same on every process."""
        values = loss.reshape(1) if self.scales_loss else torch.stack([loss.float(), grad_norm.float().to(loss.device)])
        bad = (~torch.isfinite(values)).any().float()
        if self.accelerator.num_processes > 1:  # one all-reduce, read by no one here
            bad = self.accelerator.reduce(bad, reduction="sum")
        bad = bad > 0
        if self.policy != "stop":
            return ~bad
        pair = torch.stack([loss.float(), grad_norm.float().to(loss.device)]).detach()
        if self.halted is None or self.first is None or self.back is None:
            self.halted, self.first, self.back = (
                torch.zeros_like(bad),
                torch.zeros_like(pair),
                torch.zeros_like(pair[0]),
            )
        self.first = torch.where(bad & ~self.halted, pair, self.first)
        self.halted = self.halted | bad
        self.back = self.back + self.halted.float()  # steps since the first bad one, counting it
        return ~self.halted

    def step(self, amp, optimizer, take: torch.Tensor) -> bool | None:
        """Step the optimizer unless `take` says no. On the device path the fused kernel reads `take` itself (None is
        returned: nobody on the host knows); else `take` is read (a sync) and True or False returned."""
        if self.inner is not None:
            self.inner.found_inf = (~take).float()
            try:
                amp.step(optimizer)
            finally:
                del self.inner.found_inf
            return None
        took = bool(take)
        if took:
            amp.step(optimizer)
        elif self.policy != "stop":
            amp.drop_step(optimizer)
        return took

    def read(self) -> tuple[int, float, float] | None:
        """Under stop: (steps back to the first bad one, counting it; its loss, its gradient norm) if one came since
        the last read; else None, the kept states forgotten. One host read."""
        if self.back is None or self.first is None or not self.pending:
            self.pending.clear()
            return None
        back, loss, grad_norm = torch.cat([self.back.reshape(1), self.first]).tolist()
        if not back:
            self.pending.clear()
            return None
        return int(back), loss, grad_norm

    def restore(self, back: int, state, scheduler, optimizer) -> dict:
        """Put the host back as it was before the first bad step (`back` steps ago); returns that step's RNG."""
        before = self.pending[-back]
        state.__dict__.update(before.state.__dict__)
        scheduler.load_state_dict(before.scheduler)
        for group, lr in zip(optimizer.param_groups, before.lrs):
            group["lr"] = lr
        self.pending.clear()
        return before.rng

    @staticmethod
    def message(step: int, loss: float, grad_norm: float, lr: float, precision: str, saved: Path | None) -> str:
        what = (
            " and ".join(
                f"{name} ({value})"
                for name, value in (("loss", loss), ("gradient norm", grad_norm))
                if not math.isfinite(value)
            )
            or "loss or gradient norm on another process"
        )
        cause = (
            "fp16 overflow (values beyond fp16's range); start again with --precision bf16 (or fp32), or a lower --lr"
            if precision == "fp16"
            else f"the learning rate is too high (--lr {lr:g}); start again with a lower --lr"
        )
        kept = f" The last good state (step {step - 1}) is saved in {saved}." if saved is not None else ""
        return (
            f"step {step}: non-finite {what}. Likely cause: {cause}.{kept} To skip such steps instead: "
            "--on-nan skip (e.g. --resume auto --on-nan skip)"
        )
