"""The device's peak FLOP/s, the denominator of MFU.

GPUs: dense (no 2:4 sparsity) tensor-core figures from the vendor's data sheets, matched on
`torch.cuda.get_device_name()`. CPUs, and GPUs not in the table: measured once by a GEMM probe
(a square matmul repeated for about half a second; the best repetition counts) in the run's math
dtype, and cached in `~/.cache/leantrain/peak.json` (`$LEANTRAIN_CACHE` moves it) keyed by device
model, thread count, torch version and dtype. The first few runs each probe and the cache keeps the
best figure, so one probe on a busy machine cannot deflate the peak (and inflate MFU) for good; a run
that reaches 90% of the cached peak (`IMPLAUSIBLE_MFU`) sends it back to probing. A measured peak is what
this device reaches on a large GEMM, so MFU against it reads higher than against a data-sheet figure; the
report says which.

`LEANTRAIN_PEAK_TFLOPS=<number>` overrides both (for a device the table gets wrong).
"""

from __future__ import annotations

import json
import os
import re
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

T = 1e12

# (pattern on the upper-cased device name, name, {math dtype: dense TFLOP/s}); first match wins, so
# the more specific names come first. Figures: NVIDIA data sheets (sparse figures halved to dense);
# GeForce parts use the fp32-accumulate tensor rate, which PyTorch's matmuls use.
GPU_PEAKS: list[tuple[str, str, dict[str, float]]] = [
    (r"H200.*NVL", "H200 NVL", {"fp32": 60.0, "tf32": 417.5, "bf16": 835.5, "fp16": 835.5}),
    (r"H200", "H200 SXM", {"fp32": 67.0, "tf32": 494.7, "bf16": 989.4, "fp16": 989.4}),
    (r"H100.*NVL", "H100 NVL", {"fp32": 60.0, "tf32": 417.5, "bf16": 835.5, "fp16": 835.5}),
    (r"H100.*PCIE", "H100 PCIe", {"fp32": 51.0, "tf32": 378.0, "bf16": 756.0, "fp16": 756.0}),
    (r"H100", "H100 SXM", {"fp32": 67.0, "tf32": 494.7, "bf16": 989.4, "fp16": 989.4}),
    (r"A100", "A100", {"fp32": 19.5, "tf32": 156.0, "bf16": 312.0, "fp16": 312.0}),
    (r"L40S", "L40S", {"fp32": 91.6, "tf32": 183.0, "bf16": 362.0, "fp16": 362.0}),
    (r"\bL4\b", "L4", {"fp32": 30.3, "tf32": 60.0, "bf16": 121.0, "fp16": 121.0}),
    (r"\bA40\b", "A40", {"fp32": 37.4, "tf32": 74.8, "bf16": 149.7, "fp16": 149.7}),
    # NVIDIA publishes no A10G sheet (an AWS part, GA102): third-party figures differ; approximate.
    (r"A10G", "A10G (approximate: no NVIDIA data sheet)", {"fp32": 31.2, "tf32": 35.0, "bf16": 70.0, "fp16": 70.0}),
    (r"\bA10\b", "A10", {"fp32": 31.2, "tf32": 62.5, "bf16": 125.0, "fp16": 125.0}),
    (r"\bT4\b", "T4", {"fp32": 8.1, "fp16": 65.0}),  # no bf16 or tf32 tensor cores (Turing)
    (r"V100S", "V100S PCIe", {"fp32": 16.4, "fp16": 130.0}),
    (r"V100.*PCIE", "V100 PCIe", {"fp32": 14.0, "fp16": 112.0}),
    (r"V100", "V100 SXM2", {"fp32": 15.7, "fp16": 125.0}),
    (r"RTX 4090", "GeForce RTX 4090", {"fp32": 82.6, "tf32": 82.6, "bf16": 165.2, "fp16": 165.2}),
    (r"RTX 3090 TI", "GeForce RTX 3090 Ti", {"fp32": 40.0, "tf32": 40.0, "bf16": 80.0, "fp16": 80.0}),
    (r"RTX 3090", "GeForce RTX 3090", {"fp32": 35.6, "tf32": 35.6, "bf16": 71.0, "fp16": 71.0}),
]

PROBE_SIZE = {"cpu": 2048, "cuda": 8192}
PROBE_SECONDS = 0.5
#: the probe's size for a dtype a CPU has no instructions for (bf16 without AVX-512 BF16 or AMX, fp16 without
#: AVX-512 FP16 or AMX-FP16): emulated at 0.1-0.3 GFLOP/s whatever the size, a 2048² probe took 3-12 minutes
EMULATED_PROBE_SIZE = 256


def probe_size(device_type: str, dtype: str) -> int:
    """The side of the square GEMM that probes `dtype` on this kind of device."""
    if device_type == "cpu" and dtype in ("bf16", "fp16"):
        from leantrain.parallel import cpu_flags

        native = {"bf16": ("avx512_bf16", "amx_bf16"), "fp16": ("avx512_fp16", "amx_fp16")}[dtype]
        if not cpu_flags() & set(native):
            return EMULATED_PROBE_SIZE
    return PROBE_SIZE.get(device_type, 2048)


@dataclass(frozen=True)
class Peak:
    flops_per_second: float
    dtype: str  # the math dtype the figure is for: fp32, tf32, bf16, fp16
    device: str  # the device's name
    source: str  # where the figure comes from, for the report
    cache_key: str | None = None  # set for probe figures: the entry `distrust()` marks

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def gpu_peak(device_name: str, dtype: str) -> Peak | None:
    """The data-sheet figure for this GPU and dtype, or None when the table does not know it."""
    upper = device_name.upper()
    for pattern, name, figures in GPU_PEAKS:
        if re.search(pattern, upper):
            if dtype not in figures:
                return None
            return Peak(figures[dtype] * T, dtype, device_name, f"data sheet: {name}, {dtype} dense")
    return None


def math_dtype(device_type: str, precision: str) -> str:
    """The dtype matmuls run in: the autocast dtype, or for fp32 on CUDA tf32 when torch allows it."""
    if precision in ("bf16", "fp16"):
        return precision
    if device_type == "cuda":
        import torch

        if torch.backends.cuda.matmul.allow_tf32 or torch.get_float32_matmul_precision() != "highest":
            return "tf32"
    return "fp32"


def _torch_dtype(dtype: str):
    import torch

    return {"fp32": torch.float32, "tf32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[dtype]


def measure_peak(
    dtype: str = "fp32", device: str = "cpu", size: int | None = None, seconds: float = PROBE_SECONDS
) -> float:
    """FLOP/s of the fastest of repeated (size x size) @ (size x size) matmuls over about `seconds`."""
    import torch

    size = size or probe_size(torch.device(device).type, dtype)
    dev = torch.device(device)
    sync = (lambda: torch.cuda.synchronize(dev)) if dev.type == "cuda" else (lambda: None)
    gen = torch.Generator(device="cpu").manual_seed(0)
    a = torch.randn(size, size, generator=gen).to(device=dev, dtype=_torch_dtype(dtype))
    b = torch.randn(size, size, generator=gen).to(device=dev, dtype=_torch_dtype(dtype))
    out = torch.empty_like(a)
    inner = 10 if dev.type == "cuda" else 1  # GPU matmuls are too quick to time one at a time
    torch.matmul(a, b, out=out)  # warm-up: thread pool, kernels, first-touch pages
    sync()
    best, reps, started = 0.0, 0, time.perf_counter()
    while reps < 3 or time.perf_counter() - started < seconds:
        t0 = time.perf_counter()
        for _ in range(inner):
            torch.matmul(a, b, out=out)
        sync()
        elapsed = time.perf_counter() - t0
        if elapsed > 0:
            best = max(best, inner * 2 * size**3 / elapsed)
        reps += 1
    return best


def cache_file() -> Path:
    from leantrain.paths import leantrain_cache

    return leantrain_cache() / "peak.json"


def _cache_key(device_name: str, threads: int, dtype: str) -> str:
    import torch

    return f"{device_name} | {threads} threads | torch {torch.__version__} | {dtype}"


def read_cache(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def write_cache(path: Path, key: str, entry: dict[str, Any]) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        data = read_cache(path)
        data[key] = entry
        from leantrain.paths import written_atomically

        with written_atomically(path, "w") as f:
            f.write(json.dumps(data, indent=2, sort_keys=True) + "\n")
    except OSError:
        pass  # a read-only home still gets a figure, measured again next time


#: a CPU figure is probed afresh by this many runs (the best kept) before the cache is trusted alone:
#: one probe taken while a neighbour was busy would otherwise deflate the peak, and inflate MFU, forever
PROBES_TO_TRUST = 3


def measured_peak(dtype: str, device: str = "cpu", device_name: str | None = None, refresh: bool = False) -> Peak:
    """The best probe figure for this device, thread count, torch version and dtype.

    The first `PROBES_TO_TRUST` runs each probe (about half a second) and the cache keeps the best
    figure; later runs read the cache. `refresh=True` probes again, and `distrust()` (called when a run
    beats the cached peak) sends the next runs back to probing.
    """
    import torch

    if device_name is None:
        if torch.device(device).type == "cuda":
            device_name = torch.cuda.get_device_name(torch.device(device))
        else:
            from leantrain.parallel import cpu_name

            device_name = cpu_name()
    threads = torch.get_num_threads()
    # a CPU's name ('AMD EPYC') covers generations whose GEMMs differ 2-5x; a home shared between them keeps both
    key = _cache_key(_cpu_model() if torch.device(device).type == "cpu" else device_name, threads, dtype)
    path = cache_file()
    size = probe_size(torch.device(device).type, dtype)
    entry = read_cache(path).get(key)
    if not isinstance(entry, dict) or entry.get("size") != size or float(entry.get("flops_per_second", 0)) <= 0:
        entry = None
    probes = int(entry.get("probes", PROBES_TO_TRUST)) if entry else 0  # entries from before the count: trusted
    if entry is not None and not refresh and probes >= PROBES_TO_TRUST:
        return Peak(
            float(entry["flops_per_second"]),
            dtype,
            device_name,
            f"measured: best of {probes} probes, {size}² {dtype} GEMM, {threads} threads, "
            f"{entry.get('measured', '?')} (cached in {path})",
            key,
        )
    flops = measure_peak(dtype, device, size, seconds=PROBE_SECONDS)
    stamp = time.strftime("%Y-%m-%d %H:%M")
    if entry is not None and float(entry["flops_per_second"]) >= flops:
        # a peak is the best the device has shown: a probe slowed by a busy neighbour does not lower it
        flops, stamp = float(entry["flops_per_second"]), entry.get("measured", stamp)
    probes += 1
    write_cache(path, key, {"flops_per_second": flops, "size": size, "measured": stamp, "probes": probes})
    return Peak(
        flops,
        dtype,
        device_name,
        f"measured: best of {probes} probes, {size}² {dtype} GEMM, {threads} threads, {stamp}",
        key,
    )


def _cpu_model() -> str:
    from leantrain.parallel import cpu_model

    return cpu_model()


#: the share of a measured peak beyond which a whole training step's FLOP/s say the probes ran slow: a step's
#: matmuls are smaller than the probe's and it does more than matmuls (MiniLM's default job reads 35-45% of a
#: quiet probe; 95% of one taken while neighbours were busy, 2.2x too low)
IMPLAUSIBLE_MFU = 0.9


def distrust(found: Peak, achieved_flops_per_second: float) -> bool:
    """Send a measured peak back to probing when a run came implausibly close to it or beat it (MFU above
    `IMPLAUSIBLE_MFU`).

    Returns True when the cached figure was marked; the next runs probe again and keep the best.
    """
    if found.cache_key is None or achieved_flops_per_second <= IMPLAUSIBLE_MFU * found.flops_per_second:
        return False
    path = cache_file()
    entry = read_cache(path).get(found.cache_key)
    if not isinstance(entry, dict):
        return False
    write_cache(path, found.cache_key, {**entry, "probes": 0})
    return True


def device_peak(device: Any = "cpu", precision: str = "fp32") -> Peak:
    """Peak FLOP/s of `device` (a torch.device or string) for a run in `precision` (fp32/bf16/fp16)."""
    import torch

    dev = torch.device(device)
    dtype = math_dtype(dev.type, precision)
    override = os.environ.get("LEANTRAIN_PEAK_TFLOPS")
    if override:
        name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu"
        return Peak(float(override) * T, dtype, name, "LEANTRAIN_PEAK_TFLOPS")
    if dev.type == "cuda":
        name = torch.cuda.get_device_name(dev)
        found = gpu_peak(name, dtype)
        if found is not None:
            return found
        return measured_peak(dtype, str(dev), name)
    return measured_peak(dtype, "cpu")
