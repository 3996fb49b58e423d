"""GRPO through leantrain and through TRL's GRPOTrainer on the same job, in one script: completions per second
(generation included) and peak memory, side by side.

The job: an instruction-tuned `preset:tiny-llama` (stage 1 of `benchmarks/grpo_sst2.py`, `--model`), SST-2 train
prompts ("Review: ...\\nSentiment:"), the exact-match reward against the row's label, 8 prompts a step with 8
completions each (64 completions a step: TRL's per_device_train_batch_size 64, num_generations 8), completions of at
most 4 tokens at temperature 1, AdamW at lr 2e-4 (constant), no KL (both sides' default), fp32, seed 0; TRL's loss
"dapo" (its default, leantrain's loss). Each side runs `--steps` optimizer steps in its own process; the sides
alternate (`--pairs`), since the shared machine's speed drifts. Completions per second: the steps' completions
over the training loop's seconds (leantrain's `train_seconds`, TRL's `train_runtime`: sampling, scoring and the
updates; loading and leantrain's final evaluation left out). Peak memory: each process's resident high-water
mark (`wait4`'s ru_maxrss, the same measure for both), and what it rose by over the process after loading the
model (each side's own figure).

    python benchmarks/grpo_vs_trl.py --model W/sft/model                 # writes benchmarks/results/grpo_vs_trl.*
    python benchmarks/grpo_vs_trl.py --model W/sft/model --steps 3 --pairs 1 --out /tmp/x   # a smoke test
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"
sys.path.insert(0, str(REPO))

PROMPTS_A_STEP, GROUP, LONGEST = 8, 8, 4
JOB = dict(lr=2e-4, temperature=1.0, seed=0)


def prompts(work: Path, count: int) -> Path:
    """A seeded sample of SST-2 train as prompt/label rows (TRL keeps a `completion` column from its rewards)."""
    from benchmarks.causal_lm_corpus import SHARED, read_tsv

    rows = read_tsv(SHARED / "sst2" / "train.tsv", 0)
    rows = [rows[i] for i in random.Random(0).sample(range(len(rows)), count)]
    names = {"1": " positive", "0": " negative"}
    path = work / "prompts.jsonl"
    with path.open("w") as f:
        for text, label in rows:
            f.write(
                json.dumps({"prompt": f"Review: {' '.join(text.split())}\nSentiment:", "label": names[label]}) + "\n"
            )
    return path


def side_leantrain(model: Path, data: Path, work: Path, steps: int) -> dict:
    from leantrain import TrainConfig, train

    cfg = TrainConfig(
        task="grpo", model=str(model), data=str(data), eval_data=str(work / "eval.jsonl"), reward="exact-match",
        reward_column="label", num_generations=GROUP, batch_size=PROMPTS_A_STEP, max_completion_length=LONGEST,
        max_length=128, optimizer="adamw", scheduler="constant", warmup_ratio=0.0, weight_decay=0.0,
        precision="fp32", max_steps=steps, log_every=steps, output_dir=str(work / "leantrain"), overwrite=True,
        cache_dir=str(work / "cache"), progress=False, report=False, **JOB,
    )  # fmt: skip
    m = train(cfg).metrics
    return {
        "train_seconds": m["train_seconds"],
        "completions": m["train_examples"],
        "generate_seconds": m["time_generate_seconds"],
    }


def side_trl(model: Path, data: Path, work: Path, steps: int) -> dict:
    from datasets import Dataset
    from transformers import AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    def exact_match(completions, label, **_):
        return [float(c.strip() == y.strip()) for c, y in zip(completions, label)]

    rows = [json.loads(x) for x in data.read_text().splitlines()]
    args = GRPOConfig(
        output_dir=str(work / "trl"), per_device_train_batch_size=PROMPTS_A_STEP * GROUP, num_generations=GROUP,
        max_completion_length=LONGEST, max_steps=steps, learning_rate=JOB["lr"], lr_scheduler_type="constant",
        warmup_steps=0, weight_decay=0.0, temperature=JOB["temperature"], loss_type="dapo", beta=0.0,
        logging_steps=steps, report_to="none", use_cpu=True, save_strategy="no", seed=JOB["seed"], bf16=False,
    )  # fmt: skip
    tokenizer = AutoTokenizer.from_pretrained(model)
    trainer = GRPOTrainer(
        model=str(model), reward_funcs=[exact_match], args=args, train_dataset=Dataset.from_list(rows),
        processing_class=tokenizer,
    )  # fmt: skip
    out = trainer.train()
    return {
        "train_seconds": out.metrics["train_runtime"],
        "completions": steps * PROMPTS_A_STEP * GROUP,
        "generate_seconds": None,
    }


def run_side(side: str, model: Path, data: Path, work: Path, steps: int) -> dict:
    """One side in its own process: its result and its whole-process seconds."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "LEANTRAIN_THREAD_GOVERNOR": "0"}
    cmd = [sys.executable, __file__, "--side", side, "--model", str(model), "--work", str(work), "--steps", str(steps)]
    started = time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"{side} failed:\n{proc.stderr[-3000:]}")
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    result["process_seconds"] = time.perf_counter() - started
    result["completions_per_second"] = result["completions"] / result["train_seconds"]
    return result


SIDES = {"leantrain": side_leantrain, "trl": side_trl}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, required=True, help="an instruction-tuned model folder")
    parser.add_argument("--steps", type=int, default=30, help="optimizer steps each side runs")
    parser.add_argument("--pairs", type=int, default=3, help="leantrain / TRL runs, alternating order")
    parser.add_argument("--work", type=Path, default=None)
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--side", choices=list(SIDES), help=argparse.SUPPRESS)
    args = parser.parse_args()
    work = args.work or Path(tempfile.mkdtemp(prefix="grpo-vs-trl-"))
    work.mkdir(parents=True, exist_ok=True)
    if args.side:
        import resource

        result = SIDES[args.side](args.model, work / "prompts.jsonl", work, args.steps)
        result["max_rss_bytes"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB
        print(json.dumps(result))
        return
    from benchmarks.grpo_sst2 import hardware, versions

    before = hardware()
    data = prompts(work, args.steps * PROMPTS_A_STEP)
    (work / "eval.jsonl").write_text("".join(data.read_text().splitlines(keepends=True)[:8]))
    runs: dict[str, list[dict]] = {"leantrain": [], "trl": []}
    for i in range(args.pairs):
        for side in ("leantrain", "trl") if i % 2 == 0 else ("trl", "leantrain"):
            runs[side].append(run_side(side, args.model, data, work, args.steps))
            print(side, runs[side][-1], flush=True)
    import trl

    result = {"runs": runs, "hardware_before": before, "hardware_after": hardware(),
              "versions": {**versions(), "trl": trl.__version__}, "steps": args.steps}  # fmt: skip
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "grpo_vs_trl.json").write_text(json.dumps(result, indent=2) + "\n")
    text = page(result)
    (args.out / "grpo_vs_trl.md").write_text(text)
    print(text)


def page(r: dict) -> str:
    mib = 2**20
    lt, tr = r["runs"]["leantrain"], r["runs"]["trl"]
    ratios = [a["completions_per_second"] / b["completions_per_second"] for a, b in zip(lt, tr)]
    median = lambda runs, key: statistics.median(x[key] for x in runs)  # noqa: E731
    rows = [
        f"| leantrain | {median(lt, 'completions_per_second'):.1f} | {median(lt, 'max_rss_bytes') / mib:,.0f} MiB | "
        f"{median(lt, 'train_seconds'):.1f} s | {median(lt, 'process_seconds'):.1f} s |",
        f"| TRL GRPOTrainer | {median(tr, 'completions_per_second'):.1f} | {median(tr, 'max_rss_bytes') / mib:,.0f} "
        f"MiB | {median(tr, 'train_seconds'):.1f} s | {median(tr, 'process_seconds'):.1f} s |",
    ]
    return "\n".join(
        [
            "# GRPO: leantrain against TRL's GRPOTrainer",
            "",
            f"{r['steps']} optimizer steps of {PROMPTS_A_STEP} SST-2 prompts x {GROUP} completions (at most "
            f"{LONGEST} tokens, temperature 1), exact-match reward, AdamW, fp32, no KL; medians of "
            f"{len(lt)} alternating pairs.",
            "",
            "| side | completions/s (generation included) | peak resident memory | training loop | whole process |",
            "|---|---|---|---|---|",
            *rows,
            "",
            f"leantrain / TRL completions per second: **{statistics.median(ratios):.2f}x** (pairs: "
            f"{', '.join(f'{x:.2f}' for x in ratios)}; goal 1.5x).",
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
