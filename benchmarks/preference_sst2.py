"""Preference tuning start to finish on SST-2: `preset:tiny-llama` instruction-tuned on SST-2 prompts (the language
model job of benchmarks/causal_lm_corpus.py: pretrained from scratch on offline text, then tuned on
"Review: ...\\nSentiment:" -> " positive"/" negative"), then tuned on preference pairs built from SST-2 train (chosen:
the right label, rejected: the wrong one) with `--task dpo`, and a reward model (`--task reward-model`) on the same
pairs.

Goals: the DPO model's dev generated-label accuracy (greedy decoding reproduces the label and EOS exactly: the
instruction evaluation's exact match) at least 5 points above the SFT model's; the reward model's pairwise accuracy on
dev pairs at least 0.85. SST-2's labelled test split (test-labeled.tsv, never used for a choice here) is scored too.

    python benchmarks/preference_sst2.py --work W               # all of it (stage 1 is ~30 minutes on 2 cores)
    python benchmarks/preference_sst2.py --work W --sft W/sft   # stage 2 again, from stage 1's instruction-tuned run
    python benchmarks/preference_sst2.py --work W --pretrain-steps 20 --sft-steps 20 --dpo-steps 5 --rm-steps 5 \\
        --sft-rows 500 --pair-rows 500 --results /tmp/smoke     # a smoke test (minutes)

Writes benchmarks/results/preference_sst2.{json,md} (or --results).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from benchmarks._results import write_results  # noqa: E402
from benchmarks.causal_lm_corpus import SHARED, corpus_texts, read_tsv, write_corpus  # noqa: E402

RESULTS = REPO / "benchmarks" / "results"
NAMES = {"1": " positive", "0": " negative"}


def hardware() -> dict[str, str]:
    """The machine and versions: lscpu's model name and the matrix/bf16 instruction sets it lists, the load."""
    info = {"machine": platform.machine(), "cores": str(os.cpu_count()), "python": platform.python_version()}
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        out = ""
    for line in out.splitlines():
        if line.startswith("Model name:"):
            info["cpu"] = line.split(":", 1)[1].strip()
        if line.startswith("Flags:"):
            flags = set(line.split(":", 1)[1].split())
            wanted = ("amx_bf16", "amx_tile", "amx_int8", "avx512_bf16", "avx512f", "avx2")
            info["cpu_flags"] = " ".join(f for f in wanted if f in flags) or "none of amx/avx512"
    import accelerate
    import datasets
    import peft
    import tokenizers
    import torch
    import transformers

    import leantrain

    info.update(
        torch=torch.__version__, transformers=transformers.__version__, accelerate=accelerate.__version__,
        datasets=datasets.__version__, peft=peft.__version__, tokenizers=tokenizers.__version__,
        leantrain=getattr(leantrain, "__version__", "?"),
    )  # fmt: skip
    try:
        import trl

        info["trl"] = trl.__version__
    except ImportError:
        pass
    info["uptime_at_start"] = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    return info


def sst2_rows(split: str, limit: int | None = None, seed: int = 0) -> list[tuple[str, str]]:
    """(prompt, label name) of an SST-2 split, its texts' whitespace normalised; `limit` rows drawn at random."""
    rows = read_tsv(SHARED / "sst2" / f"{split}.tsv", 0)
    if limit is not None and limit < len(rows):
        rows = [rows[i] for i in np.random.default_rng(seed).permutation(len(rows))[:limit]]
    return [(f"Review: {' '.join(text.split())}\nSentiment:", NAMES[label]) for text, label in rows if label in NAMES]


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    with path.open("w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
    return path


def instruction_file(path: Path, rows: list[tuple[str, str]]) -> Path:
    return write_jsonl(path, [{"prompt": p, "completion": c} for p, c in rows])


def pair_file(path: Path, rows: list[tuple[str, str]]) -> Path:
    """Chosen: the right label; rejected: the wrong one."""
    other = {" positive": " negative", " negative": " positive"}
    return write_jsonl(path, [{"prompt": p, "chosen": c, "rejected": other[c]} for p, c in rows])


def stage_sft(args, work: Path, common: dict[str, Any]) -> tuple[Path, dict[str, Any]]:
    """The language-model job: `preset:tiny-llama` pretrained from scratch on the offline corpus (a pretrained
    `--base` skips this), then instruction tuning on SST-2."""
    from leantrain import TrainConfig, train

    if args.sft:
        run = Path(args.sft)
        return run / "model", {"reused": str(run), **json.loads((run / "metrics.json").read_text())}
    started = time.perf_counter()
    facts: dict[str, Any] = {"base": args.base}
    base = args.base
    if base == "preset:tiny-llama":
        corpus = work / "corpus.txt"
        facts["corpus"] = write_corpus(corpus_texts(), corpus)
        pretrain = dict(common, model=base, data=str(corpus), eval_fraction=0.05, lr=3e-3)
        pretrain.update(max_steps=args.pretrain_steps, output_dir=str(work / "pretrain"), metric_for_best="loss")
        pre = train(TrainConfig(**pretrain))
        facts.update(pretrain_steps=args.pretrain_steps, pretrain_perplexity=pre.metrics["eval_perplexity"])
        base = str(pre.model_dir)
    sft_train = instruction_file(work / "sft_train.jsonl", sst2_rows("train", args.sft_rows))
    sft_dev = instruction_file(work / "sft_dev.jsonl", sst2_rows("dev"))
    sft = dict(common, model=base, data=str(sft_train), eval_data=str(sft_dev), lr=args.sft_lr)
    sft.update(max_steps=args.sft_steps, output_dir=str(work / "sft"), metric_for_best="loss")
    tuned = train(TrainConfig(**sft))
    facts.update(sft_steps=args.sft_steps, sft_lr=args.sft_lr, seconds=round(time.perf_counter() - started, 1))
    return tuned.model_dir, facts


def generated_label_accuracy(model_dir: Path, data: Path, cache: Path) -> float:
    """Greedy decoding reproduces the label and EOS exactly: the instruction evaluation's exact match."""
    from leantrain.inference.api import evaluate

    scores = evaluate(str(model_dir), data=str(data), cache_dir=str(cache), precision="fp32", task="causal-lm")
    return float(scores["exact_match"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work", required=True, help="Working folder (runs, data files, the cache)")
    parser.add_argument("--sft", default=None, help="Stage 1's instruction-tuned run (its --work folder's sft/)")
    parser.add_argument(
        "--base",
        default="preset:tiny-llama",
        help="The model instruction tuning starts from: preset:tiny-llama (pretrained here first) or a pretrained "
        "causal LM (a folder or a .gguf file: SmolLM2-135M-Instruct, docs/language-models.md)",
    )
    parser.add_argument("--pretrain-steps", type=int, default=500)
    parser.add_argument("--sft-steps", type=int, default=420)
    parser.add_argument("--sft-lr", type=float, default=1e-3)
    parser.add_argument("--sft-rows", type=int, default=None, help="SST-2 train rows for instruction tuning")
    parser.add_argument("--pair-rows", type=int, default=None, help="SST-2 train rows made into pairs")
    parser.add_argument("--dpo-steps", type=int, default=300)
    parser.add_argument("--dpo-lr", type=float, default=1e-4)
    parser.add_argument("--beta", type=float, default=0.1)
    parser.add_argument("--sft-weight", type=float, default=0.0, help="DPO's --sft-weight (the chosen's NLL term)")
    parser.add_argument("--rm-steps", type=int, default=600, help="The reward model's steps (0: no reward model)")
    parser.add_argument("--rm-lr", type=float, default=3e-4)
    parser.add_argument("--rm-model", default=None, help="The reward model's base (default: the SFT model)")
    parser.add_argument(
        "--reward-only", action="store_true", help="Only the reward model: writes preference_sst2_reward.{json,md}"
    )
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--precision", default="auto", help="Every stage's precision (evaluation runs in fp32)")
    parser.add_argument("--results", default=str(RESULTS), help="Folder for the results page")
    parser.add_argument("--name", default="preference_sst2", help="The results page's name (NAME.md, NAME.json)")
    args = parser.parse_args()

    from leantrain import TrainConfig, train

    env = hardware()
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    common = dict(max_length=128, batch_size=args.batch_size, warmup_ratio=0.05, scheduler="cosine",
                  cache_dir=str(work / "cache"), overwrite=True, progress=False, report=False,
                  precision=args.precision)  # fmt: skip
    if args.reward_only:
        return stage_reward(args, env, work, common)
    sft_model, sft_facts = stage_sft(args, work, common)
    sft_dev = instruction_file(work / "sft_dev.jsonl", sst2_rows("dev"))
    sft_test = instruction_file(work / "sft_test.jsonl", sst2_rows("test-labeled"))
    pairs_train = pair_file(work / "pairs_train.jsonl", sst2_rows("train", args.pair_rows, seed=1))
    pairs_dev = pair_file(work / "pairs_dev.jsonl", sst2_rows("dev"))
    cache = work / "cache"
    before = {"dev": generated_label_accuracy(sft_model, sft_dev, cache),
              "test": generated_label_accuracy(sft_model, sft_test, cache)}  # fmt: skip

    started = time.perf_counter()
    pairs = dict(common, model=str(sft_model), data=str(pairs_train), eval_data=str(pairs_dev))
    dpo_job = dict(pairs, task="dpo", lr=args.dpo_lr, beta=args.beta, sft_weight=args.sft_weight)
    dpo_job.update(max_steps=args.dpo_steps)
    dpo = train(TrainConfig(**dpo_job, precompute_reference=True, output_dir=str(work / "dpo")))
    dpo_seconds = time.perf_counter() - started
    after = {"dev": generated_label_accuracy(dpo.model_dir, sft_dev, cache),
             "test": generated_label_accuracy(dpo.model_dir, sft_test, cache)}  # fmt: skip
    reward = None
    if args.rm_steps:
        rm, rm_seconds, rm_test = reward_model(args, dict(pairs, model=args.rm_model or str(sft_model)), work)
        reward = {"steps": args.rm_steps, "lr": args.rm_lr, "seconds": round(rm_seconds, 1),
                  "dev_pairwise_accuracy": rm.metrics["eval_accuracy"], "dev_mean_margin": rm.metrics["eval_margin"],
                  "test_pairwise_accuracy": rm_test["accuracy"], "goal": 0.85}  # fmt: skip
    report(args, env, sft_facts, before, after, dpo.metrics, dpo_seconds, reward)


def reward_model(args, job: dict[str, Any], work: Path):
    """The reward model on the pairs: its run, seconds, and its pairwise accuracy on SST-2's labelled test pairs."""
    from leantrain import TrainConfig, train
    from leantrain.inference.api import evaluate

    started = time.perf_counter()
    rm = train(TrainConfig(**job, task="reward-model", lr=args.rm_lr, max_steps=args.rm_steps,
                           output_dir=str(work / "reward")))  # fmt: skip
    seconds = time.perf_counter() - started
    test = evaluate(str(work / "reward"), data=str(pair_file(work / "pairs_test.jsonl", sst2_rows("test-labeled"))))
    return rm, seconds, test


def stage_reward(args, env, work: Path, common: dict[str, Any]) -> None:
    """`--reward-only`: the reward model on its own base (`--rm-model`), on the pairs the full run makes."""
    pairs_train = pair_file(work / "pairs_train.jsonl", sst2_rows("train", args.pair_rows, seed=1))
    pairs_dev = pair_file(work / "pairs_dev.jsonl", sst2_rows("dev"))
    model = args.rm_model or "embedded:all-MiniLM-L6-v2"
    job = dict(common, model=model, data=str(pairs_train), eval_data=str(pairs_dev))
    rm, seconds, test = reward_model(args, job, work)
    m = rm.metrics
    data = {"reward_model": {"model": model, "steps": args.rm_steps, "lr": args.rm_lr, "seconds": round(seconds, 1),
                             "pair_rows": args.pair_rows or "all", "batch_size": args.batch_size,
                             "precision": m.get("precision"), "dev_pairwise_accuracy": m["eval_accuracy"],
                             "dev_mean_margin": m["eval_margin"], "test_pairwise_accuracy": test["accuracy"],
                             "goal": 0.85}}  # fmt: skip
    r = data["reward_model"]
    page = [
        "# A reward model on SST-2 preference pairs",
        "",
        f"`python benchmarks/preference_sst2.py --reward-only --rm-model {model} --rm-lr {args.rm_lr:g} "
        f"--rm-steps {args.rm_steps} --batch-size {args.batch_size} --pair-rows {args.pair_rows} "
        f"--precision {args.precision} --work W`: pairs built from "
        "SST-2 train (chosen: the right label, rejected: the wrong one), scored on every dev and labelled test pair.",
        "",
        "| base model | steps | pairs per step | seconds | dev pairwise accuracy | dev mean margin | test pairwise "
        "accuracy | goal |",
        "|---|---|---|---|---|---|---|---|",
        f"| {model} | {r['steps']} | {args.batch_size} | {r['seconds']} | {r['dev_pairwise_accuracy']:.4f} | "
        f"{r['dev_mean_margin']:.3f} | {r['test_pairwise_accuracy']:.4f} | >= 0.85 |",
    ]
    print(write_results(Path(args.results), "preference_sst2_reward", page, env, data))


def report(args, env, sft_facts, before, after, dpo, dpo_seconds, reward: dict[str, Any] | None) -> None:
    gain = after["dev"] - before["dev"]
    data = {
        "sft": {**{k: v for k, v in sft_facts.items() if not isinstance(v, dict) or k == "corpus"}, "accuracy": before},
        "dpo": {"steps": args.dpo_steps, "lr": args.dpo_lr, "beta": args.beta, "sft_weight": args.sft_weight,
                "seconds": round(dpo_seconds, 1),
                "accuracy": after, "dev_gain_points": 100 * gain, "goal_gain_points": 5.0,
                **{k: dpo[k] for k in dpo if k.startswith("eval_") or k in ("reference", "reference_seconds",
                                                                          "steady_samples_per_second")}},
        "reward_model": reward,
        "settings": {"base": args.base, "batch_size": args.batch_size, "pair_rows": args.pair_rows or "all",
                     "sft_rows": args.sft_rows, "precision": args.precision},
    }  # fmt: skip
    d, r = data["dpo"], reward
    page = [
        "# Preference tuning on SST-2: DPO and a reward model after instruction tuning",
        "",
        "`python benchmarks/preference_sst2.py` (the command and the reading are below the table).",
        "",
        "| stage | steps | seconds | dev | test | goal |",
        "|---|---|---|---|---|---|",
        f"| instruction-tuned (SFT) from {sft_facts.get('base', args.base)} | "
        f"{sft_facts.get('sft_steps', sft_facts.get('optimizer_steps'))} | "
        f"{sft_facts.get('seconds', '-')} | generated-label accuracy {before['dev']:.4f} | {before['test']:.4f} | |",
        f"| DPO (--precompute-reference, lr {d['lr']:g}, beta {d['beta']:g}, --sft-weight {d['sft_weight']:g}) | "
        f"{d['steps']} | {d['seconds']} | generated-label accuracy "
        f"{after['dev']:.4f} ({d['dev_gain_points']:+.1f} points) | {after['test']:.4f} | +5 points |",
    ]
    if r:
        page.append(
            f"| reward model | {r['steps']} | {r['seconds']} | pairwise accuracy {r['dev_pairwise_accuracy']:.4f} | "
            f"{r['test_pairwise_accuracy']:.4f} | >= 0.85 |"
        )
    print(write_results(Path(args.results), args.name, page, env, data))


if __name__ == "__main__":
    main()
