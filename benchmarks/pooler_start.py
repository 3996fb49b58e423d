"""What a sentence-transformers checkpoint's pooler should start as: its own weights (`--pooler keep`) or the identity
(`--pooler auto`, the default for such checkpoints), on the embedded MiniLM and tweet corpus.

The embedded all-MiniLM-L6-v2 was trained with mean pooling, so BERT's pooler (the dense layer over the first token
that `BertForSequenceClassification`'s head reads) never trained: its weights are a random matrix (std 0.009).
Every run trains `--rows` rows of the corpus for one epoch at the default job's settings (lr 1e-4, batch 32) and is
scored on one fixed set of 5,000 rows held out of the corpus before the training rows are drawn (standard error
about 0.6 points), each arm with the same seeds, alternating, each run in its own process.

    python benchmarks/pooler_start.py --rows 2000 --seeds 0,1,2   # -> benchmarks/results/pooler_start.md, .json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ARMS = ("keep", "auto")


def split(work: Path) -> tuple[Path, Path]:
    """The corpus as leantrain reads it (repaired), shuffled once: 5,000 rows to score, the rest to train from."""
    sys.path.insert(0, str(REPO / "src"))
    from leantrain.data.sources import embedded_data_path, read_table

    df, _ = read_table(str(embedded_data_path()))
    df = df[["text", "sentiment"]].rename(columns={"sentiment": "label"}).dropna().sample(frac=1.0, random_state=123)
    pool, held = work / "pool.jsonl", work / "eval.jsonl"
    df.iloc[:5000].to_json(held, orient="records", lines=True)
    df.iloc[5000:].to_json(pool, orient="records", lines=True)
    return pool, held


def child(arm: str, rows: int, seed: int, precision: str, pool: str, held: str) -> None:
    sys.path.insert(0, str(REPO / "src"))
    from leantrain import TrainConfig, train

    cfg = TrainConfig(
        data=pool, eval_data=held, limit=rows, lr=1e-4, precision=precision, seed=seed, pooler=arm,
        progress=False, report=False, output_dir=tempfile.mkdtemp(prefix="pooler-start-"),
    )  # fmt: skip
    m = train(cfg).metrics
    row = {"arm": arm, "rows": rows, "seed": seed, "precision": m.get("precision", precision)}
    row.update(
        accuracy=m["eval_accuracy"], macro_f1=m["eval_macro_f1"], samples_per_second=m.get("train_samples_per_second")
    )
    print("ROW " + json.dumps(row), flush=True)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=lambda s: [int(x) for x in s.split(",")], default=[2000])
    p.add_argument("--seeds", type=lambda s: [int(x) for x in s.split(",")], default=[0, 1, 2])
    p.add_argument("--precision", default="auto")
    p.add_argument("--out-dir", type=Path, default=REPO / "benchmarks" / "results")
    p.add_argument("--child", nargs=6, help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.child:
        arm, rows, seed, precision, pool, held = a.child
        child(arm, int(rows), int(seed), precision, pool, held)
        return 0
    import torch
    import transformers

    import leantrain

    work = Path(tempfile.mkdtemp(prefix="pooler-start-"))
    pool, held = split(work)
    runs = []
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    for rows in a.rows:
        for seed in a.seeds:
            for arm in ARMS if seed % 2 == 0 else reversed(ARMS):  # alternate who goes first
                cmd = [
                    sys.executable,
                    __file__,
                    "--child",
                    arm,
                    str(rows),
                    str(seed),
                    a.precision,
                    str(pool),
                    str(held),
                ]
                done = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
                line = next((x for x in done.stdout.splitlines() if x.startswith("ROW ")), None)
                if line is None:
                    print(done.stderr[-3000:], file=sys.stderr)
                    return 1
                runs.append(json.loads(line[4:]))
                print(line[4:], flush=True)
    info = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").is_file() else ""
    names = [x.split(":", 1)[1].strip() for x in info.splitlines() if x.startswith("model name")]
    cpu = names[0] if names else platform.processor()
    context = {
        "cpu": cpu, "cores": os.cpu_count(), "python": platform.python_version(), "torch": torch.__version__,
        "transformers": transformers.__version__, "leantrain": leantrain.__version__, "run": started,
        "command": "python benchmarks/pooler_start.py " + " ".join(sys.argv[1:]),
    }  # fmt: skip
    a.out_dir.mkdir(parents=True, exist_ok=True)
    (a.out_dir / "pooler_start.json").write_text(json.dumps({"context": context, "runs": runs}, indent=1))
    lines = [
        "# The pooler of a sentence-transformers checkpoint: kept, or started as the identity",
        "",
        f"Embedded all-MiniLM-L6-v2 on the embedded tweet corpus, one epoch, lr 1e-4, batch 32, precision "
        f"{runs[0]['precision']}; scored on one fixed set of 5,000 held-out rows. `keep`: the checkpoint's pooler "
        "(never trained: a random matrix); `auto`: the identity. Written by `benchmarks/pooler_start.py`.",
        "",
        "| rows | seed | keep: accuracy | auto: accuracy | difference | keep: macro-F1 | auto: macro-F1 |",
        "|---|---|---|---|---|---|---|",
    ]
    for rows in a.rows:
        diffs = []
        for seed in a.seeds:
            k, i = (next(r for r in runs if (r["arm"], r["rows"], r["seed"]) == (arm, rows, seed)) for arm in ARMS)
            diffs.append(i["accuracy"] - k["accuracy"])
            lines.append(
                f"| {rows:,} | {seed} | {k['accuracy']:.4f} | {i['accuracy']:.4f} | {100 * diffs[-1]:+.2f} points | "
                f"{k['macro_f1']:.4f} | {i['macro_f1']:.4f} |"
            )
        lines.append(f"| {rows:,} | mean | | | {100 * statistics.mean(diffs):+.2f} points | | |")
    lines += ["", "| context | |", "|---|---|", *(f"| {k} | {v} |" for k, v in context.items()), ""]
    (a.out_dir / "pooler_start.md").write_text("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
