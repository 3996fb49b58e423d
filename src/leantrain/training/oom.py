"""Out of memory during training, with --auto: halve the micro-batch, double accumulation, redo the step.

What counts as out of memory:
- CUDA: `torch.OutOfMemoryError` from a micro-step's forward or backward;
- the --memory budget: after each micro-step, the run's memory (weights plus the peak over the
  baseline taken once the model was loaded: telemetry.memory.MemoryMeter, the resident high-water
  mark on CPU, the allocator's peak on CUDA) is compared with the budget.

Then every process learns of it (one all-reduce of a flag per micro-step, only with several processes)
and all of them together: drop the gradients of the current optimizer step, halve the micro-batch and
double the accumulation in the sampler (data.batching.GlobalBatchSampler), and seek the sampler to the
start of the current step. The sampler cuts each global batch into micro-batches *after* drawing it, and
which examples form a global batch depends only on the seed, the epoch and the global batch size, so
the step is redone on exactly the same examples; the loss normaliser (examples in the whole step) is
unchanged. The run goes on from that step: nothing restarts, no step is lost or repeated.

Limits: an OOM raised inside the backward of the last micro-step of a step on several GPUs, while
DDP's gradient all-reduce is in flight on the other ranks, cannot be recovered here (the collective
is left half done); OOMs in the other micro-steps, and the CPU budget, are.

Tests simulate an out-of-memory signal through `Hooks.out_of_memory` (training/hooks.py).
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from leantrain.errors import LeantrainError
from leantrain.training.hooks import Hooks


@dataclass
class OomGuard:
    """Watches micro-steps for running out of memory and re-cuts the batches when it happens."""

    #: on with --auto; off, an OOM propagates as it always did
    enabled: bool
    sampler: Any
    accelerator: Any
    #: the loop's MemoryMeter (baseline after the model was loaded)
    memory: Any
    #: bytes the run may use (None: only CUDA's own out-of-memory errors count)
    budget: int | None
    #: bytes of the weights, which the meter's baseline already holds
    weights_bytes: int
    #: where tests simulate running out of memory
    hooks: Hooks = field(default_factory=Hooks)
    #: what happened: one entry per re-cut
    events: list[dict[str, Any]] = field(default_factory=list)
    _restart: bool = False

    def forward_backward(self, fn, batch, step: int) -> torch.Tensor | None:
        """`fn(batch)`, or None when this micro-step ran out of memory on any process."""
        if not self.enabled:
            return fn(batch)
        out_of_memory = False
        try:
            loss = fn(batch)
        except torch.OutOfMemoryError:
            loss, out_of_memory = None, True  # the traceback (and the activations it holds) goes here
        if not out_of_memory:
            out_of_memory = self._over_budget() or self.hooks.out_of_memory(step, batch)
        from leantrain.parallel import any_process

        return None if any_process(self.accelerator, out_of_memory) else loss

    def _over_budget(self) -> bool:
        if self.budget is None:
            return False
        over = self.memory.report().get("peak_memory_over_baseline_bytes")
        if over is None:
            return False
        used = over + (self.weights_bytes if self.memory.device.type != "cuda" else self.memory.baseline)
        return used > self.budget

    def recut(self, optimizer, epoch: int, steps_in_epoch: int, step: int) -> dict[str, Any]:
        """Halve the micro-batch, double accumulation and make the sampler start the current step again."""
        s = self.sampler
        if s.micro_batch == 1:
            budget = f" (--memory {self.budget / 2**20:.0f} MiB)" if self.budget else ""
            raise LeantrainError(
                f"step {step + 1}: out of memory{budget} with a micro-batch of 1; nothing is left to halve: "
                "give more memory, a shorter --max-length, or see `leantrain plan`"
            )
        event: dict[str, Any] = {
            "step": step,
            "from": {"batch_size": s.micro_batch, "grad_accum": s.accumulation},
            "to": {"batch_size": s.micro_batch // 2, "grad_accum": s.accumulation * 2},
        }
        if s.micro_batch % 2:  # an odd micro-batch: round up, the sampler's array_split evens the cut
            event["to"]["batch_size"] = (s.micro_batch + 1) // 2
        optimizer.zero_grad(set_to_none=True)
        # The sampler's global batch (micro x accumulation x processes) must stay the same: the examples of
        # every optimizer step are drawn from it.
        global_batch = s.global_batch
        s.micro_batch, s.accumulation = event["to"]["batch_size"], event["to"]["grad_accum"]
        s.start_at(epoch, steps_in_epoch)
        self._restart = True
        gc.collect()
        if self.memory.device.type == "cuda":
            torch.cuda.empty_cache()
        self.memory.reset_peak()
        assert s.global_batch == global_batch
        self.events.append(event)
        return event

    @staticmethod
    def describe(event: dict[str, Any]) -> str:
        a, b = event["from"], event["to"]
        return (
            f"micro-batch {a['batch_size']} x {a['grad_accum']} accumulation -> {b['batch_size']} x "
            f"{b['grad_accum']} (same global batch); the step is redone"
        )

    def batches(self, loader) -> Iterator[Any]:
        """Iterate `loader`; after a `recut`, start it again (the sampler then begins at the redone step)."""
        while True:
            self._restart = False
            for batch in loader:
                yield batch
                if self._restart:
                    break
            else:
                return

    def metrics(self) -> dict[str, Any]:
        return {
            "oom_recuts": self.events,
            "final_batch_size": self.sampler.micro_batch,
            "final_grad_accum": self.sampler.accumulation,
        }
