"""Mixed precision: Accelerate's autocast, plus fp16 loss scaling on CPU, which Accelerate leaves out.

Accelerate autocasts bf16 on CPU and GPU and scales fp16 losses on GPU; for fp16 on CPU it does
neither (its `native_amp` is off there). `MixedPrecision` fills that gap with torch's own CPU autocast
and `GradScaler("cpu")`, so the loop has one way to run a step whatever the device.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch

from leantrain.parallel.sharding import local_tensor


@contextlib.contextmanager
def own_forward(model: torch.nn.Module):
    """Inside the caller's autocast, `model`'s own forward, without what Accelerate wrapped it in for mixed precision:
    an autocast (the caller's is one already) and every output converted to fp32, which in a generation is each new
    token's whole logits where transformers' generation and leantrain's sampler read the last position in fp32
    themselves (bf16 to fp32 is exact: the same tokens). Outside an autocast, or for a model Accelerate left as it
    was, nothing changes."""
    original = getattr(model, "_original_forward", None)
    wrapped = vars(model).get("forward")
    device = next(model.parameters()).device.type
    if original is None or wrapped is None or not torch.is_autocast_enabled(device):
        yield
        return
    model.forward = original
    try:
        yield
    finally:
        model.forward = wrapped


def frozen_dtype(precision: str, device_type: str) -> torch.dtype | None:
    """The dtype a run keeps its frozen matmul weights in (`model.freezing.store_frozen`): the one its every forward,
    training's and evaluation's, autocasts matmuls to (fp16 on a CPU too: `MixedPrecision` autocasts it there). None
    in fp32."""
    return {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)


class MixedPrecision:
    def __init__(self, accelerator, precision: str, model_autocasts: bool = True):
        self.accelerator = accelerator
        self.precision = precision
        self.manual = precision == "fp16" and accelerator.device.type == "cpu"
        # a model Accelerate did not prepare (sharded on CPU, parallel.sharding) is autocast here instead
        self.own_autocast = not model_autocasts and precision == "bf16"
        self.scaler = torch.amp.GradScaler("cpu") if self.manual else None
        self.skipped_steps = 0
        self._clipped: tuple[Any, list[torch.Tensor], Any] | None = None  # (model, its parameters, fused optimizer)
        self._grad_scale: torch.Tensor | None = None  # the clip, for the fused optimizer's next step

    def autocast(self):
        if self.manual:
            return torch.autocast("cpu", dtype=torch.float16)
        if self.own_autocast:
            return torch.autocast(self.accelerator.device.type, dtype=torch.bfloat16)
        return contextlib.nullcontext()  # the prepared model autocasts itself

    def autocast_across(self):
        """An autocast around many forwards of unchanged weights (a generation's tokens): the prepared model
        autocasts each forward itself, but autocast keeps its low-precision copies of the weights only while the
        outermost autocast lasts, so without one around them every forward casts every weight again."""
        return self.autocast() if self.manual or self.own_autocast else self.accelerator.autocast()

    def backward(self, loss: torch.Tensor) -> None:
        if self.manual:
            assert self.scaler is not None  # made whenever self.manual
            loss = self.scaler.scale(loss)
        self.accelerator.backward(loss)

    @property
    def scales_loss(self) -> bool:
        """fp16 loss scaling is on: non-finite gradients are then routine overflow, skipped by the scaler."""
        return self.manual or getattr(self.accelerator, "scaler", None) is not None

    def unscale_and_clip(self, model, optimizer, max_grad_norm: float):
        """Unscale (fp16) and clip the gradients (max_grad_norm 0: no clipping); returns their pre-clip norm, a
        tensor on the device (read it only when it is shown: reading it waits for the device).

        With a fused torch optimizer the clip costs one pass over the gradients, not two: the norm is measured here
        and the clip factor handed to the optimizer's kernel as its `grad_scale` (the divisor torch's loss scaler
        hands it), which divides each gradient as it reads it, so the gradients are never rewritten in a pass of
        their own. The update equals a clip then a step to within a rounding of the factor (a division for a
        multiplication); an unclipped step is exactly the same. Elsewhere (fp16 loss scaling, sharded parameters,
        an optimizer without a fused kernel) Accelerate's clip rewrites the gradients first."""
        if self.manual:
            assert self.scaler is not None  # made whenever self.manual
            self.scaler.unscale_(optimizer)
        lean = self._lean_clip(model, optimizer)
        if lean is not None:
            norm = torch.nn.utils.get_total_norm([p.grad for p in lean if p.grad is not None], foreach=True)
            if max_grad_norm > 0:  # torch's clip multiplies by min(1, bound / (norm + 1e-6)); the kernel divides
                self._grad_scale = torch.clamp((norm + 1e-6) / max_grad_norm, min=1.0)
            return norm
        # An infinite bound measures without clipping: the gradients are multiplied by exactly 1.
        bound = max_grad_norm if max_grad_norm > 0 else float("inf")
        # torch clips with foreach kernels and a device-side factor: no read of the norm
        return local_tensor(self.accelerator.clip_grad_norm_(model.parameters(), bound))  # sharded: a DTensor

    def _lean_clip(self, model, optimizer) -> list[torch.Tensor] | None:
        """The model's parameters when the clip can be handed to the optimizer's fused kernel, else None. Walking the
        model for its parameters costs as much as measuring a small model's norm: done once."""
        if self._clipped is not None and self._clipped[0] is model:
            return self._clipped[1] if self._clipped[2] is not None else None
        inner = getattr(optimizer, "optimizer", optimizer)  # Accelerate's wrapper holds torch's
        groups = getattr(inner, "param_groups", [])
        # the optimizer's: the model's trainable parameters, or the flat tensors that hold them (`model.flat`)
        params = [p for g in groups for p in g["params"]]
        fused = (
            bool(groups)
            and all(g.get("fused") for g in groups)
            and getattr(inner, "_step_supports_amp_scaling", False)
            and not self.scales_loss
            and not any(hasattr(p, "to_local") for p in params)  # sharded parameters: Accelerate's clip
            and self.accelerator.distributed_type.value in ("NO", "MULTI_CPU", "MULTI_GPU")
        )
        self._clipped = (model, params, inner if fused else None)
        return params if fused else None

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
            grad_scale, self._grad_scale = self._grad_scale, None
            inner = self._clipped[2] if self._clipped is not None else None
            if grad_scale is not None and inner is not None:
                inner.grad_scale = grad_scale  # the clip (unscale_and_clip)
            try:
                self._unwrapped(optimizer).step()
            finally:
                if grad_scale is not None and inner is not None:
                    del inner.grad_scale
            skipped = bool(acc.optimizer_step_was_skipped)
        self.skipped_steps += int(skipped)
        return skipped

    def zero_grad(self, optimizer) -> None:
        """Clear the gradients (to None: the next backward writes them instead of adding to zeros)."""
        self._unwrapped(optimizer).zero_grad(set_to_none=True)

    def _unwrapped(self, optimizer):
        """Torch's optimizer inside Accelerate's wrapper where the wrapper would only pass the call on (no loss
        scaler, no XLA, gradients in sync: always so in leantrain's loop, which accumulates on its own). The wrapper
        looks for an optional package twice a step and inspects `zero_grad`'s signature once, about a tenth of a
        millisecond each time: a few percent of a small model's step on a CPU. Only Accelerate's plain wrapper: its
        subclasses (DeepSpeed's, Megatron's) hand the step to their engines."""
        from accelerate.optimizer import AcceleratedOptimizer

        inner = getattr(optimizer, "optimizer", None)
        acc = self.accelerator
        if (
            type(optimizer) is not AcceleratedOptimizer
            or inner is None
            or getattr(optimizer, "scaler", None) is not None
            or acc.distributed_type.value == "XLA"
            or not acc.sync_gradients
        ):
            return optimizer
        return inner

    def drop_step(self, optimizer) -> None:
        """Do not step: clear the gradients, keeping the loss scaler's books (the NaN guard's --on-nan skip)."""
        self._grad_scale = None
        scaler = self.scaler if self.manual else getattr(self.accelerator, "scaler", None)
        if scaler is not None:
            with contextlib.suppress(AssertionError):  # raised when nothing was unscaled this step
                scaler.update()  # closes this step's unscale_; the inf/NaN it found lowers the scale
        optimizer.zero_grad(set_to_none=True)

    @property
    def loss_scale(self) -> float | None:
        """fp16's current loss scale (None without loss scaling): it halves at each overflow."""
        scaler = self.scaler if self.manual else getattr(self.accelerator, "scaler", None)
        return float(scaler.get_scale()) if scaler is not None else None

    def state_dict(self) -> dict:
        return {"scaler": self.scaler.state_dict() if self.scaler else None, "skipped_steps": self.skipped_steps}

    def load_state_dict(self, state: dict) -> None:
        if self.scaler is not None and state.get("scaler"):
            self.scaler.load_state_dict(state["scaler"])
        self.skipped_steps = state.get("skipped_steps", 0)


# --- HF Trainer users: the user's Accelerate configuration, when --precision is left to auto

#: Accelerate's mixed-precision names -> leantrain's
_FROM_ACCELERATE = {"no": "fp32", "bf16": "bf16", "fp16": "fp16"}


def accelerate_precision(environ=None, config_file: str | None = None) -> tuple[str, str] | None:
    """The precision the user's Accelerate setup asks for, and where it says so; None when it says nothing.

    `accelerate launch --mixed_precision X` (or its config file, which `accelerate launch` reads) reaches a process
    as ACCELERATE_MIXED_PRECISION; a plain `leantrain train` reads the config file (`accelerate config`) itself.
    `accelerate launch` sets 'no' when nothing is configured, so 'no' from the environment alone is not taken as a
    choice; neither is the 'no' leantrain's own launcher passes to the processes it starts.
    """
    import os

    from leantrain.errors import ConfigError

    env = os.environ if environ is None else environ
    from_file = _config_file_precision(config_file)
    launched_by_leantrain = "LEANTRAIN_LAUNCHED" in env
    value = env.get("ACCELERATE_MIXED_PRECISION")
    found = None
    if value and not launched_by_leantrain and (value != "no" or (from_file and from_file[0] == "no")):
        found = (value, f"ACCELERATE_MIXED_PRECISION={value} (accelerate launch --mixed_precision or its config)")
    elif from_file is not None:
        found = (from_file[0], f"mixed_precision: {from_file[0]} in {from_file[1]} (accelerate config)")
    if found is None:
        return None
    mode, source = found
    if mode.lower() not in _FROM_ACCELERATE:
        raise ConfigError(
            f"{source}: leantrain runs fp32, bf16 or fp16, not {mode}; pass --precision bf16 (or fp16, fp32)"
        )
    return _FROM_ACCELERATE[mode.lower()], f"from {source}"


def _config_file_precision(path: str | None) -> tuple[str, str] | None:
    """mixed_precision from Accelerate's config file (default: the one `accelerate config` writes), if set."""
    import os
    from pathlib import Path

    import yaml

    if path is None:
        home = os.environ.get("HF_HOME") or os.path.join(os.path.expanduser("~"), ".cache", "huggingface")
        path = os.path.join(home, "accelerate", "default_config.yaml")
    file = Path(path)
    if not file.is_file():
        return None
    try:
        text = file.read_text()
        values = yaml.safe_load(text)  # YAML, or JSON (which YAML reads too)
    except (OSError, yaml.YAMLError):
        return None  # Accelerate itself reports a broken config file
    mode = values.get("mixed_precision") if isinstance(values, dict) else None
    return (str(mode), str(file)) if mode else None
