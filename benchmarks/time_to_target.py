"""Time to a target, per optimizer: what a user waits for is a good model, not a fast step.

For each optimizer a learning-rate sweep of three values, chosen the same way for all (its centre x 1/3, 1, 3; the
centre is the job's AdamW rate times the optimizer's usual ratio to AdamW: Lion 1/5, schedule-free SGD 100, the rest
1), then the optimizer steps and the training seconds (evaluations and saves excluded) until the target is first
reached:

1. `lm`: `preset:tiny-llama` continued pretraining on the language-model corpus (tweets, SST-2 train sentences, SMS
   texts; benchmarks/causal_lm_corpus.py): the preset first pretrained once with AdamW (`--pretrain-steps`), then
   trained on with each optimizer; target: the AdamW sweep's best final held-out perplexity (600 held-out documents,
   evaluated every `--lm-eval-every` steps).
2. `sst2`: the embedded MiniLM fine-tuned on SST-2 (../shared/data/sst2); target: 0.80 dev accuracy (all 872 dev
   rows, every `--sst2-eval-every` steps).
3. `hf`: job 2 with the Hugging Face Trainer and its own `optim=` for the optimizers it has (adamw_torch_fused,
   schedule_free_adamw, schedule_free_sgd, lion_32bit, galore_adamw, apollo_adamw), the same sweep.

Every run is a fresh `leantrain train` (or Trainer) process, run round-robin over the optimizers for each sweep value
so that the shared machine's drifting load falls on all alike; each run's folder is kept under --work, and a rerun
skips the runs already done. Writes benchmarks/results/time_to_target.{json,md,png}.

    python benchmarks/time_to_target.py                                  # everything (hours on 2 cores)
    python benchmarks/time_to_target.py --jobs sst2 --optimizers adamw,muon
    python benchmarks/time_to_target.py --smoke --work /tmp/ttt          # a few steps of each, to check the script
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
SHARED = REPO.parent / "shared" / "data"
if not SHARED.is_dir():
    SHARED = Path("/work/shared/data")
RESULTS = REPO / "benchmarks" / "results"

#: variants the sweeps treat as optimizers of their own: name -> (the --optimizer, its settings); job 2 only (the
#: embeddings are half of MiniLM's weights; tiny-llama's are tied to its output layer)
VARIANTS = {
    "galore-adamw+embeddings": ("galore-adamw", {"projection_embeddings": True}),
    "apollo-adamw+embeddings": ("apollo-adamw", {"projection_embeddings": True}),
}
OPTIMIZERS = ("adamw", "muon", "schedule-free-adamw", "schedule-free-sgd", "lion", "galore-adamw", "apollo-adamw",
              *VARIANTS)  # fmt: skip
#: each optimizer's learning rate relative to AdamW's, as its authors advise (the sweep's centre)
LR_RATIO = {"lion": 0.2, "schedule-free-sgd": 100.0}
SWEEP = (1 / 3, 1.0, 3.0)
#: the HF Trainer's own names for the optimizers it has
HF_OPTIM = {
    "adamw": "adamw_torch_fused",
    "schedule-free-adamw": "schedule_free_adamw",
    "schedule-free-sgd": "schedule_free_sgd",
    "lion": "lion_32bit",
    "galore-adamw": "galore_adamw",
    "apollo-adamw": "apollo_adamw",
}
#: BERT's hidden matrices by module name, for the Trainer's optim_target_modules: the ones leantrain picks
HF_TARGETS = ["query", "key", "value", "output.dense", "intermediate.dense"]


class Job:
    """One workload: its leantrain flags, what is evaluated, the target and the AdamW centre of the sweep."""

    def __init__(self, name: str, flags: dict[str, Any], metric: str, lower_is_better: bool, centre: float):
        self.name, self.flags, self.metric, self.lower, self.centre = name, flags, metric, lower_is_better, centre
        self.target: float | None = None

    def reached(self, value: float) -> bool:
        assert self.target is not None
        return value <= self.target if self.lower else value >= self.target


def base_of(name: str) -> tuple[str, dict[str, Any]]:
    """The --optimizer behind a sweep's name and the settings of its variant."""
    return VARIANTS.get(name, (name, {}))


def lr_grid(optimizer: str, centre: float) -> list[float]:
    c = centre * LR_RATIO.get(base_of(optimizer)[0], 1.0)
    return [float(f"{c * s:.3g}") for s in SWEEP]


def schedule_flags(optimizer: str) -> dict[str, Any]:
    return {"scheduler": "constant"} if optimizer.startswith("schedule-free") else {"scheduler": "linear"}


# -- data ------------------------------------------------------------------------------------------------------


def lm_files(work: Path, held_out: int) -> tuple[Path, Path]:
    """The corpus of benchmarks/causal_lm_corpus.py split by document: `held_out` documents (seed 0) to evaluate on,
    the rest to train on; blank-line-separated documents, as leantrain reads a text file."""
    from benchmarks.causal_lm_corpus import corpus_texts

    train, dev = work / "corpus_train.txt", work / "corpus_heldout.txt"
    if not (train.is_file() and dev.is_file()):
        docs = [" ".join(t.split()) for group in corpus_texts().values() for t in group]
        docs = [d for d in docs if d]
        random.Random(0).shuffle(docs)
        dev.write_text("\n\n".join(docs[:held_out]) + "\n", encoding="utf-8")
        train.write_text("\n\n".join(docs[held_out:]) + "\n", encoding="utf-8")
    return train, dev


def make_jobs(args: argparse.Namespace, work: Path) -> dict[str, Job]:
    sst2 = SHARED / "sst2"
    common = dict(log_every=1, seed=1, save_every=None, progress=False, report=False)
    jobs = {
        "sst2": Job(
            "sst2",
            dict(common, data=str(sst2 / "train.tsv"), eval_data=str(sst2 / "dev.tsv"), max_length=64,
                 batch_size=32, max_steps=args.sst2_steps, eval_every=args.sst2_eval_every),
            "eval_accuracy", False, args.sst2_lr,
        ),
    }  # fmt: skip
    jobs["sst2"].target = 0.80
    jobs["hf"] = Job("hf", jobs["sst2"].flags, "eval_accuracy", False, args.sst2_lr)
    jobs["hf"].target = 0.80
    if "lm" in args.jobs:
        train, dev = lm_files(work, args.lm_heldout)
        jobs["lm"] = Job(
            "lm",
            dict(common, data=str(train), eval_data=str(dev), max_length=128, batch_size=args.lm_batch_size,
                 max_steps=args.lm_steps, eval_every=args.lm_eval_every, metric_for_best="loss", seed=2),
            "eval_perplexity", True, args.lm_lr,
        )  # fmt: skip
    return jobs


# -- running -------------------------------------------------------------------------------------------------------


def flags_of(values: dict[str, Any]) -> list[str]:
    from leantrain.config import to_flags

    return to_flags({k: v for k, v in values.items() if v is not None})


def run_process(argv: list[str], log: Path, env: dict | None = None) -> dict[str, Any]:
    """Run a training process; its exit code, wall seconds and the load average around it."""
    from benchmarks.trainer_comparison import OtherLoad

    before = os.getloadavg()[0]
    started = time.perf_counter()
    with log.open("w") as f, OtherLoad() as others:
        code = subprocess.call(argv, stdout=f, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})})
    return {
        "code": code,
        "process_seconds": time.perf_counter() - started,
        "load": [before, os.getloadavg()[0]],
        "other_cores": others.cores,
    }


def pretrain_lm(args: argparse.Namespace, job: Job, work: Path) -> Path:
    """preset:tiny-llama pretrained once with AdamW on the training documents: the model every optimizer continues."""
    out = work / "lm" / "pretrain"
    if not (out / "metrics.json").is_file():
        values = dict(job.flags, model="preset:tiny-llama", max_steps=args.pretrain_steps, lr=3e-3, optimizer="adamw",
                      scheduler="cosine", warmup_ratio=0.05, eval_every=None, seed=1, output_dir=str(out),
                      overwrite=True, cache_dir=str(work / "cache"))  # fmt: skip
        out.parent.mkdir(parents=True, exist_ok=True)
        done = run_process([sys.executable, "-m", "leantrain", "train", *flags_of(values)], out.parent / "pretrain.log")
        if done["code"]:
            sys.exit(f"pretraining failed: see {out.parent / 'pretrain.log'}")
    return out / "model"


def beside(folder: Path, suffix: str) -> Path:
    """A file next to a run's folder (its log, its process figures)."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    return folder.parent / (folder.name + suffix)


def leantrain_run(job: Job, optimizer: str, lr: float, work: Path, model: str | None) -> dict[str, Any]:
    """One leantrain run, in this process (a fresh interpreter per run would add its start-up, tens of seconds
    on a busy machine, to every run; the training seconds are the trainer's own either way)."""
    from benchmarks.trainer_comparison import OtherLoad
    from leantrain import TrainConfig, train

    out = work / job.name / f"{optimizer}-lr{lr:g}"
    if not (out / "metrics.json").is_file():
        base, settings = base_of(optimizer)
        values = dict(job.flags, model=model, optimizer=base, lr=lr, output_dir=str(out), overwrite=True,
                      cache_dir=str(work / "cache"), **schedule_flags(base), **settings)  # fmt: skip
        before = os.getloadavg()[0]
        try:
            with OtherLoad() as others:
                train(TrainConfig(**{k: v for k, v in values.items() if v is not None}))
        except Exception as exc:  # a run that fails is reported, the others go on
            return {"optimizer": optimizer, "lr": lr, "failed": f"{type(exc).__name__}: {exc}"[:300]}
        load = {"load": [before, os.getloadavg()[0]], "other_cores": others.cores}
        beside(out, ".process.json").write_text(json.dumps(load))
    return read_leantrain(out, optimizer, lr)


def read_leantrain(out: Path, optimizer: str, lr: float) -> dict[str, Any]:
    """A run's curve: per evaluation, the step, the training seconds up to it (evaluations and saves excluded)
    and the metrics; and its final figures."""
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
    seconds, at_step = 0.0, {0: 0.0}
    for r in rows:
        if "loss" in r:
            seconds += r["time_wall_seconds"] - r.get("time_eval_seconds", 0.0) - r.get("time_checkpoint_seconds", 0.0)
            at_step[r["step"]] = seconds
    evals = [
        {"step": r["step"], "seconds": at_step.get(r["step"], seconds), **{k: v for k, v in r.items() if k != "step"}}
        for r in rows
        if any(k.startswith("eval_") for k in r)
    ]
    m = json.loads((out / "metrics.json").read_text())
    process = beside(out, ".process.json")
    steps = max(m["optimizer_steps"], 1)
    return {
        "optimizer": optimizer,
        "lr": lr,
        "evals": evals,
        "train_seconds": seconds,
        "steps": m["optimizer_steps"],
        "optimizer_state_bytes": m["optimizer_state_bytes"],
        "optimizer_ms_per_step": 1e3 * m["time_optimizer_seconds"] / steps,
        "step_ms": 1e3 * seconds / steps,
        "precision": m.get("precision"),
        **(json.loads(process.read_text()) if process.is_file() else {}),
    }


def hf_run(job: Job, optimizer: str, lr: float, work: Path) -> dict[str, Any]:
    out = work / "hf" / f"{optimizer}-lr{lr:g}"
    result = out / "result.json"
    if not result.is_file():
        out.mkdir(parents=True, exist_ok=True)
        spec = dict(optim=HF_OPTIM[optimizer], lr=lr, out=str(out), steps=job.flags["max_steps"],
                    eval_every=job.flags["eval_every"], batch=job.flags["batch_size"],
                    max_length=job.flags["max_length"], train=job.flags["data"], dev=job.flags["eval_data"],
                    constant=optimizer.startswith("schedule-free"), bf16=leantrain_precision() == "bf16")  # fmt: skip
        done = run_process([sys.executable, __file__, "--hf-child", json.dumps(spec)], out / "run.log")
        if done["code"] or not result.is_file():
            return {"optimizer": optimizer, "lr": lr, "failed": f"exit {done['code']}: see {out / 'run.log'}"}
        saved = json.loads(result.read_text())
        result.write_text(json.dumps({**saved, "load": done["load"], "other_cores": done["other_cores"]}))
    return {"optimizer": optimizer, "lr": lr, **json.loads(result.read_text())}


def leantrain_precision() -> str:
    """What `--precision auto` resolves to here (the Trainer runs the same)."""
    from leantrain.parallel import choose_precision

    return choose_precision("auto")[0]


# -- the Hugging Face Trainer's side (a child process; nothing of leantrain) ---------------------------------------


def hf_child(spec: dict[str, Any]) -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import datasets
    import numpy as np
    from transformers import (
        AutoModelForSequenceClassification,
        AutoTokenizer,
        DataCollatorWithPadding,
        Trainer,
        TrainerCallback,  # fmt: skip
        TrainingArguments,
    )

    from benchmarks.hf_trainer_job import read_tsv
    from leantrain.model.loading import embedded_model_path  # (only to find the same MiniLM folder)

    model_dir = str(embedded_model_path())
    tok = AutoTokenizer.from_pretrained(model_dir)

    def build(path: str) -> datasets.Dataset:
        texts, labels = read_tsv(path, ["sentence"], "label")
        return datasets.Dataset.from_dict({**tok(*texts, truncation=True, max_length=spec["max_length"]),
                                           "labels": labels})  # fmt: skip

    train_set, dev_set = build(spec["train"]), build(spec["dev"])
    model = AutoModelForSequenceClassification.from_pretrained(model_dir, num_labels=2)
    clock = {"eval": 0.0, "rows": []}

    class Timed(Trainer):
        def evaluate(self, *a, **kw):
            t = time.perf_counter()
            out = super().evaluate(*a, **kw)
            clock["eval"] += time.perf_counter() - t
            return out

    class Watch(TrainerCallback):
        def on_train_begin(self, args, state, control, **kw):
            clock["start"] = time.perf_counter()

        def on_step_end(self, args, state, control, **kw):
            clock["at"] = time.perf_counter() - clock["start"] - clock["eval"]  # training seconds so far

        def on_evaluate(self, args, state, control, metrics=None, **kw):
            clock["rows"].append({"step": state.global_step, "seconds": clock["at"], **(metrics or {})})

    def accuracy(p):
        return {"accuracy": float((np.argmax(p.predictions, axis=-1) == p.label_ids).mean())}

    extra: dict[str, Any] = {}
    if spec["optim"] in ("galore_adamw", "apollo_adamw"):
        args_of = {
            "galore_adamw": "rank=128,update_proj_gap=200,scale=0.25",
            "apollo_adamw": "rank=128,update_proj_gap=200,scale=1.0,proj=random,scale_type=channel",
        }
        extra = dict(optim_target_modules=HF_TARGETS, optim_args=args_of[spec["optim"]])  # fmt: skip
    args = TrainingArguments(
        output_dir=spec["out"], optim=spec["optim"], learning_rate=spec["lr"], max_steps=spec["steps"],
        per_device_train_batch_size=spec["batch"], per_device_eval_batch_size=64, warmup_steps=0.06,
        lr_scheduler_type="constant" if spec["constant"] else "linear", eval_strategy="steps",
        eval_steps=spec["eval_every"], save_strategy="no", logging_strategy="no", report_to="none", seed=1,
        bf16=spec["bf16"],
        use_cpu=True, dataloader_num_workers=0, train_sampling_strategy="group_by_length", disable_tqdm=True,
        **extra,
    )  # fmt: skip
    trainer = Timed(model=model, args=args, train_dataset=train_set, eval_dataset=dev_set, callbacks=[Watch()],
                    data_collator=DataCollatorWithPadding(tok), compute_metrics=accuracy)  # fmt: skip
    trainer.train()
    if not clock["rows"] or clock["rows"][-1]["step"] != spec["steps"]:
        trainer.evaluate()
        clock["rows"][-1]["seconds"] = clock["at"]
    state = trainer.optimizer.optimizer if hasattr(trainer.optimizer, "optimizer") else trainer.optimizer
    from leantrain.model.optimizers import state_bytes

    evals = [{"step": r["step"], "seconds": r["seconds"], "eval_accuracy": r["eval_accuracy"],
              "eval_loss": r["eval_loss"]} for r in clock["rows"]]  # fmt: skip
    Path(spec["out"], "result.json").write_text(json.dumps({
        "evals": evals, "train_seconds": clock["at"], "steps": spec["steps"],
        "optimizer_state_bytes": state_bytes(state), "step_ms": 1e3 * clock["at"] / spec["steps"],
        "precision": "bf16" if args.bf16 else "fp32",
    }))  # fmt: skip


# -- reading the sweeps --------------------------------------------------------------------------------------------


def first_reach(run: dict[str, Any], job: Job) -> dict[str, Any] | None:
    for e in run.get("evals", []):
        if job.metric in e and job.reached(e[job.metric]):
            return {"step": e["step"], "seconds": e["seconds"]}
    return None


def final(run: dict[str, Any], job: Job) -> float | None:
    values = [e[job.metric] for e in run.get("evals", []) if job.metric in e]
    return values[-1] if values else None


def best_of(runs: list[dict[str, Any]], job: Job) -> dict[str, Any] | None:
    """The sweep's best run: the soonest to reach the target (in steps), else the best final value."""
    ok = [r for r in runs if "failed" not in r and final(r, job) is not None]
    if not ok:
        return None
    reaching = [r for r in ok if first_reach(r, job)]
    if reaching:
        return min(reaching, key=lambda r: (first_reach(r, job)["step"], first_reach(r, job)["seconds"]))
    sign = 1 if job.lower else -1
    return min(ok, key=lambda r: sign * final(r, job))


def set_lm_target(job: Job, runs: dict[str, list[dict[str, Any]]]) -> None:
    """The AdamW sweep's best final held-out perplexity."""
    finals = [final(r, job) for r in runs.get("adamw", []) if "failed" not in r]
    finals = [f for f in finals if f is not None and math.isfinite(f)]
    job.target = min(finals) if finals else None


# -- the page ------------------------------------------------------------------------------------------------------


def sweep_table(job: Job, runs: dict[str, list[dict[str, Any]]], label: str) -> list[str]:
    metric = job.metric.removeprefix("eval_")
    lines = [
        f"| {label} | lr | final {metric} | steps to target | seconds to target | step ms | optimizer ms/step | "
        "state MB | others' cores |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for optimizer, sweep in runs.items():
        best = best_of(sweep, job)
        for r in sweep:
            if "failed" in r:
                lines.append(f"| {optimizer} | {r['lr']:g} | failed: {r['failed']} | | | | | | |")
                continue
            hit, f = first_reach(r, job), final(r, job)
            mark = " **(best)**" if r is best else ""
            load = f"{r['other_cores']:.1f}" if r.get("other_cores") is not None else "?"
            steps, secs = (str(hit["step"]), f"{hit['seconds']:.0f}") if hit else ("-", "-")
            lines.append(
                f"| {optimizer}{mark} | {r['lr']:g} | {f:.4f} | {steps} | {secs} | {r['step_ms']:.0f} | "
                f"{r.get('optimizer_ms_per_step', float('nan')):.0f} | {r['optimizer_state_bytes'] / 2**20:.1f} | "
                f"{load} |"
            )
    return lines


def goals(jobs: dict[str, Job], results: dict[str, dict[str, list]]) -> list[str]:
    """The issue's goals, each met or by how much not."""
    out = []
    lm = results.get("lm")
    if lm and jobs["lm"].target is not None:
        job = jobs["lm"]
        a, m = best_of(lm.get("adamw", []), job), best_of(lm.get("muon", []), job)
        ha, hm = (first_reach(a, job) if a else None), (first_reach(m, job) if m else None)
        if ha and hm:
            out.append(
                f"- Muon reaches AdamW's final held-out perplexity {job.target:.2f} in {hm['step']} steps against "
                f"AdamW's {ha['step']} ({hm['step'] / ha['step']:.2f}x, goal <= 0.7x) and {hm['seconds']:.0f} s "
                f"against {ha['seconds']:.0f} s ({hm['seconds'] / ha['seconds']:.2f}x, goal <= 0.75x)"
            )
        elif a:
            out.append(f"- Muon does not reach AdamW's final held-out perplexity {job.target:.2f} in its sweep")
    sst = results.get("sst2")
    if sst:
        job = jobs["sst2"]
        fa = max((final(r, job) or 0) for r in sst.get("adamw", []) if "failed" not in r)
        fs = [final(r, job) or 0 for r in sst.get("schedule-free-adamw", []) if "failed" not in r]
        if fs:
            out.append(
                f"- schedule-free AdamW's best final dev accuracy {max(fs):.4f} against AdamW with a linear schedule "
                f"{fa:.4f}: {100 * (max(fs) - fa):+.2f} points (goal: within 0.5 points)"
            )
        adamw_state = min(r["optimizer_state_bytes"] for r in sst.get("adamw", []) if "failed" not in r)
        for name in ("galore-adamw", "apollo-adamw", *VARIANTS):
            ok = [r for r in sst.get(name, []) if "failed" not in r]
            if ok:
                best = max(ok, key=lambda r: final(r, job) or 0)
                less = 1 - best["optimizer_state_bytes"] / adamw_state
                out.append(
                    f"- {name}: {100 * less:.0f}% less optimizer state than AdamW (goal >= 50%), best final dev "
                    f"accuracy {final(best, job):.4f}: {100 * ((final(best, job) or 0) - fa):+.2f} points against "
                    "AdamW's (goal >= -1)"
                )
    return out


def plot(jobs: dict[str, Job], results: dict[str, dict[str, list]], path: Path) -> None:
    """Held-out loss against training seconds, the best run of each optimizer's sweep; the Trainer's dashed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [
        (k, t) for k, t in (("lm", "tiny-llama continued pretraining"), ("sst2", "MiniLM on SST-2")) if k in results
    ]
    if not panels:
        return
    fig, axes = plt.subplots(1, len(panels), figsize=(6.5 * len(panels), 4.2), squeeze=False)
    for ax, (key, title) in zip(axes[0], panels):
        for source, style in ((key, "-"), ("hf", "--") if key == "sst2" else (None, None)):
            if source is None or source not in results:
                continue
            for i, (name, sweep) in enumerate(results[source].items()):
                best = best_of(sweep, jobs[source])
                if best is None:
                    continue
                pts = [(e["seconds"], e["eval_loss"]) for e in best["evals"] if "eval_loss" in e]
                label = f"{name} (lr {best['lr']:g})" + (" HF Trainer" if source == "hf" else "")
                ax.plot(*zip(*pts), style, color=f"C{OPTIMIZERS.index(name) if name in OPTIMIZERS else i}",
                        label=label, marker="." if style == "-" else None)  # fmt: skip
        ax.set(title=title, xlabel="training seconds (evaluations excluded)", ylabel="held-out loss")
        ax.legend(fontsize=7)
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def hardware() -> dict[str, str]:
    import importlib.metadata as md

    import torch
    import transformers

    flags, model = "", "?"
    for line in subprocess.run(["lscpu"], capture_output=True, text=True).stdout.splitlines():
        if line.startswith("Model name:"):
            model = line.split(":", 1)[1].strip()
        if line.startswith("Flags:"):
            flags = line
    versions = {}
    for pkg in ("schedulefree", "pytorch-optimizer", "apollo-torch", "galore-torch", "bitsandbytes", "accelerate"):
        try:
            versions[pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            versions[pkg] = "absent"
    return {
        "cpu": model,
        "amx_bf16": str("amx_bf16" in flags),
        "avx512_bf16": str("avx512_bf16" in flags),
        "cores": str(os.cpu_count()),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        **versions,
    }


def write_page(jobs, results, context, path_stem: Path) -> None:
    from benchmarks._results import write_results

    page = ["# Time to a target, per optimizer", "",
            "Written by `benchmarks/time_to_target.py` (its docstring says how the sweeps are chosen). Seconds are "
            "training seconds: evaluations and saves excluded.", ""]  # fmt: skip
    page += ["## Goals", "", *goals(jobs, results), ""]
    titles = {"lm": "1. preset:tiny-llama, continued pretraining (held-out perplexity)",
              "sst2": "2. MiniLM on SST-2 (dev accuracy, target 0.80)",
              "hf": "3. MiniLM on SST-2 with the HF Trainer's own optim= (dev accuracy, target 0.80)"}  # fmt: skip
    for key, runs in results.items():
        job = jobs[key]
        target = f"target {job.target:.4g}" if job.target is not None else "no target"
        page += [f"## {titles[key]}", "", f"{target}; {job.flags['max_steps']} steps of {job.flags['batch_size']} "
                 f"rows of up to {job.flags['max_length']} tokens, evaluated every {job.flags['eval_every']}.", "",
                 *sweep_table(job, runs, "optimizer"), ""]  # fmt: skip
    page += [f"![held-out loss against training seconds]({path_stem.name}.png)", ""]
    data = {"results": results, "targets": {k: j.target for k, j in jobs.items()},
            "flags": {k: j.flags for k, j in jobs.items()}}  # fmt: skip
    write_results(path_stem.parent, path_stem.name, page, context, data)


# -- main ----------------------------------------------------------------------------------------------------------


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--jobs", default="lm,sst2,hf", help="comma-separated: lm, sst2, hf (default: all)")
    p.add_argument("--optimizers", default=",".join(OPTIMIZERS))
    p.add_argument("--work", type=Path, default=REPO / "runs" / "time_to_target", help="runs are kept here")
    p.add_argument("--pretrain-steps", type=int, default=200)
    p.add_argument("--lm-steps", type=int, default=150)
    p.add_argument("--lm-eval-every", type=int, default=10)
    p.add_argument("--lm-heldout", type=int, default=600, help="held-out documents of the corpus")
    p.add_argument("--lm-lr", type=float, default=1e-3, help="AdamW's centre of the sweep, job 1")
    p.add_argument("--lm-batch-size", type=int, default=16,
                   help="job 1's rows of 128 tokens a step (the pretraining before it keeps 16: copy or link "
                        "another --work's lm/pretrain to start every batch size from the same model)")  # fmt: skip
    p.add_argument("--sst2-steps", type=int, default=150)
    p.add_argument("--sst2-eval-every", type=int, default=25)
    p.add_argument("--sst2-lr", type=float, default=1.5e-4, help="AdamW's centre of the sweep, jobs 2 and 3")
    p.add_argument("--smoke", action="store_true", help="a few steps of each, to check the script end to end")
    p.add_argument("--out", type=Path, default=RESULTS / "time_to_target", help="results stem (.md, .json, .png)")
    p.add_argument("--hf-child", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    args.jobs = [j.strip() for j in args.jobs.split(",") if j.strip()]
    args.optimizers = [o.strip() for o in args.optimizers.split(",") if o.strip()]
    if args.smoke:
        args.pretrain_steps, args.lm_steps, args.lm_eval_every, args.lm_heldout = 6, 6, 3, 40
        args.sst2_steps, args.sst2_eval_every = 6, 3
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.hf_child:
        hf_child(json.loads(args.hf_child))
        return 0
    if not (SHARED / "sst2" / "train.tsv").is_file():
        print(f"skipped: no SST-2 in {SHARED}")
        return 0
    args.work.mkdir(parents=True, exist_ok=True)
    started = (time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), os.getloadavg())
    jobs = make_jobs(args, args.work)
    results: dict[str, dict[str, list]] = {}
    for key in args.jobs:
        job = jobs[key]
        names = [o for o in args.optimizers if (key != "hf" or o in HF_OPTIM) and (key == "sst2" or o not in VARIANTS)]
        model = str(pretrain_lm(args, job, args.work)) if key == "lm" else None
        runs: dict[str, list] = {n: [] for n in names}
        for index in (1, 0, 2):  # the centres first, round-robin over the optimizers
            for name in names:
                lr = lr_grid(name, job.centre)[index]
                print(f"{key}: {name} lr {lr:g}", flush=True)
                run = (
                    hf_run(job, name, lr, args.work) if key == "hf" else leantrain_run(job, name, lr, args.work, model)
                )
                runs[name].append(run)
        for sweep in runs.values():
            sweep.sort(key=lambda r: r["lr"])
        if key == "lm":
            set_lm_target(job, runs)
        results[key] = runs
    ended = (time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), os.getloadavg())
    context = {
        **hardware(),
        "started": f"{started[0]}, load average {' '.join(f'{x:.2f}' for x in started[1])}",
        "ended": f"{ended[0]}, load average {' '.join(f'{x:.2f}' for x in ended[1])}",
        "runs kept in": str(args.work),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write_page(jobs, results, context, args.out)
    plot(jobs, results, args.out.with_suffix(".png"))
    print(args.out.with_suffix(".md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
