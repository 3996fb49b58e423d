"""A causal LM's output head in training, three ways in one script: fused with the loss over chunks of
counted rows (leantrain's default: the logits never whole), its logits at the counted positions only, and every
position's logits (what a trainer that cuts nothing computes).

Two jobs on `preset:tiny-llama`'s architecture (4 layers, hidden 256, vocabulary 8,192, from scratch), 16 packed
rows of 128 tokens a step, fp32, AdamW: continued pretraining on real short documents (every token counts but each
document's last), and instruction tuning on SST-2 prompts ("Review: ...\\nSentiment:" -> " positive"/" negative":
the completion and EOS count, the prompt does not). Each run is its own process; the ways alternate, so a
neighbour's load falls on all. The peers are leantrain itself with the fusion turned off (`head_loss_works` says
no), and with the selection off too (its task's `forward` and FLOP count put back to the base task's). Reported:
tokens per second of the training loop (every token in the rows, the same data each way), peak memory over the
baseline, and the final training loss (equal up to rounding).

    python benchmarks/lm_logits.py                 # writes benchmarks/results/lm_logits.{json,md}
    python benchmarks/lm_logits.py --steps 5 --repeats 1
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks._results import write_results  # noqa: E402

MODES = ("fused with the loss", "counted rows' logits", "every position's logits")


def one_run(work: Path, job: str, mode: str, steps: int) -> dict:
    """Runs in a child process: one training run, its metrics."""
    from leantrain import TrainConfig, train
    from leantrain.tasks import causal_lm
    from leantrain.tasks.base import Task
    from leantrain.tasks.causal_lm import CausalLM

    if mode != MODES[0]:
        causal_lm.head_loss_works = lambda model: False
    if mode == MODES[2]:
        CausalLM.forward = Task.forward  # type: ignore[method-assign]
        CausalLM.tail_rows = Task.tail_rows  # type: ignore[method-assign]
    data = {"pretraining": work / "train.txt", "instruction tuning": work / "sst2_train.jsonl"}[job]
    result = train(
        TrainConfig(
            model=str(work / "model-init"),
            data=str(data),
            max_length=128,
            batch_size=16,
            max_steps=steps,
            precision="fp32",
            optimizer="adamw",
            lr=3e-3,
            seed=0,
            eval_fraction=0.02,
            output_dir=str(work / "out"),
            cache_dir=str(work / "cache"),
            overwrite=True,
            progress=False,
            report=False,
        )
    )
    m = result.metrics
    keys = ("steady_tokens_per_second", "train_tokens_per_second", "peak_memory_over_baseline_bytes", "train_loss")
    return {k: m[k] for k in keys} | {"steady_mfu": m["steady_mfu"]}


def prepare(work: Path, docs: int, prompts: int) -> None:
    from benchmarks.causal_lm_corpus import sft_files
    from benchmarks.causal_lm_vs_hf import prepare as prepare_documents

    prepare_documents(work, docs, held_out=200)
    sft_files(work, prompts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=25)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--child", nargs=3, metavar=("WORK", "JOB", "MODE"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        work, job, mode = args.child
        print(json.dumps(one_run(Path(work), job, mode, args.steps)))
        return

    from leantrain.commands import bench

    work = Path(tempfile.mkdtemp(prefix="lm-logits-"))
    prepare(work, docs=6000, prompts=8000)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    load_before = os.getloadavg()
    runs: dict[str, dict[str, list[dict]]] = {}
    for job in ("pretraining", "instruction tuning"):
        for r in range(args.repeats):
            for mode in MODES if r % 2 == 0 else MODES[::-1]:
                cmd = [sys.executable, __file__, "--steps", str(args.steps), "--child", str(work), job, mode]
                proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
                if proc.returncode != 0:
                    sys.exit(f"{job}, {mode} failed:\n{proc.stderr[-3000:]}")
                runs.setdefault(job, {}).setdefault(mode, []).append(json.loads(proc.stdout.splitlines()[-1]))
                print(job, mode, runs[job][mode][-1], flush=True)

    def median(job: str, mode: str, key: str) -> float:
        return statistics.median(float(x[key]) for x in runs[job][mode])

    page = [
        "# The output head of causal LM training: fused with the loss, counted rows, every position",
        "",
        f"`preset:tiny-llama`'s architecture from scratch, 16 packed rows of 128 tokens a step, fp32, AdamW, "
        f"{args.steps} steps a run, medians of {args.repeats} runs each way, alternating. Tokens/s: every token of "
        "the rows (the same data each way), steady (after the warm-up steps). Written by "
        "`benchmarks/lm_logits.py`.",
        "",
        "| job | head | tokens/s | speed-up | steady MFU | peak memory over baseline | final train loss |",
        "|---|---|---|---|---|---|---|",
    ]
    for job in runs:
        base = median(job, MODES[2], "steady_tokens_per_second")
        for mode in MODES:
            tps = median(job, mode, "steady_tokens_per_second")
            page.append(
                f"| {job} | {mode} | {tps:.0f} | {tps / base:.2f}x | {median(job, mode, 'steady_mfu'):.1%} | "
                f"{median(job, mode, 'peak_memory_over_baseline_bytes') / 2**20:.0f} MiB | "
                f"{runs[job][mode][0]['train_loss']:.6f} |"
            )
    context = {"load average before / after": f"{load_before} / {os.getloadavg()}", **bench.environment_context()}
    text = write_results(REPO / "benchmarks" / "results", "lm_logits", page, context, {"runs": runs})
    print(text)


if __name__ == "__main__":
    main()
