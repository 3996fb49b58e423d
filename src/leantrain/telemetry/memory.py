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

    def start(self, resident=None) -> None:
        """Open the window: the baseline is what is resident now.

        `resident`: tensors to page in first. Weights loaded from a safetensors file are memory-mapped and
        stay on disk until first read, so without this the first step's peak would count them once more
        (85 MB for MiniLM) on top of the weights already counted apart."""
        if resident is not None and self.device.type != "cuda":
            with torch.no_grad():
                for t in resident:
                    t = t.to_local() if hasattr(t, "to_local") else t  # --shard fsdp: this process's shard
                    if t.device.type == "cpu" and t.numel():
                        t.view(-1)[:: max(1, 4096 // t.element_size())].sum()  # one read per 4 KiB page
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self.baseline = torch.cuda.memory_allocated(self.device)
            return
        with contextlib.suppress(OSError):  # not Linux, or not allowed: the peak then covers the whole process
            Path("/proc/self/clear_refs").write_text("5")
        self.baseline = (_status_kib("VmRSS") or 0) * 1024

    def reset_peak(self) -> None:
        """Open a new window for the peak, keeping the baseline (the OOM fallback after a re-cut).

        On CPU, freed heap pages go back to the kernel first: else the new window would start with the
        last step's garbage already resident."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            return
        release_free_memory()
        with contextlib.suppress(OSError):
            Path("/proc/self/clear_refs").write_text("5")

    def report(self) -> dict[str, int | None]:
        if self.device.type == "cuda":  # the allocator's books are the host's: no need to wait for the device
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


#: glibc's mallopt parameter M_MMAP_THRESHOLD, and the size from which allocations are mapped apart
_M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD_BYTES = 256 * 1024


def return_freed_memory() -> bool:
    """Make freed tensors go back to the kernel at once (glibc), so the resident size follows live memory.

    By default glibc raises its mmap threshold as large blocks are freed (up to 32 MiB), after which
    activations come from the heap and stay resident, fragmented, once freed: the peak RSS of a
    MiniLM step then runs 20-60% above its live tensors, by an amount that depends on the order of
    allocations (activation checkpointing and Adafactor's temporaries fare worst). A fixed threshold
    (the same as MALLOC_MMAP_THRESHOLD_=262144 in the environment) maps every tensor of 256 KiB or
    more apart and unmaps it when freed. leantrain does this when a memory budget is in force
    (--auto), which is what makes the budget predictable. Returns whether it took effect."""
    import ctypes

    try:
        return bool(ctypes.CDLL("libc.so.6").mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES))
    except (OSError, AttributeError):  # not glibc
        return False


#: glibc's initial M_MMAP_THRESHOLD, set again when a block that fixed it ends
GLIBC_DEFAULT_MMAP_THRESHOLD = 128 * 1024


@contextlib.contextmanager
def freed_memory_returned():
    """`return_freed_memory()` for the duration of a block (a run under a memory budget), then glibc's initial
    threshold again, so a program that called leantrain keeps its allocator as it was. (glibc cannot turn its
    dynamic threshold back on once set: the initial value is the closest restore there is.)"""
    took = return_freed_memory()
    try:
        yield took
    finally:
        if took:
            import ctypes

            ctypes.CDLL("libc.so.6").mallopt(_M_MMAP_THRESHOLD, GLIBC_DEFAULT_MMAP_THRESHOLD)


#: glibc's mallopt parameters M_TRIM_THRESHOLD and M_MMAP_MAX, and their initial values
_M_TRIM_THRESHOLD, _M_MMAP_MAX = -1, -4
GLIBC_DEFAULT_TRIM_THRESHOLD, GLIBC_DEFAULT_MMAP_MAX = 128 * 1024, 65536
#: LEANTRAIN_KEEP_FREED_MEMORY=0 leaves glibc's heap as it is in a run without a memory budget
KEEP_FREED_MEMORY_ENV = "LEANTRAIN_KEEP_FREED_MEMORY"


def malloc_set_by_environment() -> bool:
    """Whether the environment already tunes glibc's malloc (MALLOC_*_ variables or glibc.malloc tunables): the
    planner's probes and users who chose their own setting keep it."""
    import os

    return any(k.startswith("MALLOC_") for k in os.environ) or "glibc.malloc." in os.environ.get("GLIBC_TUNABLES", "")


@contextlib.contextmanager
def freed_memory_kept():
    """For the duration of a block (a training run without a memory budget, on CPU), glibc keeps what is freed
    for the next allocation: nothing is mapped apart and the heap is never trimmed, so a block that a step
    allocates again and again (activations, the head's logits, zeroed gradients) reuses the pages of the step
    before instead of faulting fresh ones in (one fault per 4 KiB page: two thirds of a tiny-llama run's page
    faults, docs/performance.md). Afterwards glibc's initial settings come back and malloc_trim hands back what
    free heap it can (a free block inside the heap may stay). Off under LEANTRAIN_KEEP_FREED_MEMORY=0 or when the
    environment sets malloc's own tunables. Yields whether it took effect."""
    import ctypes
    import os

    libc, took = None, False
    if os.environ.get(KEEP_FREED_MEMORY_ENV, "1") != "0" and not malloc_set_by_environment():
        try:
            libc = ctypes.CDLL("libc.so.6")
            took = bool(libc.mallopt(_M_MMAP_MAX, 0)) & bool(libc.mallopt(_M_TRIM_THRESHOLD, 2**31 - 1))
        except (OSError, AttributeError):  # not glibc
            libc = None
    try:
        yield took
    finally:
        if libc is not None:  # glibc's own settings again, whichever of the two took
            libc.mallopt(_M_MMAP_MAX, GLIBC_DEFAULT_MMAP_MAX)
            libc.mallopt(_M_TRIM_THRESHOLD, GLIBC_DEFAULT_TRIM_THRESHOLD)
            libc.malloc_trim(0)


def release_free_memory() -> None:
    """Collect garbage and hand free heap pages back to the kernel (glibc's malloc_trim), so RSS tracks live memory."""
    import ctypes
    import gc

    gc.collect()
    with contextlib.suppress(OSError, AttributeError):  # not glibc
        ctypes.CDLL("libc.so.6").malloc_trim(0)


def tensor_bytes(tensors, float_bytes: int | None = None) -> int:
    """Bytes this process holds: a sharded tensor (a DTensor, --shard fsdp) counts its local shard. `float_bytes`:
    floating-point numbers counted at that size whatever their dtype (4: as saved in fp32)."""
    local = (t.to_local() if hasattr(t, "to_local") else t for t in tensors)
    return sum(t.numel() * (float_bytes if float_bytes and t.is_floating_point() else t.element_size()) for t in local)
