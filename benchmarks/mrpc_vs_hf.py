"""MRPC through examples/mrpc.yaml against the Hugging Face Trainer on the same job: binary F1 of the
paraphrase class and accuracy on dev.tsv, as GLUE scores MRPC; the two should agree within one point.

The job (examples/mrpc.yaml, the embedded MiniLM): sentence pairs at max length 128, batch 32, 3 epochs, lr 5e-5,
weight decay 0.01, warm-up 6%, linear schedule, clipping 1.0, seed 42, fp32. The Trainer gets the same numbers as
`TrainingArguments`, dynamic padding, and its scores are computed with scikit-learn from `trainer.predict`.
Seeds differ in what they seed (data order, head), so one pair of runs differs by run-to-run noise too: run
`--seeds 42,43,44` to compare means. Needs a quiet machine: on 2 shared cores one pair takes about an hour.

    python benchmarks/mrpc_vs_hf.py                   # writes benchmarks/results/mrpc_vs_hf.json
    python benchmarks/mrpc_vs_hf.py --max-steps 5     # a quick check that both sides run
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

REPO = Path(__file__).resolve().parents[1]
DATA = REPO.parent / "shared" / "data" / "mrpc"
OUT = REPO / "benchmarks" / "results" / "mrpc_vs_hf.json"


def read_pairs(path: Path) -> tuple[list[str], list[str], list[int]]:
    with path.open(encoding="utf-8-sig", newline="") as f:
        rows = list(csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE))
    return [r["#1 String"] for r in rows], [r["#2 String"] for r in rows], [int(r["Quality"]) for r in rows]


def glue_scores(preds, labels) -> dict[str, float]:
    from sklearn.metrics import accuracy_score, f1_score

    return {"f1": float(f1_score(labels, preds)), "accuracy": float(accuracy_score(labels, preds))}


def run_leantrain(job: dict, seed: int, work: Path, max_steps: int | None) -> dict[str, float]:
    from leantrain import TrainConfig, train

    cfg = TrainConfig.from_yaml(REPO / "examples" / "mrpc.yaml")
    changes = dict(
        data=str(DATA / "train.tsv"),
        eval_data=str(DATA / "dev.tsv"),
        seed=seed,
        precision="fp32",
        output_dir=str(work / f"leantrain-{seed}"),
        progress=False,
        report=False,
        max_steps=max_steps,
    )
    result = train(cfg.replace(**changes))
    return {"f1": result.metrics["eval_f1"], "accuracy": result.metrics["eval_accuracy"]}


def run_hf_trainer(job: dict, seed: int, work: Path, max_steps: int | None) -> dict[str, float]:
    import datasets
    import numpy as np
    import torch
    from transformers import (
        AutoModelForSequenceClassification,
        AutoTokenizer,
        DataCollatorWithPadding,
        Trainer,
        TrainingArguments,
        set_seed,
    )

    from leantrain.model.loading import embedded_model_path

    model_path = str(embedded_model_path())
    tok = AutoTokenizer.from_pretrained(model_path)

    def build(path: Path):
        first, second, labels = read_pairs(path)
        enc = tok(first, second, truncation=True, max_length=job["max_length"])
        return datasets.Dataset.from_dict({**enc, "labels": labels})

    train_ds, dev_ds = build(DATA / "train.tsv"), build(DATA / "dev.tsv")
    set_seed(seed)
    model = AutoModelForSequenceClassification.from_pretrained(model_path, num_labels=2)
    args = TrainingArguments(
        output_dir=str(work / f"trainer-{seed}"),
        per_device_train_batch_size=job["batch_size"],
        per_device_eval_batch_size=2 * job["batch_size"],
        learning_rate=job["lr"],
        num_train_epochs=job["epochs"],
        max_steps=max_steps or -1,
        weight_decay=job["weight_decay"],
        warmup_steps=job["warmup_ratio"],  # transformers 5: a float below 1 is a ratio
        lr_scheduler_type=job["scheduler"],
        max_grad_norm=job["max_grad_norm"],
        seed=seed,
        use_cpu=not torch.cuda.is_available(),  # leantrain uses the GPU where there is one
        report_to=[],
        save_strategy="no",
        eval_strategy="no",
        logging_strategy="no",
        disable_tqdm=True,
    )
    trainer = Trainer(
        model=model, args=args, train_dataset=train_ds, processing_class=tok, data_collator=DataCollatorWithPadding(tok)
    )
    trainer.train()
    pred = trainer.predict(dev_ds)
    return glue_scores(np.argmax(pred.predictions, axis=-1), pred.label_ids)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="42", help="Comma-separated seeds; each runs both sides.")
    parser.add_argument("--max-steps", type=int, default=None, help="Cut both runs short (a smoke test).")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    if not DATA.is_dir():
        print(f"{DATA}: MRPC is absent", file=sys.stderr)
        return 2
    from leantrain import TrainConfig

    example = TrainConfig.from_yaml(REPO / "examples" / "mrpc.yaml")
    job = {k: getattr(example, k) for k in ("max_length", "batch_size", "epochs", "lr", "weight_decay")}
    job |= {k: getattr(example, k) for k in ("warmup_ratio", "scheduler", "max_grad_norm")}
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for seed in (int(s) for s in args.seeds.split(",")):
            ours = run_leantrain(job, seed, Path(tmp), args.max_steps)
            theirs = run_hf_trainer(job, seed, Path(tmp), args.max_steps)
            rows.append({"seed": seed, "leantrain": ours, "hf_trainer": theirs})
            print(json.dumps(rows[-1]), flush=True)
    mean = {
        side: {k: sum(r[side][k] for r in rows) / len(rows) for k in ("f1", "accuracy")}
        for side in ("leantrain", "hf_trainer")
    }
    gap = {k: 100 * (mean["leantrain"][k] - mean["hf_trainer"][k]) for k in ("f1", "accuracy")}
    result = {"job": job, "runs": rows, "mean": mean, "gap_points": gap, "max_steps": args.max_steps}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    table = [
        f"| {r['seed']} | {name} | {r[side]['f1']:.4f} | {r[side]['accuracy']:.4f} |"
        for r in rows
        for side, name in (("leantrain", "leantrain"), ("hf_trainer", "HF Trainer"))
    ]
    args.out.with_suffix(".md").write_text(
        "# MRPC: leantrain (examples/mrpc.yaml) against the HF Trainer on the same job\n\n"
        "Written by `benchmarks/mrpc_vs_hf.py`; the job is in its docstring. F1: binary, of the paraphrase class.\n\n"
        "| seed | | binary F1 | accuracy |\n|---|---|---|---|\n" + "\n".join(table) + "\n\n"
        f"leantrain - HF Trainer (means): F1 {gap['f1']:+.2f} points, accuracy {gap['accuracy']:+.2f} points "
        "(goal: within one point).\n"
    )
    print(f"gap (leantrain - HF Trainer, points): F1 {gap['f1']:+.2f}, accuracy {gap['accuracy']:+.2f}")
    return 0 if args.max_steps or all(abs(g) <= 1.0 for g in gap.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
