"""What leantrain reads of the CPU: its name, family and the instruction sets that set its matmul speed."""

from __future__ import annotations

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


def test_cpuinfo_reads_the_first_processor():
    fields = parallel.cpuinfo()
    if not fields:
        return  # no /proc/cpuinfo (not Linux)
    assert parallel.cpu_name() == fields["model name"] and parallel.cpu_flags() == set(fields["flags"].split())
