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
import dataclasses
import gc
import io
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the model is a local folder; never wait on the Hub

REPO = Path(__file__).resolve().parents[1]
DEFAULT_DATA = REPO.parent / "shared" / "data" / "sst2"
DEFAULT_OUT = REPO / "benchmarks" / "results"

QUIET_CORES = 0.25  # a pair is "quiet" when other processes used at most this much CPU during both runs

# The job both sides run. Any change here changes both sides.
JOB = dict(
    batch_size=32,
    lr=5e-5,
    epochs=1,
    max_length=128,
    weight_decay=0.01,
    warmup_ratio=0.06,
    scheduler="linear",
    max_grad_norm=1.0,
    seed=42,
)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--data-dir",
        type=Path,
        default=DEFAULT_DATA,
        help="folder holding SST-2's train.tsv and dev.tsv (default: %(default)s)",
    )
    p.add_argument("--train-rows", type=int, default=2000, help="first N rows of train.tsv to train on")
    p.add_argument("--precisions", default="fp32,bf16", help="comma-separated: fp32, bf16")
    p.add_argument("--repeats", type=int, default=1, help="back-to-back (leantrain, Trainer) pairs per precision")
    p.add_argument(
        "--no-warmup",
        action="store_true",
        help="skip the untimed 2-step run of each side per precision (warms kernels and "
        "leantrain's tokenization cache)",
    )
    p.add_argument(
        "--leantrain-rev",
        metavar="REV",
        help="benchmark leantrain as committed at this git revision (its src/ exported to a temp "
        "folder) rather than the installed one; useful while src/ is being edited",
    )
    p.add_argument(
        "--wait-quiet",
        type=float,
        default=0,
        metavar="SECONDS",
        help="before each pair, wait up to this long for other processes to use at most "
        f"{QUIET_CORES} cores (then run anyway; every pair records what it got)",
    )
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
    """`leantrain.train`, the function. Up to commit 5d01fb2 `from leantrain import train` recursed forever
    (the lazy package attribute `train` collided with the subpackage `leantrain.train`, and once that
    subpackage was imported the name meant the module); fall back to the subpackage's re-export there."""
    try:
        from leantrain import train
    except RecursionError:
        from leantrain.train import train
    return train if callable(train) else train.train


def run_leantrain(
    model_path: Path, train_tsv: Path, dev_tsv: Path, precision: str, work: Path, max_steps: int | None = None
) -> dict:
    from leantrain import TrainConfig

    train = leantrain_train_function()
    extra = {}
    if "report" in {f.name for f in dataclasses.fields(TrainConfig)}:
        extra["report"] = False  # report.html is written after training; the Trainer side writes nothing either
    cfg = TrainConfig(
        model=str(model_path),
        data=str(train_tsv),
        eval_data=str(dev_tsv),
        batch_size=JOB["batch_size"],
        epochs=JOB["epochs"],
        lr=JOB["lr"],
        max_length=JOB["max_length"],
        weight_decay=JOB["weight_decay"],
        warmup_ratio=JOB["warmup_ratio"],
        scheduler=JOB["scheduler"],
        max_grad_norm=JOB["max_grad_norm"],
        seed=JOB["seed"],
        precision=precision,
        max_steps=max_steps,
        output_dir=str(work / "leantrain-run"),
        overwrite=True,
        progress=False,
        cache_dir=str(work / "leantrain-cache"),
        **extra,
    )
    m = train(cfg).metrics
    # train_samples_per_second counts every step (like the Trainer's figure); steady_* skips the first few.
    return {
        "samples_per_second": m["train_samples_per_second"],
        "train_seconds": m["train_seconds"],
        "steady_samples_per_second": m.get("steady_samples_per_second"),
        "train_examples": m["train_examples"],
        "optimizer_steps": m["optimizer_steps"],
        "eval_accuracy": m["eval_accuracy"],
        "train_loss": m["train_loss"],
        "padding_fraction": m["padding_fraction"],
        "precision": m["precision"],
        "model_tflops": m.get("model_tflops"),
        "mfu": m.get("mfu"),
        "mfu_useful": m.get("mfu_useful"),
        "peak_tflops": m.get("peak_tflops"),
    }


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


def run_trainer(
    model_path: Path, tok, train_ds, dev_ds, precision: str, work: Path, max_steps: int | None = None
) -> dict:
    import numpy as np
    from transformers import (
        AutoModelForSequenceClassification,
        DataCollatorWithPadding,
        Trainer,
        TrainerCallback,
        TrainingArguments,
        set_seed,
    )

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
        per_device_train_batch_size=JOB["batch_size"],
        per_device_eval_batch_size=2 * JOB["batch_size"],
        learning_rate=JOB["lr"],
        num_train_epochs=JOB["epochs"],
        max_steps=max_steps or -1,
        weight_decay=JOB["weight_decay"],
        warmup_steps=JOB["warmup_ratio"],  # transformers 5: a float below 1 is a ratio (no warmup_ratio)
        lr_scheduler_type=JOB["scheduler"],
        max_grad_norm=JOB["max_grad_norm"],
        seed=JOB["seed"],
        train_sampling_strategy="group_by_length",  # v5 name of group_by_length: 3% padding, not 44%
        optim="adamw_torch_fused",  # 4x faster optimizer step on CPU than foreach
        bf16=(precision == "bf16"),
        use_cpu=True,
        report_to=[],
        save_strategy="no",
        eval_strategy="no",
        logging_strategy="no",
        disable_tqdm=True,
        dataloader_num_workers=0,  # 2 cores: workers would steal them from the model
    )
    clock = LoopClock()
    flops = TrainingFlops(model, precision)
    trainer = Trainer(
        model=model,
        args=args,
        train_dataset=train_ds,
        processing_class=tok,
        data_collator=DataCollatorWithPadding(tok),
        callbacks=[clock],
    )
    t0 = time.perf_counter()
    out = trainer.train()
    wall = time.perf_counter() - t0
    examples = min(out.global_step * JOB["batch_size"], len(train_ds)) if max_steps else len(train_ds)
    pred = trainer.predict(dev_ds)
    accuracy = float((np.argmax(pred.predictions, axis=-1) == pred.label_ids).mean())
    loop = clock.end - clock.begin
    flops.remove_hook()
    return {
        **flops.row(wall, loop),
        "samples_per_second": examples / wall,
        "train_seconds": wall,
        "train_examples": examples,
        "loop_seconds": loop,
        "loop_samples_per_second": examples / loop,
        "optimizer_steps": out.global_step,
        "eval_accuracy": accuracy,
        "train_loss": out.training_loss,
    }


class TrainingFlops:
    """MFU for the Trainer, computed as leantrain computes its own: leantrain's FLOP model of this model
    (telemetry/flops.py) applied to every training batch the model sees (a forward pre-hook reads the
    batch's shape and attention mask), over the same peak (telemetry/peak.py, same precision)."""

    def __init__(self, model, precision: str):
        from leantrain.telemetry.flops import FlopMeter, flop_model
        from leantrain.telemetry.peak import device_peak

        self.meter = FlopMeter(flop_model(model), device_peak("cpu", precision).flops_per_second)
        self._handle = model.register_forward_pre_hook(self._count, with_kwargs=True)

    def _count(self, module, args, kwargs):
        if module.training and kwargs.get("input_ids") is not None:  # eval batches are not training FLOPs
            self.meter.add(kwargs["input_ids"], kwargs.get("attention_mask"))

    def remove_hook(self) -> None:
        self._handle.remove()

    def row(self, wall_seconds: float, loop_seconds: float) -> dict:
        from leantrain.telemetry.flops import mfu

        m = self.meter.metrics(wall_seconds)
        return {
            "model_tflops": m["model_tflops"],
            "mfu": m["mfu"],  # over the wall time of trainer.train(), like its samples/s
            "mfu_useful": m["mfu_useful"],
            "mfu_loop": mfu(self.meter.flops, loop_seconds, self.meter.peak),
            "peak_tflops": (self.meter.peak or 0) / 1e12,
        }


# --- the comparison ------------------------------------------------------------------------------


def environment(rev_commit: str | None) -> dict:
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
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "accelerate": accelerate.__version__,
        "datasets": datasets.__version__,
        "leantrain": leantrain.__version__,
        "leantrain_source": leantrain_source(Path(leantrain.__file__).parent, rev_commit),
    }


def git(*args: str) -> str:
    return subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True).stdout.strip()


def use_leantrain_at(rev: str, dest: Path) -> str:
    """Export src/ as committed at `rev` into `dest` and import leantrain from there; returns the short hash."""
    commit = git("rev-parse", "--short", f"{rev}^{{commit}}")
    if not commit:
        sys.exit(f"--leantrain-rev: '{rev}' is not a commit of {REPO}")
    archive = subprocess.run(["git", "-C", str(REPO), "archive", commit, "src"], capture_output=True, check=True)
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        try:
            tar.extractall(dest, filter="data")
        except TypeError:  # Python before 3.10.12/3.11.4 has no extraction filters
            tar.extractall(dest)
    sys.path.insert(0, str(dest / "src"))  # ahead of the editable install
    for name in [m for m in sys.modules if m == "leantrain" or m.startswith("leantrain.")]:
        del sys.modules[name]
    return commit


def leantrain_source(pkg: Path, rev_commit: str | None) -> str:
    """Which leantrain ran: the commit exported by --leantrain-rev, or the folder imported and whether it
    is this checkout's src/ with uncommitted changes."""
    if rev_commit:
        return f"commit {rev_commit} (src/ exported by --leantrain-rev)"
    commit = git("rev-parse", "--short", "HEAD") or "?"
    if pkg.resolve().is_relative_to((REPO / "src").resolve()):
        dirty = git("status", "--porcelain", "--", "src")
        return f"this checkout's src/ at commit {commit}{' + uncommitted changes' if dirty else ''}"
    return f"{pkg} (outside this checkout, whose HEAD is {commit})"


class OtherLoad:
    """Cores' worth of CPU used by *other* processes while a run went on: the noise that matters on a shared
    2-core machine (the load average lags by a minute and counts this process too)."""

    def __enter__(self):
        self._t, self._busy, self._own = time.perf_counter(), _system_busy_seconds(), _own_cpu_seconds()
        return self

    def __exit__(self, *exc):
        wall = time.perf_counter() - self._t
        others = (_system_busy_seconds() - self._busy) - (_own_cpu_seconds() - self._own)
        self.cores = max(others, 0.0) / wall if wall > 0 else 0.0


def _system_busy_seconds() -> float:
    try:
        fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    except (OSError, ValueError):
        return 0.0
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    busy = sum(fields[:8]) - idle  # user..steal; guest time is already inside user
    return busy / os.sysconf("SC_CLK_TCK")


def _own_cpu_seconds() -> float:
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def wait_for_quiet(max_seconds: float, probe_seconds: float = 5.0) -> float:
    """Sleep until other processes use at most QUIET_CORES over a probe, or max_seconds pass; returns the wait."""
    started = time.perf_counter()
    while time.perf_counter() - started < max_seconds:
        with OtherLoad() as probe:
            time.sleep(probe_seconds)
        if probe.cores <= QUIET_CORES:
            break
    return time.perf_counter() - started


def free_memory() -> None:
    gc.collect()  # each run loads its own model; drop the last one before the next starts


def main(argv=None) -> int:
    args = parse_args(argv)
    train_src, dev_tsv = args.data_dir / "train.tsv", args.data_dir / "dev.tsv"
    if not (train_src.is_file() and dev_tsv.is_file()):
        print(f"skipped: SST-2 not found in {args.data_dir} (needs train.tsv and dev.tsv)")
        return 0

    code_dir = tempfile.TemporaryDirectory(prefix="leantrain_src_")
    rev_commit = use_leantrain_at(args.leantrain_rev, Path(code_dir.name)) if args.leantrain_rev else None

    from leantrain.models import embedded_model_path

    model_path = embedded_model_path()
    env = environment(rev_commit)
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
        print(
            f"training on the first {n_rows:,} rows of {train_src}; evaluating on {len(dev_ds):,} dev rows", flush=True
        )
        meta = {
            "job": {
                **JOB,
                "model": "embedded all-MiniLM-L6-v2",
                "train_rows": n_rows,
                "train_data": f"first {n_rows} rows of SST-2 train.tsv",
                "eval_data": "SST-2 dev.tsv",
                "eval_rows": len(dev_ds),
                "warmup_runs": not args.no_warmup,
            },
            "environment": env,
            "command": command,
        }

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
                if args.wait_quiet:
                    waited = wait_for_quiet(args.wait_quiet)
                    print(f"[{precision} #{rep + 1}] waited {waited:.0f} s for a quiet machine", flush=True)
                with OtherLoad() as lean_noise:
                    lean = run_leantrain(model_path, train_tsv, dev_tsv, precision, work)
                free_memory()
                with OtherLoad() as hf_noise:
                    hf = run_trainer(model_path, tok, train_ds, dev_ds, precision, work)
                free_memory()
                lean["other_processes_cores"] = round(lean_noise.cores, 2)
                hf["other_processes_cores"] = round(hf_noise.cores, 2)
                pair = {
                    "precision": precision,
                    "repeat": rep + 1,
                    "leantrain": lean,
                    "trainer": hf,
                    "ratio": lean["samples_per_second"] / hf["samples_per_second"],
                    "ratio_vs_trainer_loop": lean["samples_per_second"] / hf["loop_samples_per_second"],
                }
                pairs.append(pair)
                print(
                    f"[{precision} #{rep + 1}] leantrain {lean['samples_per_second']:.1f} samples/s "
                    f"(acc {lean['eval_accuracy']:.4f}), Trainer {hf['samples_per_second']:.1f} samples/s "
                    f"(loop only {hf['loop_samples_per_second']:.1f}; acc {hf['eval_accuracy']:.4f}), "
                    f"ratio {pair['ratio']:.2f}; other processes used {lean_noise.cores:.2f} / "
                    f"{hf_noise.cores:.2f} cores",
                    flush=True,
                )
                if not args.no_write:  # after every pair, so a run killed part-way keeps what it measured
                    write_result(build_result(pairs, args, meta, complete=False), args.out_dir)

    result = build_result(pairs, args, meta, complete=True)
    print("\n" + render_markdown(result))
    if not args.no_write:
        write_result(result, args.out_dir)
        print(f"wrote {args.out_dir / 'trainer_comparison.md'} and .json")
    return 0


def build_result(pairs: list[dict], args: argparse.Namespace, meta: dict, complete: bool) -> dict:
    precisions = [x for x in args.precisions if any(p["precision"] == x for p in pairs)]
    return {
        **meta,
        "complete": complete,
        "pairs_planned": args.repeats * len(args.precisions),
        "summary": summarise(pairs, precisions),
        "pairs": pairs,
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
    }


def write_result(result: dict, out_dir: Path) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "trainer_comparison.json").write_text(json.dumps(result, indent=2) + "\n")
    (out_dir / "trainer_comparison.md").write_text(render_markdown(result))


def is_quiet(pair: dict) -> bool:
    return max(pair["leantrain"]["other_processes_cores"], pair["trainer"]["other_processes_cores"]) <= QUIET_CORES


def summarise(pairs: list[dict], precisions: list[str]) -> list[dict]:
    """Per precision: medians of each side and of the per-pair ratios, and the verdict on the goal.

    The verdict rests on the quiet pairs when there are any: with 2 cores, a neighbour using one of them
    slows a 2-thread run several-fold, so a noisy pair says more about the neighbour than the code."""
    rows = []
    for precision in precisions:
        ps = [p for p in pairs if p["precision"] == precision]
        quiet = [p for p in ps if is_quiet(p)]

        def med(side: str, key: str, ps: list[dict] = ps) -> float:
            return statistics.median(p[side][key] for p in ps)

        ratio = statistics.median(p["ratio"] for p in ps)
        quiet_ratio = statistics.median(p["ratio"] for p in quiet) if quiet else None
        lean_acc, hf_acc = med("leantrain", "eval_accuracy"), med("trainer", "eval_accuracy")
        met = (quiet_ratio if quiet else ratio) >= 1.0 and lean_acc >= hf_acc - 0.01
        rows.append(
            {
                "precision": precision,
                "pairs": len(ps),
                "quiet_pairs": len(quiet),
                "leantrain_samples_per_second": med("leantrain", "samples_per_second"),
                "trainer_samples_per_second": med("trainer", "samples_per_second"),
                "trainer_loop_samples_per_second": med("trainer", "loop_samples_per_second"),
                "ratio_median": ratio,
                "ratios": [p["ratio"] for p in ps],
                "ratio_quiet_median": quiet_ratio,
                "leantrain_eval_accuracy": lean_acc,
                "trainer_eval_accuracy": hf_acc,
                **{
                    f"{side}_{key}": med(side, key)
                    for side, keys in (
                        ("leantrain", ("mfu", "mfu_useful", "peak_tflops")),
                        ("trainer", ("mfu", "mfu_useful", "mfu_loop")),
                    )
                    for key in keys
                    if all(p[side].get(key) is not None for p in ps)
                },
                "goal_met": met if quiet else None,
                "goal_met_on_noisy_pairs": None if quiet else met,
            }
        )
    return rows


def mfu_section(summary: list[dict]) -> list[str]:
    rows = [s for s in summary if "leantrain_mfu" in s and "trainer_mfu" in s]
    if not rows:
        return []
    out = [
        "",
        "## Model FLOPs utilisation",
        "",
        "Both sides computed the same way: leantrain's FLOP model of MiniLM (closed form, forward + backward "
        "= 3x forward) applied to every training batch each side fed the model (a forward pre-hook counts "
        "the Trainer's), over this CPU's peak for the run's math dtype (leantrain's GEMM probe: the best "
        "2048x2048 matmul). MFU counts the padded tokens the device computed; 'real tokens' leaves the "
        "padding out. Trainer: over the wall time of `trainer.train()` (its loop alone in brackets).",
        "",
        "| precision | peak TFLOP/s | leantrain MFU | Trainer MFU | leantrain MFU (real tokens) "
        "| Trainer MFU (real tokens) |",
        "|---|---|---|---|---|---|",
    ]
    for s in rows:
        loop = f" ({s['trainer_mfu_loop']:.1%})" if "trainer_mfu_loop" in s else ""
        out.append(
            f"| {s['precision']} | {s['leantrain_peak_tflops']:.3f} | {s['leantrain_mfu']:.1%} "
            f"| {s['trainer_mfu']:.1%}{loop} | {s['leantrain_mfu_useful']:.1%} | {s['trainer_mfu_useful']:.1%} |"
        )
    return out


def render_markdown(r: dict) -> str:
    job, env = r["job"], r["environment"]
    out = [
        "# leantrain vs Hugging Face Trainer",
        "",
        *(
            []
            if r.get("complete", True)
            else [f"**Incomplete run: {len(r['pairs'])} of {r['pairs_planned']} pairs measured so far.**", ""]
        ),
        f"One job both ways: {job['model']} fine-tuned on the {job['train_data']}, evaluated on "
        f"{job['eval_data']} ({job['eval_rows']} rows). Batch {job['batch_size']}, lr {job['lr']}, "
        f"{job['epochs']} epoch, max length {job['max_length']}, weight decay {job['weight_decay']}, "
        f"warm-up {job['warmup_ratio']:.0%}, {job['scheduler']} schedule, clipping {job['max_grad_norm']}, "
        f"seed {job['seed']}. Trainer: group_by_length sampling, fused AdamW, dynamic padding, "
        "no logging/saving/eval during training.",
        "",
        "samples/s: leantrain's `train_samples_per_second` (training loop only); Trainer: examples / wall "
        "seconds of `trainer.train()` (its loop alone, from the train-begin to the train-end callback, in "
        "brackets). Ratio = leantrain / Trainer, measured back to back; medians over pairs.",
        "",
        "| precision | leantrain samples/s | Trainer samples/s | ratio (median) | ratios per pair "
        "| quiet pairs (their median ratio) | leantrain dev acc | Trainer dev acc | goal met |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for s in r["summary"]:
        quiet = f"{s['quiet_pairs']} ({s['ratio_quiet_median']:.2f})" if s["quiet_pairs"] else "0"
        verdict = ("yes" if s["goal_met"] else "no") if s["quiet_pairs"] else "undecided (no quiet pair)"
        out.append(
            f"| {s['precision']} | {s['leantrain_samples_per_second']:.1f} "
            f"| {s['trainer_samples_per_second']:.1f} ({s['trainer_loop_samples_per_second']:.1f}) "
            f"| {s['ratio_median']:.2f} | {', '.join(f'{x:.2f}' for x in s['ratios'])} | {quiet} "
            f"| {s['leantrain_eval_accuracy']:.4f} | {s['trainer_eval_accuracy']:.4f} | {verdict} |"
        )
    out += [
        "",
        "Goal: leantrain at least as fast as the Trainer (ratio >= 1) at equal accuracy (within one "
        f"point), judged on quiet pairs: those during which other processes used at most {QUIET_CORES} "
        "cores in both runs. Each side's samples/s column is its own median, so it need not match the "
        "median ratio.",
        "",
        "## Every pair",
        "",
        'The machine is shared: "others" is how many cores\' worth of CPU other processes used during '
        "that run (of 2). A pair in which the two differ a lot is a measurement of the neighbours.",
        "",
        "| precision | pair | leantrain samples/s (others) | Trainer samples/s (others) | ratio "
        "| leantrain acc | Trainer acc |",
        "|---|---|---|---|---|---|---|",
    ]
    for p in r["pairs"]:
        a, b = p["leantrain"], p["trainer"]
        out.append(
            f"| {p['precision']} | {p['repeat']} "
            f"| {a['samples_per_second']:.1f} ({a['other_processes_cores']:.2f}) "
            f"| {b['samples_per_second']:.1f} ({b['other_processes_cores']:.2f}) | {p['ratio']:.2f} "
            f"| {a['eval_accuracy']:.4f} | {b['eval_accuracy']:.4f} |"
        )
    out += mfu_section(r["summary"])
    out += [
        "",
        "## Hardware and versions",
        "",
        f"- CPU: {env['cpu']}, {env['cores']} cores, torch threads {env['torch_threads']}",
        f"- python {env['python']}, torch {env['torch']}, transformers {env['transformers']}, "
        f"accelerate {env['accelerate']}, datasets {env['datasets']}, leantrain {env['leantrain']}",
        f"- leantrain: {env['leantrain_source']}",
        f"- run {r['date']}",
        "",
        "## Command",
        "",
        "```",
        r["command"],
        "```",
        "",
    ]
    return "\n".join(out)


if __name__ == "__main__":
    sys.exit(main())
