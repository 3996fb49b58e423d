"""Attention over packed rows: the block-diagonal SDPA leantrain runs against attention per document.

A packed row of 128 tokens holding documents of ~20 tokens computes every 128 x 128 block of attention under a
block-diagonal causal mask; a trainer that pads short documents computes ~24 x 24 blocks. Per-document attention
would compute what a document needs: gather each document's queries, keys and values into length buckets (16, 32,
64, 128), run SDPA with `is_causal` per bucket, scatter the outputs back. This script times both, forward and
backward of one layer's attention (tiny-llama's 4 heads of 64), on 16 rows packed with documents whose lengths
follow the causal-LM comparison's corpus (exponential, mean 20, at most 127 tokens), in alternating rounds, and
checks that the two give the same output.

    python benchmarks/attention_per_document.py     # writes benchmarks/results/attention_per_document.{json,md}
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks._results import write_results  # noqa: E402

ROWS, HEADS, LENGTH, HEAD_DIM = 16, 4, 128, 64


def packed_lengths(seed: int = 0) -> list[list[int]]:
    """Each row's document lengths, filling rows of LENGTH tokens."""
    rng, rows = random.Random(seed), []
    for _ in range(ROWS):
        row: list[int] = []
        while sum(row) < LENGTH:
            row.append(min(LENGTH - sum(row), max(2, int(rng.expovariate(1 / 20)))))
        rows.append(row)
    return rows


def block_mask(rows: list[list[int]]) -> torch.Tensor:
    doc = torch.tensor([[d for d, n in enumerate(row) for _ in range(n)] for row in rows])
    causal = torch.ones(LENGTH, LENGTH, dtype=torch.bool).tril()
    return ((doc[:, :, None] == doc[:, None, :]) & causal)[:, None]


def buckets(rows: list[list[int]]) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per bucket: (documents x bucket length) indices into the flattened tokens (ROWS * LENGTH: a zero row), and
    which of them are real."""
    by_size: dict[int, list[tuple[int, int]]] = {}
    for r, row in enumerate(rows):
        start = r * LENGTH
        for n in row:
            size = 16
            while size < n:
                size *= 2
            by_size.setdefault(size, []).append((start, n))
            start += n
    out = []
    for size, docs in sorted(by_size.items()):
        index = torch.full((len(docs), size), ROWS * LENGTH)
        for i, (start, n) in enumerate(docs):
            index[i, :n] = torch.arange(start, start + n)
        out.append((index, index < ROWS * LENGTH))
    return out


def per_document(q, k, v, plan) -> torch.Tensor:
    def flat(t):  # (rows, heads, length, dim) -> (tokens + 1, heads, dim), the extra row zeros for padding
        t = t.transpose(1, 2).reshape(ROWS * LENGTH, HEADS, HEAD_DIM)
        return torch.cat([t, t.new_zeros(1, HEADS, HEAD_DIM)])

    qf, kf, vf = flat(q), flat(k), flat(v)
    out = q.new_zeros(ROWS * LENGTH + 1, HEADS, HEAD_DIM)
    for index, real in plan:
        gather = [t[index].transpose(1, 2) for t in (qf, kf, vf)]
        o = F.scaled_dot_product_attention(*gather, is_causal=True).transpose(1, 2)
        out = out.index_copy(0, index[real], o[real])
    return out[:-1].reshape(ROWS, LENGTH, HEADS, HEAD_DIM).transpose(1, 2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=7, help="timed calls a round (their median is the round's)")
    args = parser.parse_args()
    from leantrain.commands import bench

    torch.manual_seed(0)
    rows = packed_lengths()
    mask, plan = block_mask(rows), buckets(rows)
    q, k, v = (torch.randn(ROWS, HEADS, LENGTH, HEAD_DIM, requires_grad=True) for _ in range(3))
    grad = torch.randn(ROWS, HEADS, LENGTH, HEAD_DIM)
    ways = {
        "packed rows, block-diagonal SDPA": lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask),
        "per document, buckets of 16-128": lambda: per_document(q, k, v, plan),
    }
    outputs = [way().detach() for way in ways.values()]
    difference = float((outputs[0] - outputs[1]).abs().max())
    load_before = os.getloadavg()
    ms: dict[str, list[float]] = {name: [] for name in ways}
    for r in range(args.rounds):
        for name in list(ways) if r % 2 == 0 else list(ways)[::-1]:
            times = []
            for _ in range(args.repeats):
                q.grad = k.grad = v.grad = None
                started = time.perf_counter()
                ways[name]().backward(grad)
                times.append(time.perf_counter() - started)
            ms[name].append(1e3 * statistics.median(times))
    base = statistics.median(ms[next(iter(ways))])
    documents = sum(len(row) for row in rows)
    page = [
        "# Attention over packed rows: block-diagonal SDPA against attention per document",
        "",
        f"One layer's attention, forward and backward, fp32: {ROWS} rows of {LENGTH} tokens packed with {documents} "
        f"documents (mean {ROWS * LENGTH / documents:.1f} tokens), {HEADS} heads of {HEAD_DIM}; medians of "
        f"{args.rounds} alternating rounds of {args.repeats} calls. Largest output difference between the two ways: "
        f"{difference:.1e}. Written by `benchmarks/attention_per_document.py`.",
        "",
        "| way | ms a layer (median) | rounds | against the packed rows |",
        "|---|---|---|---|",
    ]
    for name, values in ms.items():
        median = statistics.median(values)
        page.append(f"| {name} | {median:.2f} | {', '.join(f'{x:.1f}' for x in values)} | {median / base:.2f}x |")
    context = {
        "load average before / after": f"{load_before} / {os.getloadavg()}",
        **bench.environment_context(),
    }
    print(write_results(REPO / "benchmarks" / "results", "attention_per_document", page, context, {"ms": ms}))


if __name__ == "__main__":
    main()
