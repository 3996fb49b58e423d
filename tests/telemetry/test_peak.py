"""Peak FLOP/s: the GPU table, the CPU GEMM probe and its cache."""

from __future__ import annotations

import json

import pytest

from leantrain.telemetry import peak


# Each figure worked out by hand from the architecture, not copied from the table: streaming multiprocessors x
# units per SM x FLOP per unit per clock x boost clock. Units are tensor cores (dense FMAs per clock, x2 FLOP)
# or, for fp32, CUDA cores (one FMA = 2 FLOP). Sources: NVIDIA's Volta, Turing, Ampere (A100), Hopper and
# Ada whitepapers and the products' data sheets (SM counts, boost clocks).
@pytest.mark.parametrize(
    "name,dtype,sms,units_per_sm,flop_per_unit_clock,boost_mhz,table_name",
    [
        ("Tesla V100-SXM2-16GB", "fp16", 80, 8, 2 * 64, 1530, "V100 SXM2"),  # 125 TFLOP/s
        ("Tesla V100-PCIE-32GB", "fp16", 80, 8, 2 * 64, 1380, "V100 PCIe"),  # 112
        ("Tesla V100-PCIE-32GB", "fp32", 80, 64, 2, 1380, "V100 PCIe"),  # 14
        ("Tesla T4", "fp16", 40, 8, 2 * 64, 1590, "T4"),  # 65
        ("Tesla T4", "fp32", 40, 64, 2, 1590, "T4"),  # 8.1
        ("NVIDIA A100-SXM4-80GB", "bf16", 108, 4, 2 * 256, 1410, "A100"),  # 312
        ("NVIDIA A100 80GB PCIe", "tf32", 108, 4, 2 * 128, 1410, "A100"),  # 156: tf32 at half the fp16 rate
        ("NVIDIA A100-SXM4-40GB", "fp32", 108, 64, 2, 1410, "A100"),  # 19.5
        ("NVIDIA H100 80GB HBM3", "bf16", 132, 4, 2 * 512, 1830, "H100 SXM"),  # 989
        ("NVIDIA H100 80GB HBM3", "tf32", 132, 4, 2 * 256, 1830, "H100 SXM"),  # 495
        ("NVIDIA H100 PCIe", "bf16", 114, 4, 2 * 512, 1620, "H100 PCIe"),  # 756
        ("NVIDIA H200", "fp16", 132, 4, 2 * 512, 1830, "H200 SXM"),  # the H100 SXM's compute, more memory
        ("NVIDIA GeForce RTX 4090", "bf16", 128, 4, 2 * 64, 2520, "RTX 4090"),  # 165: fp32-accumulate rate
    ],
)
def test_gpu_table_agrees_with_the_figure_worked_out_from_the_architecture(
    name, dtype, sms, units_per_sm, flop_per_unit_clock, boost_mhz, table_name
):
    found = peak.gpu_peak(name, dtype)
    assert found is not None
    expected = sms * units_per_sm * flop_per_unit_clock * boost_mhz * 1e6
    assert found.flops_per_second == pytest.approx(expected, rel=0.015)
    assert table_name in found.source and dtype in found.source


@pytest.mark.parametrize(
    "name,table_name",
    [
        ("NVIDIA H100 NVL", "H100 NVL"),
        ("NVIDIA H200 NVL", "H200 NVL"),
        ("NVIDIA A10G", "A10G"),
        ("NVIDIA A10", "A10"),
        ("NVIDIA L4", "L4"),
        ("NVIDIA L40S", "L40S"),
        ("NVIDIA GeForce RTX 3090", "GeForce RTX 3090"),
        ("NVIDIA GeForce RTX 3090 Ti", "GeForce RTX 3090 Ti"),
    ],
)
def test_device_names_pick_their_own_row(name, table_name):
    """The more specific name wins (an A10G is not an A10, an H100 NVL not an H100 SXM)."""
    found = peak.gpu_peak(name, "bf16")
    assert found is not None
    row = found.source.split(",")[0].removeprefix("data sheet: ").split(" (")[0]
    assert row == table_name


def test_gpu_table_knows_what_it_does_not_know():
    assert peak.gpu_peak("Tesla T4", "bf16") is None  # no bf16 tensor cores: measured instead
    assert peak.gpu_peak("Some Future GPU", "bf16") is None


def test_math_dtype_follows_the_precision():
    assert peak.math_dtype("cpu", "fp32") == "fp32"
    assert peak.math_dtype("cpu", "bf16") == "bf16"
    assert peak.math_dtype("cuda", "fp16") == "fp16"


def test_the_probe_measures_a_positive_figure():
    flops = peak.measure_peak("fp32", "cpu", size=256, seconds=0.05)
    assert flops > 1e8  # any CPU does 0.1 GFLOP/s


def test_the_best_of_the_first_probes_is_cached_and_reused(tmp_path, monkeypatch):
    monkeypatch.setenv("LEANTRAIN_CACHE", str(tmp_path))
    monkeypatch.delenv("LEANTRAIN_PEAK_TFLOPS", raising=False)
    calls = []
    figures = iter([40e9, 123e9, 100e9, 999e9])  # the first probe ran beside a busy neighbour

    def fake_measure(dtype, device="cpu", size=None, seconds=0.5):
        calls.append((dtype, size))
        return next(figures)

    monkeypatch.setattr(peak, "measure_peak", fake_measure)
    first = peak.device_peak("cpu", "bf16")
    assert first.flops_per_second == 40e9 and first.dtype == "bf16" and "measured" in first.source
    assert peak.device_peak("cpu", "bf16").flops_per_second == 123e9  # the low figure did not stick
    assert peak.device_peak("cpu", "bf16").flops_per_second == 123e9  # nor does a lower later one win
    trusted = peak.device_peak("cpu", "bf16")
    assert trusted.flops_per_second == 123e9 and "cached" in trusted.source and "best of 3" in trusted.source
    assert len(calls) == peak.PROBES_TO_TRUST == 3
    cached = json.loads((tmp_path / "peak.json").read_text())
    ((key, entry),) = cached.items()
    assert "bf16" in key and "threads" in key and "torch" in key
    assert entry["flops_per_second"] == 123e9 and entry["probes"] == 3
    peak.device_peak("cpu", "fp32")  # another dtype: another probe
    assert len(calls) == 4


def test_a_run_at_90_percent_of_the_cached_peak_or_more_sends_it_back_to_probing(tmp_path, monkeypatch):
    monkeypatch.setenv("LEANTRAIN_CACHE", str(tmp_path))
    monkeypatch.delenv("LEANTRAIN_PEAK_TFLOPS", raising=False)
    monkeypatch.setattr(peak, "PROBES_TO_TRUST", 1)
    figures = iter([50e9, 200e9])
    monkeypatch.setattr(peak, "measure_peak", lambda *a, **k: next(figures))
    low = peak.device_peak("cpu", "fp32")
    assert peak.device_peak("cpu", "fp32").flops_per_second == 50e9  # trusted from the cache
    assert not peak.distrust(low, 44e9)  # 88% of the peak: a step can get there
    assert peak.distrust(low, 46e9)  # 92%: more than a training step reaches, the probes ran slow
    assert peak.device_peak("cpu", "fp32").flops_per_second == 200e9  # probed again
    assert not peak.distrust(peak.Peak(1.0, "fp32", "cpu", "table"), 2.0)  # table figures are not probed


def test_cpus_of_one_name_and_another_generation_keep_their_own_peaks(tmp_path, monkeypatch):
    """'AMD EPYC' names AVX2 parts and AVX-512 BF16 ones: a home shared between them must not hand one's peak to
    the other."""
    from leantrain import parallel

    monkeypatch.setenv("LEANTRAIN_CACHE", str(tmp_path))
    monkeypatch.delenv("LEANTRAIN_PEAK_TFLOPS", raising=False)
    monkeypatch.setattr(peak, "PROBES_TO_TRUST", 1)
    figures = iter([400e9, 30e9])
    monkeypatch.setattr(peak, "measure_peak", lambda *a, **k: next(figures))
    monkeypatch.setattr(parallel, "cpu_name", lambda: "AMD EPYC")
    for flags, expected in ((["avx2", "avx512f", "avx512_bf16"], 400e9), (["avx2"], 30e9)):
        monkeypatch.setattr(parallel, "cpu_flags", lambda flags=flags: set(flags))
        assert peak.device_peak("cpu", "bf16").flops_per_second == expected
    assert len(json.loads((tmp_path / "peak.json").read_text())) == 2


def test_an_unwritable_cache_still_gives_a_figure(tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    monkeypatch.setenv("LEANTRAIN_CACHE", str(blocker))
    monkeypatch.setattr(peak, "measure_peak", lambda *a, **k: 5e9)
    assert peak.measured_peak("fp32").flops_per_second == 5e9


def test_the_environment_overrides_the_peak(monkeypatch):
    monkeypatch.setenv("LEANTRAIN_PEAK_TFLOPS", "2.5")
    found = peak.device_peak("cpu", "fp32")
    assert found.flops_per_second == 2.5e12 and found.source == "LEANTRAIN_PEAK_TFLOPS"


def test_refreshing_keeps_the_best_figure(tmp_path, monkeypatch):
    monkeypatch.setenv("LEANTRAIN_CACHE", str(tmp_path))
    figures = iter([100e9, 40e9, 150e9])
    monkeypatch.setattr(peak, "measure_peak", lambda *a, **k: next(figures))
    assert peak.measured_peak("fp32").flops_per_second == 100e9
    assert peak.measured_peak("fp32", refresh=True).flops_per_second == 100e9  # a busy moment does not lower it
    assert peak.measured_peak("fp32", refresh=True).flops_per_second == 150e9


@pytest.mark.parametrize(
    "flags,bf16_size,fp16_size",
    [
        ({"avx2"}, 256, 256),  # an AMD EPYC without AVX-512: both emulated (0.09 GFLOP/s measured in bf16)
        ({"avx512_bf16", "avx512_fp16"}, 2048, 2048),
        ({"amx_bf16"}, 2048, 256),  # AMX-BF16 without any fp16 instructions
    ],
)
def test_an_emulated_dtype_is_probed_small_and_cached_at_that_size(tmp_path, monkeypatch, flags, bf16_size, fp16_size):
    """A 2048² GEMM in a dtype the CPU emulates takes minutes (it made a 2-step bf16 test run for 12 minutes)."""
    from leantrain import parallel

    monkeypatch.setenv("LEANTRAIN_CACHE", str(tmp_path))
    monkeypatch.delenv("LEANTRAIN_PEAK_TFLOPS", raising=False)
    monkeypatch.setattr(parallel, "cpu_flags", lambda: frozenset(flags))
    sizes = []
    monkeypatch.setattr(
        peak, "measure_peak", lambda dtype, device="cpu", size=None, seconds=0.5: sizes.append(size) or 1e9
    )
    peak.device_peak("cpu", "bf16")
    peak.device_peak("cpu", "fp16")
    peak.device_peak("cpu", "fp32")
    assert sizes == [bf16_size, fp16_size, 2048]
    cached = json.loads((tmp_path / "peak.json").read_text())
    assert sorted(e["size"] for e in cached.values()) == sorted([bf16_size, fp16_size, 2048])
