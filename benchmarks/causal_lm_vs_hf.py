"""The same causal-LM job through leantrain (packed rows) and through the HF Trainer (padded batches grouped by
length), in one script: counted tokens per second, whole-process seconds and held-out perplexity.

The job: a 4-layer Llama (`preset:tiny-llama`'s architecture, about 5 M parameters) trained from scratch for one
epoch on a seeded sample of real short documents (SST-2 train sentences, SMS texts and the embedded tweets; labels
dropped), max length 128, AdamW, lr 3e-3, 5% warm-up, cosine, fp32, SDPA attention, seed 0. Both sides start from
the same folder (the config and a BPE tokenizer trained here on the training documents; no weights) and see the
same tokens: documents end with EOS, and documents longer than the max length are left out, so neither side cuts.
Every optimizer step holds about the same tokens: leantrain packs 16 rows of 128 tokens; the Trainer's batch is
2,048 tokens over the mean document length, with `group_by_length` and `DataCollatorForLanguageModeling` (dynamic
padding), as a Trainer user would write it; and once more with the Trainer's default random batches, which pad each
batch to its longest document. Each side runs in its own process, held-out evaluation and saving
included, and one function scores the final models' perplexity on the held-out documents.

Counted tokens are the tokens with a next-token target: each document's length minus one, the same on both sides.

    python benchmarks/causal_lm_vs_hf.py                  # writes benchmarks/results/causal_lm_vs_hf.{json,md}
    python benchmarks/causal_lm_vs_hf.py --docs 800 --pairs 1     # a quick check that both sides run

On a GPU (`benchmarks/gpu_check.py --lm-vs-hf`): `--from-model DIR --from-text FILE` take a model folder (config and
tokenizer; no weights are read) and a CSV `text` column of documents instead of the real corpus and a trained
tokenizer, `--precision bf16` trains both sides in bf16, and `--out` names where the page goes. The Trainer's side
uses a plain list of examples, not `datasets` (which the GPU image lacks).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"
sys.path.insert(0, str(REPO))

MAX_LENGTH = 128
ROWS = 16  # leantrain's packed rows per step: 2,048 tokens
NOTE = (
    "Reading it: both sides run the same model over the same tokens. With `group_by_length` the Trainer's batches"
    " hold documents of nearly one length (its padding column), so packing removes little work. What leantrain "
    "computes less of, and more cheaply, is the output head: only at counted positions (each document's last "
    "token is left out here, the whole prompt in instruction tuning), fused with the loss over chunks of rows, so"
    " the logits never pass through memory whole (benchmarks/results/lm_logits.md); the rest of a step is mostly "
    "matrix products that both sides do alike (docs/language-models.md). Against the Trainer's default random "
    "batches, padded to their longest document, packing also saves the padding. The held-out perplexity after one"
    " epoch moves with the order of the batches: the Trainer's two rows differ only in how batches are drawn."
)
JOB = dict(lr=3e-3, warmup_ratio=0.05, scheduler="cosine", weight_decay=0.01, seed=0, max_grad_norm=1.0)


def prepare(
    work: Path,
    docs: int,
    held_out: int,
    settings: dict | None = None,
    model: Path | None = None,
    text: Path | None = None,
) -> dict:
    """Sample documents, train the tokenizer (or take `model`'s), write the model folder and both sides' data.
    `settings`: max_length, rows and precision (the defaults: fp32, 16 rows of MAX_LENGTH)."""
    settings = settings or {"max_length": MAX_LENGTH, "rows": ROWS, "precision": "fp32"}
    max_length = settings["max_length"]
    model_dir = work / "model-init"
    if model is None:
        from benchmarks.causal_lm_corpus import corpus_texts
        from leantrain.data.lm import train_bpe_tokenizer
        from leantrain.model.presets import preset_config

        texts = [" ".join(t.split()) for group in corpus_texts().values() for t in group]
        texts = [t for t in dict.fromkeys(texts) if t]
        random.Random(0).shuffle(texts)
        tokenizer = train_bpe_tokenizer(texts[: docs + held_out], vocab_size=8192)
        config = preset_config("preset:tiny-llama")
        config.vocab_size = len(tokenizer)
        config.eos_token_id = config.bos_token_id = tokenizer.eos_token_id
        config.pad_token_id = tokenizer.pad_token_id
    else:
        import pandas as pd
        from transformers import AutoConfig, AutoTokenizer

        texts = [" ".join(str(t).split()) for t in pd.read_csv(text)["text"].dropna()]
        tokenizer, config = AutoTokenizer.from_pretrained(model), AutoConfig.from_pretrained(model)
        if tokenizer.pad_token is None:  # the Trainer's collator pads with it; leantrain packs
            tokenizer.pad_token = tokenizer.eos_token
    fits = [t for t in texts if len(tokenizer(t)["input_ids"]) + 1 <= max_length]  # + EOS
    train_docs, eval_docs = fits[:docs], fits[docs : docs + held_out]
    tokenizer.save_pretrained(model_dir)
    config.save_pretrained(model_dir)
    (work / "settings.json").write_text(json.dumps(settings))
    for name, rows in (("train", train_docs), ("eval", eval_docs)):
        (work / f"{name}.txt").write_text("\n\n".join(rows) + "\n")
        (work / f"{name}.json").write_text(json.dumps(rows))
    lengths = [len(tokenizer(t)["input_ids"]) + 1 for t in train_docs]
    return {
        "train_documents": len(train_docs),
        "eval_documents": len(eval_docs),
        "counted_tokens": sum(n - 1 for n in lengths),
        "mean_document_tokens": sum(lengths) / len(lengths),
    }


def side_leantrain(work: Path) -> dict:
    from leantrain import TrainConfig, train

    settings = json.loads((work / "settings.json").read_text())
    result = train(
        TrainConfig(
            model=str(work / "model-init"),
            data=str(work / "train.txt"),
            eval_data=str(work / "eval.txt"),
            max_length=settings["max_length"],
            batch_size=settings["rows"],
            epochs=1,
            precision=settings["precision"],
            optimizer="adamw",
            output_dir=str(work / "leantrain"),
            cache_dir=str(work / "cache"),
            overwrite=True,
            progress=False,
            report=False,
            **JOB,
        )
    )
    m = result.metrics
    return {"model_dir": str(result.model_dir), "train_seconds": m["train_seconds"], "steps": m["optimizer_steps"]}


class CountingCollator:
    """The Trainer's collator, counting the padding of the batches it makes (the Trainer's loader runs in-process)."""

    def __init__(self, inner):
        self.inner, self.real, self.padded = inner, 0, 0

    def __call__(self, features):
        batch = self.inner(features)
        self.real += int(batch["attention_mask"].sum())
        self.padded += batch["attention_mask"].numel()
        return batch

    def padding(self) -> float:
        """The share of the tokens of the batches made so far that were padding."""
        return 1 - self.real / max(self.padded, 1)


def side_hf(work: Path, batch_size: int, grouped: bool = True) -> dict:
    import torch
    from transformers import (
        AutoConfig,
        AutoModelForCausalLM,
        AutoTokenizer,
        DataCollatorForLanguageModeling,
        Trainer,
        TrainingArguments,
        set_seed,
    )

    folder, out = work / "model-init", work / ("hf" if grouped else "hf-random")
    settings = json.loads((work / "settings.json").read_text())
    tok = AutoTokenizer.from_pretrained(folder)

    def build(name: str) -> list[dict]:  # a list of examples: the Trainer needs no `datasets` for it
        docs = json.loads((work / f"{name}.json").read_text())
        return [{"input_ids": tok(d)["input_ids"] + [tok.eos_token_id]} for d in docs]

    collator = CountingCollator(DataCollatorForLanguageModeling(tok, mlm=False))
    set_seed(JOB["seed"])
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(folder), attn_implementation="sdpa")
    args = TrainingArguments(
        output_dir=str(out),
        per_device_train_batch_size=batch_size,
        per_device_eval_batch_size=batch_size,
        num_train_epochs=1,
        learning_rate=JOB["lr"],
        warmup_steps=JOB["warmup_ratio"],  # transformers 5: a float below 1 is a ratio
        lr_scheduler_type=JOB["scheduler"],
        weight_decay=JOB["weight_decay"],
        max_grad_norm=JOB["max_grad_norm"],
        seed=JOB["seed"],
        # transformers 5's name of group_by_length; "random" is the Trainer's default
        train_sampling_strategy="group_by_length" if grouped else "random",
        use_cpu=not torch.cuda.is_available(),
        bf16=settings["precision"] == "bf16",
        report_to=[],
        save_strategy="no",
        eval_strategy="no",
        logging_strategy="no",
        disable_tqdm=True,
    )
    trainer = Trainer(
        model=model,
        args=args,
        train_dataset=build("train"),
        eval_dataset=build("eval"),
        processing_class=tok,
        data_collator=collator,
    )
    trained = trainer.train()
    padding = collator.padding()  # of the training batches
    trainer.evaluate()  # as leantrain's run does at its end
    trainer.save_model(str(out / "model"))
    return {
        "model_dir": str(out / "model"),
        "padding": padding,
        "train_seconds": trained.metrics["train_runtime"],
        "steps": trained.global_step,
    }


def perplexity(model_dir: str, work: Path) -> float:
    """exp(mean loss over the held-out documents' counted tokens), each document alone (padding masked)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(work / "model-init")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval().to(device)
    docs = [tok(d)["input_ids"] + [tok.eos_token_id] for d in json.loads((work / "eval.json").read_text())]
    total, count = 0.0, 0
    with torch.no_grad():
        for start in range(0, len(docs), 32):
            batch = docs[start : start + 32]
            width = max(map(len, batch))
            ids = torch.tensor([d + [tok.pad_token_id] * (width - len(d)) for d in batch])
            mask = torch.tensor([[1] * len(d) + [0] * (width - len(d)) for d in batch])
            ids, mask = ids.to(device), mask.to(device)
            logits = model(input_ids=ids, attention_mask=mask).logits[:, :-1].float()
            target = ids[:, 1:].masked_fill(mask[:, 1:] == 0, -100)
            total += torch.nn.functional.cross_entropy(
                logits.reshape(-1, logits.shape[-1]), target.reshape(-1), ignore_index=-100, reduction="sum"
            ).item()
            count += int((target != -100).sum())
    return math.exp(total / count)


def run_side(side: str, work: Path, batch_size: int) -> tuple[dict, float]:
    """One side in its own process: its result and its whole-process seconds (imports to exit)."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    cmd = [sys.executable, __file__, "--side", side, "--work", str(work), "--hf-batch", str(batch_size)]
    started = time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - started
    if proc.returncode != 0:
        sys.exit(f"{side} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1]), seconds


SIDES = {
    "leantrain": "leantrain (packed)",
    "hf": "HF Trainer (padded, group_by_length)",
    "hf-random": "HF Trainer (padded, random batches: its default)",
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--docs", type=int, default=6000, help="training documents")
    parser.add_argument("--held-out", type=int, default=500)
    parser.add_argument("--pairs", type=int, default=5, help="leantrain / grouped-Trainer runs, alternating order")
    parser.add_argument("--precision", choices=("fp32", "bf16"), default="fp32")
    parser.add_argument("--max-length", type=int, default=MAX_LENGTH)
    parser.add_argument("--rows", type=int, default=ROWS, help="leantrain's packed rows a step")
    parser.add_argument("--from-model", type=Path, help="a model folder's config and tokenizer (no weights)")
    parser.add_argument("--from-text", type=Path, help="with --from-model: a CSV whose `text` column is the documents")
    parser.add_argument("--no-random", action="store_true", help="leave out the Trainer's random-batch default")
    parser.add_argument("--out", type=Path, default=RESULTS, help="where causal_lm_vs_hf.{json,md} go")
    parser.add_argument("--work", type=Path, default=None)
    parser.add_argument("--side", choices=list(SIDES), help=argparse.SUPPRESS)
    parser.add_argument("--hf-batch", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.side:
        if args.side == "leantrain":
            result = side_leantrain(args.work)
        else:
            result = side_hf(args.work, args.hf_batch, grouped=args.side == "hf")
        print(json.dumps(result))
        return

    import tempfile

    from leantrain.commands import bench

    work = args.work or Path(tempfile.mkdtemp(prefix="lm-vs-hf-"))
    load_before = os.getloadavg()
    settings = {"max_length": args.max_length, "rows": args.rows, "precision": args.precision}
    data = prepare(work, args.docs, args.held_out, settings, args.from_model, args.from_text)
    hf_batch = max(1, round(args.rows * args.max_length / data["mean_document_tokens"]))
    sides = [s for s in SIDES if not (args.no_random and s == "hf-random")]
    runs = measure(work, data, hf_batch, args.pairs, sides)
    context = {
        "load average before / after (1, 5, 15 min)": f"{load_before} / {os.getloadavg()}",
        **bench.environment_context(),
    }
    model = f"`{args.from_model}`" if args.from_model else "`preset:tiny-llama`'s architecture from scratch"
    job = (
        f"{model}, one epoch, max length {args.max_length}, {args.precision}, SDPA. leantrain: {args.rows} packed "
        f"rows a step; the Trainer: {hf_batch} documents a step"
    )
    page = publish(args.out, data, hf_batch, runs, job, context)
    print(page)


def measure(work: Path, data: dict, hf_batch: int, pairs: int, sides: list[str]) -> dict[str, list[dict]]:
    """Each side's runs. The machine's speed drifts within the hour: leantrain and the grouped Trainer alternate
    (each pair's ratio is taken apart), and the Trainer's slow default (random batches) runs once, last."""
    runs: dict[str, list[dict]] = {side: [] for side in sides}
    order = [("leantrain", "hf") if i % 2 == 0 else ("hf", "leantrain") for i in range(pairs)]
    for side in [s for pair in order for s in pair] + [s for s in sides if s == "hf-random"]:
        result, seconds = run_side(side, work, hf_batch)
        runs[side].append(
            {
                **result,
                "process_seconds": seconds,
                "tokens_per_second": data["counted_tokens"] / result["train_seconds"],
                "perplexity": perplexity(result["model_dir"], work),
            }
        )
        print(side, runs[side][-1], flush=True)
    return runs


def publish(out: Path, data: dict, hf_batch: int, runs: dict[str, list[dict]], job: str, context: dict) -> str:
    """Write causal_lm_vs_hf.{json,md} into `out`; returns the page."""
    pairs = list(zip(runs["leantrain"], runs["hf"]))
    pair_ratios = [ours["tokens_per_second"] / theirs["tokens_per_second"] for ours, theirs in pairs]
    whole_ratios = [theirs["process_seconds"] / ours["process_seconds"] for ours, theirs in pairs]
    rows = {side: median_run(side_runs) for side, side_runs in runs.items()}
    ours, theirs = rows["leantrain"], rows["hf"]
    ratio, whole = statistics.median(pair_ratios), statistics.median(whole_ratios)
    saved = {"data": data, "hf_batch": hf_batch, "job": JOB, "runs": runs, "pair_ratios": pair_ratios}
    saved |= {"whole_ratios": whole_ratios, "tokens_ratio": ratio, "context": context}
    out.mkdir(parents=True, exist_ok=True)
    (out / "causal_lm_vs_hf.json").write_text(json.dumps(saved, indent=2) + "\n")
    lines = [
        "# A causal LM through leantrain (packed) and the HF Trainer (padded)",
        "",
        f"{data['train_documents']:,} training documents ({data['counted_tokens']:,} counted tokens, "
        f"{data['mean_document_tokens']:.1f} tokens a document), {data['eval_documents']} held out; {job}. leantrain "
        f"and the grouped Trainer ran {len(pairs)} times each, alternating (the median run of each below; the ratio "
        "is the median of the pairs' ratios)"
        + ("; the Trainer's default once" if "hf-random" in runs else "")
        + ". Written by `benchmarks/causal_lm_vs_hf.py`.",
        "",
        "| | optimizer steps | padding | counted tokens/s (loop) | leantrain's speed-up | loop s | whole process s "
        "| held-out perplexity |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for side, r in rows.items():
        padding = f"{r['padding']:.1%}" if "padding" in r else "none (packed)"
        speed_up = ratio if side == "hf" else ours["tokens_per_second"] / r["tokens_per_second"]
        lines.append(
            f"| {SIDES[side]} | {r['steps']} | {padding} | {r['tokens_per_second']:.0f} | {speed_up:.2f}x | "
            f"{r['train_seconds']:.1f} | {r['process_seconds']:.1f} | {r['perplexity']:.2f} |"
        )
    lines += [
        "",
        f"leantrain / HF Trainer with group_by_length: **{ratio:.2f}x** the counted tokens per second (goal 1.5x; "
        f"pairs {', '.join(f'{x:.2f}' for x in pair_ratios)}), whole process {whole:.2f}x as fast (pairs "
        f"{', '.join(f'{x:.2f}' for x in whole_ratios)}); perplexity {ours['perplexity']:.2f} against "
        f"{theirs['perplexity']:.2f} (goal: equal or better).",
        "",
        NOTE,
        "",
        "| context | |",
        "|---|---|",
        *[f"| {k} | {v} |" for k, v in context.items()],
    ]
    (out / "causal_lm_vs_hf.md").write_text("\n".join(lines) + "\n")
    return "\n".join(lines)


def median_run(runs: list[dict]) -> dict:
    """The run of median training speed."""
    return sorted(runs, key=lambda r: r["tokens_per_second"])[(len(runs) - 1) // 2]


if __name__ == "__main__":
    main()
