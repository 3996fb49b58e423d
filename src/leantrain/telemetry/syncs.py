"""Counting the host's reads of device values (host syncs): what makes a GPU wait for the CPU.

`HostSyncs` is a `TorchDispatchMode` that counts, while it is entered:
- `aten._local_scalar_dense` (`float(t)`, `int(t)`, `bool(t)`, `t.item()`, `math.isfinite(t)`),
- copies from an accelerator to the CPU (`t.cpu()`, `t.to("cpu")`) and blocking copies onto it from pageable memory,
- `Tensor.tolist()` and `Tensor.numpy()`, which read memory without dispatching an operator on CPU,
- `torch.cuda.synchronize()`.

A read made inside transformers' model code is counted apart, as `model_<kind>`: eager transformers reads a padded
batch's attention mask to choose its SDPA kernel (`masking_utils._ignore_bidirectional_mask_sdpa`); `--compile`
traces that read away.

On a CPU every tensor is a host tensor, so every read counts: the loop is held to what it would do on a GPU. The
data loader's own work (collating on the CPU, before the batch is placed) is left out: reading a CPU tensor there
costs the device nothing.
"""

from __future__ import annotations

import contextlib
import functools
import os
import sys
import threading
from collections import Counter
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

_COPIES = {torch.ops.aten._to_copy.default, torch.ops.aten.copy_.default}


def _in_model_library() -> bool:
    """Whether the read comes from inside transformers' model code (eager transformers reads the padding mask to
    choose an attention kernel, `masking_utils`; compiled, the read is traced away)."""
    frame = sys._getframe(2)
    while frame is not None:
        if f"{os.sep}transformers{os.sep}" in frame.f_code.co_filename:
            return True
        frame = frame.f_back  # type: ignore[assignment]
    return False


class HostSyncs(TorchDispatchMode):
    """`with HostSyncs() as syncs: ...`; `syncs.total` and `syncs.kinds` (a Counter by kind) say what was read."""

    def __init__(self) -> None:
        super().__init__()
        self.kinds: Counter[str] = Counter()
        self._paused = threading.local()
        self._undo: list[tuple[Any, str, Any]] = []

    @property
    def total(self) -> int:
        return sum(self.kinds.values())

    @property
    def paused(self) -> bool:
        return getattr(self._paused, "depth", 0) > 0

    @contextlib.contextmanager
    def pause(self):
        self._paused.depth = getattr(self._paused, "depth", 0) + 1
        try:
            yield
        finally:
            self._paused.depth -= 1

    def count(self, kind: str) -> None:
        if not self.paused:
            self.kinds[f"model_{kind}" if _in_model_library() else kind] += 1

    @property
    def ours(self) -> int:
        """Reads made by leantrain's own code (not inside the model's library)."""
        return sum(n for k, n in self.kinds.items() if not k.startswith("model_"))

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.ops.aten._local_scalar_dense.default:
            self.count("item")
        elif func in _COPIES:
            self._copy(func, args, kwargs)
        return func(*args, **kwargs)

    def _copy(self, func, args, kwargs) -> None:
        if func is torch.ops.aten.copy_.default:
            dst, src = args[0].device, args[1].device
            non_blocking = bool(args[2]) if len(args) > 2 else bool(kwargs.get("non_blocking"))
        else:
            src, dst = args[0].device, kwargs.get("device") or args[0].device
            non_blocking = bool(kwargs.get("non_blocking"))
        dst = torch.device(dst)
        if src.type != "cpu" and dst.type == "cpu":
            self.count("device_to_host")
        elif src.type == "cpu" and dst.type != "cpu" and not non_blocking:
            self.count("blocking_host_to_device")

    def __enter__(self):
        self._patch(torch.Tensor, "tolist", "tolist")
        self._patch(torch.Tensor, "numpy", "numpy")
        self._patch(torch.cuda, "synchronize", "synchronize")
        loader_iter = torch.utils.data.dataloader._BaseDataLoaderIter
        real_next = loader_iter.__next__

        @functools.wraps(real_next)
        def next_unseen(it):
            with self.pause():
                return real_next(it)

        self._undo.append((loader_iter, "__next__", real_next))
        loader_iter.__next__ = next_unseen  # type: ignore[method-assign]
        return super().__enter__()

    def __exit__(self, *exc):
        try:
            return super().__exit__(*exc)
        finally:
            for owner, name, real in reversed(self._undo):
                setattr(owner, name, real)
            self._undo.clear()

    def _patch(self, owner: Any, name: str, kind: str) -> None:
        real = getattr(owner, name)

        @functools.wraps(real)
        def counted(*args, **kwargs):
            self.count(kind)
            with self.pause():  # tolist's own reads are this one read
                return real(*args, **kwargs)

        self._undo.append((owner, name, real))
        setattr(owner, name, counted)
