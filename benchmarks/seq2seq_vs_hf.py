"""The same sequence-to-sequence job through leantrain and through the HF `Seq2SeqTrainer` with `predict_with_generate`,
in one script: whole-process seconds (training, the generating evaluation and saving included) and ROUGE.

The job: paraphrase generation on MRPC (../shared/data/mrpc). Its pairs whose `Quality` is 1 are paraphrases (2,474
in train.tsv, 279 in dev.tsv): the model reads `#1 String` and writes `#2 String`. No pretrained encoder-decoder is
available offline, so the model is a bert2bert warm-started from the embedded all-MiniLM-L6-v2 (`EncoderDecoderModel`
from the encoder twice; the decoder's cross-attention new), built once here and saved (seeded), so both sides start
from the same weights. Training: `--epochs` (default 3) at batch 16, in `--precision` (auto: bf16 where the CPU runs
it natively, on both sides), AdamW at `--lr` (default 5e-5), weight decay 0.01, 6% warm-up,
linear decay, clipping 1.0, seed 42, sources and targets cut at 64 tokens, batches grouped by length on both sides;
then one evaluation on dev's 279 paraphrase pairs that generates greedily (at most 64 new tokens, batches of 32)
and scores ROUGE, and the model saved. Both sides see the same tokens: the target's leading [CLS] (the decoder's
start token) is left out on both.

leantrain runs as a user types it (`python -m leantrain train --task seq2seq ...`, its defaults otherwise: the report
page is written, the tokenization cache starts empty). The Trainer's side is the script a careful user writes:
`DataCollatorForSeq2Seq`, `train_sampling_strategy="group_by_length"` (transformers 5's `group_by_length`),
`predict_with_generate=True` with a ROUGE `compute_metrics` (rouge-score, stemmed, as leantrain's), no logging,
saving or progress bars during training, `save_model` at the end. Each side runs in its own process, in alternating
pairs (the machine is shared: each pair's ratio is taken apart, the median reported), and one function here re-scores
both final models' ROUGE with plain transformers, so a difference in scoring code cannot hide a difference in models.

    python benchmarks/seq2seq_vs_hf.py                          # writes benchmarks/results/seq2seq_vs_hf.{json,md}
    python benchmarks/seq2seq_vs_hf.py --train-rows 64 --eval-rows 16 --epochs 1 --pairs 1 --out /tmp/s2s  # smoke
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"
MRPC = REPO.parent / "shared" / "data" / "mrpc"
sys.path.insert(0, str(REPO))

#: the training both sides run; a change here changes both
JOB = dict(
    batch_size=16,
    eval_batch_size=32,
    lr=5e-5,
    weight_decay=0.01,
    warmup_ratio=0.06,
    scheduler="linear",
    max_grad_norm=1.0,
    seed=42,
    max_length=64,  # sources and targets
    max_new_tokens=64,
)
ROUGE = ("rouge1", "rouge2", "rougeL", "rougeLsum")


# -- the data and the model --------------------------------------------------------------------------------------------


def paraphrases(path: Path, rows: int | None) -> list[tuple[str, str]]:
    """MRPC's paraphrase pairs (Quality 1) of a split, as published (the TSV has bare quotes: no quoting)."""
    with path.open(encoding="utf-8-sig", newline="") as f:
        table = list(csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE))
    pairs = [(r[3], r[4]) for r in table[1:] if r[0] == "1"]
    return pairs[:rows] if rows else pairs


def prepare(work: Path, train_rows: int | None, eval_rows: int | None, settings: dict) -> dict:
    """The pairs as CSV files (source, target) and JSON, and the warm-started bert2bert folder both sides load."""
    import torch
    from transformers import AutoTokenizer, EncoderDecoderModel
    from transformers.utils import logging as hf_logging

    from leantrain.model.loading import embedded_model_path

    work.mkdir(parents=True, exist_ok=True)
    data = {"train": paraphrases(MRPC / "train.tsv", train_rows), "eval": paraphrases(MRPC / "dev.tsv", eval_rows)}
    for split, pairs in data.items():
        with (work / f"{split}.csv").open("w", newline="", encoding="utf-8") as f:
            w = csv.writer(f)
            w.writerow(["source", "target"])
            w.writerows(pairs)
        (work / f"{split}.json").write_text(json.dumps(pairs))
    minilm = str(embedded_model_path())
    tokenizer = AutoTokenizer.from_pretrained(minilm)
    torch.manual_seed(0)  # the cross-attention's new weights
    hf_logging.set_verbosity_error()  # "newly initialized": the cross-attention, as intended
    model = EncoderDecoderModel.from_encoder_decoder_pretrained(minilm, minilm)
    for config in (model.config, model.generation_config):  # a bert2bert starts from [CLS] and stops at [SEP]
        config.decoder_start_token_id = tokenizer.cls_token_id
        config.pad_token_id = tokenizer.pad_token_id
        config.eos_token_id = tokenizer.sep_token_id
    model.save_pretrained(work / "model-init")
    tokenizer.save_pretrained(work / "model-init")
    (work / "settings.json").write_text(json.dumps(settings))
    copy = rouge([s for s, _ in data["eval"]], [t for _, t in data["eval"]])  # the source as its own paraphrase
    return {"train_pairs": len(data["train"]), "eval_pairs": len(data["eval"]), "copy_baseline": copy}


def rouge(predictions: list[str], references: list[str]) -> dict[str, float]:
    """rouge-score's mean F-measure x 100, Porter-stemmed (what both sides compute)."""
    from rouge_score import rouge_scorer

    scorer = rouge_scorer.RougeScorer(list(ROUGE), use_stemmer=True)
    scores = [scorer.score(ref, pred) for pred, ref in zip(predictions, references)]
    return {k: 100 * sum(s[k].fmeasure for s in scores) / max(len(scores), 1) for k in ROUGE}


# -- the two sides -----------------------------------------------------------------------------------------------------


def leantrain_command(work: Path, out: Path) -> list[str]:
    settings = json.loads((work / "settings.json").read_text())
    flags = {
        "task": "seq2seq",
        "model": work / "model-init",
        "data": work / "train.csv",
        "eval_data": work / "eval.csv",
        "epochs": settings["epochs"],
        "batch_size": JOB["batch_size"],
        "eval_batch_size": JOB["eval_batch_size"],
        "lr": settings["lr"],
        "weight_decay": JOB["weight_decay"],
        "warmup_ratio": JOB["warmup_ratio"],
        "scheduler": JOB["scheduler"],
        "max_grad_norm": JOB["max_grad_norm"],
        "seed": JOB["seed"],
        "max_source_length": JOB["max_length"],
        "max_target_length": JOB["max_length"],
        "generation_max_new_tokens": JOB["max_new_tokens"],
        "precision": settings["precision"],
        "output_dir": out,
        "cache_dir": out.with_name(out.name + "-cache"),  # empty: this run tokenizes
    }
    argv = [sys.executable, "-m", "leantrain", "train", "--no-progress", "--overwrite"]
    for key, value in flags.items():
        argv += ["--" + key.replace("_", "-"), str(value)]
    return argv


def side_hf(work: Path, out: Path) -> dict:
    """The Seq2SeqTrainer job (runs in its own process: `--side hf`)."""
    import torch
    from transformers import (
        AutoModelForSeq2SeqLM,
        AutoTokenizer,
        DataCollatorForSeq2Seq,
        Seq2SeqTrainer,
        Seq2SeqTrainingArguments,
        set_seed,
    )

    settings = json.loads((work / "settings.json").read_text())
    folder = work / "model-init"
    tok = AutoTokenizer.from_pretrained(folder)
    set_seed(JOB["seed"])
    model = AutoModelForSeq2SeqLM.from_pretrained(folder)
    start = model.config.decoder_start_token_id

    def build(split: str) -> tuple[list[dict], list[str]]:  # a list of examples: the Trainer needs no `datasets`
        pairs = json.loads((work / f"{split}.json").read_text())
        sources, targets = [s for s, _ in pairs], [t for _, t in pairs]
        enc = tok(sources, truncation=True, max_length=JOB["max_length"], return_token_type_ids=False)
        labels = tok(text_target=targets, truncation=True, max_length=JOB["max_length"])["input_ids"]
        labels = [ids[1:] if ids and ids[0] == start else ids for ids in labels]  # as leantrain: no [CLS] target
        rows = [{"input_ids": i, "attention_mask": m, "labels": y} for i, m, y in zip(*enc.values(), labels)]
        return rows, targets

    train_rows, _ = build("train")
    eval_rows, references = build("eval")

    order: list[int] = []  # the evaluation's row order: with group_by_length the Trainer evaluates length-grouped

    def compute_metrics(prediction) -> dict[str, float]:
        ids = prediction.predictions
        ids = [[t for t in row if t >= 0] for row in ids]  # the Trainer pads generated ids with -100
        texts = [t.strip() for t in tok.batch_decode(ids, skip_special_tokens=True)]
        return rouge(texts, [references[i] for i in order])

    args = Seq2SeqTrainingArguments(
        output_dir=str(out),
        per_device_train_batch_size=JOB["batch_size"],
        per_device_eval_batch_size=JOB["eval_batch_size"],
        num_train_epochs=settings["epochs"],
        learning_rate=settings["lr"],
        weight_decay=JOB["weight_decay"],
        warmup_steps=JOB["warmup_ratio"],  # transformers 5: a float below 1 is a ratio
        lr_scheduler_type=JOB["scheduler"],
        max_grad_norm=JOB["max_grad_norm"],
        seed=JOB["seed"],
        train_sampling_strategy="group_by_length",  # transformers 5's group_by_length
        predict_with_generate=True,
        generation_num_beams=1,
        use_cpu=not torch.cuda.is_available(),
        bf16=settings["precision"] == "bf16",
        report_to=[],
        save_strategy="no",
        eval_strategy="no",
        logging_strategy="no",
        disable_tqdm=True,
    )
    trainer = Seq2SeqTrainer(
        model=model,
        args=args,
        train_dataset=train_rows,
        eval_dataset=eval_rows,
        processing_class=tok,
        data_collator=DataCollatorForSeq2Seq(tok, model=model),
        compute_metrics=compute_metrics,
    )
    trained = trainer.train()
    order[:] = list(trainer._get_eval_sampler(eval_rows) or range(len(eval_rows)))
    metrics = trainer.evaluate(max_new_tokens=JOB["max_new_tokens"], num_beams=1)
    trainer.save_model(str(out / "model"))
    return {
        "model_dir": str(out / "model"),
        "steps": trained.global_step,
        "train_seconds": trained.metrics["train_runtime"],
        "eval_seconds": metrics["eval_runtime"],
        **{k: metrics[f"eval_{k}"] for k in ROUGE},
        "eval_loss": metrics["eval_loss"],
    }


def run_side(side: str, work: Path, out: Path) -> dict:
    """One side in its own process: its results and its whole-process seconds (start to exit)."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    if side == "leantrain":
        cmd = leantrain_command(work, out)
    else:
        cmd = [sys.executable, __file__, "--side", "hf", "--work", str(work), "--side-out", str(out)]
    from benchmarks.trainer_comparison import OtherLoad

    started = time.perf_counter()
    with OtherLoad() as load:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - started
    if proc.returncode != 0:
        sys.exit(f"{side} failed:\n{proc.stderr[-3000:]}")
    if side == "leantrain":
        m = json.loads((out / "metrics.json").read_text())
        result = {
            "model_dir": str(out / "model"),
            "steps": m["optimizer_steps"],
            "train_seconds": m["train_seconds"],
            "eval_seconds": m["time_eval_seconds"],
            **{k: m[f"eval_{k}"] for k in ROUGE},
            "eval_loss": m["eval_loss"],
        }
    else:
        result = json.loads(proc.stdout.strip().splitlines()[-1])
    return {**result, "process_seconds": seconds, "other_processes_cores": load.cores}


def rescore(model_dir: str, work: Path) -> dict[str, float]:
    """One scorer for both final models: greedy generation with plain transformers, longest sources first in batches
    of 32, at most 64 new tokens, ROUGE against dev's targets."""
    import torch
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(work / "model-init")
    model = AutoModelForSeq2SeqLM.from_pretrained(model_dir).eval()
    pairs = json.loads((work / "eval.json").read_text())
    order = sorted(range(len(pairs)), key=lambda i: -len(tok(pairs[i][0])["input_ids"]))
    texts: dict[int, str] = {}
    for start in range(0, len(order), JOB["eval_batch_size"]):
        chunk = order[start : start + JOB["eval_batch_size"]]
        enc = tok(
            [pairs[i][0] for i in chunk],
            truncation=True,
            max_length=JOB["max_length"],
            padding=True,
            return_tensors="pt",
            return_token_type_ids=False,
        )
        with torch.no_grad():
            out = model.generate(**enc, max_new_tokens=JOB["max_new_tokens"], do_sample=False, num_beams=1)
        for i, text in zip(chunk, tok.batch_decode(out, skip_special_tokens=True)):
            texts[i] = text.strip()
    return rouge([texts[i] for i in range(len(pairs))], [t for _, t in pairs])


# -- the comparison ----------------------------------------------------------------------------------------------------


SIDES = {"leantrain": "leantrain (`--task seq2seq`)", "hf": "HF Seq2SeqTrainer (predict_with_generate)"}


def measure(work: Path, pairs: int) -> dict[str, list[dict]]:
    runs: dict[str, list[dict]] = {side: [] for side in SIDES}
    order = [("leantrain", "hf") if i % 2 == 0 else ("hf", "leantrain") for i in range(pairs)]
    for i, pair in enumerate(order):
        for side in pair:
            result = run_side(side, work, work / f"{side}-{i}")
            result["rescored"] = rescore(result["model_dir"], work)
            runs[side].append(result)
            print(side, json.dumps(result), flush=True)
    return runs


def publish(out: Path, data: dict, runs: dict[str, list[dict]], settings: dict, context: dict) -> str:
    from benchmarks._results import write_results

    pairs = list(zip(runs["leantrain"], runs["hf"]))
    whole = [theirs["process_seconds"] / ours["process_seconds"] for ours, theirs in pairs]
    loop = [theirs["train_seconds"] / ours["train_seconds"] for ours, theirs in pairs]
    evals = [theirs["eval_seconds"] / ours["eval_seconds"] for ours, theirs in pairs]
    gaps = {k: [ours["rescored"][k] - theirs["rescored"][k] for ours, theirs in pairs] for k in ROUGE}
    speedup = statistics.median(whole)
    worst_gap = max(abs(statistics.median(g)) for g in gaps.values())
    lines = [
        "# Sequence-to-sequence: leantrain against the HF Seq2SeqTrainer",
        "",
        f"Paraphrase generation on MRPC: {data['train_pairs']:,} training pairs (train.tsv, Quality 1), "
        f"{data['eval_pairs']} held out (dev.tsv, Quality 1); a bert2bert warm-started from all-MiniLM-L6-v2, "
        f"{settings['epochs']:g} epochs at batch {JOB['batch_size']}, peak lr {settings['lr']:g}, "
        f"{settings['precision']}, greedy generation of at "
        f"most {JOB['max_new_tokens']} tokens. {len(pairs)} alternating pairs of runs, each side in its own process; "
        "the median pair's ratios. Written by `benchmarks/seq2seq_vs_hf.py` (its docstring has the whole job).",
        "",
        "| | optimizer steps | training s | evaluation s | whole process s | ROUGE-1 | ROUGE-2 | ROUGE-L | "
        "ROUGE-Lsum | eval loss |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for side, side_runs in runs.items():
        for r in side_runs:
            scores = " | ".join(f"{r['rescored'][k]:.2f}" for k in ROUGE)
            lines.append(
                f"| {SIDES[side]} | {r['steps']} | {r['train_seconds']:.1f} | {r['eval_seconds']:.1f} | "
                f"{r['process_seconds']:.1f} | {scores} | {r['eval_loss']:.4f} |"
            )
    copy = " / ".join(f"{data['copy_baseline'][k]:.2f}" for k in ROUGE)
    lines += [
        "",
        f"**Whole process: leantrain {speedup:.2f}x as fast** (goal 1.3x; pairs "
        f"{', '.join(f'{x:.2f}' for x in whole)}); the training loop {statistics.median(loop):.2f}x, the "
        f"generating evaluation {statistics.median(evals):.2f}x. **ROUGE: the largest median gap "
        f"{worst_gap:.2f} points** (goal: within 1), leantrain minus the Trainer per pair: "
        + "; ".join(f"{k} {', '.join(f'{x:+.2f}' for x in g)}" for k, g in gaps.items())
        + ".",
        "",
        "ROUGE above is one scorer's (`rescore`: plain transformers generation and rouge-score) for both final models;"
        " each side's own evaluation reported "
        + "; ".join(
            f"{SIDES[s]}: " + ", ".join(f"{statistics.mean(x[k] for x in r):.2f}" for k in ("rouge1", "rougeL"))
            for s, r in ((s, runs[s]) for s in SIDES)
        )
        + " (ROUGE-1, ROUGE-L, mean over runs). Copying the source as its own paraphrase scores "
        f"{copy} (ROUGE-1/2/L/Lsum): most of a paraphrase is its source's words.",
    ]
    return write_results(out, "seq2seq_vs_hf", lines, context, {"data": data, "job": JOB, "runs": runs})


def hardware() -> dict[str, str]:
    """lscpu's model name and the matrix instruction sets the CPU has (AMX, AVX-512 BF16/FP16)."""
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    except OSError:
        return {}
    fields = dict(line.split(":", 1) for line in out.splitlines() if ":" in line)
    flags = fields.get("Flags", "").split()
    wanted = [f for f in flags if f.startswith(("amx", "avx512_bf16", "avx512_fp16", "avx512f"))]
    return {"lscpu model name": fields.get("Model name", "?").strip(), "matrix flags": " ".join(wanted) or "none"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--train-rows", type=int, help="the first N training paraphrases (default: all 2,474)")
    parser.add_argument("--eval-rows", type=int, help="the first N dev paraphrases (default: all 279)")
    parser.add_argument("--epochs", type=float, default=3)
    parser.add_argument("--lr", type=float, default=JOB["lr"], help="both sides' peak learning rate")
    parser.add_argument("--pairs", type=int, default=2, help="leantrain / Trainer runs, alternating order")
    parser.add_argument(
        "--precision",
        choices=("auto", "fp32", "bf16"),
        default="auto",
        help="both sides' precision; auto: bf16 where this CPU runs it natively (AMX, AVX-512 BF16), else fp32",
    )
    parser.add_argument("--out", type=Path, default=RESULTS, help="where seq2seq_vs_hf.{json,md} go")
    parser.add_argument("--work", type=Path, default=None)
    parser.add_argument("--side", choices=["hf"], help=argparse.SUPPRESS)
    parser.add_argument("--side-out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.side:
        print(json.dumps(side_hf(args.work, args.side_out)))
        return
    import tempfile

    from benchmarks.trainer_comparison import environment

    if not (MRPC / "train.tsv").is_file():
        sys.exit(f"no MRPC at {MRPC} (see ../shared/data/README.md)")
    work = args.work or Path(tempfile.mkdtemp(prefix="seq2seq-vs-hf-"))
    uptime_before = Path("/proc/loadavg").read_text().split()[:3]
    started = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    from leantrain.parallel import choose_precision

    precision, why = choose_precision(args.precision)
    print(f"precision {precision} ({why})", flush=True)
    job = {"precision": precision, "epochs": args.epochs, "lr": args.lr}
    data = prepare(work, args.train_rows, args.eval_rows, job)
    runs = measure(work, args.pairs)
    context = {
        **hardware(),
        **environment(None),
        "run": started,
        "load average (1, 5, 15 min) before / after": f"{' '.join(uptime_before)} / "
        + " ".join(Path("/proc/loadavg").read_text().split()[:3]),
        "other processes' cores during each run": ", ".join(
            f"{r['other_processes_cores']:.2f}" for side in SIDES for r in runs[side]
        ),
        "command": "python benchmarks/seq2seq_vs_hf.py " + " ".join(sys.argv[1:]),
    }
    settings = {"epochs": args.epochs, "lr": args.lr, "precision": f"{precision} ({why})"}
    print(publish(args.out, data, runs, settings, context))


if __name__ == "__main__":
    main()
