"""What leantrain reads of the CPU: its name, family and the instruction sets that set its matmul speed."""

from __future__ import annotations

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
