"""Which attention implementation is fastest here: eager against SDPA on the embedded MiniLM, on this CPU.

For each case (training step or inference forward; attention dropout on as shipped, or off; sequence length) the
two implementations run in alternation on the same batch (random token ids, batch 32 unless --batch), fp32, and
the median seconds of --repeats timed runs each (after one warm-up) give their ratio. Alternating pairs keep a
neighbour's load from favouring one side. `--attention auto` (leantrain.model.attention) follows this table on CPUs;
the GPU's figures come from benchmarks/gpu_check.sh.

    python benchmarks/attention.py                 # writes benchmarks/results/attention.{json,md}
    python benchmarks/attention.py --repeats 1 --lengths 16   # a quick look
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

RESULTS = Path(__file__).parent / "results"
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # `benchmarks` as a package when run as a script


def step(model, ids, mask, train: bool) -> float:
    import torch

    started = time.perf_counter()
    if train:
        out = model(input_ids=ids, attention_mask=mask, labels=torch.zeros(len(ids), dtype=torch.long))
        out.loss.backward()
        model.zero_grad(set_to_none=True)
    else:
        with torch.no_grad():
            model(input_ids=ids, attention_mask=mask)
    return time.perf_counter() - started


def measure(path: str, dropout: bool, length: int, batch: int, repeats: int, train: bool) -> dict:
    import torch
    from transformers import AutoModelForSequenceClassification

    extra = {} if dropout else {"hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0}
    models = {
        impl: AutoModelForSequenceClassification.from_pretrained(path, num_labels=2, attn_implementation=impl, **extra)
        for impl in ("eager", "sdpa")
    }
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(1000, 20000, (batch, length), generator=gen)
    mask = torch.ones_like(ids)
    mask[batch // 2 :, length * 3 // 4 :] = 0  # dynamic padding leaves some rows shorter than the batch's longest
    times: dict[str, list[float]] = {impl: [] for impl in models}
    for model in models.values():
        model.train(train)
        step(model, ids, mask, train)  # warm-up
    for _ in range(repeats):
        for impl, model in models.items():
            times[impl].append(step(model, ids, mask, train))
    eager, sdpa = (statistics.median(times[i]) for i in ("eager", "sdpa"))
    return {
        "case": "train" if train else "inference",
        "dropout": dropout,
        "length": length,
        "batch": batch,
        "eager_seconds": eager,
        "sdpa_seconds": sdpa,
        "sdpa_over_eager": sdpa / eager,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--lengths", default="16,64,128")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--out", type=Path, default=RESULTS)
    args = p.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch
    import transformers

    from leantrain.model.loading import embedded_model_path

    path = str(embedded_model_path())
    load_before = os.getloadavg()
    rows = []
    for train in (True, False):
        for dropout in (True, False) if train else (False,):  # dropout does nothing at inference
            for length in map(int, args.lengths.split(",")):
                row = measure(path, dropout, length, args.batch, args.repeats, train)
                rows.append(row)
                print(json.dumps(row), flush=True)
    context = {
        "cpu": platform.processor() or platform.machine(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "threads": torch.get_num_threads(),
        "load average before / after": f"{load_before[0]:.1f} / {os.getloadavg()[0]:.1f}",
        "command": "python benchmarks/attention.py " + " ".join(argv if argv is not None else sys.argv[1:]),
    }
    lines = [
        "# Attention: eager against SDPA on the embedded MiniLM, this CPU",
        "",
        f"fp32, batch {args.batch}, a quarter of half the rows padded; median of {args.repeats} alternating runs "
        "after one warm-up. Ratio above 1: eager is faster.",
        "",
        "| case | attention dropout | length | eager s | SDPA s | SDPA / eager |",
        "|---|---|---|---|---|---|",
        *[
            f"| {r['case']} | {'0.1 (as shipped)' if r['dropout'] else 'off'} | {r['length']} "
            f"| {r['eager_seconds']:.3f} | {r['sdpa_seconds']:.3f} | {r['sdpa_over_eager']:.2f} |"
            for r in rows
        ],
    ]
    from benchmarks._results import write_results

    print(write_results(args.out, "attention", lines, context, {"rows": rows}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
