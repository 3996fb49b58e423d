"""The GPU check's host-overhead section (`gpu_check.py --host`): on BERT-base (length 128, micro-batch 64) and the
check's 125 M Llama (packed rows of 1,024, micro-batch 16), in bf16, each job its own process:

- host syncs per optimizer step on quiet steps (telemetry.syncs: reads of device values, device-to-host copies,
  blocking host-to-device copies, cuda.synchronize), counted on a short run of its own (the counting slows a step);
- leantrain eager, `--compile` (mode reduce-overhead: CUDA graphs), BERT compiled on dynamic lengths with static
  shapes (buckets and the filled last micro-batch: graphs compiled, padding), the Llama with `--kernels liger`, and
  eager with `--no-flat-parameters` (what the flat parameters buy on a GPU);
- the HF Trainer on the same model, rows and batch (bf16, adamw_torch_fused): samples/s against leantrain's.

    python benchmarks/gpu_host.py --child JOB.json       # one job (what the section runs per row)
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]

#: (name, model, leantrain settings beyond the model's job); "hf" rows run the HF Trainer, "syncs" rows count syncs
JOBS = (
    ("syncs", "bert", {}),
    ("syncs", "llama", {}),
    ("eager", "bert", {}),
    ("hf", "bert", {}),
    ("compile", "bert", {"compile": True}),
    # five times the steps: on CUDA each length bucket records its own CUDA graph when first met, inside the window
    ("compile on dynamic lengths (static shapes)", "bert", {"compile": True, "pad_to_max_length": False, "steps_x": 5}),
    ("eager", "llama", {}),
    ("hf", "llama", {}),
    ("compile", "llama", {"compile": True}),
    ("compile + liger", "llama", {"compile": True, "kernels": "liger"}),
    ("liger", "llama", {"kernels": "liger"}),
    # what flat parameters (on by default) buy on a GPU: the same eager job stepping tensor by tensor
    ("eager per-tensor", "bert", {"flat_parameters": False}),
    ("eager per-tensor", "llama", {"flat_parameters": False}),
)


def base_jobs(bert_dir: Path, bert_data: Path, lm_dir: Path, lm_data: Path, cache: Path, smoke: bool) -> dict:
    common = {"precision": "bf16", "report": False, "cache_dir": str(cache), "progress": False, "log_every": 1000}
    bert = {**common, "model": str(bert_dir), "data": str(bert_data), "max_length": 128, "pad_to_max_length": True}
    bert.update(batch_size=8 if smoke else 64, lr=1e-4)
    lm = {**common, "model": str(lm_dir), "data": str(lm_data), "task": "causal-lm", "eval_fraction": 0.02}
    lm.update(max_length=128 if smoke else 1024, batch_size=4 if smoke else 16, lr=3e-4)
    return {"bert": bert, "llama": lm}


def section(bases: dict, steps: int, work: Path, clock, say, runs: list[str] | None = None) -> list[dict[str, Any]]:
    """Every job while the budget lasts (each given what is left, at least 60 s)."""
    rows = []
    for name, model, over in JOBS:
        if model not in bases or (runs is not None and name not in runs):
            continue
        if clock.left() < 60:  # a job takes 20-90 s on an H200: none is started that would overrun much
            say(f"host: {name} on {model} skipped (time budget)")
            continue
        over = dict(over)
        steps_here = steps * over.pop("steps_x", 1)
        job = {"kind": name, "model": model, "steps": steps_here, "config": {**bases[model], **over}}
        job["config"]["output_dir"] = str(work / f"{model}-{name.replace(' ', '_').replace(',', '')}")
        spec = work / f"{model}-{len(rows)}.json"
        spec.write_text(json.dumps(job))
        started = time.perf_counter()
        try:
            done = subprocess.run(
                [sys.executable, __file__, "--child", str(spec)], capture_output=True, text=True,
                timeout=max(clock.left(), 60),
            )  # fmt: skip
            row = json.loads(done.stdout.strip().splitlines()[-1]) if done.returncode == 0 else {"error": done.stderr}
        except (subprocess.TimeoutExpired, json.JSONDecodeError, IndexError) as e:
            row = {"error": f"{type(e).__name__}: {e}"}
        if "error" in row:
            row["error"] = row["error"].strip().splitlines()[-1][:300] if row["error"].strip() else "failed"
        rows.append({"name": name, "model": model, "seconds": time.perf_counter() - started, **row})
        say(f"host: {json.dumps(rows[-1])}")
    return rows


def render(rows: list[dict[str, Any]]) -> list[str]:
    lines = [
        "| model | run | samples/s | MFU (steady) | x HF Trainer | host syncs / quiet step | graphs | recompiles | "
        "padding |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    hf = {r["model"]: r.get("samples_per_second") for r in rows if r["name"] == "hf"}
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['model']} | {r['name']} | {r['error']} | | | | | | |")
            continue
        sps, ref = r.get("samples_per_second"), hf.get(r["model"])
        ratio = f"{sps / ref:.2f}" if sps and ref and r["name"] != "hf" else "-"
        syncs = r.get("syncs")
        shown_syncs = "-" if syncs is None else ", ".join(f"{k} {v}" for k, v in syncs.items()) or "0"
        mfu, pad = r.get("mfu"), r.get("padding_fraction")
        cells = [
            r["model"], r["name"], "-" if sps is None else f"{sps:.1f}", "-" if mfu is None else f"{mfu:.1%}", ratio,
            shown_syncs, r.get("compiled_graphs") or "-", r.get("recompiles") or "-",
            "-" if pad is None else f"{pad:.1%}",
        ]  # fmt: skip
        lines.append("| " + " | ".join(map(str, cells)) + " |")
    return lines


# -- one job, in its own process -------------------------------------------------------------------------------------
def child(spec_path: Path) -> int:
    job = json.loads(spec_path.read_text())
    if job["kind"] == "hf":
        out = hf_job(job)
    elif job["kind"] == "syncs":
        out = syncs_job(job)
    else:
        from leantrain import TrainConfig, train

        m = train(TrainConfig(**job["config"], max_steps=job["steps"])).metrics
        keys = ("steady_samples_per_second", "steady_mfu", "compiled_graphs", "recompiles", "padding_fraction")
        out = dict(zip(("samples_per_second", "mfu", *keys[2:]), (m.get(k) for k in keys)))
    print(json.dumps(out))
    return 0


def syncs_job(job: dict) -> dict:
    from leantrain import TrainConfig, train
    from leantrain.telemetry.syncs import HostSyncs
    from leantrain.training.hooks import SyncsPerStep

    with HostSyncs() as syncs:
        per = SyncsPerStep(syncs)
        train(TrainConfig(**{**job["config"], "log_every": 8}, max_steps=8), hooks=per)
    per.finish()
    quiet = [per.steps.get(s, {}) for s in (2, 3, 5, 6)]  # neither log (8), evaluate nor save
    kinds = sorted({k for q in quiet for k in q})
    return {"syncs": {k: max(q.get(k, 0) for q in quiet) for k in kinds}}


def hf_job(job: dict) -> dict:
    """The HF Trainer on the model and rows leantrain trains: BERT's rows padded to 128, the LM's packed 1,024-token
    rows (no restart of positions: the Trainer's usual pretraining rows); bf16, fused AdamW, nothing else."""
    import torch
    from transformers import (
        AutoModelForCausalLM,
        AutoModelForSequenceClassification,
        AutoTokenizer,
        Trainer,
        TrainerCallback,
        TrainingArguments,
    )

    cfg, steps = job["config"], job["steps"]
    tokenizer = AutoTokenizer.from_pretrained(cfg["model"])
    lines = Path(cfg["data"]).read_text().splitlines()[1:]
    rows: list[dict[str, Any]] = []
    need = cfg["batch_size"] * (steps + 2)
    if job["model"] == "bert":
        model = AutoModelForSequenceClassification.from_pretrained(cfg["model"], num_labels=2)
        for line in lines[:need]:
            text, label = line.rsplit(",", 1)
            enc = tokenizer(text, truncation=True, max_length=cfg["max_length"], padding="max_length")
            rows.append({**enc, "labels": int(label)})
    else:
        model = AutoModelForCausalLM.from_pretrained(cfg["model"])
        stream: list[int] = []
        for line in lines:
            stream += tokenizer(line)["input_ids"] + [tokenizer.eos_token_id]
            if len(stream) >= need * cfg["max_length"]:
                break
        n = cfg["max_length"]
        rows = [{"input_ids": stream[i : i + n], "labels": stream[i : i + n]} for i in range(0, len(stream) - n, n)]
    rows = (rows * (need // max(len(rows), 1) + 1))[:need]

    warm = min(5, steps // 2)

    class Clock(TrainerCallback):
        """The start of each step; the device drained only at the window's two ends (the Trainer's own steps do
        not wait for the GPU, and neither do leantrain's)."""

        def __init__(self):
            self.starts: list[float] = []

        def on_step_begin(self, args, state, control, **kw):
            if torch.cuda.is_available() and len(self.starts) in (warm, steps - 1):
                torch.cuda.synchronize()
            self.starts.append(time.perf_counter())

    clock = Clock()
    args = TrainingArguments(
        output_dir=cfg["output_dir"], per_device_train_batch_size=cfg["batch_size"], max_steps=steps,
        learning_rate=cfg["lr"], bf16=True, use_cpu=not torch.cuda.is_available(), optim="adamw_torch_fused",
        report_to=[], logging_strategy="no", save_strategy="no", eval_strategy="no", disable_tqdm=True, seed=0,
    )  # fmt: skip
    Trainer(model=model, args=args, train_dataset=rows, callbacks=[clock]).train()
    spans = clock.starts[warm:]
    seconds = spans[-1] - spans[0] if len(spans) > 1 else float("nan")
    return {"samples_per_second": cfg["batch_size"] * (len(spans) - 1) / seconds}


if __name__ == "__main__":
    if sys.argv[1:2] == ["--child"]:
        sys.path.insert(0, str(REPO / "src"))
        sys.exit(child(Path(sys.argv[2])))
    sys.exit(__doc__)
