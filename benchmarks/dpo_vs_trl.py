"""leantrain's `--task dpo` against TRL's DPOTrainer on the same job: the SST-2 pairs of benchmarks/preference_sst2.py
from its instruction-tuned tiny Llama, the reference's log-probabilities precomputed on both sides
(`--precompute-reference`, TRL's `precompute_ref_log_probs`), fp32, the same optimizer, schedule, clipping, beta and
global batches in the same order (TRL reads the pairs in leantrain's order, sequentially). Each side trains in its own
process, alternating, `--repeats` times.

Reported: the loss curves (the first steps must agree within 1e-4), pairs per second over the steps after the first
`--warmup` (goal: leantrain at least 1.5x TRL's) and peak memory over each process's resident memory when training
starts (the same measure on both sides: /proc's VmHWM after clear_refs; goal: leantrain at most 0.7x TRL's).

    python benchmarks/dpo_vs_trl.py --model W/sft/model --pairs W/pairs_train.jsonl --steps 40 --repeats 3
    python benchmarks/dpo_vs_trl.py --model W/sft/model --pairs W/pairs_train.jsonl --steps 6 --repeats 1 \\
        --results /tmp/smoke                                     # a smoke test

Writes benchmarks/results/dpo_vs_trl.{json,md} (or --results).
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
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from benchmarks._results import write_results  # noqa: E402
from benchmarks.preference_sst2 import RESULTS, hardware  # noqa: E402

#: the settings both sides train with
JOB = dict(lr=5e-5, beta=0.1, max_length=128, weight_decay=0.0, max_grad_norm=1.0, seed=42)


def _status_kib(key: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    return 0


def leantrain_config(args, pairs: str, out: str) -> Any:
    from leantrain import TrainConfig

    return TrainConfig(
        task="dpo", model=args.model, data=pairs, eval_data=args.eval_pairs, cache_dir=args.cache,
        output_dir=out, overwrite=True, batch_size=args.batch_size, max_steps=args.steps, log_every=1,
        optimizer="adamw", scheduler="linear", warmup_ratio=0.0, precision="fp32", precompute_reference=True,
        progress=False, report=False, **JOB,
    )  # fmt: skip


def trl_order(args, work: Path) -> Path:
    """The pairs as leantrain's sampler draws them, its global batches one after another: TRL reads them in order."""
    from leantrain.tasks.preference import DPO

    cfg = leantrain_config(args, args.pairs, str(work / "unused")).resolved()
    data = DPO(cfg).prepare_data(args.model, None)
    rows = Path(args.pairs).read_text().splitlines()
    assert len(data.train) == len(rows), "every pair trains on both sides (none held out or skipped)"
    sampler, _ = data.train.batches(args.batch_size, 1, 1, cfg.seed)
    order = [int(i) for batch in sampler.global_batches()[: args.steps] for i in batch]
    path = work / "pairs_in_leantrains_order.jsonl"
    path.write_text("".join(rows[i] + "\n" for i in order))
    return path


def run_leantrain(args, out: Path) -> dict[str, Any]:
    from leantrain import train

    result = train(leantrain_config(args, args.pairs, str(out)))
    rows = [json.loads(x) for x in (result.output_dir / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if "loss" in r]
    m = result.metrics
    return {
        "loss": [r["loss"] for r in rows],
        "step_end_seconds": [r["elapsed_seconds"] for r in rows],
        "peak_over_start_bytes": m["peak_memory_over_baseline_bytes"],
        "setup_seconds": m["reference_seconds"],
        "process_peak_bytes": _status_kib("VmHWM") * 1024,
    }


def run_trl(args, ordered: Path, out: Path) -> dict[str, Any]:
    import torch
    from datasets import load_dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import DPOConfig, DPOTrainer

    class Meter(TrainerCallback):
        def __init__(self):
            self.ends: list[float] = []
            self.start_rss = 0

        def on_train_begin(self, *a, **k):
            Path("/proc/self/clear_refs").write_text("5")  # the peak from here on, as leantrain's meter
            self.start_rss, self.started = _status_kib("VmRSS") * 1024, time.perf_counter()

        def on_step_end(self, *a, **k):
            self.ends.append(time.perf_counter() - self.started)

    started = time.perf_counter()
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    config = DPOConfig(
        output_dir=str(out), per_device_train_batch_size=args.batch_size, max_steps=args.steps,
        learning_rate=JOB["lr"], lr_scheduler_type="linear", warmup_steps=0, weight_decay=JOB["weight_decay"],
        max_grad_norm=JOB["max_grad_norm"], beta=JOB["beta"], loss_type=["sigmoid"], max_length=JOB["max_length"],
        precompute_ref_log_probs=True, train_sampling_strategy="sequential", logging_steps=1, report_to="none",
        bf16=False, use_cpu=True, save_strategy="no", seed=JOB["seed"], dataloader_num_workers=0, optim="adamw_torch",
    )  # fmt: skip
    meter = Meter()
    dataset = load_dataset("json", data_files=str(ordered), split="train", cache_dir=str(out / "datasets"))
    trainer = DPOTrainer(model=model, args=config, train_dataset=dataset, processing_class=tokenizer, callbacks=[meter])
    setup = time.perf_counter() - started
    trainer.train()
    return {
        "loss": [r["loss"] for r in trainer.state.log_history if "loss" in r],
        "step_end_seconds": meter.ends,
        "peak_over_start_bytes": _status_kib("VmHWM") * 1024 - meter.start_rss,
        "setup_seconds": setup,
        "process_peak_bytes": None,
    }


def pairs_per_second(side: dict[str, Any], warmup: int, batch: int) -> float:
    ends = side["step_end_seconds"]
    return (len(ends) - warmup) * batch / (ends[-1] - ends[warmup - 1])


def one_side(args) -> None:
    """This process trains one side and prints its figures as JSON (the last line)."""
    out = Path(args.out)
    got = run_leantrain(args, out) if args.side == "leantrain" else run_trl(args, Path(args.ordered), out)
    print(json.dumps(got))


def launch(args, side: str, work: Path, ordered: Path, k: int) -> dict[str, Any]:
    flags = ["--side", side, "--out", str(work / f"{side}-{k}"), "--ordered", str(ordered)]
    for name in ("model", "pairs", "eval_pairs", "cache", "steps", "batch_size"):
        flags += [f"--{name.replace('_', '-')}", str(getattr(args, name))]
    env = {**os.environ, "LEANTRAIN_THREAD_GOVERNOR": "0", "HF_HUB_OFFLINE": "1", "TQDM_DISABLE": "1"}
    proc = subprocess.run([sys.executable, __file__, *flags], capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        raise SystemExit(f"{side} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def compare(args) -> None:
    """Both sides train on the same rows: the first --steps x --batch-size pairs (one epoch), leantrain evaluating at
    the end on the next 64."""
    work = Path(tempfile.mkdtemp(prefix="dpo-vs-trl-"))
    args.cache = args.cache or str(work / "cache")
    env = hardware()
    rows = Path(args.pairs).read_text().splitlines()
    n = args.steps * args.batch_size
    args.pairs, args.eval_pairs = str(work / "pairs.jsonl"), str(work / "eval_pairs.jsonl")
    Path(args.pairs).write_text("".join(r + "\n" for r in rows[:n]))
    Path(args.eval_pairs).write_text("".join(r + "\n" for r in rows[n : n + 64]))
    ordered = trl_order(args, work)
    runs: dict[str, list[dict[str, Any]]] = {"leantrain": [], "trl": []}
    for k in range(args.repeats):  # alternating: a neighbour's load falls on both alike
        for side in ("leantrain", "trl") if k % 2 == 0 else ("trl", "leantrain"):
            runs[side].append(launch(args, side, work, ordered, k))
            print(f"run {k + 1} {side}: {pairs_per_second(runs[side][-1], args.warmup, args.batch_size):.1f} pairs/s")
    env["uptime_at_end"] = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    report(args, env, runs)


def report(args, env: dict[str, Any], runs: dict[str, list[dict[str, Any]]]) -> None:
    speeds = {s: [pairs_per_second(r, args.warmup, args.batch_size) for r in rs] for s, rs in runs.items()}
    peaks = {s: [r["peak_over_start_bytes"] for r in rs] for s, rs in runs.items()}
    ratios = [a / b for a, b in zip(speeds["leantrain"], speeds["trl"])]
    first = min(10, args.steps)
    gaps = [abs(a - b) for a, b in zip(runs["leantrain"][0]["loss"][:first], runs["trl"][0]["loss"][:first])]
    mib = 2**-20
    data = {
        "settings": {"steps": args.steps, "batch_size": args.batch_size, "warmup_steps": args.warmup, **JOB},
        "pairs_per_second": speeds,
        "speed_ratio_median": statistics.median(ratios),
        "peak_over_start_mib": {s: [round(p * mib, 1) for p in v] for s, v in peaks.items()},
        "memory_ratio_median": statistics.median(peaks["leantrain"]) / statistics.median(peaks["trl"]),
        "loss": {s: rs[0]["loss"] for s, rs in runs.items()},
        "largest_loss_gap_first_steps": max(gaps),
        "setup_seconds": {s: [round(r["setup_seconds"], 1) for r in rs] for s, rs in runs.items()},
        "goals": {"speed_ratio_at_least": 1.5, "memory_ratio_at_most": 0.7, "loss_gap_at_most": 1e-4},
    }
    page = [
        "# leantrain --task dpo against TRL's DPOTrainer (reference precomputed on both sides)",
        "",
        "| | leantrain | TRL | leantrain / TRL | goal |",
        "|---|---|---|---|---|",
        f"| pairs/s (steps {args.warmup + 1}-{args.steps}, median of {args.repeats}) | "
        f"{statistics.median(speeds['leantrain']):.1f} | {statistics.median(speeds['trl']):.1f} | "
        f"{data['speed_ratio_median']:.2f}x (runs {', '.join(f'{r:.2f}' for r in ratios)}) | >= 1.5x |",
        f"| peak memory over the start of training, MiB (median) | {statistics.median(peaks['leantrain']) * mib:.0f} | "
        f"{statistics.median(peaks['trl']) * mib:.0f} | {data['memory_ratio_median']:.2f}x | <= 0.7x |",
        f"| largest loss gap, first {first} steps | | | {max(gaps):.2e} | <= 1e-4 |",
        "",
        "| step | " + " | ".join(str(i + 1) for i in range(first)) + " |",
        "|---|" + "---|" * first,
        *[
            f"| {s} | " + " | ".join(f"{v:.6f}" for v in runs[s][0]["loss"][:first]) + " |"
            for s in ("leantrain", "trl")
        ],
    ]
    print(write_results(Path(args.results), "dpo_vs_trl", page, env, data))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="The instruction-tuned model (preference_sst2.py's W/sft/model)")
    parser.add_argument("--pairs", required=True, help="Training pairs (preference_sst2.py's W/pairs_train.jsonl)")
    parser.add_argument("--eval-pairs", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--warmup", type=int, default=5, help="Steps left out of the speed")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--cache", default=None)
    parser.add_argument("--results", default=str(RESULTS))
    parser.add_argument("--side", choices=("leantrain", "trl"), default=None, help=argparse.SUPPRESS)
    parser.add_argument("--out", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--ordered", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.side:
        one_side(args)
    else:
        compare(args)


if __name__ == "__main__":
    main()
