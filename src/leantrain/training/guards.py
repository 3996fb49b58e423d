"""The NaN guard: a step whose loss or gradient norm is not finite on any process never moves the weights."""

from __future__ import annotations

import math
from pathlib import Path


class NanGuard:
    """`--on-nan stop` (save the last good state, then stop with the likely cause) or `skip` (drop the step).

    Under fp16 loss scaling an overflowing gradient norm is routine (the scaler skips that step and lowers its
    scale), so only the loss is checked there.
    """

    def __init__(self, accelerator, policy: str, scales_loss: bool):
        self.accelerator, self.policy, self.scales_loss = accelerator, policy, scales_loss

    def finite(self, loss: float, grad_norm: float) -> bool:
        """Whether the step's values are finite on every process (one all-reduce when there are several)."""
        from leantrain.parallel import any_process

        values = [loss] if self.scales_loss else [loss, grad_norm]
        return not any_process(self.accelerator, not all(math.isfinite(v) for v in values))

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
