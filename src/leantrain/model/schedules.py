"""Learning-rate schedules: transformers' `get_scheduler` names, with the three most used computed here."""

from __future__ import annotations

import functools
import math

import torch

from leantrain.errors import ConfigError


def build_scheduler(
    optimizer: torch.optim.Optimizer,
    name: str,
    total_steps: int,
    warmup_ratio: float,
    warmup_steps: float | None = None,
    kwargs: str | None = None,
):
    """transformers' schedule `name` over `total_steps`; the warm-up from `warmup_steps` when given (steps, or a
    ratio below 1 as transformers 5 has it), else `warmup_ratio`; `kwargs`: --scheduler-kwargs (JSON)."""
    import json

    hf_name = "constant_with_warmup" if name == "constant" else name  # leantrain's constant keeps the warm-up
    warmup = warmup_length(total_steps, warmup_ratio, warmup_steps)
    specific = json.loads(kwargs) if kwargs else None
    if hf_name in _COMMON and not specific:
        return torch.optim.lr_scheduler.LambdaLR(
            optimizer, functools.partial(_COMMON[hf_name], warmup=warmup, total=max(total_steps, 1))
        )
    from transformers import get_scheduler

    try:
        scheduler = get_scheduler(
            hf_name,
            optimizer,
            num_warmup_steps=warmup,
            num_training_steps=max(total_steps, 1),
            scheduler_specific_kwargs=specific,
        )
    except (TypeError, ValueError) as exc:  # an argument the schedule does not take, or a bad value
        first = str(exc).strip().splitlines()[0][:200]
        raise ConfigError(f"--scheduler {name} --scheduler-kwargs {kwargs}: {first}") from None
    if specific:
        _check_every_step(scheduler, f"--scheduler {name} --scheduler-kwargs {kwargs}", max(total_steps, 1))
    return scheduler


def warmup_length(total_steps: int, warmup_ratio: float, warmup_steps: float | None = None) -> int:
    """The warm-up's optimizer steps: `warmup_steps` (steps, or a share below 1), else `warmup_ratio` of the run."""
    if warmup_steps is not None:
        return int(warmup_steps) if warmup_steps >= 1 else round(warmup_steps * total_steps)
    return round(warmup_ratio * total_steps)


def resize(scheduler, name: str, total_steps: int, warmup: int, kwargs: str | None = None) -> None:
    """Make `scheduler` (built by `build_scheduler`, or Accelerate's wrapper of it) the schedule `name` over
    `total_steps` with a warm-up of `warmup` steps, from its next step on: its position is kept, and so is the rate it
    set at this step, which every schedule gives whatever its length up to the end of the warm-up."""
    inner = getattr(scheduler, "scheduler", scheduler)
    scratch = torch.optim.SGD([torch.zeros(1)], lr=1.0)  # its lambdas hold the length; they take no optimizer state
    template = build_scheduler(scratch, name, total_steps, 0.0, warmup, kwargs)
    inner.lr_lambdas = [template.lr_lambdas[0]] * len(inner.lr_lambdas)


def warp(scheduler, at: int, end: int, new_end: int) -> None:
    """Stretch or squeeze the rest of `scheduler`'s schedule after step `at` so that what it reached at step `end`
    it reaches at `new_end` (--max-time's re-sizing): the rate up to `at` is kept, the shape after it too."""
    inner = getattr(scheduler, "scheduler", scheduler)
    scale = (end - at) / max(1, new_end - at)

    def stretched(rate):
        # a plain function: LambdaLR saves a callable object's attributes in its state, a function's not at all
        def warped(step: float) -> float:
            return rate(step) if step <= at else rate(at + (step - at) * scale)

        return warped

    inner.lr_lambdas = [stretched(rate) for rate in inner.lr_lambdas]


def _check_every_step(scheduler, flags: str, total: int) -> None:
    """The schedule's rate at every step of the run, now: a value its kwargs allow can fail later (a division by
    zero at the last step, after the training) or go negative (the run would climb the loss, and say nothing)."""
    lambdas = getattr(scheduler, "lr_lambdas", None) or []
    for base, rate in zip(scheduler.base_lrs, lambdas, strict=False):
        for step in range(total + 1):  # the last step() leaves the rate of step `total`
            try:
                value = base * rate(step)
            except (ArithmeticError, TypeError, ValueError) as exc:
                raise ConfigError(f"{flags}: fails at step {step} ({exc})") from None
            if not (math.isfinite(value) and value >= 0):
                raise ConfigError(
                    f"{flags}: the learning rate at step {step} would be {value:g}; a rate must be finite and not "
                    "negative: change the kwargs"
                )


# The three most used schedules, with transformers' formulas (tests/test_optim.py checks them step by step against
# get_scheduler): importing transformers.optimization loads peft, bitsandbytes and inductor through
# transformers.trainer_utils, several seconds of every run's start-up. The others come from transformers.
def _warming(step: int, warmup: int) -> float | None:
    return float(step) / float(max(1, warmup)) if step < warmup else None


def _linear(step: int, *, warmup: int, total: int) -> float:
    up = _warming(step, warmup)
    return up if up is not None else max(0.0, float(total - step) / float(max(1, total - warmup)))


def _cosine(step: int, *, warmup: int, total: int) -> float:
    up = _warming(step, warmup)
    if up is not None:
        return up
    progress = float(step - warmup) / float(max(1, total - warmup))
    return max(0.0, 0.5 * (1.0 + math.cos(math.pi * 0.5 * 2.0 * progress)))  # transformers' order: same floats


def _constant(step: int, *, warmup: int, total: int) -> float:
    up = _warming(step, warmup)
    return up if up is not None else 1.0


_COMMON = {"linear": _linear, "cosine": _cosine, "constant_with_warmup": _constant}
