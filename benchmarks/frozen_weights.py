"""LoRA in bf16 with the frozen weights kept in bf16 against kept in fp32, and against peft + the HF Trainer, in one
script: each process's peak resident memory, its steady step time and its losses.

The job: a BERT-base-shaped classifier (12 layers, hidden 768, 110 M parameters: `BertConfig()`'s defaults, random
weights, the embedded MiniLM's tokenizer, whose vocabulary is BERT-base's) trained with LoRA r=8 on every Linear
outside the head, the head whole, bf16 autocast, AdamW lr 1e-3, micro-batch 16 of SST-2 train sentences (length <=
64), for --steps steps. Three sides, each its own process, in alternating order:

- **leantrain**: as it runs (`model.freezing.store_frozen` keeps frozen Linear weights in bf16);
- **leantrain, frozen fp32**: the same with `store_frozen` switched off (every weight fp32, as before);
- **HF Trainer + peft**: `get_peft_model(..., LoraConfig(task_type="SEQ_CLS", target_modules="all-linear"))` on the
  model as `from_pretrained` loads it (fp32; a bf16 checkpoint in bf16, transformers 5's default, so everything is
  bf16 there), `TrainingArguments(bf16=True)` and batches grouped by length
  (`train_sampling_strategy="group_by_length"`): the usual recipe, which autocasts.

Peak memory is the process's resident high-water mark (`ru_maxrss`), with freed memory returned to the kernel at
once on every side (glibc's mmap threshold), so it is memory in use: through training (read before the model is
saved) and for the whole process, which also saves the merged model (the Trainer side as a user would:
`merge_and_unload().save_pretrained`). The steady step time is the median of the steps after the first five. The
first steps' losses are printed: the two leantrain sides must agree bitwise.

    python benchmarks/frozen_weights.py                 # writes benchmarks/results/frozen_weights.{json,md}
    python benchmarks/frozen_weights.py --steps 10 --rounds 1     # a quick check
    python benchmarks/frozen_weights.py --stored bf16   # a checkpoint stored in bf16: its embedding tables kept too
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"
SST2 = REPO.parent / "shared" / "data" / "sst2" / "train.tsv"
sys.path.insert(0, str(REPO))
MIB = 2**20
SIDES = ("leantrain", "leantrain, frozen fp32", "HF Trainer + peft")
JOB = dict(batch_size=16, max_length=64, lr=1e-3, r=8, rows=2048)


def make_model(folder: Path, stored: str) -> None:
    """BERT-base's architecture with random weights and the embedded MiniLM's tokenizer (the same vocabulary), saved in
    `stored` (bf16: the embedding tables then stay in bf16 too)."""
    import torch
    from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification

    from leantrain.model.loading import embedded_model_path

    torch.manual_seed(0)
    model = BertForSequenceClassification(BertConfig(num_labels=2))
    (model.to(torch.bfloat16) if stored == "bf16" else model).save_pretrained(folder)
    AutoTokenizer.from_pretrained(embedded_model_path()).save_pretrained(folder)


def make_data(path: Path, rows: int) -> None:
    lines = SST2.read_text(encoding="utf-8").splitlines()
    path.write_text("\n".join(lines[: rows + 1]) + "\n", encoding="utf-8")


def run_leantrain(model: Path, data: Path, out: Path, steps: int, frozen_fp32: bool) -> dict:
    from leantrain import TrainConfig, train
    from leantrain.model import freezing
    from leantrain.training.trainer import Trainer

    if frozen_fp32:
        freezing.store_frozen = lambda model, dtype: None
    publish, trained = Trainer._publish, {}

    def publishing(self, *args, **kwargs):  # the high-water mark through training, before the model is saved
        trained["peak_trained_bytes"] = max_rss()
        return publish(self, *args, **kwargs)

    Trainer._publish = publishing
    cfg = TrainConfig(
        model=str(model), data=str(data), output_dir=str(out), cache_dir=str(out.parent / "cache"),
        lora=True, lora_r=JOB["r"], lora_alpha=2 * JOB["r"], lora_dropout=0.0, batch_size=JOB["batch_size"],
        max_length=JOB["max_length"], lr=JOB["lr"], precision="bf16", optimizer="adamw", max_steps=steps,
        log_every=1, eval_every=None, progress=False, report=False, seed=0, warmup_steps=0,
    )  # fmt: skip
    result = train(cfg)
    rows = [json.loads(r) for r in (result.output_dir / "metrics.jsonl").read_text().splitlines()]
    steps_rows = [r for r in rows if "loss" in r]
    times = [b["elapsed_seconds"] - a["elapsed_seconds"] for a, b in itertools.pairwise(steps_rows)]
    return {"losses": [r["loss"] for r in steps_rows[:5]], "step_seconds": times[5:], **trained}


def run_trainer(model: Path, data: Path, out: Path, steps: int) -> dict:
    import csv

    import transformers as hf
    from datasets import Dataset
    from peft import LoraConfig, get_peft_model

    with open(data, encoding="utf-8", newline="") as f:
        rows = list(csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE))
    tokenizer = hf.AutoTokenizer.from_pretrained(model)
    encoded = tokenizer([r["sentence"] for r in rows], truncation=True, max_length=JOB["max_length"])
    dataset = Dataset.from_dict({**encoded, "labels": [int(r["label"]) for r in rows]})
    net = hf.AutoModelForSequenceClassification.from_pretrained(model, num_labels=2)
    config = LoraConfig(task_type="SEQ_CLS", r=JOB["r"], lora_alpha=2 * JOB["r"], target_modules="all-linear")
    net = get_peft_model(net, config)
    stamps: list[float] = []

    trained = {}

    class Clock(hf.TrainerCallback):
        def on_step_end(self, args, state, control, **kw):
            stamps.append(time.perf_counter())

        def on_train_end(self, args, state, control, **kw):
            trained["peak_trained_bytes"] = max_rss()

    args = hf.TrainingArguments(
        output_dir=str(out), per_device_train_batch_size=JOB["batch_size"], learning_rate=JOB["lr"], max_steps=steps,
        bf16=True, use_cpu=True, report_to=[], save_strategy="no", logging_strategy="steps", logging_steps=1,
        disable_tqdm=True, optim="adamw_torch_fused", seed=0, dataloader_num_workers=0, lr_scheduler_type="linear",
        train_sampling_strategy="group_by_length",
    )  # fmt: skip
    trainer = hf.Trainer(
        model=net, args=args, train_dataset=dataset, data_collator=hf.DataCollatorWithPadding(tokenizer),
        callbacks=[Clock()],
    )  # fmt: skip
    trainer.train()
    net.merge_and_unload().save_pretrained(out / "model")  # as leantrain publishes: the merged model
    tokenizer.save_pretrained(out / "model")
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h][:5]
    return {"losses": losses, "step_seconds": [b - a for a, b in itertools.pairwise(stamps)][5:], **trained}


def max_rss() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def child(side: str, work: Path, steps: int, tag: str) -> None:
    out = work / f"run-{tag}"
    model, data = work / "model", work / "train.tsv"
    if side == "HF Trainer + peft":
        row = run_trainer(model, data, out, steps)
    else:
        row = run_leantrain(model, data, out, steps, frozen_fp32=side != "leantrain")
    row["peak_bytes"] = max_rss()
    print("RESULT " + json.dumps(row))


def planned(work: Path) -> dict:
    """The planner's weights and peak for the leantrain side (its micro-batch at the full length: the worst case)."""
    from leantrain.planner.memory import LoraSpec, estimate, model_facts

    facts = model_facts(str(work / "model"), 2)
    est = estimate(facts, JOB["batch_size"], JOB["max_length"], "bf16", False, "adamw", lora=LoraSpec(r=JOB["r"]))
    return {"weights_bytes": est.weights, "peak_bytes": est.peak}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--stored", choices=("fp32", "bf16"), default="fp32", help="the checkpoint's dtype")
    p.add_argument("--child", choices=SIDES, help=argparse.SUPPRESS)
    p.add_argument("--work", type=Path, help=argparse.SUPPRESS)
    p.add_argument("--tag", default="0", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.child:
        child(a.child, a.work, a.steps, a.tag)
        return
    if not SST2.is_file():
        sys.exit(f"{SST2}: absent; this benchmark needs ../shared/data/sst2")
    from leantrain.commands.bench import environment_context
    from leantrain.telemetry.memory import MMAP_THRESHOLD_BYTES

    work = Path(tempfile.mkdtemp(prefix="frozen-weights-"))
    make_model(work / "model", a.stored)
    make_data(work / "train.tsv", JOB["rows"])
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": str(MMAP_THRESHOLD_BYTES), "HF_HUB_OFFLINE": "1"}
    load_before = os.getloadavg()
    runs: dict[str, list[dict]] = {s: [] for s in SIDES}
    for i in range(a.rounds):
        for side in SIDES if i % 2 == 0 else SIDES[::-1]:
            cmd = [sys.executable, __file__, "--child", side, "--work", str(work), "--steps", str(a.steps)]
            proc = subprocess.run([*cmd, "--tag", f"{i}-{SIDES.index(side)}"], capture_output=True, text=True, env=env)
            line = next((x for x in proc.stdout.splitlines() if x.startswith("RESULT ")), None)
            if line is None:
                sys.exit(f"{side} failed:\n{proc.stderr[-3000:]}")
            runs[side].append(json.loads(line[len("RESULT ") :]))
            print(f"{side}: peak {runs[side][-1]['peak_bytes'] / MIB:.0f} MiB", flush=True)
    context = {"load average before / after": f"{load_before} / {os.getloadavg()}", **environment_context()}
    context["peft"] = _version("peft")
    context["command"] = " ".join([Path(sys.argv[0]).name, *sys.argv[1:]])
    write(runs, planned(work), context, a)


def _version(name: str) -> str:
    from importlib.metadata import version

    return version(name)


def write(runs: dict[str, list[dict]], plan: dict, context: dict, a) -> None:
    from benchmarks._results import write_results

    base = min(r["peak_trained_bytes"] for r in runs["HF Trainer + peft"])
    lines = [
        "# LoRA in bf16: frozen weights kept in bf16",
        "",
        f"BERT-base's architecture (110 M parameters, random weights stored in {a.stored}), LoRA r={JOB['r']} on "
        "every Linear outside the "
        f"head, bf16 autocast, micro-batch {JOB['batch_size']} of SST-2 sentences (<= {JOB['max_length']} tokens), "
        f"{a.steps} steps, {a.rounds} round(s) in alternating order, each side its own process. Written by "
        "`benchmarks/frozen_weights.py`.",
        "",
        "| side | peak through training | against the Trainer | peak of the process (the merged model saved too) | "
        "steady step (median) | first losses |",
        "|---|---|---|---|---|---|",
    ]
    for side, rows in runs.items():
        trained, peak = (min(r[k] for r in rows) for k in ("peak_trained_bytes", "peak_bytes"))
        step = statistics.median(t for r in rows for t in r["step_seconds"])
        losses = ", ".join(f"{x:.5f}" for x in rows[0]["losses"][:3])
        lines.append(
            f"| {side} | {trained / MIB:,.0f} MiB | {trained / base:.2f}x | {peak / MIB:,.0f} MiB | "
            f"{1000 * step:.0f} ms | {losses} |"
        )
    same = all(r["losses"] == runs["leantrain"][0]["losses"] for r in runs["leantrain, frozen fp32"])
    lines += [
        "",
        f"The two leantrain sides' logged losses are {'bitwise the same' if same else 'NOT the same'}. The planner "
        f"predicts the leantrain side's weights at {plan['weights_bytes'] / MIB:,.0f} MiB and its peak (every row at "
        f"the full length) at {plan['peak_bytes'] / MIB:,.0f} MiB.",
    ]
    name = "frozen_weights" if a.stored == "fp32" else f"frozen_weights_{a.stored}"
    write_results(RESULTS, name, lines, context, {"job": JOB, "runs": runs, "planned": plan})
    print("\n".join(lines))


if __name__ == "__main__":
    main()
