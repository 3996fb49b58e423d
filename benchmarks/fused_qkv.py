"""Whether fusing a BERT layer's query, key and value projections into one matmul pays, on this machine.

Fewer launches make a host-bound step cheaper: the three projections of each self-attention as one Linear of three
times the width is one matmul forward and two backward where there were three and six. Two ways to fuse, each
timed against the model as transformers builds it, on whole training steps (forward, backward, fused AdamW,
clearing), in one process, alternating step by step:

- **stored**: one parameter holding the three weights (and one the three biases): what a model built fused holds,
  and what a checkpoint in transformers' layout would have to be converted to and from;
- **cat**: the three parameters as they are, concatenated in every forward (the checkpoint's layout unchanged).

    python benchmarks/fused_qkv.py            # -> benchmarks/results/fused_qkv.{md,json}

Dropout is off (its draws would differ between the models, not the projections); the logits of the fused models
are compared with the separate model's before timing.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
#: (name, hidden width, layers, rows, length, precision): a host-bound BERT as benchmarks/host_overhead.py trains
#: it, and MiniLM's shape on a fine-tuning batch
SHAPES = [
    ("host-bound BERT", 32, 12, 8, 16, "fp32"),
    ("MiniLM-shaped", 384, 6, 16, 64, "fp32"),
    ("MiniLM-shaped", 384, 6, 16, 64, "bf16"),
]


class FusedProjections(torch.nn.Module):
    """The query, key and value of one self-attention from one matmul; the model's `query`, `key` and `value` are
    replaced by `part(i)` modules that return its i-th third (the three are called in that order on one input)."""

    def __init__(self, attention, stored: bool):
        super().__init__()
        q, k, v = attention.query, attention.key, attention.value
        if stored:
            self.qkv = torch.nn.Linear(q.in_features, 3 * q.out_features)
            with torch.no_grad():
                self.qkv.weight.copy_(torch.cat([q.weight, k.weight, v.weight]))
                self.qkv.bias.copy_(torch.cat([q.bias, k.bias, v.bias]))
            self.linear = self.qkv
        else:
            self.q, self.k, self.v = q, k, v
            self.linear = self._concatenated
        self.parts: tuple[torch.Tensor, ...] | None = None

    def _concatenated(self, x: torch.Tensor) -> torch.Tensor:
        weight = torch.cat([self.q.weight, self.k.weight, self.v.weight])
        bias = torch.cat([self.q.bias, self.k.bias, self.v.bias])
        return torch.nn.functional.linear(x, weight, bias)

    def part(self, i: int) -> torch.nn.Module:
        fused = self

        class Part(torch.nn.Module):
            def forward(self, x: torch.Tensor) -> torch.Tensor:
                if i == 0:
                    fused.parts = fused.linear(x).chunk(3, dim=-1)
                assert fused.parts is not None
                return fused.parts[i]

        return Part()


def models(width: int, layers: int) -> dict[str, torch.nn.Module]:
    from transformers import BertConfig, BertForSequenceClassification

    config = BertConfig(
        hidden_size=width, num_hidden_layers=layers, num_attention_heads=max(2, width // 64),
        intermediate_size=4 * width, vocab_size=1000, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
    )  # fmt: skip
    torch.manual_seed(0)
    separate = BertForSequenceClassification(config).train()
    out = {"separate": separate}
    for name, stored in (("stored", True), ("cat", False)):
        model = copy.deepcopy(separate)
        for layer in model.bert.encoder.layer:
            attention = layer.attention.self
            fused = FusedProjections(attention, stored)
            attention.fused = fused
            attention.query, attention.key, attention.value = fused.part(0), fused.part(1), fused.part(2)
        out[name] = model
    return out


def measure(shape: tuple, steps: int) -> dict:
    name, width, layers, rows, length, precision = shape
    sides = models(width, layers)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 1000, (rows, length), generator=g)
    labels = torch.randint(0, 2, (rows,), generator=g)
    with torch.no_grad():
        logits = {k: m(input_ids=ids).logits for k, m in sides.items()}
    differences = {k: float((logits[k] - logits["separate"]).abs().max()) for k in ("stored", "cat")}

    def stepper(model):
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)

        def step():
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16"):
                loss = model(input_ids=ids, labels=labels).loss
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)

        return step

    steppers = {k: stepper(m) for k, m in sides.items()}
    for _ in range(5):
        for step in steppers.values():
            step()
    times: dict[str, list[float]] = {k: [] for k in sides}
    order = list(sides)
    for s in range(steps):
        for k in order if s % 2 == 0 else reversed(order):
            start = time.perf_counter()
            steppers[k]()
            times[k].append(time.perf_counter() - start)
    ms = {k: statistics.median(v) * 1e3 for k, v in times.items()}
    return {
        "shape": name, "width": width, "layers": layers, "rows": rows, "length": length, "precision": precision,
        "ms": ms, "logit_difference": differences,
    }  # fmt: skip


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=200, help="timed steps of each model (host-bound shape)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results")
    args = p.parse_args()
    sys.path[:0] = [str(REPO), str(REPO / "src")]

    from benchmarks._results import machine_context, write_results

    torch.set_num_threads(args.threads)
    results = [measure(shape, args.steps if shape[1] < 256 else max(10, args.steps // 10)) for shape in SHAPES]
    page = [
        "# Fused query, key and value projections: measured",
        "",
        "`python benchmarks/fused_qkv.py`: median ms per training step (forward, backward, fused AdamW, clearing) of",
        "a BERT as transformers builds it and of two fused forms of it, alternating step by step in one process;",
        "dropout off. `stored`: one parameter holds the three weights; `cat`: concatenated in every forward.",
        "",
        "| shape | width x layers | rows x length | precision | separate ms | stored ms | cat ms | stored speed-up "
        "| cat speed-up | largest logit difference (stored, cat) |",
        "|---|---|---|---|---:|---:|---:|---:|---:|---|",
    ]
    for r in results:
        ms, d = r["ms"], r["logit_difference"]
        page.append(
            f"| {r['shape']} | {r['width']} x {r['layers']} | {r['rows']} x {r['length']} | {r['precision']} "
            f"| {ms['separate']:.2f} | {ms['stored']:.2f} | {ms['cat']:.2f} | {ms['separate'] / ms['stored']:.3f}x "
            f"| {ms['separate'] / ms['cat']:.3f}x | {d['stored']:.1e}, {d['cat']:.1e} |"
        )
    context = machine_context(threads=args.threads)
    print(write_results(args.out, "fused_qkv", page, context, {"results": results}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
