"""leantrain against the Hugging Face Trainer at its best settings: one fine-tuning job, both ways, each side in
its own process, from the command to the published model.

Two jobs (`--job`): SST-2 sentences (the first 2,000 rows of train.tsv; about 10 words each) and MRPC sentence
pairs (all 3,668 pairs of train.tsv; about 45 words a pair), so a gain on short phrases is not the whole story.
Both: the embedded MiniLM, batch 32, lr 5e-5, 1 epoch, max length 128, weight decay 0.01, warm-up 6%, linear
schedule, gradient clipping 1.0, seed 42, evaluated on dev.tsv, in fp32 and/or bf16.

leantrain runs as a user types it: `leantrain train --model ... --data train.tsv --eval-data dev.tsv ...` (its
defaults otherwise: the report page is written, the tokenization cache starts empty each run). The Trainer runs
`benchmarks/hf_trainer_job.py`, the script a careful user writes: length-grouped batches, fused AdamW, dynamic
padding, no logging, saving or progress bars during training, `trainer.predict` on dev, `save_model`.

Two figures per side:
- the loop: leantrain's `train_samples_per_second`; the Trainer's examples / wall seconds of `trainer.train()`;
- the whole process: wall seconds from starting the process to its exit (imports, reading and tokenizing,
  loading the model, training, evaluating, saving), measured here around the child process.
The machine is shared and noisy, so the two sides run back to back, pair after pair; every pair's ratios are
reported with how busy the machine was, plus the medians. An untimed short run of each side first warms the
file cache.

    python benchmarks/trainer_comparison.py --precisions fp32 --repeats 3 --wait-quiet 60
    python benchmarks/trainer_comparison.py --job mrpc --precisions fp32 --repeats 3 --wait-quiet 60
    python benchmarks/trainer_comparison.py --train-rows 200 --precisions fp32 --no-write   # quick check
"""

from __future__ import annotations

import argparse
import dataclasses
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
SHARED_DATA = REPO.parent / "shared" / "data"
DEFAULT_OUT = REPO / "benchmarks" / "results"

QUIET_CORES = 0.25  # a pair is "quiet" when other processes used at most this much CPU during both runs
GOALS = {"fp32": 1.3, "bf16": 1.5}  # leantrain / Trainer, for the loop and for the whole process


@dataclasses.dataclass(frozen=True)
class Data:
    """A GLUE data set in ../shared/data: its TSV columns and how many training rows the job takes."""

    folder: str
    text_columns: tuple[str, ...]
    label_column: str
    train_rows: int | None  # None: all of train.tsv
    describe: str


JOBS = {
    "sst2": Data("sst2", ("sentence",), "label", 2000, "SST-2 sentences"),
    "mrpc": Data("mrpc", ("#1 String", "#2 String"), "Quality", None, "MRPC sentence pairs"),
}

# The training both sides run. Any change here changes both sides.
TRAINING = dict(
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
    p.add_argument("--job", choices=sorted(JOBS), default="sst2", help="which data set (default: %(default)s)")
    p.add_argument(
        "--data-dir", type=Path, help="folder holding the job's train.tsv and dev.tsv (default: ../shared/data/JOB)"
    )
    p.add_argument("--train-rows", type=int, help="first N rows of train.tsv (default: 2000 for sst2, all for mrpc)")
    p.add_argument("--precisions", default="fp32,bf16", help="comma-separated: fp32, bf16")
    p.add_argument("--repeats", type=int, default=1, help="back-to-back (leantrain, Trainer) pairs per precision")
    p.add_argument("--no-warmup", action="store_true", help="skip the untimed 2-step run of each side per precision")
    p.add_argument(
        "--leantrain-rev",
        metavar="REV",
        help="benchmark leantrain as committed at this git revision (its src/ exported to a temp folder and put "
        "first on the child's PYTHONPATH) rather than the installed one",
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
    bad = [x for x in args.precisions if x not in GOALS]
    if bad:
        p.error(f"--precisions: unknown {bad}; use fp32 and/or bf16")
    data = JOBS[args.job]
    args.data_dir = args.data_dir or SHARED_DATA / data.folder
    args.train_rows = args.train_rows or data.train_rows
    if (args.train_rows is not None and args.train_rows < TRAINING["batch_size"]) or args.repeats < 1:
        p.error("--train-rows must be at least one batch (32) and --repeats at least 1")
    return args


# --- data -------------------------------------------------------------------------------------------


def write_train_slice(src: Path, dst: Path, rows: int | None) -> int:
    """The header and the first `rows` data lines (all when None), byte for byte, so both sides read the same
    file."""
    lines = []
    with src.open(encoding="utf-8", newline="") as f:
        for line in f:
            lines.append(line)
            if rows is not None and len(lines) == rows + 1:
                break
    dst.write_text("".join(lines), encoding="utf-8", newline="")
    return len(lines) - 1


# --- the two sides, each in its own process ------------------------------------------------------


def run_child(cmd: list[str], log: Path, env: dict[str, str]) -> float:
    """Run one side to its exit; returns its wall seconds. A failure stops the benchmark with the log's tail."""
    t0 = time.perf_counter()
    with log.open("w") as out:
        code = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=REPO).returncode
    seconds = time.perf_counter() - t0
    if code != 0:
        tail = "".join(log.read_text(errors="replace").splitlines(keepends=True)[-30:])
        sys.exit(f"{shlex.join(cmd)} exited with {code}:\n{tail}")
    return seconds


def leantrain_command(
    model: Path, train_tsv: Path, dev_tsv: Path, precision: str, out: Path, cache: Path, max_steps: int | None
) -> list[str]:
    """`leantrain train` with the job's numbers as flags (`python -m leantrain.commands.cli` is the script)."""
    t = TRAINING
    flags = {
        "model": model, "data": train_tsv, "eval-data": dev_tsv, "batch-size": t["batch_size"],
        "epochs": t["epochs"], "lr": t["lr"], "max-length": t["max_length"], "weight-decay": t["weight_decay"],
        "warmup-ratio": t["warmup_ratio"], "scheduler": t["scheduler"], "max-grad-norm": t["max_grad_norm"],
        "seed": t["seed"], "precision": precision, "output-dir": out, "cache-dir": cache,
    }  # fmt: skip
    if max_steps:
        flags["max-steps"] = max_steps
    cmd = [sys.executable, "-m", "leantrain.commands.cli", "train", "--no-progress"]
    for name, value in flags.items():
        cmd += [f"--{name}", str(value)]
    return cmd


def run_leantrain(
    model: Path, train_tsv: Path, dev_tsv: Path, precision: str, work: Path, pythonpath: str | None,
    max_steps: int | None = None,
) -> dict:  # fmt: skip
    fresh = Path(tempfile.mkdtemp(prefix="leantrain-", dir=work))
    out, cache = fresh / "run", fresh / "cache"  # a new run, its cache empty: tokenizing is part of a first run
    env = dict(os.environ)
    if pythonpath:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [pythonpath, env.get("PYTHONPATH")]))
    cmd = leantrain_command(model, train_tsv, dev_tsv, precision, out, cache, max_steps)
    seconds = run_child(cmd, work / "leantrain.log", env)
    m = json.loads((out / "metrics.json").read_text())
    log = (work / "leantrain.log").read_text(errors="replace")
    return {
        "process_seconds": seconds,
        # the thread governor's changes (parallel/threads.py): none is expected on a quiet machine
        "thread_changes": [line for line in log.splitlines() if " CPU threads (other processes used " in line],
        "samples_per_second": m["train_samples_per_second"],
        "train_seconds": m["train_seconds"],
        "eval_seconds": m.get("time_eval_seconds"),
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


def run_trainer(
    model: Path, data: Data, train_tsv: Path, dev_tsv: Path, precision: str, work: Path, peak_tflops: float | None,
    max_steps: int | None = None,
) -> dict:  # fmt: skip
    job = {
        **TRAINING, "model": str(model), "train": str(train_tsv), "dev": str(dev_tsv),
        "text_columns": list(data.text_columns), "label_column": data.label_column, "precision": precision,
        "output_dir": str(work / "trainer-run"), "max_steps": max_steps,
    }  # fmt: skip
    metrics_path = work / "trainer-metrics.json"
    cmd = [sys.executable, str(REPO / "benchmarks" / "hf_trainer_job.py"), "--job", json.dumps(job)]
    seconds = run_child([*cmd, "--metrics-out", str(metrics_path)], work / "trainer.log", dict(os.environ))
    m = json.loads(metrics_path.read_text())
    batches = m.pop("batches")
    return {"process_seconds": seconds, **m, **trainer_flops(model, batches, m, peak_tflops)}


def trainer_flops(model: Path, batches: list[list[int]], m: dict, peak_tflops: float | None) -> dict:
    """MFU for the Trainer, computed as leantrain computes its own: leantrain's FLOP model of the model
    (telemetry/flops.py) over every training batch the Trainer's model saw (its padded length and each row's
    real tokens, recorded by the script), over the peak leantrain measured in the same pair."""
    import torch
    from transformers import AutoConfig

    from leantrain.telemetry.flops import FlopMeter, encoder_flop_model, mfu

    peak = peak_tflops * 1e12 if peak_tflops else None
    meter = FlopMeter(encoder_flop_model(AutoConfig.from_pretrained(str(model))), peak)
    for length, *rows in batches:
        mask = (torch.arange(length)[None, :] < torch.tensor(rows)[:, None]).long()
        meter.add(torch.zeros_like(mask), mask)
    wall = meter.metrics(m["train_seconds"])
    return {
        "model_tflops": wall["model_tflops"],
        "mfu": wall["mfu"],  # over the wall time of trainer.train(), like its samples/s
        "mfu_useful": wall["mfu_useful"],
        "mfu_loop": mfu(meter.flops, m["loop_seconds"], peak),
        "peak_tflops": peak_tflops,
    }


# --- the comparison ------------------------------------------------------------------------------


def environment(rev_commit: str | None) -> dict:
    import accelerate
    import datasets
    import torch
    import transformers

    import leantrain
    from leantrain.parallel import cpu_model

    return {
        "cpu": cpu_model(),
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


def export_leantrain(rev: str, dest: Path) -> str:
    """Export src/ as committed at `rev` into `dest` (the leantrain child imports it from there); returns the
    short hash."""
    commit = git("rev-parse", "--short", f"{rev}^{{commit}}")
    if not commit:
        sys.exit(f"--leantrain-rev: '{rev}' is not a commit of {REPO}")
    archive = subprocess.run(["git", "-C", str(REPO), "archive", commit, "src"], capture_output=True, check=True)
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        try:
            tar.extractall(dest, filter="data")
        except TypeError:  # Python before 3.10.12/3.11.4 has no extraction filters
            tar.extractall(dest)
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
    """Busy seconds of this process's CPUs, by any process: what the thread governor reads (parallel/threads.py)."""
    from leantrain.parallel.threads import busy_seconds

    return busy_seconds(os.sched_getaffinity(0)) or 0.0


def _own_cpu_seconds() -> float:
    """This process's CPU and that of its finished children (each side runs as one)."""
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


def main(argv=None) -> int:
    args = parse_args(argv)
    data = JOBS[args.job]
    train_src, dev_tsv = args.data_dir / "train.tsv", args.data_dir / "dev.tsv"
    if not (train_src.is_file() and dev_tsv.is_file()):
        print(f"skipped: {data.describe} not found in {args.data_dir} (needs train.tsv and dev.tsv)")
        return 0

    code_dir = tempfile.TemporaryDirectory(prefix="leantrain_src_")
    rev_commit = export_leantrain(args.leantrain_rev, Path(code_dir.name)) if args.leantrain_rev else None
    pythonpath = str(Path(code_dir.name) / "src") if rev_commit else None

    from leantrain.model.loading import embedded_model_path

    model = embedded_model_path()
    env = environment(rev_commit)
    command = "python " + " ".join(shlex.quote(a) for a in [os.path.relpath(__file__, REPO), *sys.argv[1:]])
    print(f"{env['cpu']}, {env['cores']} cores, torch threads {env['torch_threads']}", flush=True)

    pairs: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="trainer_comparison_") as tmp:
        work = Path(tmp)
        train_tsv = work / "train.tsv"
        n_rows = write_train_slice(train_src, train_tsv, args.train_rows)
        with dev_tsv.open(encoding="utf-8", newline="") as f:
            eval_rows = sum(1 for _ in f) - 1  # the header
        sliced = f"the first {n_rows:,} rows" if args.train_rows else f"all {n_rows:,} rows"
        print(f"{data.describe}: training on {sliced} of {train_src}; evaluating on {eval_rows:,}", flush=True)
        meta = {
            "job": {
                **TRAINING,
                "name": args.job,
                "model": "embedded all-MiniLM-L6-v2",
                "train_rows": n_rows,
                "train_data": f"{sliced} of {data.folder}/train.tsv ({data.describe})",
                "eval_data": f"{data.folder}/dev.tsv",
                "eval_rows": eval_rows,
                "warmup_runs": not args.no_warmup,
            },
            "environment": env,
            "command": command,
        }

        def one_pair(precision: str, max_steps: int | None = None) -> tuple[dict, dict]:
            with OtherLoad() as lean_noise:
                lean = run_leantrain(model, train_tsv, dev_tsv, precision, work, pythonpath, max_steps)
            with OtherLoad() as hf_noise:
                hf = run_trainer(model, data, train_tsv, dev_tsv, precision, work, lean["peak_tflops"], max_steps)
            lean["other_processes_cores"] = round(lean_noise.cores, 2)
            hf["other_processes_cores"] = round(hf_noise.cores, 2)
            return lean, hf

        for precision in args.precisions:
            if not args.no_warmup:
                # Untimed: loads both sides' files into the page cache and measures leantrain's GEMM peak once
                # (it keeps it), so neither timed run pays a one-time cost of this machine the other does not.
                t = time.perf_counter()
                one_pair(precision, max_steps=2)
                print(f"[{precision}] warm-up done in {time.perf_counter() - t:.0f} s", flush=True)
            for rep in range(args.repeats):
                if args.wait_quiet:
                    waited = wait_for_quiet(args.wait_quiet)
                    print(f"[{precision} #{rep + 1}] waited {waited:.0f} s for a quiet machine", flush=True)
                lean, hf = one_pair(precision)
                pairs.append(make_pair(precision, rep + 1, lean, hf))
                print(pair_line(pairs[-1]), flush=True)
                if not args.no_write:  # after every pair, so a run killed part-way keeps what it measured
                    write_result(build_result(pairs, args, meta, complete=False), args.out_dir, args.job)

    result = build_result(pairs, args, meta, complete=True)
    print("\n" + render_markdown(result))
    if not args.no_write:
        stem = write_result(result, args.out_dir, args.job)
        print(f"wrote {args.out_dir / stem}.md and .json")
    return 0


def make_pair(precision: str, repeat: int, lean: dict, hf: dict) -> dict:
    return {
        "precision": precision,
        "repeat": repeat,
        "leantrain": lean,
        "trainer": hf,
        "ratio": lean["samples_per_second"] / hf["samples_per_second"],
        "ratio_vs_trainer_loop": lean["samples_per_second"] / hf["loop_samples_per_second"],
        "process_ratio": hf["process_seconds"] / lean["process_seconds"],
    }


def pair_line(p: dict) -> str:
    a, b = p["leantrain"], p["trainer"]
    return (
        f"[{p['precision']} #{p['repeat']}] loop: leantrain {a['samples_per_second']:.1f} samples/s, Trainer "
        f"{b['samples_per_second']:.1f} (its loop alone {b['loop_samples_per_second']:.1f}), ratio {p['ratio']:.2f}; "
        f"whole process: {a['process_seconds']:.1f} s against {b['process_seconds']:.1f} s, ratio "
        f"{p['process_ratio']:.2f}; dev accuracy {a['eval_accuracy']:.4f} / {b['eval_accuracy']:.4f}; other "
        f"processes used {a['other_processes_cores']:.2f} / {b['other_processes_cores']:.2f} cores"
    )


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


def result_stem(job: str) -> str:
    return "trainer_comparison" if job == "sst2" else f"trainer_comparison_{job}"


def write_result(result: dict, out_dir: Path, job: str) -> str:
    stem = result_stem(job)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / f"{stem}.json").write_text(json.dumps(result, indent=2) + "\n")
    (out_dir / f"{stem}.md").write_text(render_markdown(result))
    return stem


def is_quiet(pair: dict) -> bool:
    return max(pair["leantrain"]["other_processes_cores"], pair["trainer"]["other_processes_cores"]) <= QUIET_CORES


def summarise(pairs: list[dict], precisions: list[str]) -> list[dict]:
    """Per precision: medians of each side and of the per-pair ratios, and the verdicts on the goals.

    The verdicts rest on the quiet pairs when there are any: with 2 cores, a neighbour using one of them
    slows a 2-thread run several-fold, so a noisy pair says more about the neighbour than the code."""
    rows = []
    for precision in precisions:
        ps = [p for p in pairs if p["precision"] == precision]
        quiet = [p for p in ps if is_quiet(p)]
        judged = quiet or ps

        def med(side: str, key: str, ps: list[dict] = ps) -> float:
            return statistics.median(p[side][key] for p in ps)

        ratio = statistics.median(p["ratio"] for p in judged)
        process_ratio = statistics.median(p["process_ratio"] for p in judged)
        lean_acc, hf_acc = med("leantrain", "eval_accuracy"), med("trainer", "eval_accuracy")
        accurate = lean_acc >= hf_acc - 0.01
        rows.append(
            {
                "precision": precision,
                "pairs": len(ps),
                "quiet_pairs": len(quiet),
                "goal": GOALS[precision],
                **{
                    f"{side}_{key}": med(side, key)
                    for side, keys in (
                        ("leantrain", ("samples_per_second", "process_seconds", "train_seconds", "eval_seconds")),
                        ("trainer", ("samples_per_second", "loop_samples_per_second", "process_seconds")),
                        ("trainer", ("train_seconds", "predict_seconds", "start_seconds")),
                    )
                    for key in keys
                },
                "ratio_median": ratio,
                "ratios": [p["ratio"] for p in ps],
                "process_ratio_median": process_ratio,
                "process_ratios": [p["process_ratio"] for p in ps],
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
                "judged_on": "quiet pairs" if quiet else "all pairs (none was quiet)",
                "loop_goal_met": ratio >= GOALS[precision] and accurate,
                "process_goal_met": process_ratio >= GOALS[precision] and accurate,
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
        "= 3x forward, every layer at every token) applied to every training batch each side fed the model, over "
        "this CPU's peak for the run's math dtype (leantrain's GEMM probe: the best 2048x2048 matmul). MFU counts "
        "the padded tokens; 'real tokens' leaves the padding out. Trainer: over the wall time of `trainer.train()` "
        "(its loop alone in brackets).",
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


def verdict(s: dict, key: str) -> str:
    return "yes" if s[key] else "no"


def render_markdown(r: dict) -> str:
    job, env = r["job"], r["environment"]
    incomplete = f"**Incomplete run: {len(r['pairs'])} of {r['pairs_planned']} pairs measured so far.**"
    out = [
        f"# leantrain vs Hugging Face Trainer: {job['name']}",
        "",
        *([] if r.get("complete", True) else [incomplete, ""]),
        f"One job both ways, each side in its own process: {job['model']} fine-tuned on {job['train_data']}, "
        f"evaluated on {job['eval_data']} ({job['eval_rows']} rows). Batch {job['batch_size']}, lr {job['lr']}, "
        f"{job['epochs']} epoch, max length {job['max_length']}, weight decay {job['weight_decay']}, "
        f"warm-up {job['warmup_ratio']:.0%}, {job['scheduler']} schedule, clipping {job['max_grad_norm']}, "
        f"seed {job['seed']}. leantrain: `leantrain train` with these as flags, its defaults otherwise (report "
        "page written, tokenization cache empty at the start). Trainer: `benchmarks/hf_trainer_job.py`, "
        "group_by_length sampling, fused AdamW, dynamic padding, no logging/saving/eval during training, then "
        "`trainer.predict` on dev and `save_model`.",
        "",
        "**Loop**: leantrain's `train_samples_per_second`; Trainer: examples / wall seconds of `trainer.train()` "
        "(its loop alone, from the train-begin to the train-end callback, in brackets). **Whole process**: wall "
        "seconds from starting the process to its exit (imports, tokenizing, loading, training, evaluating on dev, "
        "saving the model). Ratios are leantrain over the Trainer (the Trainer's seconds over leantrain's), per "
        "back-to-back pair, medians over the quiet pairs; goal: "
        + ", ".join(f"{g}x in {p}" for p, g in GOALS.items())
        + " for both, dev accuracy within one point.",
        "",
        "| precision | leantrain samples/s | Trainer samples/s | loop ratio | leantrain process s "
        "| Trainer process s | process ratio | quiet pairs | leantrain dev acc | Trainer dev acc "
        "| loop goal met | process goal met |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for s in r["summary"]:
        out.append(
            f"| {s['precision']} | {s['leantrain_samples_per_second']:.1f} "
            f"| {s['trainer_samples_per_second']:.1f} ({s['trainer_loop_samples_per_second']:.1f}) "
            f"| {s['ratio_median']:.2f} | {s['leantrain_process_seconds']:.1f} | {s['trainer_process_seconds']:.1f} "
            f"| {s['process_ratio_median']:.2f} | {s['quiet_pairs']} of {s['pairs']} "
            f"| {s['leantrain_eval_accuracy']:.4f} | {s['trainer_eval_accuracy']:.4f} "
            f"| {verdict(s, 'loop_goal_met')} ({s['goal']}x) | {verdict(s, 'process_goal_met')} ({s['goal']}x) |"
        )
    out += [
        "",
        "Where each side's process went (medians, seconds): leantrain's training loop and final evaluation (its "
        "own timers), the rest being start-up (imports, reading, tokenizing, loading the model) and finish "
        "(saving, the report page); the Trainer's start (script start to `trainer.train()`), `train()`, "
        "`predict()` on dev, and the rest (interpreter start, imports before the script's clock, saving).",
        "",
        "| precision | leantrain: loop | evaluation | the rest | Trainer: start | train() | predict() | the rest |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for s in r["summary"]:
        lean_rest = s["leantrain_process_seconds"] - s["leantrain_train_seconds"] - s["leantrain_eval_seconds"]
        hf_rest = (
            s["trainer_process_seconds"] - s["trainer_start_seconds"] - s["trainer_train_seconds"]
            - s["trainer_predict_seconds"]
        )  # fmt: skip
        out.append(
            f"| {s['precision']} | {s['leantrain_train_seconds']:.1f} | {s['leantrain_eval_seconds']:.1f} "
            f"| {lean_rest:.1f} | {s['trainer_start_seconds']:.1f} | {s['trainer_train_seconds']:.1f} "
            f"| {s['trainer_predict_seconds']:.1f} | {hf_rest:.1f} |"
        )
    out += [
        "",
        "## Every pair",
        "",
        '"others": how many cores\' worth of CPU other processes used during that run (of 2); a pair is quiet '
        f"when both are at most {QUIET_CORES}.",
        "",
        "| precision | pair | leantrain samples/s (others) | Trainer samples/s (others) | loop ratio "
        "| leantrain s | Trainer s | process ratio | leantrain acc | Trainer acc |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for p in r["pairs"]:
        a, b = p["leantrain"], p["trainer"]
        out.append(
            f"| {p['precision']} | {p['repeat']} "
            f"| {a['samples_per_second']:.1f} ({a['other_processes_cores']:.2f}) "
            f"| {b['samples_per_second']:.1f} ({b['other_processes_cores']:.2f}) | {p['ratio']:.2f} "
            f"| {a['process_seconds']:.1f} | {b['process_seconds']:.1f} | {p['process_ratio']:.2f} "
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
