"""leantrain against the Hugging Face Trainer at its best settings: one fine-tuning job, both ways.

The job: the embedded MiniLM fine-tuned on a fixed slice of SST-2 (default the first 2,000 rows of
train.tsv), evaluated on dev.tsv; batch 32, lr 5e-5, 1 epoch, max length 128, weight decay 0.01,
warm-up 6%, linear schedule, gradient clipping 1.0, seed 42, in fp32 and in bf16.

The Trainer gets what a careful user would give it on this CPU: length-grouped batches
(`train_sampling_strategy="group_by_length"`), fused AdamW, dynamic padding, no logging, saving or
progress bars, no dataloader workers (2 cores). Tokenization happens before the clock starts on both
sides.

Throughput: leantrain's own `train_samples_per_second` (its training loop only); for the Trainer,
training examples / wall seconds of `trainer.train()`. The Trainer's loop-only time (from its
`on_train_begin` to `on_train_end` callbacks) is recorded as well, to show how much of `train()` is
set-up. The machine is shared and noisy, so the two sides run back to back, pair after pair, and
every pair's ratio is reported, plus the median.

    python benchmarks/trainer_comparison.py                       # full run, writes benchmarks/results/
    python benchmarks/trainer_comparison.py --train-rows 200      # quick check
"""

from __future__ import annotations

import argparse
import csv
import gc
import json
import os
import platform
import shlex
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the model is a local folder; never wait on the Hub

REPO = Path(__file__).resolve().parents[1]
DEFAULT_DATA = REPO.parent / "shared" / "data" / "sst2"
DEFAULT_OUT = REPO / "benchmarks" / "results"

# The job both sides run. Any change here changes both sides.
JOB = dict(batch_size=32, lr=5e-5, epochs=1, max_length=128, weight_decay=0.01, warmup_ratio=0.06,
           scheduler="linear", max_grad_norm=1.0, seed=42)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data-dir", type=Path, default=DEFAULT_DATA,
                   help="folder holding SST-2's train.tsv and dev.tsv (default: %(default)s)")
    p.add_argument("--train-rows", type=int, default=2000, help="first N rows of train.tsv to train on")
    p.add_argument("--precisions", default="fp32,bf16", help="comma-separated: fp32, bf16")
    p.add_argument("--repeats", type=int, default=1, help="back-to-back (leantrain, Trainer) pairs per precision")
    p.add_argument("--no-warmup", action="store_true",
                   help="skip the untimed 2-step run of each side per precision (warms kernels and "
                        "leantrain's tokenization cache)")
    p.add_argument("--out-dir", type=Path, default=DEFAULT_OUT, help="where the .md and .json go")
    p.add_argument("--no-write", action="store_true", help="print the results, write no files")
    args = p.parse_args(argv)
    args.precisions = [x.strip() for x in args.precisions.split(",") if x.strip()]
    bad = [x for x in args.precisions if x not in ("fp32", "bf16")]
    if bad:
        p.error(f"--precisions: unknown {bad}; use fp32 and/or bf16")
    if args.train_rows < JOB["batch_size"] or args.repeats < 1:
        p.error("--train-rows must be at least one batch (32) and --repeats at least 1")
    return args


# --- data -------------------------------------------------------------------------------------------


def read_tsv(path: Path) -> tuple[list[str], list[int]]:
    """SST-2 is GLUE TSV: unquoted, so a bare " is part of the text (hence QUOTE_NONE)."""
    with path.open(encoding="utf-8", newline="") as f:
        rows = list(csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE))
    return [r["sentence"] for r in rows], [int(r["label"]) for r in rows]


def write_train_slice(src: Path, dst: Path, rows: int) -> int:
    """The header and the first `rows` data lines, byte for byte, so both sides read the same file."""
    lines = []
    with src.open(encoding="utf-8", newline="") as f:
        for line in f:
            lines.append(line)
            if len(lines) == rows + 1:
                break
    dst.write_text("".join(lines), encoding="utf-8", newline="")
    return len(lines) - 1


# --- leantrain side ------------------------------------------------------------------------------


def leantrain_train_function():
    """`leantrain.train`, the function. In leantrain 0.1.0 `from leantrain import train` recurses forever
    (the lazy package attribute `train` collides with the subpackage `leantrain.train`), and once that
    subpackage is imported the name means the module; so fall back to the subpackage's re-export."""
    try:
        from leantrain import train
    except RecursionError:
        from leantrain.train import train
    return train if callable(train) else train.train


def run_leantrain(model_path: Path, train_tsv: Path, dev_tsv: Path, precision: str, work: Path,
                  max_steps: int | None = None) -> dict:
    from leantrain import TrainConfig

    train = leantrain_train_function()
    cfg = TrainConfig(model=str(model_path), data=str(train_tsv), eval_data=str(dev_tsv),
                      batch_size=JOB["batch_size"], epochs=JOB["epochs"], lr=JOB["lr"],
                      max_length=JOB["max_length"], weight_decay=JOB["weight_decay"],
                      warmup_ratio=JOB["warmup_ratio"], scheduler=JOB["scheduler"],
                      max_grad_norm=JOB["max_grad_norm"], seed=JOB["seed"], precision=precision,
                      max_steps=max_steps, output_dir=str(work / "leantrain-run"), overwrite=True,
                      progress=False, cache_dir=str(work / "leantrain-cache"))
    m = train(cfg).metrics
    return {"samples_per_second": m["train_samples_per_second"], "train_seconds": m["train_seconds"],
            "train_examples": m["train_examples"], "optimizer_steps": m["optimizer_steps"],
            "eval_accuracy": m["eval_accuracy"], "train_loss": m["train_loss"],
            "padding_fraction": m["padding_fraction"], "precision": m["precision"]}


# --- Trainer side --------------------------------------------------------------------------------


def tokenize_for_trainer(model_path: Path, train_tsv: Path, dev_tsv: Path):
    """datasets.Dataset objects, tokenized without padding (DataCollatorWithPadding pads per batch)."""
    import datasets
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(model_path))

    def build(path: Path):
        texts, labels = read_tsv(path)
        enc = tok(texts, truncation=True, max_length=JOB["max_length"])
        return datasets.Dataset.from_dict({**enc, "labels": labels})

    return tok, build(train_tsv), build(dev_tsv)


def run_trainer(model_path: Path, tok, train_ds, dev_ds, precision: str, work: Path,
                max_steps: int | None = None) -> dict:
    import numpy as np
    from transformers import (AutoModelForSequenceClassification, DataCollatorWithPadding, Trainer,
                              TrainerCallback, TrainingArguments, set_seed)

    class LoopClock(TrainerCallback):
        """Times the Trainer's loop alone, to separate set-up inside train() from training."""

        def on_train_begin(self, args, state, control, **kw):
            self.begin = time.perf_counter()

        def on_train_end(self, args, state, control, **kw):
            self.end = time.perf_counter()

    set_seed(JOB["seed"])  # the new classification head is initialised here, before Trainer seeds again
    model = AutoModelForSequenceClassification.from_pretrained(str(model_path), num_labels=2)
    args = TrainingArguments(
        output_dir=str(work / "trainer-run"),
        per_device_train_batch_size=JOB["batch_size"], per_device_eval_batch_size=2 * JOB["batch_size"],
        learning_rate=JOB["lr"], num_train_epochs=JOB["epochs"], max_steps=max_steps or -1,
        weight_decay=JOB["weight_decay"],
        warmup_steps=JOB["warmup_ratio"],  # transformers 5: a float below 1 is a ratio (no warmup_ratio)
        lr_scheduler_type=JOB["scheduler"], max_grad_norm=JOB["max_grad_norm"], seed=JOB["seed"],
        train_sampling_strategy="group_by_length",  # v5 name of group_by_length: 3% padding, not 44%
        optim="adamw_torch_fused",  # 4x faster optimizer step on CPU than foreach
        bf16=(precision == "bf16"), use_cpu=True,
        report_to=[], save_strategy="no", eval_strategy="no", logging_strategy="no", disable_tqdm=True,
        dataloader_num_workers=0,  # 2 cores: workers would steal them from the model
    )
    clock = LoopClock()
    trainer = Trainer(model=model, args=args, train_dataset=train_ds, processing_class=tok,
                      data_collator=DataCollatorWithPadding(tok), callbacks=[clock])
    t0 = time.perf_counter()
    out = trainer.train()
    wall = time.perf_counter() - t0
    examples = min(out.global_step * JOB["batch_size"], len(train_ds)) if max_steps else len(train_ds)
    pred = trainer.predict(dev_ds)
    accuracy = float((np.argmax(pred.predictions, axis=-1) == pred.label_ids).mean())
    loop = clock.end - clock.begin
    return {"samples_per_second": examples / wall, "train_seconds": wall, "train_examples": examples,
            "loop_seconds": loop, "loop_samples_per_second": examples / loop,
            "optimizer_steps": out.global_step, "eval_accuracy": accuracy, "train_loss": out.training_loss}


# --- the comparison ------------------------------------------------------------------------------


def environment() -> dict:
    import accelerate
    import datasets
    import torch
    import transformers

    import leantrain

    cpu = "?"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"cpu": cpu, "cores": os.cpu_count(), "torch_threads": torch.get_num_threads(),
            "python": platform.python_version(), "torch": torch.__version__,
            "transformers": transformers.__version__, "accelerate": accelerate.__version__,
            "datasets": datasets.__version__, "leantrain": leantrain.__version__,
            "leantrain_source": leantrain_source(Path(leantrain.__file__).parent)}


def leantrain_source(pkg: Path) -> str:
    """Which leantrain ran: the folder imported, and this repo's commit (with "+ uncommitted changes" when
    the imported code is this checkout's src/ and it differs from the commit)."""
    import subprocess

    def git(*a):
        return subprocess.run(["git", "-C", str(REPO), *a], capture_output=True, text=True).stdout.strip()

    commit = git("rev-parse", "--short", "HEAD") or "?"
    if pkg.resolve().is_relative_to((REPO / "src").resolve()):
        dirty = git("status", "--porcelain", "--", "src")
        return f"{pkg} (commit {commit}{' + uncommitted changes' if dirty else ''})"
    return f"{pkg} (outside this checkout; repo HEAD is {commit})"


def free_memory() -> None:
    gc.collect()  # each run loads its own model; drop the last one before the next starts


def main(argv=None) -> int:
    args = parse_args(argv)
    train_src, dev_tsv = args.data_dir / "train.tsv", args.data_dir / "dev.tsv"
    if not (train_src.is_file() and dev_tsv.is_file()):
        print(f"skipped: SST-2 not found in {args.data_dir} (needs train.tsv and dev.tsv)")
        return 0

    from leantrain.models import embedded_model_path

    model_path = embedded_model_path()
    env = environment()
    command = "python " + " ".join(shlex.quote(a) for a in [os.path.relpath(__file__, REPO), *sys.argv[1:]])
    if os.environ.get("PYTHONPATH"):  # it may pick which leantrain runs, so it is part of the command
        command = f"PYTHONPATH={shlex.quote(os.environ['PYTHONPATH'])} {command}"
    print(f"{env['cpu']}, {env['cores']} cores, torch threads {env['torch_threads']}", flush=True)

    pairs = []
    with tempfile.TemporaryDirectory(prefix="trainer_comparison_") as tmp:
        work = Path(tmp)
        train_tsv = work / "train.tsv"
        n_rows = write_train_slice(train_src, train_tsv, args.train_rows)
        tok, train_ds, dev_ds = tokenize_for_trainer(model_path, train_tsv, dev_tsv)
        print(f"training on the first {n_rows:,} rows of {train_src}; evaluating on {len(dev_ds):,} dev rows",
              flush=True)

        for precision in args.precisions:
            if not args.no_warmup:
                # Untimed: fills leantrain's tokenization cache and builds each precision's kernels on
                # both sides, so neither timed run pays a one-time cost the other does not.
                t = time.perf_counter()
                run_leantrain(model_path, train_tsv, dev_tsv, precision, work, max_steps=2)
                run_trainer(model_path, tok, train_ds, dev_ds, precision, work, max_steps=2)
                free_memory()
                print(f"[{precision}] warm-up done in {time.perf_counter() - t:.0f} s", flush=True)
            for rep in range(args.repeats):
                load_before = os.getloadavg()[0]
                lean = run_leantrain(model_path, train_tsv, dev_tsv, precision, work)
                free_memory()
                hf = run_trainer(model_path, tok, train_ds, dev_ds, precision, work)
                free_memory()
                pair = {"precision": precision, "repeat": rep + 1, "leantrain": lean, "trainer": hf,
                        "ratio": lean["samples_per_second"] / hf["samples_per_second"],
                        "ratio_vs_trainer_loop": lean["samples_per_second"] / hf["loop_samples_per_second"],
                        "load_avg_1min": [round(load_before, 2), round(os.getloadavg()[0], 2)]}
                pairs.append(pair)
                print(f"[{precision} #{rep + 1}] leantrain {lean['samples_per_second']:.1f} samples/s "
                      f"(acc {lean['eval_accuracy']:.4f}), Trainer {hf['samples_per_second']:.1f} samples/s "
                      f"(loop only {hf['loop_samples_per_second']:.1f}; acc {hf['eval_accuracy']:.4f}), "
                      f"ratio {pair['ratio']:.2f}; load {pair['load_avg_1min']}", flush=True)

    summary = summarise(pairs, args.precisions)
    result = {"job": {**JOB, "model": "embedded all-MiniLM-L6-v2", "train_rows": n_rows,
                      "train_data": f"first {n_rows} rows of SST-2 train.tsv", "eval_data": "SST-2 dev.tsv",
                      "eval_rows": len(dev_ds), "warmup_runs": not args.no_warmup},
              "summary": summary, "pairs": pairs, "environment": env, "command": command,
              "date": time.strftime("%Y-%m-%d %H:%M:%S %Z")}
    md = render_markdown(result)
    print("\n" + md)
    if not args.no_write:
        args.out_dir.mkdir(parents=True, exist_ok=True)
        (args.out_dir / "trainer_comparison.json").write_text(json.dumps(result, indent=2) + "\n")
        (args.out_dir / "trainer_comparison.md").write_text(md)
        print(f"wrote {args.out_dir / 'trainer_comparison.md'} and .json")
    return 0


def summarise(pairs: list[dict], precisions: list[str]) -> list[dict]:
    """Per precision: medians of each side and of the per-pair ratios, and the verdict on the goal."""
    rows = []
    for precision in precisions:
        ps = [p for p in pairs if p["precision"] == precision]
        med = lambda side, key: statistics.median(p[side][key] for p in ps)  # noqa: E731
        ratio = statistics.median(p["ratio"] for p in ps)
        lean_acc, hf_acc = med("leantrain", "eval_accuracy"), med("trainer", "eval_accuracy")
        rows.append({"precision": precision, "pairs": len(ps),
                     "leantrain_samples_per_second": med("leantrain", "samples_per_second"),
                     "trainer_samples_per_second": med("trainer", "samples_per_second"),
                     "trainer_loop_samples_per_second": med("trainer", "loop_samples_per_second"),
                     "ratio_median": ratio, "ratios": [p["ratio"] for p in ps],
                     "leantrain_eval_accuracy": lean_acc, "trainer_eval_accuracy": hf_acc,
                     "goal_met": ratio >= 1.0 and lean_acc >= hf_acc - 0.01})
    return rows


def render_markdown(r: dict) -> str:
    job, env = r["job"], r["environment"]
    out = ["# leantrain vs Hugging Face Trainer", "",
           f"One job both ways: {job['model']} fine-tuned on the {job['train_data']}, evaluated on "
           f"{job['eval_data']} ({job['eval_rows']} rows). Batch {job['batch_size']}, lr {job['lr']}, "
           f"{job['epochs']} epoch, max length {job['max_length']}, weight decay {job['weight_decay']}, "
           f"warm-up {job['warmup_ratio']:.0%}, {job['scheduler']} schedule, clipping {job['max_grad_norm']}, "
           f"seed {job['seed']}. Trainer: group_by_length sampling, fused AdamW, dynamic padding, "
           "no logging/saving/eval during training.", "",
           "samples/s: leantrain's `train_samples_per_second` (training loop only); Trainer: examples / wall "
           "seconds of `trainer.train()` (its loop alone, from the train-begin to the train-end callback, in "
           "brackets). Ratio = leantrain / Trainer, measured back to back; medians over pairs.", "",
           "| precision | leantrain samples/s | Trainer samples/s | ratio (median) | ratios per pair "
           "| leantrain dev acc | Trainer dev acc | goal met |",
           "|---|---|---|---|---|---|---|---|"]
    for s in r["summary"]:
        out.append(f"| {s['precision']} | {s['leantrain_samples_per_second']:.1f} "
                   f"| {s['trainer_samples_per_second']:.1f} ({s['trainer_loop_samples_per_second']:.1f}) "
                   f"| {s['ratio_median']:.2f} | {', '.join(f'{x:.2f}' for x in s['ratios'])} "
                   f"| {s['leantrain_eval_accuracy']:.4f} | {s['trainer_eval_accuracy']:.4f} "
                   f"| {'yes' if s['goal_met'] else 'no'} |")
    out += ["", "Goal: leantrain at least as fast as the Trainer (ratio >= 1) at equal accuracy (within one "
            "point). 1-minute load average before/after each pair is in the JSON; the machine is shared.", "",
            "## Hardware and versions", "",
            f"- CPU: {env['cpu']}, {env['cores']} cores, torch threads {env['torch_threads']}",
            f"- python {env['python']}, torch {env['torch']}, transformers {env['transformers']}, "
            f"accelerate {env['accelerate']}, datasets {env['datasets']}, leantrain {env['leantrain']}",
            f"- leantrain imported from {env['leantrain_source']}",
            f"- run {r['date']}", "", "## Command", "", "```", r["command"], "```", ""]
    return "\n".join(out)


if __name__ == "__main__":
    sys.exit(main())
