"""Peak memory, measured: CUDA's allocator counters, or the process's resident set on CPU.

On CPU the kernel's high-water mark (VmHWM) is reset by writing 5 to /proc/self/clear_refs, so
`start()` can open a fresh window after the model is loaded; the peak is then reported over the
resident size at that moment. Noise: the allocator keeps freed pages, so a window starts with some
slack already resident (a few MB to tens of MB); compare configurations by ratios within one benchmark.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import torch


def _status_kib(field: str) -> int | None:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except OSError:
        pass
    return None


class MemoryMeter:
    def __init__(self, device: torch.device):
        self.device = device
        self.baseline = 0

    def start(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self.baseline = torch.cuda.memory_allocated(self.device)
            return
        with contextlib.suppress(OSError):  # not Linux, or not allowed: the peak then covers the whole process
            Path("/proc/self/clear_refs").write_text("5")
        self.baseline = (_status_kib("VmRSS") or 0) * 1024

    def report(self) -> dict[str, int | None]:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            peak = torch.cuda.max_memory_allocated(self.device)
            return {
                "peak_memory_bytes": peak,
                "peak_memory_over_baseline_bytes": peak - self.baseline,
                "peak_reserved_bytes": torch.cuda.max_memory_reserved(self.device),
            }
        hwm = _status_kib("VmHWM")
        rss_peak = hwm * 1024 if hwm is not None else None
        return {
            "peak_memory_bytes": rss_peak,
            "peak_memory_over_baseline_bytes": rss_peak - self.baseline if rss_peak is not None else None,
        }


def tensor_bytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)
