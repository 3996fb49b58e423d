"""Predict the relative throughput of one configuration: seconds per optimizer step, from FLOPs and a few factors.

    step seconds = accumulation x micro-step seconds + optimizer step seconds
    micro-step   = FLOPs(micro-batch) / (peak x utilisation x precision speed-up) x checkpointing cost
                   x (1 + small-batch inefficiency) + fixed per-micro-step overhead

FLOPs come from telemetry.flops (6 x parameters per token plus attention, per padded sequence), the
peak from telemetry.peak (data sheet on GPUs, a measured GEMM on CPUs). Only *ratios* between
configurations matter for ranking, so the utilisation and overhead constants below need not be exact;
the factors that decide the ranking are measured (benchmarks/results/bench_minilm_sst2.md, docs/measurements.md):

- bf16 on a CPU with AMX: GEMMs run 2.8x fp32 (docs/measurements.md: 720 against 260 GFLOP/s), the rest of the step not
  at all (a little slower: autocast's casts). The matmul share of an fp32 step grows with the width h as
  h / (h + 350): 0.52 for MiniLM (h 384), which gives its measured 1.4-1.5x end to end
  (bench_minilm_sst2.md: 1.51x; docs/measurements.md: 1.3-1.5x), and 0.15 for a 64-wide BERT, which bf16 does not speed
  up (measured 0.8-1.0x, benchmarks/results/planner_accuracy.md). On Ampere+ GPUs: about 2x end to end.
  Without fast bf16 (no AMX/AVX-512 BF16, pre-Ampere GPUs) it is emulated and slower. fp16 on CPUs
  with AVX-512 FP16 but no AMX-FP16 is no faster than fp32 (docs/measurements.md); without AVX-512 FP16 (AMD EPYC,
  AVX2-only CPUs) it is emulated, its GEMMs about 100x slower than fp32's (docs/techniques/mixed-precision.md).
- Activation checkpointing: one more forward per step; measured 0.62x throughput on CPU (the forward
  of a CPU step is relatively dearer than on GPU), 0.75x is the usual GPU figure.
- Optimizer steps per parameter (CPU, 22.7 M params): fused AdamW 25 ms, Adafactor 150 ms,
  bitsandbytes AdamW8bit 500 ms; on GPU the 8-bit step costs about what AdamW's does. Muon's orthogonalisation
  is counted in bf16 matmul FLOPs (`OptimizerEntry.hidden_flops`): it grows with each matrix's width.
- Smaller micro-batches use the device less well: a half-saturation of `half_tokens` tokens, and a fixed
  cost per micro-step (kernel launches and Python per layer).
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class DeviceSpeed:
    """What makes one configuration faster than another on a device; see the module docstring for sources."""

    #: "cpu" or "cuda"
    kind: str
    #: peak FLOP/s of fp32 matmuls (measured on CPU, data sheet on GPU)
    peak_fp32: float
    #: speed-up of each precision's matmuls over fp32 on this device (1.0 = no faster, < 1 slower)
    precision_speedup: dict[str, float]
    #: the matmuls' share of an fp32 step is width / (width + this): narrow models spend their time in
    #: elementwise work, embeddings and overheads, which low precision does not speed up (0: all matmul)
    matmul_half_width: float = 0.0
    #: how much slower the non-matmul rest of a step runs under a low precision (the casts autocast adds)
    low_precision_rest: float = 1.0
    #: share of the peak a well-fed training step reaches in fp32
    utilisation: float = 0.5
    #: throughput with activation checkpointing relative to without
    checkpointing_factor: float = 0.62
    #: optimizer step seconds per parameter
    optimizer_seconds_per_param: dict[str, float] = field(default_factory=dict)
    #: tokens per micro-batch at which the device runs at half its large-batch efficiency... beyond the
    #: linear part: efficiency = tokens / (tokens + half_tokens)
    half_tokens: float = 256.0
    #: fixed seconds per micro-step (launches, Python), per layer
    micro_step_overhead_per_layer: float = 0.001
    #: where the figures come from, for the plan's notes
    source: str = ""


def optimizer_seconds(kind: str) -> dict[str, float]:
    """Seconds per parameter of each registered optimizer's step on a "cpu" or "gpu" (the registry's figures)."""
    from leantrain.model.optimizers import OPTIMIZERS

    return {n: e.cpu_seconds_per_param if kind == "cpu" else e.gpu_seconds_per_param for n, e in OPTIMIZERS.items()}


def device_speed(device: str = "cpu", peak_fp32: float | None = None) -> DeviceSpeed:
    """The speed facts of this machine's `device` ("cpu" or "cuda")."""
    from leantrain.parallel import cpu_flags, precision_support

    if device == "cuda":
        return _gpu_speed(peak_fp32)
    support = precision_support("cpu")
    if peak_fp32 is None:
        from leantrain.telemetry.peak import device_peak

        peak_fp32 = device_peak("cpu", "fp32").flops_per_second
    speed = {
        # matmuls alone: AMX-BF16 2.8x fp32 (docs/measurements.md); emulated bf16 is far slower than fp32
        "fp32": 1.0,
        "bf16": 2.8 if support["bf16"].fast else 0.5,
        # fp16 fast only with AMX-FP16; with AVX-512 FP16 about fp32's speed, without it emulated (0.01x measured)
        "fp16": 2.8 if support["fp16"].fast else 0.9 if "avx512_fp16" in cpu_flags() else 0.01,
    }
    return DeviceSpeed(
        "cpu",
        peak_fp32,
        speed,
        utilisation=0.55,
        matmul_half_width=350.0,
        low_precision_rest=1.15,
        checkpointing_factor=0.62,
        optimizer_seconds_per_param=optimizer_seconds("cpu"),
        half_tokens=256.0,
        micro_step_overhead_per_layer=0.001,
        source=f"CPU; bf16: {support['bf16'].why}; fp16: {support['fp16'].why}",
    )


def _gpu_speed(peak_fp32: float | None) -> DeviceSpeed:
    """This machine's GPU, or, planning for a GPU from a machine without one, an A100-like device."""
    import torch

    from leantrain.parallel import PrecisionSupport, precision_support

    if torch.cuda.is_available():
        support = precision_support("cuda")
        if peak_fp32 is None:
            from leantrain.telemetry.peak import device_peak

            peak_fp32 = device_peak("cuda", "fp32").flops_per_second
        name = torch.cuda.get_device_name(0)
    else:
        assumed = PrecisionSupport(True, True, "assumed Ampere")
        support = {"bf16": assumed, "fp16": assumed}
        peak_fp32 = peak_fp32 or 156e12  # A100 tf32
        name = "a CUDA GPU (none here: A100-like figures assumed)"
    speed = {"fp32": 1.0, "bf16": 2.0 if support["bf16"].fast else 0.8, "fp16": 2.0 if support["fp16"].fast else 0.8}
    return DeviceSpeed(
        "cuda",
        peak_fp32,
        speed,
        utilisation=0.4,
        checkpointing_factor=0.75,
        optimizer_seconds_per_param=optimizer_seconds("gpu"),
        half_tokens=4096.0,
        micro_step_overhead_per_layer=0.0005,
        source=f"{name}; bf16 {support['bf16'].why}",
    )


def step_seconds(
    speed: DeviceSpeed,
    flops_per_sequence: float,
    layers: int,
    hidden: int,
    params: int,
    micro_batch: int,
    grad_accum: int,
    seq_len: int,
    precision: str,
    checkpointing: bool,
    optimizer: str,
    optimizer_flops: float = 0.0,
) -> float:
    """Predicted seconds of one optimizer step on one process (its share of the global batch); `params`: the
    parameters the optimizer steps (those that train); `optimizer_flops`: the optimizer step's own matmuls
    (`ParamInventory.step_flops`)."""
    tokens = micro_batch * seq_len
    efficiency = tokens / (tokens + speed.half_tokens)
    micro = micro_batch * flops_per_sequence / (speed.peak_fp32 * speed.utilisation * efficiency)  # fp32
    if precision != "fp32":
        share = hidden / (hidden + speed.matmul_half_width) if hidden else 1.0
        rest = speed.low_precision_rest
        micro *= share / speed.precision_speedup.get(precision, 1.0) + (1 - share) * rest
    if checkpointing:
        micro /= speed.checkpointing_factor
    micro += speed.micro_step_overhead_per_layer * layers
    return grad_accum * micro + optimizer_step_seconds(speed, optimizer, params, optimizer_flops)


def optimizer_step_seconds(speed: DeviceSpeed, optimizer: str, params: int, flops: float = 0.0) -> float:
    """The optimizer's step: its per-parameter cost, and its own matmuls (`flops`, in bf16 whatever the training
    precision: torch's Muon orthogonalises in bf16) at the device's bf16 matmul speed."""
    per_param = speed.optimizer_seconds_per_param.get(optimizer, 0.0) * params
    if not flops:
        return per_param
    return per_param + flops / (speed.peak_fp32 * speed.precision_speedup.get("bf16", 1.0) * speed.utilisation)
