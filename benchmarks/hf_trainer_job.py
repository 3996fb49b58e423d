"""The Hugging Face Trainer's side of `trainer_comparison.py`: the script a careful user writes for the job.

It reads the TSV files, tokenizes, trains with `Trainer` at its best settings on this CPU (length-grouped
batches, fused AdamW, dynamic padding, no logging, saving or progress bars during training, no dataloader
workers on 2 cores), predicts the dev set, and saves the model and tokenizer: from this script's start to its
exit is the Trainer's "whole process". It imports nothing of leantrain, so its start-up is its own.

What it measured goes to --metrics-out as JSON: the wall seconds of `trainer.train()` and of its loop alone
(from the train-begin to the train-end callback), dev accuracy, and each training batch's rows' token counts,
from which the comparison computes FLOPs the way it computes leantrain's (this script stays free of leantrain).

    python benchmarks/hf_trainer_job.py --job '{"model": ..., "train": ..., ...}' --metrics-out m.json
"""

from __future__ import annotations

import time

STARTED = time.perf_counter()  # the script's clock: start-up is what a user waits for before training

import argparse  # noqa: E402
import csv  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the model is a local folder; never wait on the Hub


def read_tsv(path: str, text_columns: list[str], label_column: str) -> tuple[list[list[str]], list[int]]:
    """GLUE TSV is unquoted, so a bare " is part of the text (QUOTE_NONE); MRPC starts with a BOM (utf-8-sig)."""
    with open(path, encoding="utf-8-sig", newline="") as f:
        rows = list(csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE))
    return [[r[c] for r in rows] for c in text_columns], [int(r[label_column]) for r in rows]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--job", required=True, help="JSON: the job (see trainer_comparison.py's trainer_command)")
    p.add_argument("--metrics-out", required=True)
    a = p.parse_args()
    job = json.loads(a.job)

    import datasets
    import numpy as np
    from transformers import (
        AutoModelForSequenceClassification,
        AutoTokenizer,
        DataCollatorWithPadding,
        Trainer,
        TrainerCallback,
        TrainingArguments,
        set_seed,
    )

    tok = AutoTokenizer.from_pretrained(job["model"])

    def build(path: str) -> datasets.Dataset:
        texts, labels = read_tsv(path, job["text_columns"], job["label_column"])
        enc = tok(*texts, truncation=True, max_length=job["max_length"])
        return datasets.Dataset.from_dict({**enc, "labels": labels})

    train_ds, dev_ds = build(job["train"]), build(job["dev"])

    class LoopClock(TrainerCallback):
        """Times the Trainer's loop alone, to separate set-up inside train() from training."""

        def on_train_begin(self, args, state, control, **kw):
            self.begin = time.perf_counter()

        def on_train_end(self, args, state, control, **kw):
            self.end = time.perf_counter()

    set_seed(job["seed"])  # the new classification head is initialised here, before Trainer seeds again
    model = AutoModelForSequenceClassification.from_pretrained(job["model"], num_labels=2)
    batches: list[list[int]] = []  # real tokens of each row of each training batch, for the FLOP count

    def record(module, args, kwargs):
        mask = kwargs.get("attention_mask")
        if module.training and mask is not None:
            batches.append([int(mask.shape[1]), *mask.sum(dim=1).tolist()])

    model.register_forward_pre_hook(record, with_kwargs=True)
    args = TrainingArguments(
        output_dir=job["output_dir"],
        per_device_train_batch_size=job["batch_size"],
        per_device_eval_batch_size=2 * job["batch_size"],
        learning_rate=job["lr"],
        num_train_epochs=job["epochs"],
        max_steps=job.get("max_steps") or -1,
        weight_decay=job["weight_decay"],
        warmup_steps=job["warmup_ratio"],  # transformers 5: a float below 1 is a ratio (no warmup_ratio)
        lr_scheduler_type=job["scheduler"],
        max_grad_norm=job["max_grad_norm"],
        seed=job["seed"],
        train_sampling_strategy="group_by_length",  # v5 name of group_by_length: 3% padding, not 44%
        optim="adamw_torch_fused",  # 4x faster optimizer step on CPU than foreach
        bf16=(job["precision"] == "bf16"),
        use_cpu=True,
        report_to=[],
        save_strategy="no",
        eval_strategy="no",
        logging_strategy="no",
        disable_tqdm=True,
        dataloader_num_workers=0,  # 2 cores: workers would steal them from the model
    )
    clock = LoopClock()
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
    t1 = time.perf_counter()
    pred = trainer.predict(dev_ds)
    t2 = time.perf_counter()
    accuracy = float((np.argmax(pred.predictions, axis=-1) == pred.label_ids).mean())
    trainer.save_model(os.path.join(job["output_dir"], "model"))  # the published model, with its tokenizer
    examples = sum(len(b) - 1 for b in batches)
    train_seconds = t1 - t0
    metrics = {
        "start_seconds": t0 - STARTED,
        "train_seconds": train_seconds,
        "predict_seconds": t2 - t1,
        "loop_seconds": clock.end - clock.begin,
        "train_examples": examples,
        "samples_per_second": examples / train_seconds,
        "loop_samples_per_second": examples / (clock.end - clock.begin),
        "optimizer_steps": out.global_step,
        "eval_accuracy": accuracy,
        "train_loss": out.training_loss,
        "batches": batches,
    }
    with open(a.metrics_out, "w") as f:
        json.dump(metrics, f)


if __name__ == "__main__":
    main()
