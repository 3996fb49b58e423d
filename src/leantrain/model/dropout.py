"""Dropout on a CPU drawn from 16 random bits a number.

torch's dropout on a CPU draws each number's keep-or-drop through `bernoulli_`, which runs the generator one number at
a time and converts each draw to a float: about 5 ns a number on 2 cores, a quarter of a MiniLM step in bf16
(`benchmarks/results/dropout.md`). Here one 64-bit draw of the same generator (`random_` over the whole int64 range)
decides four numbers, 16 bits each, compared with p rounded to 1/65,536; the kept numbers are scaled by the exact
inverse of the kept fraction, so each output's expectation is its input, as with torch's. A dropout and its backward
cost about 2.5x less. An fp32 input keeps a bool mask for backward, not torch's float one: 15-20% fewer bytes kept
for backward by a MiniLM with eager attention (`benchmarks/results/dropout_mask.md`).

The draws come from torch's CPU generator, in order: a seed gives the same masks, a checkpoint's saved generator
resumes them bitwise, activation checkpointing's replay (which restores the generator) draws them again, and the
NaN guard's restore puts them back. They are not torch's draws: a run with this dropout is not bitwise one with
torch's (`--no-fast-dropout`), only alike in distribution. Within `fast_dropout()` every `torch.nn.functional.dropout`
call of CPU tensors takes this path (`nn.Dropout` modules and transformers' eager attention go through it); SDPA's
dropout inside its kernel does not, which is why `--attention auto` picks eager attention for such a model on a CPU.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from typing import Any

import torch

#: the resolution of p: each number is kept when its 16 random bits are at least p x 65,536 (rounded)
LEVELS = 1 << 16
_INT64 = (-(1 << 63), (1 << 63) - 1)


def dropout(input: torch.Tensor, p: float = 0.5, training: bool = True, inplace: bool = False) -> torch.Tensor:
    """`torch.nn.functional.dropout`'s contract (zero each number with probability p, scale the rest by the inverse
    of the kept fraction) with 16-bit draws on a CPU; anything else (another device, p of 0 or 1, not training)
    goes to torch's own."""
    if not training or input.device.type != "cpu" or not 0.0 < p < 1.0 or not input.is_floating_point():
        return _TORCH_DROPOUT(input, p, training, inplace)
    dropped = round(p * LEVELS)
    if dropped in (0, LEVELS):  # p within 1/131,072 of 0 or 1: torch's, exactly
        return _TORCH_DROPOUT(input, p, training, inplace)
    n = input.numel()
    bits = torch.empty((n + 3) // 4, dtype=torch.int64).random_(*_INT64).view(torch.int16)[:n].view(input.shape)
    scale = LEVELS / (LEVELS - dropped)
    if input.dtype == torch.float32:
        # scaled, then zeroed where dropped: autograd keeps a bool mask (1 byte a number) where a product with a float
        # mask keeps the float (4), and the values are that product's. A 16-bit input keeps the product: its mask is
        # 2 bytes, and the bool-masked operators, which a CPU runs unvectorized, would cost it time
        drop = bits < dropped - LEVELS // 2
        return input.mul_(scale).masked_fill_(drop, 0.0) if inplace else (input * scale).masked_fill_(drop, 0.0)
    keep = (bits >= dropped - LEVELS // 2).to(input.dtype).mul_(scale)
    return input.mul_(keep) if inplace else input * keep


_TORCH_DROPOUT = torch.nn.functional.dropout


def applies(cfg: Any, device_type: str) -> bool:
    """Whether a run of `cfg` on `device_type` draws its dropout here: --fast-dropout, a CPU, an eager model (a
    compiled graph traces torch's own)."""
    return bool(getattr(cfg, "fast_dropout", False)) and device_type == "cpu" and not getattr(cfg, "compile", False)


@contextlib.contextmanager
def fast_dropout(on: bool = True) -> Iterator[None]:
    """Within: `torch.nn.functional.dropout` of CPU tensors draws 16 bits a number (`dropout`); `on` False: torch's."""
    if not on:
        yield
        return
    functional = torch.nn.functional
    own = functional.dropout
    functional.dropout = dropout
    try:
        yield
    finally:
        functional.dropout = own


#: what transformers' models call a dropout probability, in their configs and as their modules' float attributes
_RATE_NAME = re.compile(r"(^|_)(dropout|pdrop)(_prob|_rate|_p)?$")


def set_rate(model: Any, p: float) -> str:
    """Set every dropout of `model` to probability `p` (--dropout): its dropout modules, the float rates that
    transformers' attention modules keep (Llama's `attention_dropout`), and its config's rates (saved with the model,
    so its config.json says how it trained). Returns what it did, for the log."""
    config = getattr(model, "config", None)
    rates = vars(config).items() if config is not None else ()
    own = {k: v for k, v in rates if _RATE_NAME.search(k) and isinstance(v, (int, float))}
    changed = set_module_rates(model, p)
    set_config_rates(config, p)
    was = ", ".join(f"{k} {v:g}" for k, v in own.items()) or "none in its config"
    return f"dropout: {p:g} in {changed} places (--dropout {p:g}; the model's own: {was})"


def set_module_rates(model: torch.nn.Module, p: float) -> int:
    """Every dropout `model` runs at probability `p`: its dropout modules and the float rates that transformers'
    attention modules read at forward time (Llama's `attention_dropout`); its config is left as it is. Returns how
    many it set."""
    changed = 0
    for module in model.modules():
        if isinstance(module, torch.nn.modules.dropout._DropoutNd):
            module.p = p
            changed += 1
            continue
        for name, value in vars(module).items():
            if _RATE_NAME.search(name) and isinstance(value, float):
                setattr(module, name, p)
                changed += 1
    return changed


def set_config_rates(config: Any, p: float, seen: set[int] | None = None) -> None:
    """The config's dropout rates, and those of the configs it holds (a vision-language model's text_config)."""
    seen = set() if seen is None else seen
    if config is None or id(config) in seen or not hasattr(config, "to_dict"):
        return
    seen.add(id(config))
    for name, value in list(vars(config).items()):
        rate = value is None or (isinstance(value, (int, float)) and not isinstance(value, bool))
        if _RATE_NAME.search(name) and rate:
            setattr(config, name, p)
        elif hasattr(value, "to_dict"):
            set_config_rates(value, p, seen)
