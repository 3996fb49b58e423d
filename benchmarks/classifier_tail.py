"""The classifier's last layer at the first token only, against the same run computing every position, in one
script.

The job: the embedded MiniLM fine-tuned on SST-2 `train_1k.tsv` (1,000 sentences), 1 epoch, batch 32, max length
128 with dynamic padding, fp32, AdamW, evaluated on SST-2 dev (872 sentences) at the end; then the saved run
evaluated again on dev with `leantrain.evaluate`, as `leantrain evaluate` does. Each run is its own process and
the two ways alternate, so a neighbour's load falls on both. The peer is leantrain itself with the cut turned off
(the task's `check_model` put back to the base task's, which finds no tail). Reported: steady training samples/s,
the training loop's seconds, `evaluate`'s seconds, the whole process from start to exit, and dev accuracy.

    python benchmarks/classifier_tail.py                 # writes benchmarks/results/classifier_tail.{json,md}
    python benchmarks/classifier_tail.py --rows 200 --repeats 1
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks._results import write_results  # noqa: E402

DATA = REPO.parent / "shared" / "data" / "sst2"
MODES = ("first token", "every position")


def one_run(work: Path, mode: str, data: str, rows: int) -> dict:
    """Runs in a child process: one training run and one evaluation, their metrics."""
    from leantrain import TrainConfig, evaluate, train
    from leantrain.tasks.base import Task
    from leantrain.tasks.classification import Classification

    if mode == "every position":
        Classification.check_model = Task.check_model  # type: ignore[method-assign]
    result = train(
        TrainConfig(
            data=str(DATA / data),
            eval_data=str(DATA / "dev.tsv"),
            limit=rows,
            epochs=1,
            batch_size=32,
            max_length=128,
            precision="fp32",
            seed=42,
            output_dir=str(work / "out"),
            cache_dir=str(work / "cache"),
            overwrite=True,
            progress=False,
            report=False,
        )
    )
    started = time.perf_counter()
    scores = evaluate(str(work / "out"), data=str(DATA / "dev.tsv"), cache_dir=str(work / "cache"))
    m = result.metrics
    return {
        "steady_samples_per_second": m["steady_samples_per_second"],
        "train_seconds": m["train_seconds"],
        "eval_accuracy": m["eval_accuracy"],
        "evaluate_seconds": time.perf_counter() - started,
        "evaluate_accuracy": scores["accuracy"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default="train_1k.tsv", help="SST-2 file to train on (train.tsv: short phrases)")
    parser.add_argument("--rows", type=int, default=1000, help="training rows (the first N of --data)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--child", nargs=2, metavar=("WORK", "MODE"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        work, mode = args.child
        print(json.dumps(one_run(Path(work), mode, args.data, args.rows)))
        return
    if not DATA.is_dir():
        sys.exit(f"{DATA} is absent: this benchmark reads SST-2 there")

    from leantrain.commands import bench

    work = Path(tempfile.mkdtemp(prefix="classifier-tail-"))
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    load_before = os.getloadavg()
    runs: dict[str, list[dict]] = {}
    for r in range(args.repeats + 1):  # the first round warms the tokenization cache and is not kept
        for mode in MODES if r % 2 == 0 else MODES[::-1]:
            started = time.perf_counter()
            cmd = [sys.executable, __file__, "--data", args.data, "--rows", str(args.rows), "--child", str(work), mode]
            proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
            if proc.returncode != 0:
                sys.exit(f"{mode} failed:\n{proc.stderr[-3000:]}")
            run = json.loads(proc.stdout.splitlines()[-1]) | {"process_seconds": time.perf_counter() - started}
            print(r, mode, run, flush=True)
            if r > 0:
                runs.setdefault(mode, []).append(run)

    def median(mode: str, key: str) -> float:
        return statistics.median(float(x[key]) for x in runs[mode])

    page = [
        "# A classifier's last layer at the first token only (MiniLM, SST-2)",
        "",
        f"The embedded MiniLM (6 layers) fine-tuned on the first {args.rows} rows of SST-2 `{args.data}`, 1 epoch, "
        "batch 32, max length 128 with dynamic padding, fp32, AdamW, evaluated on dev (872 sentences) at the end; then "
        "`leantrain.evaluate` on the saved run. Medians of "
        f"{args.repeats} runs each way, alternating, after one untimed round. Process: from the child's start to its "
        "exit (imports, data from the cache, training, evaluation, saving, the second evaluation). Written by "
        "`benchmarks/classifier_tail.py`.",
        "",
        "| last layer | steady samples/s | speed-up | training loop s | evaluate s | process s | dev accuracy |",
        "|---|---|---|---|---|---|---|",
    ]
    base = median("every position", "steady_samples_per_second")
    for mode in MODES:
        sps = median(mode, "steady_samples_per_second")
        page.append(
            f"| {mode} | {sps:.1f} | {sps / base:.2f}x | {median(mode, 'train_seconds'):.1f} | "
            f"{median(mode, 'evaluate_seconds'):.1f} | {median(mode, 'process_seconds'):.1f} | "
            f"{runs[mode][0]['eval_accuracy']:.4f} |"
        )
    context = {"load average before / after": f"{load_before} / {os.getloadavg()}", **bench.environment_context()}
    name = "classifier_tail" + ("" if args.data == "train_1k.tsv" else "_" + Path(args.data).stem)
    text = write_results(REPO / "benchmarks" / "results", name, page, context, {"runs": runs})
    print(text)


if __name__ == "__main__":
    main()
