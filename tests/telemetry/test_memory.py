"""glibc's heap during a run: kept for the next step without a memory budget, returned at once under one."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from leantrain.telemetry import memory

# A 64 MiB block, above glibc's largest dynamic mmap threshold (32 MiB): glibc as it is maps it apart and unmaps
# it when freed, so the next one faults all of its 16,384 pages in anew.
SCRIPT = """
import json, resource, sys
import torch
from leantrain.telemetry import memory

def faults_of_three_blocks(mib=64):
    # three blocks allocated, touched and freed in turn, after five that let glibc's bins settle (an aligned
    # block asks a little more than a freed one holds, so the first few can land elsewhere)
    for _ in range(5):
        torch.ones(mib * 2**20 // 4)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(3):
        torch.ones(mib * 2**20 // 4)
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before

def mapped_apart():
    # glibc's own settings again: a block larger than all the heap holds free is mapped apart (mmap), not carved
    # from a grown heap. Read from glibc's own counters (mallinfo2): page faults cannot tell, as a heap that
    # could not be trimmed (seen in CI) serves a block from pages touched before.
    import ctypes

    class Info(ctypes.Structure):
        _fields_ = [(name, ctypes.c_size_t) for name in
                    "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost".split()]

    mallinfo2 = ctypes.CDLL("libc.so.6").mallinfo2
    mallinfo2.restype = Info
    size = max(128 * 2**20, mallinfo2().fordblks + 64 * 2**20)
    before = mallinfo2().hblkhd
    block = torch.empty(size // 4)
    return mallinfo2().hblkhd - before >= block.nbytes

plain = faults_of_three_blocks()
with memory.freed_memory_kept() as took:
    kept = faults_of_three_blocks()
    during = mapped_apart()
after = mapped_apart()
print(json.dumps({"took": took, "plain": plain, "kept": kept, "during": during, "after": after}))
"""
PAGES = 64 * 2**20 // 4096


def run(env_extra: dict[str, str]) -> dict:
    import os

    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_") and k != "GLIBC_TUNABLES"}
    out = subprocess.run([sys.executable, "-c", SCRIPT], env=env | env_extra, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_kept_freed_memory_is_reused_without_page_faults_and_glibc_is_itself_again_afterwards():
    r = run({})
    if not r["took"]:
        pytest.skip("not glibc")
    assert r["plain"] > 2.7 * PAGES  # glibc as it is: every page of every block anew
    assert r["kept"] < PAGES  # kept: the pages of the blocks before (glibc may place one block afresh)
    assert not r["during"] and r["after"]  # kept: nothing mapped apart; afterwards glibc's own settings again


@pytest.mark.parametrize(
    "env",
    [
        {memory.KEEP_FREED_MEMORY_ENV: "0"},
        {"MALLOC_MMAP_THRESHOLD_": "262144"},
        {"GLIBC_TUNABLES": "glibc.malloc.tcache_count=0"},
    ],
)
def test_the_heap_is_left_alone_when_turned_off_or_tuned_by_the_environment(env):
    r = run(env)
    assert not r["took"] and r["kept"] > 2.7 * PAGES


def test_a_run_keeps_freed_memory_on_cpu_and_returns_it_under_a_memory_budget(monkeypatch):
    import contextlib

    from leantrain import api

    entered = []

    def spy(name):
        @contextlib.contextmanager
        def cm():
            entered.append(name)
            yield True

        return cm

    monkeypatch.setattr(memory, "freed_memory_kept", spy("kept"))
    monkeypatch.setattr(memory, "freed_memory_returned", spy("returned"))
    monkeypatch.setattr(api, "Trainer", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("stop")))
    with pytest.raises(RuntimeError, match="stop"):
        api.train(model="preset:tiny-vit", data="unused.csv")
    assert entered == ["kept"]
