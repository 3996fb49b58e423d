"""Data parallelism on this machine: 1 process against 2 (gloo), and what each optimizer step all-reduces.

The job: the embedded MiniLM (22.7 M parameters) fine-tuned on SST-2's first 1,000 training rows
(`shared/data/sst2/train_1k.tsv`; 10% held out for evaluation), fp32, AdamW, max length 128,
length-grouped batches, a global batch of 32 examples per optimizer step, `--steps` optimizer steps.

Configurations (same global batch, so the same examples per step):

* 1 process with 2 threads, batch 32 (and with 1 thread: on a loaded machine, two OpenMP threads that
  must meet at every barrier can be slower than one);
* 2 processes (torchrun, gloo) with 1 thread each, batch 16 each: DDP all-reduces the gradients once
  per optimizer step;
* the same with `--grad-accum 2` (batch 8 x 2 micro-batches): still once per optimizer step, since the
  loop skips the all-reduce (`no_sync`) on all but the last micro-batch;
* the same with `--local-sgd-steps 4`: no gradient all-reduce; parameters averaged every 4 steps.

Bytes all-reduced are *measured*: each rank runs plain `leantrain train` under torchrun with a DDP
communication hook that counts the bytes of every gradient bucket it all-reduces (this file's
`--worker` mode); local SGD's parameter averaging is counted by leantrain itself
(`local_sgd_bytes_communicated` in metrics.json). Samples/s are leantrain's own
(`train_samples_per_second`: all training examples over the loop's time; `steady_samples_per_second`
leaves out the first warm-up steps).

    python benchmarks/data_parallel.py                 # writes benchmarks/results/data_parallel.md
    python benchmarks/data_parallel.py --steps 4 --no-write
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

os.environ.setdefault("HF_HUB_OFFLINE", "1")

REPO = Path(__file__).resolve().parents[1]
DEFAULT_DATA = REPO.parent / "shared" / "data" / "sst2" / "train_1k.tsv"
DEFAULT_OUT = REPO / "benchmarks" / "results"
GLOBAL_BATCH = 32

# name: (processes, threads per process, train flags)
CONFIGS = {
    "1 process": (1, 2, {"batch_size": 32}),
    "1 process, 1 thread": (1, 1, {"batch_size": 32}),
    "2 processes (DDP)": (2, 1, {"batch_size": 16}),
    "2 processes, --grad-accum 2": (2, 1, {"batch_size": 8, "grad_accum": 2}),
    "2 processes, --local-sgd-steps 4": (2, 1, {"batch_size": 16, "local_sgd_steps": 4}),
}


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--data", type=Path, default=DEFAULT_DATA, help="training TSV (default: %(default)s)")
    p.add_argument("--steps", type=int, default=20, help="optimizer steps per run (global batch 32)")
    p.add_argument("--repeats", type=int, default=1, help="rounds over all configurations (median reported)")
    p.add_argument("--out-dir", type=Path, default=DEFAULT_OUT)
    p.add_argument("--no-write", action="store_true", help="print the results, write no files")
    p.add_argument("--timeout", type=int, default=900, help="seconds one run may take before it is killed")
    p.add_argument(
        "--render",
        type=Path,
        metavar="JSON",
        help="rewrite the markdown from a data_parallel.json written earlier; run nothing",
    )
    return p.parse_args(argv)


# --- one rank: plain `leantrain train`, plus a DDP hook that counts all-reduced bytes -----------------------


def worker(out: str, argv: list[str]) -> int:
    import torch.distributed as dist
    from torch import nn
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    import leantrain.parallel.local_sgd as local_sgd
    from leantrain.commands.cli import main

    counts = {"allreduce_bytes": 0, "allreduce_calls": 0}

    def counting_hook(state, bucket):
        buf = bucket.buffer()
        counts["allreduce_bytes"] += buf.numel() * buf.element_size()
        counts["allreduce_calls"] += 1
        return default_hooks.allreduce_hook(state, bucket)

    original_init = local_sgd.LocalSGD.__init__

    def init(self, model, *args, **kwargs):  # the loop builds LocalSGD right after prepare(), before any backward
        if isinstance(model, nn.parallel.DistributedDataParallel):
            model.register_comm_hook(None, counting_hook)
        original_init(self, model, *args, **kwargs)

    local_sgd.LocalSGD.__init__ = init
    try:
        return main(argv)
    finally:
        rank = dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
        Path(f"{out}.{rank}.json").write_text(json.dumps(counts))


# --- the driver -------------------------------------------------------------------------------------------------


def run(name: str, args, root: Path) -> dict:
    nproc, threads, extra = CONFIGS[name]
    out_dir = root / f"run-{len(list(root.glob('run-*')))}"
    counts = root / f"counts-{out_dir.name}"
    flags = {
        "data": args.data,
        "max_steps": args.steps,
        "precision": "fp32",
        "max_length": 128,
        "output_dir": out_dir,
        "cache_dir": root / "cache",
        "log_every": max(1, args.steps),
        **extra,
    }
    argv = ["train", "--no-progress"]
    for key, value in flags.items():
        argv += ["--" + key.replace("_", "-"), str(value)]
    me = [str(Path(__file__).resolve()), "--worker", str(counts), "--"]
    if nproc == 1:
        cmd = [sys.executable, *me, *argv]
    else:
        cmd = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node",
            str(nproc),
            *me,
            *argv,
        ]
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "TOKENIZERS_PARALLELISM": "false"}
    started = time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.timeout)
    wall = time.perf_counter() - started
    if proc.returncode != 0:
        raise SystemExit(f"{name}: failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}")
    metrics = json.loads((out_dir / "metrics.json").read_text())
    ranks = [json.loads(Path(f"{counts}.{r}.json").read_text()) for r in range(nproc)]
    steps = metrics["optimizer_steps"]
    ddp_bytes = ranks[0]["allreduce_bytes"]
    local_bytes = metrics.get("local_sgd_bytes_communicated") or 0
    return {
        "config": name,
        "processes": nproc,
        "threads": threads,
        "batch_per_process": extra["batch_size"],
        "grad_accum": extra.get("grad_accum", 1),
        "global_batch": metrics["global_batch"],
        "steps": steps,
        "samples_per_second": metrics["train_samples_per_second"],
        "steady_samples_per_second": metrics["steady_samples_per_second"],
        "allreduce_bytes_per_step": (ddp_bytes + local_bytes) / steps,
        "ddp_allreduce_calls_per_step": ranks[0]["allreduce_calls"] / steps,
        "gradient_bytes": metrics["gradients_bytes"],
        "local_sgd_syncs": metrics.get("local_sgd_syncs"),
        "eval_accuracy": metrics["eval_accuracy"],
        "wall_seconds": wall,
    }


def environment() -> dict:
    import accelerate
    import torch
    import transformers

    from leantrain.parallel import cpu_name

    return {
        "cpu": cpu_name(),
        "cores": len(os.sched_getaffinity(0)),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "accelerate": accelerate.__version__,
        "transformers": transformers.__version__,
        "load_average": os.getloadavg(),
        "date": time.strftime("%Y-%m-%d"),
    }


def summarise(results: list[dict]) -> list[dict]:
    rows = []
    for name in CONFIGS:
        mine = [r for r in results if r["config"] == name]
        row = dict(mine[0])
        for key in ("samples_per_second", "steady_samples_per_second", "wall_seconds"):
            row[key] = statistics.median(r[key] for r in mine)
        row["samples_per_second_all"] = [r["samples_per_second"] for r in mine]
        rows.append(row)
    return rows


def markdown(rows: list[dict], env_before: dict, load_after, args) -> str:
    mb = 1 / 2**20
    grad = rows[0]["gradient_bytes"]
    lines = [
        "# Data parallelism on this machine: 1 process against 2",
        "",
        f"Written by `benchmarks/data_parallel.py` on {env_before.get('date', time.strftime('%Y-%m-%d'))}. "
        "MiniLM-L6 (embedded), "
        f"SST-2 first 1,000 training rows (900 trained on), fp32, AdamW, max length 128, global batch "
        f"{GLOBAL_BATCH}, {args.steps} optimizer steps per run, {args.repeats} round(s) (median shown).",
        "",
        f"Hardware: {env_before['cpu']}, {env_before['cores']} cores. Python {env_before['python']}, "
        f"torch {env_before['torch']}, accelerate {env_before['accelerate']}, "
        f"transformers {env_before['transformers']}. Load average at start "
        f"{' / '.join(f'{x:.1f}' for x in env_before['load_average'])}, at end "
        f"{' / '.join(f'{x:.1f}' for x in load_after)} (1/5/15 min): other jobs shared the 2 cores, "
        "so treat the speeds as rough.",
        "",
        "| configuration | processes x threads | batch per process x accumulation | samples/s (train) | "
        "samples/s (steady) | each round (train) | all-reduced per optimizer step | DDP all-reduce calls per step |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['config']} | {r['processes']} x {r['threads']} | {r['batch_per_process']} x {r['grad_accum']} | "
            f"{r['samples_per_second']:.1f} | {r['steady_samples_per_second']:.1f} | "
            f"{', '.join(f'{x:.1f}' for x in r['samples_per_second_all'])} | "
            f"{r['allreduce_bytes_per_step'] * mb:.1f} MiB | {r['ddp_allreduce_calls_per_step']:.1f} |"
        )
    k = CONFIGS["2 processes, --local-sgd-steps 4"][2]["local_sgd_steps"]
    lines += [
        "",
        f"Gradient (= trainable parameter) bytes: {grad:,} ({grad * mb:.1f} MiB, fp32). Expected per optimizer "
        f"step: DDP {grad * mb:.1f} MiB (every gradient once, in buckets); with `--grad-accum 2` the same, once "
        f"per optimizer step, not per micro-batch; with `--local-sgd-steps {k}` no gradients but the parameters "
        f"every {k} steps: {grad / k * mb:.1f} MiB per step on average. Measured values above come from a DDP "
        "communication hook (gradient buckets) and leantrain's own count of local SGD's parameter averaging; "
        "not counted: DDP's one-off parameter broadcast at wrap time and its broadcast of BERT's two int64 "
        "buffers (position and token type ids, 8 KiB) before every forward.",
        "",
        _verdict(rows),
        "",
    ]
    return "\n".join(lines)


def _verdict(rows: list[dict]) -> str:
    by = {r["config"]: r["steady_samples_per_second"] for r in rows}
    two, one, single = by["2 processes (DDP)"], by["1 process"], by["1 process, 1 thread"]
    return (
        f"Steady throughput of 2 processes against 1 process with 2 threads: {two / one:.2f}x; against 1 "
        f"process with 1 thread: {two / single:.2f}x. On 2 quiet cores two single-threaded processes do the "
        "same arithmetic as one process with two threads, plus a gloo all-reduce of every gradient over "
        "loopback each step, so no speed-up is to be expected (a quiet machine of this kind gave 20.6 "
        "against 27.3 samples/s); when other jobs share the cores, two OpenMP threads that wait for each "
        "other at every barrier suffer more than two independent processes, which can reverse the order. "
        "What several processes are for on this machine is correctness (tests/parallel: 2 processes equal 1 "
        "to 1e-5); they pay off where each gets its own cores or GPU."
    )


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.render:
        saved = json.loads(args.render.read_text())
        args.steps, args.repeats = saved["steps"], saved["repeats"]
        text = markdown(saved["rows"], saved["environment"], saved["load_average_after"], args)
        (args.out_dir / "data_parallel.md").write_text(text)
        print(text)
        return 0
    env_before = environment()
    results = []
    with tempfile.TemporaryDirectory(prefix="leantrain-dp-bench-") as tmp:
        root = Path(tmp)
        for round_ in range(args.repeats):
            for name in CONFIGS:
                r = run(name, args, root)
                results.append(r)
                print(
                    f"[{round_ + 1}/{args.repeats}] {name}: {r['samples_per_second']:.1f} samples/s "
                    f"(steady {r['steady_samples_per_second']:.1f}), "
                    f"{r['allreduce_bytes_per_step'] / 2**20:.1f} MiB all-reduced per step, "
                    f"wall {r['wall_seconds']:.0f} s",
                    flush=True,
                )
    rows = summarise(results)
    load_after = os.getloadavg()
    text = markdown(rows, env_before, load_after, args)
    print(text)
    if not args.no_write:
        args.out_dir.mkdir(parents=True, exist_ok=True)
        (args.out_dir / "data_parallel.md").write_text(text)
        (args.out_dir / "data_parallel.json").write_text(
            json.dumps(
                {
                    "environment": env_before,
                    "load_average_after": load_after,
                    "steps": args.steps,
                    "repeats": args.repeats,
                    "rows": rows,
                },
                indent=2,
            )
            + "\n"
        )
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--worker":
        rest = sys.argv[3:]
        sys.exit(worker(sys.argv[2], rest[1:] if rest[:1] == ["--"] else rest))
    sys.exit(main())
