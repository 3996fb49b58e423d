"""Counting autocast's casts of the trained weights: a generation or an evaluation under mixed precision should cast
each weight once, not once per forward (autocast keeps its casts only while the outermost autocast lasts)."""

from __future__ import annotations

from collections import Counter

import torch
from torch.utils._python_dispatch import TorchDispatchMode


class WeightCasts(TorchDispatchMode):
    """Within it, `counts` holds how often each fp32 parameter of `model` was cast to a half type, by storage (the
    parameters are read when it is entered)."""

    def __init__(self, model: torch.nn.Module | None = None):
        super().__init__()
        self.model = model
        self.weights: set[int] = set()
        self.counts: Counter[int] = Counter()

    def __enter__(self):
        self.weights = {p.data_ptr() for p in self.model.parameters()} if self.model is not None else set()
        return super().__enter__()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        # a cast reaches this mode as `_to_copy`, or as `to` when it is not decomposed (under inference_mode)
        if func.overloadpacket in (torch.ops.aten._to_copy, torch.ops.aten.to):
            source = args[0]
            dtypes = [kwargs.get("dtype"), *(a for a in args[1:] if isinstance(a, torch.dtype))]
            half = any(d in (torch.bfloat16, torch.float16) for d in dtypes)
            if half and source.dtype == torch.float32 and source.data_ptr() in self.weights:
                self.counts[source.data_ptr()] += 1
        return func(*args, **kwargs)

    @property
    def most(self) -> int:
        """The most casts of any one weight (0: none was cast)."""
        return max(self.counts.values(), default=0)


def casts_in(monkeypatch, owner, name: str, model_at: int = 0) -> list[int]:
    """Patch `owner.name` so that each call counts the casts of the weights of the model it is given (its positional
    argument `model_at`); returns the list each call's most casts of any one weight go to."""
    original = getattr(owner, name)
    most: list[int] = []

    def counted(*args, **kwargs):
        with WeightCasts(args[model_at]) as casts:
            out = original(*args, **kwargs)
        most.append(casts.most)
        return out

    monkeypatch.setattr(owner, name, counted)
    return most
