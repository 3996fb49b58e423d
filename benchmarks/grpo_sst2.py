"""GRPO on SST-2 after instruction tuning: does online RL with a checkable reward beat the instruction-tuned model?

1. The language-model job of `benchmarks/causal_lm_corpus.py` (docs/language-models.md): `preset:tiny-llama`
   pretrained on the real offline corpus, then instruction-tuned on SST-2 train ("Review: ...\\nSentiment:" ->
   " positive"/" negative"), with that script's settings. `--sft-model` starts from a model made so already.
2. GRPO (`--task grpo`) from that model on the SST-2 train prompts with the exact-match reward against the row's
   label (`--reward exact-match --reward-column completion`): 8 completions a prompt, 8 prompts a step, sampled
   at temperature 1, completions of at most 4 tokens.

Both models are scored the same way on all 872 SST-2 dev prompts: the share whose greedy completion is the label
(exact match, surrounding whitespace aside), by leantrain's own sampler. Goal: GRPO at least 5 points above the
instruction-tuned model, within 20 minutes of GRPO on 2 cores. The page shows the reward curve.

    python benchmarks/grpo_sst2.py                                  # the whole job (stage 1: 4 minutes, quiet)
    python benchmarks/grpo_sst2.py --sft-model W/sft/model          # GRPO only, from an instruction-tuned model
    python benchmarks/grpo_sst2.py --pretrain-steps 0 --sft-steps 150 --sft-rows 4000 --grpo-steps 20  # smoke

Writes benchmarks/results/grpo_sst2.{json,md} and grpo_sst2_reward.png.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"
sys.path.insert(0, str(REPO))

#: GRPO's settings (the instruction tuning's are causal_lm_corpus.py's)
GRPO = dict(
    task="grpo",
    reward="exact-match",
    reward_column="completion",
    num_generations=8,
    batch_size=8,
    max_completion_length=4,
    max_length=128,
    temperature=1.0,
    lr=2e-4,
    optimizer="adamw",
    scheduler="constant",
    warmup_ratio=0.05,
    weight_decay=0.0,
    precision="fp32",
    seed=0,
    log_every=5,
)


def hardware() -> dict[str, str]:
    """The CPU's model name and whether it has AMX and AVX-512 BF16 (lscpu), the cores, the load (uptime)."""
    lscpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    fields = dict(line.split(":", 1) for line in lscpu.splitlines() if ":" in line)
    flags = fields.get("Flags", "").split()
    return {
        "cpu": fields.get("Model name", "?").strip(),
        "amx": "yes" if any(f.startswith("amx") for f in flags) else "no",
        "avx512_bf16": "yes" if "avx512_bf16" in flags else "no",
        "cores": str(os.cpu_count()),
        "uptime": subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip(),
    }


def versions() -> dict[str, str]:
    import accelerate
    import torch
    import transformers

    import leantrain

    return {
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "accelerate": accelerate.__version__,
        "leantrain": leantrain.__version__,
    }


def instruction_tuned(args, work: Path) -> tuple[Path, dict]:
    """Stage 1: the causal_lm_corpus.py job (pretraining, then instruction tuning on SST-2 train)."""
    from benchmarks import causal_lm_corpus as lm
    from leantrain import TrainConfig, train

    train_jsonl, _ = lm.sft_files(work, args.sft_rows)
    common = dict(
        model="preset:tiny-llama", max_length=128, batch_size=16, lr=3e-3, warmup_ratio=0.05, scheduler="cosine",
        metric_for_best="loss", cache_dir=str(work / "cache"), overwrite=True, progress=False, report=False,
    )  # fmt: skip
    started, facts = time.perf_counter(), {}
    model = "preset:tiny-llama"
    if args.pretrain_steps:
        corpus = work / "corpus.txt"
        facts["corpus"] = lm.write_corpus(lm.corpus_texts(), corpus)
        pre = train(TrainConfig(**common, data=str(corpus), eval_fraction=0.05, max_steps=args.pretrain_steps,
                                output_dir=str(work / "pretrain")))  # fmt: skip
        model = str(pre.model_dir)
        facts["pretrain_perplexity"] = pre.metrics["eval_perplexity"]
    sft = train(TrainConfig(**{**common, "lr": 1e-3, "model": model}, data=str(train_jsonl), max_steps=args.sft_steps,
                            eval_data=str(work / "sst2_dev.jsonl"), output_dir=str(work / "sft")))  # fmt: skip
    facts.update(
        seconds=round(time.perf_counter() - started, 1), pretrain_steps=args.pretrain_steps, sft_steps=args.sft_steps,
        sft_rows=args.sft_rows or "all", sft_exact_match=sft.metrics["eval_exact_match"],
    )  # fmt: skip
    return sft.model_dir, facts


def greedy_accuracy(model_dir: Path, dev_jsonl: Path, batch: int = 64) -> float:
    """The share of dev prompts whose greedy completion (at most 4 tokens, to EOS) is the label."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from leantrain.model.generation import Sampling, sample
    from leantrain.tasks.grpo import encode_prompts
    from leantrain.tasks.rewards import exact_match

    rows = [json.loads(line) for line in dev_jsonl.read_text().splitlines()]
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    ids = encode_prompts(tokenizer, [r["prompt"] for r in rows])
    greedy = Sampling(4, (tokenizer.eos_token_id,), tokenizer.pad_token_id or tokenizer.eos_token_id, None)
    right = 0.0
    for start in range(0, len(rows), batch):
        completions = sample(model, ids[start : start + batch], 1, greedy)
        texts = tokenizer.batch_decode(completions, skip_special_tokens=True)
        right += sum(exact_match(texts, [r["completion"] for r in rows[start : start + batch]]))
    return right / len(rows)


def grpo(args, model_dir: Path, work: Path) -> tuple[dict, Path]:
    from benchmarks import causal_lm_corpus as lm
    from leantrain import TrainConfig, train

    train_jsonl, dev_jsonl = lm.sft_files(work, None)  # every SST-2 train prompt; all of dev
    if args.grpo_min_words:  # SST-2 train is mostly phrases, dev whole sentences: train on the sentence-like rows
        rows = [
            r for r in train_jsonl.read_text().splitlines() if words(json.loads(r)["prompt"]) >= args.grpo_min_words
        ]
        train_jsonl = work / f"sst2_train_min{args.grpo_min_words}.jsonl"
        train_jsonl.write_text("\n".join(rows) + "\n")
    cfg = TrainConfig(
        **{**GRPO, **json.loads(args.grpo_settings)}, model=str(model_dir), data=str(train_jsonl),
        eval_data=str(dev_jsonl), max_steps=args.grpo_steps,
        eval_every=args.eval_every, cache_dir=str(work / "cache"), output_dir=str(work / "grpo"), overwrite=True,
        progress=False,
    )  # fmt: skip
    started = time.perf_counter()
    result = train(cfg)
    return {"seconds": round(time.perf_counter() - started, 1), **result.metrics}, result.output_dir


def words(prompt: str) -> int:
    """The review's words in a prompt of `sft_files`."""
    return len(prompt.removeprefix("Review: ").removesuffix("\nSentiment:").split())


def plot_reward(run_dir: Path, png: Path) -> None:
    from matplotlib.figure import Figure

    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in rows if "reward" in r]
    evals = [r for r in rows if "eval_reward" in r]
    fig = Figure(figsize=(7, 3.6))
    ax = fig.subplots()
    ax.plot([r["step"] for r in train], [r["reward"] for r in train], label="reward of the sampled completions")
    ax.plot([r["step"] for r in evals], [r["eval_reward"] for r in evals], "o-", label="dev accuracy (greedy)")
    ax.set(xlabel="optimizer step", ylabel="exact-match reward", title="GRPO on SST-2: reward over steps")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(png, dpi=96)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sft-model", type=Path, help="an instruction-tuned model folder: skip stage 1")
    parser.add_argument("--pretrain-steps", type=int, default=500, help="stage 1's pretraining (0: none)")
    parser.add_argument("--sft-steps", type=int, default=420)
    parser.add_argument("--sft-rows", type=int, default=None, help="SST-2 train rows for instruction tuning")
    parser.add_argument("--grpo-steps", type=int, default=300)
    parser.add_argument("--eval-every", type=int, default=100)
    parser.add_argument("--grpo-min-words", type=int, default=0, help="GRPO on train reviews of at least N words")
    parser.add_argument("--grpo-settings", default="{}", help='GRPO settings over the defaults, JSON: {"lr": 1e-4}')
    parser.add_argument("--sft-only", action="store_true", help="stop after stage 1 (its model: WORK/sft/model)")
    parser.add_argument("--work", type=Path, default=None)
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--name", default="grpo_sst2", help="The results' names (NAME.md, NAME.json, NAME_reward.png)")
    args = parser.parse_args()

    before = hardware()
    work = args.work or Path(tempfile.mkdtemp(prefix="grpo-sst2-"))
    work.mkdir(parents=True, exist_ok=True)
    from benchmarks import causal_lm_corpus as lm

    _, dev_jsonl = lm.sft_files(work, None)
    stage1: dict = {"model": str(args.sft_model)} if args.sft_model else {}
    model_dir = args.sft_model
    if model_dir is None:
        model_dir, stage1 = instruction_tuned(args, work)
        (work / "stage1.json").write_text(json.dumps({**stage1, "hardware": before, "after": hardware()}) + "\n")
        if args.sft_only:
            print(json.dumps(stage1))
            return
    elif (args.sft_model.parent.parent / "stage1.json").is_file():  # made by --sft-only: its figures
        stage1 = json.loads((args.sft_model.parent.parent / "stage1.json").read_text())
    sft_accuracy = greedy_accuracy(model_dir, dev_jsonl)
    stage2, run_dir = grpo(args, model_dir, work)
    grpo_accuracy = greedy_accuracy(run_dir / "model", dev_jsonl)
    args.out.mkdir(parents=True, exist_ok=True)
    plot_reward(run_dir, args.out / f"{args.name}_reward.png")
    result = {
        "name": args.name,
        "instruction_tuning": stage1,
        "sft_dev_accuracy": sft_accuracy,
        "grpo_dev_accuracy": grpo_accuracy,
        "gain_points": 100 * (grpo_accuracy - sft_accuracy),
        "grpo": {k: stage2.get(k) for k in KEPT},
        "grpo_settings": {
            **GRPO,
            **json.loads(args.grpo_settings),
            "max_steps": args.grpo_steps,
            "min_words": args.grpo_min_words,
        },
        "hardware_before": before,
        "hardware_after": hardware(),
        "versions": versions(),
    }
    (args.out / f"{args.name}.json").write_text(json.dumps(result, indent=2) + "\n")
    (args.out / f"{args.name}.md").write_text(page(result))
    print(json.dumps(result, indent=2))


KEPT = (
    "seconds", "wall_seconds", "train_seconds", "time_generate_seconds", "time_forward_backward_seconds",
    "time_optimizer_seconds", "time_eval_seconds", "optimizer_steps", "train_samples_per_second", "eval_reward",
    "peak_memory_over_baseline_bytes",
)  # fmt: skip


def page(r: dict) -> str:
    g, s = r["grpo"], r["instruction_tuning"]
    # stage 1 made here is the tiny Llama's; a given --sft-model is named by its folder
    tuned = f"`{s['model']}`" if set(s) == {"model"} else "`preset:tiny-llama`, stage 1"
    minutes = g["wall_seconds"] / 60
    return "\n".join(
        [
            "# GRPO on SST-2 after instruction tuning",
            "",
            "| model | dev generated-label accuracy (872 prompts, greedy) |",
            "|---|---|",
            f"| instruction-tuned ({tuned}) | {r['sft_dev_accuracy']:.4f} |",
            f"| + GRPO, exact-match reward, {g['optimizer_steps']} steps | {r['grpo_dev_accuracy']:.4f} |",
            "",
            f"Gain: **{r['gain_points']:+.1f} points** (goal +5). GRPO took {minutes:.1f} minutes of wall time "
            f"(goal 20 on 2 cores): generation {g['time_generate_seconds']:.0f} s, forward and backward "
            f"{g['time_forward_backward_seconds']:.0f} s, optimizer {g['time_optimizer_seconds']:.0f} s, "
            f"evaluation {g['time_eval_seconds']:.0f} s; {g['train_samples_per_second']:.1f} completions/s.",
            "",
            f"![reward over steps]({r['name']}_reward.png)",
            "",
            f"Stage 1: {json.dumps(s)}",
            "",
            f"GRPO settings: {json.dumps(r['grpo_settings'])}",
            "",
            "| context | |",
            "|---|---|",
            *[f"| {k} | {v} |" for k, v in r["hardware_before"].items()],
            f"| uptime after | {r['hardware_after']['uptime']} |",
            *[f"| {k} | {v} |" for k, v in r["versions"].items()],
            "",
        ]
    )


if __name__ == "__main__":
    main()
