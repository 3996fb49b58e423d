"""How many rows `losses.head_cross_entropy_sum` should take at once: the fused head and loss, forward
and backward, at several chunk sizes against the unfused `cross_entropy(hidden @ weight.T)` over every row, on two
head shapes: tiny-llama's (1,900 counted rows of 256 -> 8,192) and a 125 M Llama's (2,048 rows of 768 -> 32,000).
fp32, alternating rounds; each round's figure is the median of its calls, with the page faults of those calls (a
fresh block of memory this large is new pages, which the kernel faults in one by one).

    python benchmarks/head_chunks.py        # writes benchmarks/results/head_chunks.{json,md}
    PYTHONPATH=OLD/src python benchmarks/head_chunks.py --name head_chunks_old --label 'commit X'  # another version
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks._results import write_results  # noqa: E402

SHAPES = {"256 -> 8,192 (1,900 rows)": (1900, 256, 8192), "768 -> 32,000 (2,048 rows)": (2048, 768, 32000)}
CHUNKS = (64, 128, 256, 512, 1024)


def timed(fn, hidden, weight, targets, calls: int) -> tuple[float, float]:
    """Milliseconds (median) and page faults (mean) of a call."""
    times, faults = [], []
    for _ in range(calls):
        hidden.grad = weight.grad = None
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        started = time.perf_counter()
        fn(hidden, weight, targets).backward()
        times.append(time.perf_counter() - started)
        faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
    return 1e3 * statistics.median(times), statistics.mean(faults)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--calls", type=int, default=3)
    parser.add_argument("--chunks", default=",".join(map(str, CHUNKS)), help="chunk sizes, comma-separated")
    parser.add_argument("--name", default="head_chunks", help="the results' file name")
    parser.add_argument("--label", default="this checkout", help="which leantrain the page measures")
    args = parser.parse_args()
    chunks = [int(c) for c in args.chunks.split(",")]
    import leantrain.model.losses as losses
    from leantrain.commands import bench

    def unfused(h, w, t):
        return F.cross_entropy(h @ w.t(), t, reduction="sum")

    def fused(chunk: int):
        def run(h, w, t):
            losses.HEAD_CHUNK_ROWS = chunk
            return losses.head_cross_entropy_sum(h, w, None, t)

        return run

    ways = {"unfused, every row": unfused, **{f"fused, {c} rows a chunk": fused(c) for c in chunks}}
    load_before = os.getloadavg()
    ms: dict[str, dict[str, list[float]]] = {}
    faults: dict[str, dict[str, list[float]]] = {}
    for shape, (rows, width, vocab) in SHAPES.items():
        g = torch.Generator().manual_seed(0)
        hidden = torch.randn(rows, width, generator=g, requires_grad=True)
        weight = (torch.randn(vocab, width, generator=g) * 0.02).requires_grad_()
        targets = torch.randint(0, vocab, (rows,), generator=g)
        ms[shape], faults[shape] = {name: [] for name in ways}, {name: [] for name in ways}
        for r in range(args.rounds):
            for name in list(ways) if r % 2 == 0 else list(ways)[::-1]:
                call_ms, call_faults = timed(ways[name], hidden, weight, targets, args.calls)
                ms[shape][name].append(call_ms)
                faults[shape][name].append(call_faults)
    page = [
        "# The fused head and loss by chunk size",
        "",
        f"`losses.head_cross_entropy_sum` forward and backward, fp32, against the unfused loss over every row; "
        f"medians of {args.rounds} alternating rounds of {args.calls} calls; page faults a call, median of the "
        f"rounds' means. leantrain: {args.label}. Written by `benchmarks/head_chunks.py`.",
        "",
        "| head | way | ms (median) | against unfused | page faults a call |",
        "|---|---|---|---|---|",
    ]
    for shape, by_way in ms.items():
        base = statistics.median(by_way["unfused, every row"])
        for name, values in by_way.items():
            median = statistics.median(values)
            page.append(
                f"| {shape} | {name} | {median:.1f} | {median / base:.2f}x | "
                f"{statistics.median(faults[shape][name]):,.0f} |"
            )
    context = {"load average before / after": f"{load_before} / {os.getloadavg()}", **bench.environment_context()}
    print(write_results(REPO / "benchmarks" / "results", args.name, page, context, {"ms": ms, "faults": faults}))


if __name__ == "__main__":
    main()
