"""What a dropout keeps for backward on a CPU: torch's dropout keeps a float mask (a product with it); zeroing the
dropped numbers with `masked_fill` keeps a bool (1 byte a number for 4 in fp32, 2 in bf16), at the price of
bool-masked operators, which a CPU runs unvectorized. leantrain's fast dropout takes the bool form for fp32 inputs and
the product for 16-bit ones.

On the embedded MiniLM (dropout 0.1, eager attention, which --fast-dropout picks on a CPU, so the attention
probabilities' dropout is rows x heads x L² numbers a layer): the bytes autograd keeps for backward in one training
forward (`saved_tensors_hooks`, exact), and the median time of training steps (forward, backward, fused AdamW)
alternating the two forms step by step in one process.

    python benchmarks/dropout_mask.py          # -> benchmarks/results/dropout_mask.{md,json}
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
SHAPES = ((32, 128), (8, 512))  # (rows, length)


def float_mask(input: torch.Tensor, p: float = 0.5, training: bool = True, inplace: bool = False) -> torch.Tensor:
    """leantrain's fast dropout's draws as a product with a float mask (its form for 16-bit inputs, and for every
    input before): autograd keeps the float mask."""
    from leantrain.model import dropout as D

    if not training or not 0.0 < p < 1.0:
        return D._TORCH_DROPOUT(input, p, training, inplace)
    dropped, n = round(p * D.LEVELS), input.numel()
    bits = torch.empty((n + 3) // 4, dtype=torch.int64).random_(*D._INT64).view(torch.int16)[:n].view(input.shape)
    keep = (bits >= dropped - D.LEVELS // 2).to(input.dtype).mul_(D.LEVELS / (D.LEVELS - dropped))
    return input.mul_(keep) if inplace else input * keep


def bool_mask(input: torch.Tensor, p: float = 0.5, training: bool = True, inplace: bool = False) -> torch.Tensor:
    """leantrain's fast dropout's draws, the dropped numbers zeroed after scaling: autograd keeps the bool mask."""
    from leantrain.model import dropout as D

    if not training or not 0.0 < p < 1.0:
        return D._TORCH_DROPOUT(input, p, training, inplace)
    dropped, n = round(p * D.LEVELS), input.numel()
    bits = torch.empty((n + 3) // 4, dtype=torch.int64).random_(*D._INT64).view(torch.int16)[:n].view(input.shape)
    drop = bits < dropped - D.LEVELS // 2
    scale = D.LEVELS / (D.LEVELS - dropped)
    return input.mul_(scale).masked_fill_(drop, 0.0) if inplace else (input * scale).masked_fill_(drop, 0.0)


@contextlib.contextmanager
def using(f):
    own = torch.nn.functional.dropout
    torch.nn.functional.dropout = f
    try:
        yield
    finally:
        torch.nn.functional.dropout = own


def saved_mib(model, ids, labels, f, precision: str) -> float:
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen: dict[int, int] = {}

    def pack(t):
        storage = t.untyped_storage()
        seen[storage.data_ptr()] = storage.nbytes()
        return t

    bf16 = precision == "bf16"
    hooks = torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t)
    with using(f), hooks, torch.autocast("cpu", torch.bfloat16, enabled=bf16):
        loss = model(input_ids=ids, labels=labels).loss
    del loss
    return sum(v for k, v in seen.items() if k not in params) / 2**20


def step_ms(model, ids, labels, sides: dict, precision: str, steps: int) -> dict[str, float]:
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=True)
    times: dict[str, list[float]] = {k: [] for k in sides}
    for s in range(steps + 2):
        for name in sides if s % 2 == 0 else reversed(list(sides)):
            start = time.perf_counter()
            with using(sides[name]), torch.autocast("cpu", torch.bfloat16, enabled=precision == "bf16"):
                loss = model(input_ids=ids, labels=labels).loss
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            if s >= 2:  # two warm-up steps each
                times[name].append(time.perf_counter() - start)
    return {k: statistics.median(v) * 1e3 for k, v in times.items()}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results")
    args = p.parse_args()
    sys.path[:0] = [str(REPO), str(REPO / "src")]
    from transformers import AutoModelForSequenceClassification

    from benchmarks._results import machine_context, write_results
    from leantrain.model import dropout as D
    from leantrain.model.loading import embedded_model_path

    torch.set_num_threads(2)
    model = AutoModelForSequenceClassification.from_pretrained(
        embedded_model_path(), num_labels=2, attn_implementation="eager"
    ).train()
    sides = {"torch": D._TORCH_DROPOUT, "float": float_mask, "bool": bool_mask}
    rows = []
    for n, length in SHAPES:
        g = torch.Generator().manual_seed(0)
        ids, labels = torch.randint(1000, 20000, (n, length), generator=g), torch.randint(0, 2, (n,), generator=g)
        for precision in ("fp32", "bf16"):
            saved = {k: saved_mib(model, ids, labels, f, precision) for k, f in sides.items()}
            ms = step_ms(model, ids, labels, {k: sides[k] for k in ("float", "bool")}, precision, args.steps)
            rows.append({"rows": n, "length": length, "precision": precision, "saved_mib": saved, "step_ms": ms})
    page = [
        "# What a dropout keeps for backward on a CPU",
        "",
        "`python benchmarks/dropout_mask.py`: the embedded MiniLM, dropout 0.1, eager attention, one training",
        "forward's saved tensors (MiB, exact) and the median ms of training steps alternating the fast dropout's two",
        "forms: a product with a float mask, and zeroed with a bool one (leantrain's for fp32 inputs).",
        "",
        "| rows x length | precision | saved: torch's dropout | float mask | bool mask | bool / float "
        "| step ms float | step ms bool |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        s, ms = r["saved_mib"], r["step_ms"]
        page.append(
            f"| {r['rows']} x {r['length']} | {r['precision']} | {s['torch']:,.0f} | {s['float']:,.0f} "
            f"| {s['bool']:,.0f} | {s['bool'] / s['float']:.2f} | {ms['float']:,.0f} | {ms['bool']:,.0f} |"
        )
    context = machine_context(threads=2)
    print(write_results(args.out, "dropout_mask", page, context, {"rows": rows}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
