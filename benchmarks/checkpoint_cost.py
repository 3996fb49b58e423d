"""What a checkpoint costs: the time and size of one save, and the time a resumed run takes to its first step.

The job: the embedded all-MiniLM-L6-v2 with AdamW (fused), fp32, batch 32, max length 128, on a small
SST-2 slice (default ../shared/data/sst2/train_1k.tsv, 10% held out). Tokenization is cached by an untimed
warm-up run first.

* save: `--save-every 1` for a few steps; each `CheckpointDir.save` is timed, with how much of it went
  to fsync and to the CRC-32 of the files (the rest is serialising and writing). Size: the checkpoint
  folder on disk, per file.
* resume: `train()` called with `--resume` on the step-2 checkpoint, timed from the call to the start of
  its first forward pass (and to the end of that step), against the same for a fresh run (both in this
  process, imports done); plus the verification (sizes and checksums) and the restore (weights,
  optimizer, scheduler, RNG) alone. Steps differ in cost with their batch's length (batches are
  length-grouped), so the set-up time is the comparable figure.

    python benchmarks/checkpoint_cost.py              # writes benchmarks/results/checkpoint_cost.{md,json}
    python benchmarks/checkpoint_cost.py --no-write   # print only
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

REPO = Path(__file__).resolve().parents[1]
DEFAULT_DATA = REPO.parent / "shared" / "data" / "sst2" / "train_1k.tsv"
DEFAULT_OUT = REPO / "benchmarks" / "results"
JOB = dict(
    batch_size=32, lr=5e-5, max_length=128, optimizer="adamw", precision="fp32", seed=42, log_every=1, progress=False
)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", type=Path, default=DEFAULT_DATA, help="training TSV/CSV (default: %(default)s)")
    p.add_argument("--saves", type=int, default=4, help="checkpoints saved (one per step) in the save run")
    p.add_argument("--repeats", type=int, default=3, help="fresh and resumed runs timed to their first step")
    p.add_argument("--out-dir", type=Path, default=DEFAULT_OUT)
    p.add_argument("--no-write", action="store_true")
    return p.parse_args(argv)


class Timers:
    """Wraps functions to add up the seconds spent in them."""

    def __init__(self):
        self.seconds: dict[str, list[float]] = {}
        self._undo = []

    def wrap(self, owner, name: str, label: str) -> None:
        original = getattr(owner, name)

        def timed(*args, **kwargs):
            start = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                self.seconds.setdefault(label, []).append(time.perf_counter() - start)

        setattr(owner, name, timed)
        self._undo.append((owner, name, original))

    def undo(self) -> None:
        for owner, name, original in reversed(self._undo):
            setattr(owner, name, original)
        self._undo.clear()


def time_to_first_step(cfg) -> tuple[float, float, dict]:
    """Seconds from calling train() to the start of its first forward pass (set-up, including any restore),
    and to its first optimizer update (the first step's forward and backward done, which depend on the batch)."""
    from leantrain import train
    from leantrain.training import Hooks

    begun, done = [], []

    class FirstStep(Hooks):
        def on_micro_batch(self, model, batch):
            if not begun:
                begun.append(time.perf_counter())

        def before_optimizer_step(self, step):
            if step == 1 and not done:
                done.append(time.perf_counter())

    start = time.perf_counter()
    result = train(cfg, hooks=FirstStep())
    return begun[0] - start, done[0] - start, result.metrics


def main(argv=None) -> int:
    args = parse_args(argv)
    import accelerate
    import torch
    import transformers

    import leantrain
    from leantrain import TrainConfig, train
    from leantrain.parallel import cpu_name
    from leantrain.run import checkpoint

    if not args.data.is_file():
        print(f"no data at {args.data}", file=sys.stderr)
        return 2
    load_before = os.getloadavg()[0]
    work = Path(tempfile.mkdtemp(prefix="leantrain-ckpt-bench-"))
    base = dict(JOB, data=str(args.data), cache_dir=str(work / "cache"))

    def cfg(name, **changes):
        return TrainConfig(**{**base, "output_dir": str(work / name), **changes})

    print("warm-up (tokenization cache, kernels)...", file=sys.stderr)
    train(cfg("warmup", max_steps=1))

    # -- saving ------------------------------------------------------------------------------------------
    timers = Timers()
    timers.wrap(checkpoint.CheckpointDir, "save", "save")
    timers.wrap(checkpoint.os, "fsync", "fsync")
    timers.wrap(checkpoint, "_crc32", "crc32")
    try:
        saved = train(cfg("saves", max_steps=args.saves, save_every=1))
    finally:
        timers.undo()
    saves = timers.seconds["save"]
    fsync_total, crc_total = sum(timers.seconds.get("fsync", [])), sum(timers.seconds.get("crc32", []))
    ckpt = saved.output_dir / "checkpoints" / "step-000002"
    files = {p.name: p.stat().st_size for p in sorted(ckpt.iterdir())}
    step_seconds = saved.metrics["train_seconds"] / args.saves

    # -- resuming -----------------------------------------------------------------------------------------
    fresh, resumed, fresh_step, resumed_step, verify, restore = [], [], [], [], [], []
    for i in range(args.repeats):
        t, t_step, _ = time_to_first_step(cfg(f"fresh{i}", max_steps=1))
        fresh.append(t)
        fresh_step.append(t_step)
        timers.wrap(checkpoint, "verify", "verify")
        timers.wrap(checkpoint, "restore", "restore")
        try:
            t, t_step, metrics = time_to_first_step(cfg(f"resumed{i}", max_steps=3, resume=str(ckpt)))
        finally:
            timers.undo()
        assert metrics["resumed_from"] == str(ckpt)
        resumed.append(t)
        resumed_step.append(t_step)
        verify.append(timers.seconds["verify"][-1])
        restore.append(timers.seconds["restore"][-1])
    load_after = os.getloadavg()[0]

    mb = 1 / 2**20
    med = statistics.median
    results = {
        "job": {**JOB, "data": str(args.data), "model": "embedded all-MiniLM-L6-v2"},
        "checkpoint_bytes": sum(files.values()),
        "files": files,
        "save_seconds": saves,
        "save_seconds_median": med(saves),
        "fsync_seconds_per_save": fsync_total / len(saves),
        "crc32_seconds_per_save": crc_total / len(saves),
        "train_seconds_per_step": step_seconds,
        "setup_seconds_fresh": fresh,
        "setup_seconds_resumed": resumed,
        "first_step_done_seconds_fresh": fresh_step,
        "first_step_done_seconds_resumed": resumed_step,
        "verify_seconds": verify,
        "restore_seconds": restore,
        "weights_bytes": saved.metrics["weights_bytes"],
        "optimizer_state_bytes": saved.metrics["optimizer_state_bytes"],
        "load_average_before_after": [load_before, load_after],
        "hardware": {"cpu": cpu_name(), "cores": os.cpu_count(), "torch_threads": torch.get_num_threads()},
        "versions": {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "accelerate": accelerate.__version__,
            "leantrain": leantrain.__version__,
        },
        "run_at": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
    }
    size_rows = "\n".join(
        f"| `{name}` | {size * mb:,.1f} MB |" if size >= 2**20 else f"| `{name}` | {size / 1024:,.1f} KB |"
        for name, size in files.items()
    )
    md = f"""# What a checkpoint costs

Job: {results["job"]["model"]} with fused AdamW, fp32, batch 32, max length 128, on `{args.data.name}`
(10% held out), `--save-every 1` for {args.saves} steps; then a run resumed from the step-2 checkpoint.

| what | figure |
|---|---|
| one checkpoint on disk | {results["checkpoint_bytes"] * mb:,.1f} MB (weights {results["weights_bytes"] * mb:,.1f} MB, AdamW state {results["optimizer_state_bytes"] * mb:,.1f} MB) |
| one save, median of {len(saves)} | {med(saves):.2f} s (each: {", ".join(f"{s:.2f}" for s in saves)}) |
| of which fsync / CRC-32 | {results["fsync_seconds_per_save"]:.2f} s / {results["crc32_seconds_per_save"]:.2f} s |
| one training step (for scale) | {step_seconds:.2f} s |
| `train()` to the first step's forward, fresh | {med(fresh):.1f} s (each: {", ".join(f"{s:.1f}" for s in fresh)}) |
| `train()` to the first step's forward, resumed at step 2 | {med(resumed):.1f} s (each: {", ".join(f"{s:.1f}" for s in resumed)}) |
| `train()` to the end of the first step, fresh / resumed | {med(fresh_step):.1f} s / {med(resumed_step):.1f} s (the batches differ in length) |
| of which verifying the checkpoint (sizes, CRC-32) | {med(verify):.2f} s |
| of which restoring it (weights, optimizer, scheduler, RNG) | {med(restore):.2f} s |

Files of one checkpoint:

| file | size |
|---|---|
{size_rows}

Saving every N steps costs about (one save) / (N x one step) of the training time: here
{med(saves) / step_seconds:.1f} steps' worth per save. Resuming needs no replay of the data: the sampler
seeks to the step, so its cost is verification plus restore, whatever the step. Figures on a shared,
noisy machine (1-minute load average {load_before:.1f} before, {load_after:.1f} after); repeat runs differ.

## Hardware and versions

- CPU: {results["hardware"]["cpu"]}, {results["hardware"]["cores"]} cores, torch threads {results["hardware"]["torch_threads"]}
- python {results["versions"]["python"]}, torch {results["versions"]["torch"]}, transformers {results["versions"]["transformers"]}, accelerate {results["versions"]["accelerate"]}, leantrain {results["versions"]["leantrain"]}
- run {results["run_at"]}; disk: the temporary folder {work.parent}

## Command

```
python benchmarks/checkpoint_cost.py {shlex.join(argv if argv is not None else sys.argv[1:])}
```
"""  # noqa: E501 - markdown table rows and list items cannot be wrapped
    print(md)
    if not args.no_write:
        args.out_dir.mkdir(parents=True, exist_ok=True)
        (args.out_dir / "checkpoint_cost.md").write_text(md)
        (args.out_dir / "checkpoint_cost.json").write_text(json.dumps(results, indent=2) + "\n")
    import shutil

    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
