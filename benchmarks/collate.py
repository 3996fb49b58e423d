"""What making a micro-batch costs the host: leantrain's collators against transformers' own on the same rows.

A step the device never waits for needs its next batch ready; with `--dataloader-num-workers 0` (the default) the
batch is made on the training process, between steps. This times, per micro-batch, leantrain's text
classification, token classification and sequence-to-sequence collators and transformers' `DataCollatorWithPadding`,
`DataCollatorForTokenClassification` and `DataCollatorForSeq2Seq` (the HF Trainer's, through `tokenizer.pad`), on
SST-2 sentences tokenized by the embedded MiniLM tokenizer, at 8 and 32 rows, in alternating rounds in one process.
`--baseline-src` also times leantrain's collators from another checkout's src/ (in its own process).

    python benchmarks/collate.py                                   # -> benchmarks/results/collate.{md,json}
    python benchmarks/collate.py --baseline-src /tmp/base/src      # with leantrain@base
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SST2 = REPO.parent / "shared" / "data" / "sst2" / "train.tsv"
KINDS = ("classification", "token", "seq2seq")


def rows(count: int) -> list[list[int]]:
    """The first `count` SST-2 training sentences as MiniLM token ids (with [CLS] and [SEP])."""
    from transformers import AutoTokenizer

    from leantrain.model.loading import embedded_model_path

    lines = SST2.read_text().splitlines()[1 : count + 1]
    tokenizer = AutoTokenizer.from_pretrained(embedded_model_path())
    return tokenizer([line.split("\t")[0] for line in lines], truncation=True, max_length=128)["input_ids"]


def leantrain_sides(ids: list[list[int]]) -> dict:
    """leantrain's collators and the items its loaders hand them (NumPy rows, as the cached examples hold)."""
    import numpy as np

    from leantrain.data.batching import Collator, Slot
    from leantrain.data.seq2seq import PairCollator
    from leantrain.tasks.token_classification import TokenCollator

    def item(i: int, x: list[int]) -> dict:
        a = np.asarray(x, dtype=np.int32)
        n = len(a)
        return {
            "input_ids": a, "token_type_ids": np.zeros(n, dtype=np.int8), "label": i % 2,
            "token_labels": (a % 9).astype(np.int16), "word_index": np.arange(n, dtype=np.int32),
            "token_index": np.arange(n, dtype=np.int32), "target_ids": a[: max(1, n // 2)],
            "slot": Slot(i, float(len(ids)), True),
        }  # fmt: skip

    items = [item(i, x) for i, x in enumerate(ids)]
    return {
        "classification": (Collator(0), items),
        "token": (TokenCollator(0), items),
        "seq2seq": (PairCollator(0, 101), items),
    }


def hf_sides(ids: list[list[int]]) -> dict:
    """transformers' collators and the features a `datasets` table hands them (lists of ints)."""
    from transformers import (
        AutoTokenizer,
        DataCollatorForSeq2Seq,
        DataCollatorForTokenClassification,
        DataCollatorWithPadding,
    )

    from leantrain.model.loading import embedded_model_path

    tokenizer = AutoTokenizer.from_pretrained(embedded_model_path())
    plain = [{"input_ids": x, "token_type_ids": [0] * len(x), "attention_mask": [1] * len(x)} for x in ids]
    return {
        "classification": (DataCollatorWithPadding(tokenizer), [{**f, "labels": i % 2} for i, f in enumerate(plain)]),
        "token": (
            DataCollatorForTokenClassification(tokenizer),
            [{**f, "labels": [t % 9 for t in f["input_ids"]]} for f in plain],
        ),
        "seq2seq": (
            DataCollatorForSeq2Seq(tokenizer, label_pad_token_id=-100),
            [{**f, "labels": f["input_ids"][: max(1, len(f["input_ids"]) // 2)]} for f in plain],
        ),
    }


def time_sides(sides: dict[str, dict], sizes: list[int], rounds: int, repeats: int) -> list[dict]:
    """Microseconds per micro-batch of each side's collator, median over `rounds` alternating rounds of `repeats`."""
    found: dict[tuple, list[float]] = {}
    for r in range(rounds):
        order = list(sides) if r % 2 == 0 else list(reversed(sides))
        for size in sizes:
            for kind in KINDS:
                for side in order:
                    collate, items = sides[side][kind]
                    batches = [items[i : i + size] for i in range(0, len(items) - size + 1, size)]
                    for batch in batches[:5]:  # warm
                        collate(batch)
                    start = time.perf_counter()
                    for k in range(repeats):
                        collate(batches[k % len(batches)])
                    found.setdefault((side, kind, size), []).append((time.perf_counter() - start) / repeats * 1e6)
    return [
        {"side": s, "kind": k, "rows": n, "us": statistics.median(v), "rounds_us": [round(x, 1) for x in v]}
        for (s, k, n), v in found.items()
    ]


def child(src: str, count: int, sizes: list[int], rounds: int, repeats: int) -> list[dict]:
    """leantrain@base: this script in a process importing leantrain from `src`."""
    code = (
        f"import sys, json; sys.path.insert(0, {src!r}); sys.path.insert(0, {str(REPO)!r});"
        "from benchmarks import collate as c; import torch; torch.set_num_threads(2);"
        f"ids = c.rows({count}); s = {{'leantrain@base': c.leantrain_sides(ids)}};"
        f"print(json.dumps(c.time_sides(s, {sizes!r}, {rounds}, {repeats})))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def page(results: list[dict], args) -> list[str]:
    sides = list(dict.fromkeys(r["side"] for r in results))
    by = {(r["side"], r["kind"], r["rows"]): r["us"] for r in results}
    lines = [
        "# Making a micro-batch: leantrain's collators and transformers'",
        "",
        f"`python benchmarks/collate.py{' --baseline-src ...' if args.baseline_src else ''}`: microseconds per "
        f"micro-batch (median of {args.rounds} alternating rounds of {args.repeats}), SST-2 sentences tokenized by "
        "MiniLM's tokenizer, 2 threads. HF: transformers' DataCollatorWithPadding, DataCollatorForTokenClassification, "
        "DataCollatorForSeq2Seq.",
        "",
        "| collator | rows | " + " | ".join(f"{s} us" for s in sides) + " | HF / leantrain |",
        "|---|---:|" + "---:|" * len(sides) + "---:|",
    ]
    for kind in KINDS:
        for n in args.sizes:
            cells = " | ".join(f"{by[(s, kind, n)]:,.0f}" for s in sides)
            ratio = by[("HF", kind, n)] / by[("leantrain", kind, n)]
            lines.append(f"| {kind} | {n} | {cells} | {ratio:.1f}x |")
    return lines


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--sizes", type=lambda s: [int(x) for x in s.split(",")], default=[8, 32])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--repeats", type=int, default=200)
    p.add_argument("--baseline-src", help="also time leantrain's collators from this src/ (another checkout)")
    p.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results")
    p.add_argument("--name", default="collate")
    args = p.parse_args()
    if not SST2.exists():
        print(f"{SST2} is absent: nothing to measure", file=sys.stderr)
        return 2
    sys.path[:0] = [str(REPO), str(REPO / "src")]
    import torch

    from benchmarks._results import machine_context, write_results

    torch.set_num_threads(2)
    count = max(args.sizes) * 20
    ids = rows(count)
    sides = {"leantrain": leantrain_sides(ids), "HF": hf_sides(ids)}
    results = time_sides(sides, args.sizes, args.rounds, args.repeats)
    if args.baseline_src:
        results += child(args.baseline_src, count, args.sizes, args.rounds, args.repeats)
    text = write_results(args.out, args.name, page(results, args), machine_context(threads=2), {"results": results})
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
