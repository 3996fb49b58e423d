"""A reward model on the embedded MiniLM: its pooler kept (a random matrix: sentence-transformers never trained
it) or started as the identity (`--pooler auto`), scored on SST-2's dev preference pairs.

The pairs of `benchmarks/preference_sst2.py` (chosen: the right label of an SST-2 review, rejected: the wrong one),
--pairs training pairs drawn at random, one run per (setting, seed), each in this process; pairwise accuracy and
mean margin on all dev pairs. Needs `../shared/data/sst2`.

    python benchmarks/pooler_reward.py                        # writes benchmarks/results/pooler_reward.{json,md}
    python benchmarks/pooler_reward.py --steps 60 --seeds 0   # a quick look
    python benchmarks/pooler_reward.py --poolers identity,mean --name pooler_reward_mean   # the added mean layer
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "src"))
from benchmarks._results import write_results  # noqa: E402
from benchmarks.preference_sst2 import SHARED, pair_file, sst2_rows  # noqa: E402

RESULTS = REPO / "benchmarks" / "results"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=150)
    p.add_argument("--pairs", type=int, default=6000, help="training pairs drawn from SST-2 train")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--lr", type=float, default=5e-5)
    p.add_argument("--seeds", type=lambda s: [int(x) for x in s.split(",")], default=[0, 1])
    p.add_argument("--precision", default="auto")
    p.add_argument("--out-dir", type=Path, default=RESULTS)
    p.add_argument("--poolers", type=lambda s: s.split(","), default=["keep", "auto"], help="two --pooler settings")
    p.add_argument("--name", default="pooler_reward", help="the results page's name")
    a = p.parse_args(argv)
    if not (SHARED / "sst2").is_dir():
        print(f"no SST-2 at {SHARED / 'sst2'}: nothing to measure")
        return 0
    from leantrain import TrainConfig, train

    work = Path(tempfile.mkdtemp(prefix="pooler-reward-"))
    pairs_train = pair_file(work / "train.jsonl", sst2_rows("train", a.pairs, seed=1))
    pairs_dev = pair_file(work / "dev.jsonl", sst2_rows("dev"))
    rows = []
    load_before = os.getloadavg()[0]
    for seed in a.seeds:
        for pooler in a.poolers:
            started = time.perf_counter()
            result = train(
                TrainConfig(
                    task="reward-model", model="embedded:all-MiniLM-L6-v2", data=str(pairs_train),
                    eval_data=str(pairs_dev), max_steps=a.steps, batch_size=a.batch_size, lr=a.lr, seed=seed,
                    pooler=pooler, precision=a.precision, output_dir=str(work / f"{pooler}-{seed}"),
                    cache_dir=str(work / "cache"), progress=False, report=False,
                )
            )  # fmt: skip
            m = result.metrics
            row = dict(seed=seed, pooler=pooler, accuracy=m["eval_accuracy"], margin=m["eval_margin"],
                       seconds=round(time.perf_counter() - started, 1), precision=m.get("precision"))  # fmt: skip
            rows.append(row)
            print(json.dumps(row), flush=True)
    import torch
    import transformers

    context = {
        "cpu": Path("/proc/cpuinfo").read_text().split("model name")[1].split("\n")[0].strip(" :\t"),
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "load average before / after": f"{load_before:.2f} / {os.getloadavg()[0]:.2f}",
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "command": "python benchmarks/pooler_reward.py " + " ".join(argv if argv is not None else sys.argv[1:]),
    }
    by = {(r["seed"], r["pooler"]): r for r in rows}
    first, second = a.poolers
    lines = [
        f"# A reward model's pooler on a sentence-transformers checkpoint: {first} or {second}",
        "",
        f"The embedded all-MiniLM-L6-v2 as a reward model on {a.pairs:,} SST-2 preference pairs (chosen: the right "
        f"label), {a.steps} steps of {a.batch_size} pairs, lr {a.lr:g}; pairwise accuracy and mean margin on all "
        "dev pairs. `keep`: the checkpoint's pooler (a random matrix); `auto` and `identity`: the identity; `mean`: "
        "the identity over an added layer that averages the tokens into the first. Written by "
        "`benchmarks/pooler_reward.py`.",
        "",
        f"| seed | {first}: accuracy | {second}: accuracy | difference | {first}: margin | {second}: margin "
        "| seconds |",
        "|---|---|---|---|---|---|---|",
    ]
    for seed in a.seeds:
        k, i = by[(seed, first)], by[(seed, second)]
        diff = 100 * (i["accuracy"] - k["accuracy"])
        lines.append(
            f"| {seed} | {k['accuracy']:.4f} | {i['accuracy']:.4f} | {diff:+.2f} points | {k['margin']:.3f} | "
            f"{i['margin']:.3f} | {k['seconds']:.0f} / {i['seconds']:.0f} |"
        )
    write_results(a.out_dir, a.name, lines, context, {"runs": rows})
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
