"""What leantrain reads of the CPU: its name, family and the instruction sets that set its matmul speed."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from leantrain import parallel
from leantrain.run.report import collect_environment


def fake_cpuinfo(monkeypatch, family: int, flags: str) -> None:
    fields = {"cpu family": str(family), "model": "2", "model name": "AMD EPYC", "flags": f"fpu sse2 {flags}"}
    monkeypatch.setattr(parallel, "cpuinfo", lambda: fields)


def test_two_cpus_of_one_name_are_told_apart_by_family_and_matmul_instructions(monkeypatch):
    fake_cpuinfo(monkeypatch, 23, "avx avx2 fma")
    older = parallel.cpu_model()
    fake_cpuinfo(monkeypatch, 26, "avx2 avx512f avx512bw avx512_bf16 avx512_vnni")
    newer = parallel.cpu_model()
    assert older == "AMD EPYC, family 23 model 2, avx2"
    assert newer == "AMD EPYC, family 26 model 2, avx2 avx512f avx512_bf16"
    assert collect_environment()["cpu_model"] == newer  # what every run's environment.json and bench page record


@pytest.mark.parametrize(
    ("flags", "fast", "said", "planned"),
    [
        ("avx2 avx512f avx512_bf16", False, "emulated", 0.01),  # an AMD EPYC: fp16 matmuls ~100x slower
        ("avx2 avx512f avx512_bf16 avx512_fp16 amx_bf16", False, "no faster than fp32", 0.9),  # Sapphire Rapids
        ("avx2 avx512f avx512_fp16 amx_bf16 amx_fp16", True, "AMX-FP16", 2.8),
    ],
)
def test_fp16_on_a_cpu_is_told_as_fast_as_its_instructions_make_it(monkeypatch, flags, fast, said, planned):
    from leantrain.planner.speed import device_speed

    fake_cpuinfo(monkeypatch, 26, flags)
    fp16 = parallel.precision_support("cpu")["fp16"]
    assert fp16.supported and fp16.fast == fast and said in fp16.why
    assert device_speed("cpu", peak_fp32=1e11).precision_speedup["fp16"] == planned


def test_cpuinfo_reads_the_first_processor():
    # whether there is a /proc/cpuinfo is decided here, not by what cpuinfo() returns: a reader pointed at the
    # wrong file returns nothing, which must fail rather than pass as "not Linux"
    source = Path("/proc/cpuinfo")
    if not source.is_file():
        pytest.skip("no /proc/cpuinfo (not Linux)")
    first = source.read_text().split("\n\n")[0]
    expected = {k.strip(): v.strip() for k, _, v in (line.partition(":") for line in first.splitlines())}
    expected.pop("", None)
    fields = parallel.cpuinfo()
    assert fields and {k: fields.get(k) for k in expected} == expected
    if "model name" in expected:  # x86: the name and the instruction sets
        assert parallel.cpu_name() == expected["model name"]
        assert parallel.cpu_flags() == set(expected["flags"].split()) and parallel.cpu_flags()


def test_cpu_trains_on_the_cpu_where_a_gpu_is_visible_and_leaves_the_switch_as_it_was(
    monkeypatch, tiny_model_dir, sentiment_csv, cache_dir, tmp_path
):
    """--cpu (the Trainer's use_cpu) on a machine where torch sees a GPU: every choice of device reads Accelerate's
    switch, the Accelerator's included, so the run trains where it would fail on the missing GPU."""
    import torch

    from leantrain import TrainConfig, train

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # a GPU, as far as the run can tell
    monkeypatch.delenv(parallel.CPU_ENV, raising=False)
    job = dict(model=str(tiny_model_dir), data=str(sentiment_csv), cache_dir=str(cache_dir), max_steps=2)
    result = train(TrainConfig(**job, cpu=True, output_dir=str(tmp_path / "cpu")))
    assert result.metrics["optimizer_steps"] == 2 and parallel.CPU_ENV not in os.environ
    with pytest.raises(AssertionError, match="CUDA"):  # without it the run goes for the GPU that is not there
        train(TrainConfig(**job, output_dir=str(tmp_path / "gpu")))
