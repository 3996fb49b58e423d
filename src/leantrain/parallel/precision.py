"""Mixed precision: Accelerate's autocast, plus fp16 loss scaling on CPU, which Accelerate leaves out.

Accelerate autocasts bf16 on CPU and GPU and scales fp16 losses on GPU; for fp16 on CPU it does
neither (its `native_amp` is off there). `MixedPrecision` fills that gap with torch's own CPU autocast
and `GradScaler("cpu")`, so the loop has one way to run a step whatever the device.
"""

from __future__ import annotations

import contextlib

import torch


class MixedPrecision:
    def __init__(self, accelerator, precision: str):
        self.accelerator = accelerator
        self.precision = precision
        self.manual = precision == "fp16" and accelerator.device.type == "cpu"
        self.scaler = torch.amp.GradScaler("cpu") if self.manual else None
        self.skipped_steps = 0

    def autocast(self):
        if self.manual:
            return torch.autocast("cpu", dtype=torch.float16)
        return contextlib.nullcontext()  # the prepared model autocasts itself

    def backward(self, loss: torch.Tensor) -> None:
        if self.manual:
            assert self.scaler is not None  # made whenever self.manual
            loss = self.scaler.scale(loss)
        self.accelerator.backward(loss)

    @property
    def scales_loss(self) -> bool:
        """fp16 loss scaling is on: non-finite gradients are then routine overflow, skipped by the scaler."""
        return self.manual or getattr(self.accelerator, "scaler", None) is not None

    def unscale_and_clip(self, model, optimizer, max_grad_norm: float) -> float:
        """Unscale (fp16) and clip the gradients (max_grad_norm 0: no clipping); returns their pre-clip norm."""
        if self.manual:
            assert self.scaler is not None  # made whenever self.manual
            self.scaler.unscale_(optimizer)
        # An infinite bound measures without clipping: the gradients are multiplied by exactly 1.
        bound = max_grad_norm if max_grad_norm > 0 else float("inf")
        return float(self.accelerator.clip_grad_norm_(model.parameters(), bound))

    def step(self, optimizer) -> bool:
        """Step the optimizer (through the scaler for fp16); returns whether it was skipped for inf/NaN."""
        acc = self.accelerator
        if self.manual:
            assert self.scaler is not None  # made whenever self.manual
            scale = self.scaler.get_scale()
            self.scaler.step(optimizer)
            self.scaler.update()
            skipped = self.scaler.get_scale() < scale
        else:
            optimizer.step()
            skipped = bool(acc.optimizer_step_was_skipped)
        self.skipped_steps += int(skipped)
        return skipped

    def drop_step(self, optimizer) -> None:
        """Do not step: clear the gradients, keeping the loss scaler's books (the NaN guard's --on-nan skip)."""
        scaler = self.scaler if self.manual else getattr(self.accelerator, "scaler", None)
        if scaler is not None:
            with contextlib.suppress(AssertionError):  # raised when nothing was unscaled this step
                scaler.update()  # closes this step's unscale_; the inf/NaN it found lowers the scale
        optimizer.zero_grad(set_to_none=True)

    def state_dict(self) -> dict:
        return {"scaler": self.scaler.state_dict() if self.scaler else None, "skipped_steps": self.skipped_steps}

    def load_state_dict(self, state: dict) -> None:
        if self.scaler is not None and state.get("scaler"):
            self.scaler.load_state_dict(state["scaler"])
        self.skipped_steps = state.get("skipped_steps", 0)
