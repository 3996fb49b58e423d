"""How good are the planner's predictions? Predicted against measured peak memory, and planted budgets probed.

    python benchmarks/planner_accuracy.py                 # everything (~15-30 min on 2 busy cores)
    python benchmarks/planner_accuracy.py --skip-probe    # memory only
    python benchmarks/planner_accuracy.py --probe-only    # planted cases only (memory results kept)
    python benchmarks/planner_accuracy.py --models tiny   # the tiny BERT only
    python benchmarks/planner_accuracy.py --models tiny-llama,gpt2,gqa-llama --skip-probe \
        --out benchmarks/results/planner_accuracy_lm      # causal LMs
    python benchmarks/planner_accuracy.py --models t5-small --skip-probe \
        --out benchmarks/results/planner_accuracy_seq2seq # an encoder-decoder (t5-small's config, random weights)

1. Memory: for MiniLM (all-MiniLM-L6-v2, 22.7 M parameters) and a tiny BERT (2 layers, width 64, 2.0 M),
   at several micro-batches and lengths, with and without activation checkpointing, for AdamW, Adafactor
   and 8-bit AdamW, in fp32 and bf16: the predicted peak (planner.memory, without its one-off runtime
   share) against the measured one (benchmarks/planner_measure.py: the trainer's step, resident
   high-water mark over a baseline taken before the model is built, after a warm-up).
2. Planted cases: budgets that rule out nothing, the baseline, the fastest candidate, every full
   micro-batch, all but the smallest; `plan --probe` runs the top candidates of each as real
   `leantrain train` jobs and re-ranks; the table says whether the prediction alone had already picked
   the fastest fitting probed candidate, and compares each probe's measured peak (a real run: weights plus
   its peak over the baseline, the first step's one-off runtime share included) with the full prediction.
   Plus a budget nothing fits.

Writes benchmarks/results/planner_accuracy.md and .json.
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

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
MIB = 2**20


def tiny_bert(path: Path) -> str:
    from transformers import AutoTokenizer, BertConfig, BertModel

    from leantrain.model.loading import embedded_model_path

    if not (path / "config.json").is_file():
        import torch

        torch.manual_seed(0)
        config = BertConfig(
            vocab_size=30522,
            hidden_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            intermediate_size=128,
            max_position_embeddings=128,
        )
        BertModel(config).save_pretrained(path)
        AutoTokenizer.from_pretrained(embedded_model_path()).save_pretrained(path)
    return str(path)


def tiny_causal_lms(work: Path) -> dict[str, str]:
    """Causal LMs of three shapes: the preset (tied embeddings, vocabulary 8,192), a GPT-2 (dropout,
    learned positions, GELU) and a Llama with grouped-query attention and its own output layer."""
    from transformers import GPT2Config, LlamaConfig

    configs = {
        "gpt2": GPT2Config(vocab_size=5000, n_embd=128, n_layer=2, n_head=4, n_positions=512),
        "gqa-llama": LlamaConfig(
            vocab_size=6000,
            hidden_size=192,
            intermediate_size=512,
            num_hidden_layers=3,
            num_attention_heads=6,
            num_key_value_heads=2,
            tie_word_embeddings=False,
            max_position_embeddings=1024,
        ),
    }
    out = {"tiny-llama": "preset:tiny-llama"}
    for name, config in configs.items():
        config.architectures = [("GPT2LMHeadModel" if name == "gpt2" else "LlamaForCausalLM")]
        config.save_pretrained(work / name)
        out[name] = str(work / name)
    return out


LM_KINDS = ("tiny-llama", "gpt2", "gqa-llama")


def seq2seq_models(work: Path) -> dict[str, str]:
    """Encoder-decoders at real sizes, from their configs alone (random weights): t5-small (512 wide, 6 + 6 layers,
    8 heads, vocabulary 32,128; its head fused with the loss at target tokens)."""
    from transformers import T5Config

    config = T5Config(vocab_size=32128, d_model=512, d_ff=2048, num_layers=6, num_decoder_layers=6, num_heads=8,
                      d_kv=64, architectures=["T5ForConditionalGeneration"])  # fmt: skip
    config.save_pretrained(work / "t5-small")
    return {"t5-small": str(work / "t5-small")}


SEQ2SEQ_KINDS = ("t5-small",)


def length(row: dict) -> str:
    """The row length, and the share of positions counted when not all are (instruction tuning); an encoder-decoder's
    source / target lengths."""
    counted = row.get("counted", 1.0)
    if row.get("target_len"):
        return f"{row['seq_len']} / {row['target_len']}"
    return str(row["seq_len"]) + (f" ({counted:.1%} counted)" if counted < 1 else "")


def grid(model: str | None, kind: str):
    from planner_measure import Trial

    if kind in SEQ2SEQ_KINDS:  # sources of 128 tokens, targets of 64: a few micro-batches, both precisions
        combos = [
            ("fp32", False, "adamw", 4),
            ("fp32", False, "adamw", 8),
            ("fp32", False, "adamw", 16),
            ("fp32", True, "adamw", 16),
            ("bf16", False, "adamw", 8),
            ("bf16", True, "adamw", 8),
            # after the end of backward was modelled on the two checkpointed trials above: checked on two more
            ("fp32", True, "adafactor", 8),
            ("bf16", True, "adamw", 16),
        ]
        return [Trial(model, p, c, o, b, 1, 128, steps=2, target_len=64) for p, c, o, b in combos]
    if kind in LM_KINDS:  # packed rows; the logits' share changes with tokens per micro-batch, not with the split
        combos = [
            ("fp32", False, "adamw", 16, 128),
            ("fp32", True, "adamw", 16, 128),
            ("fp32", False, "adafactor", 4, 512),
            ("fp32", True, "adafactor", 8, 256),
            ("bf16", False, "adamw", 8, 128),
            ("bf16", True, "adamw", 8, 128),
        ]
        trials = [Trial(model, p, c, o, b, 1, s, steps=2) for p, c, o, b, s in combos]
        # accumulation; instruction tuning (the next token counted at one position in 16: logits there only)
        return [
            *trials,
            Trial(model, "fp32", False, "adamw", 8, 2, 128, steps=2),
            Trial(model, "fp32", False, "adamw", 16, 1, 128, steps=2, counted=1 / 16),
        ]
    if kind == "tiny":
        shapes = [(32, 128), (64, 128), (128, 64), (128, 128), (96, 96)]
    else:
        shapes = [(8, 128), (16, 128), (32, 64), (32, 128), (64, 64)]
    trials = []
    combos = [
        ("fp32", False, "adamw"),
        ("fp32", True, "adamw"),
        ("fp32", False, "adafactor"),
        ("fp32", True, "adafactor"),
        ("fp32", False, "adamw8bit"),
        ("bf16", False, "adamw"),
        ("bf16", True, "adamw8bit"),
        ("bf16", False, "adafactor"),
    ]
    for i, (precision, ckpt, opt) in enumerate(combos):
        for j in (0, 1):
            b, s = shapes[(i + 2 * j) % len(shapes)]
            trials.append(Trial(model, precision, ckpt, opt, b, 1, s, steps=2))
    b, s = shapes[1]
    # accumulation: the gradients are alive through backward
    trials.append(Trial(model, "fp32", False, "adamw", b // 2, 2, s, steps=2))
    return trials


def accuracy(model: str | None, kind: str, say) -> list[dict]:
    from planner_measure import measure_trials

    from leantrain.planner import memory as M

    facts = M.model_facts(model)
    rows = []
    trials = grid(model, kind)
    say(f"memory: {kind}, {len(trials)} trials in one process ...")
    for r in measure_trials(trials):
        e = M.estimate(
            facts,
            r["batch_size"],
            r["seq_len"],
            r["precision"],
            r["activation_checkpointing"],
            r["optimizer"],
            r["grad_accum"],
            counted=r.get("counted", 1.0),
            target_len=r.get("target_len", 0),
        )
        rows.append(
            {
                "model": kind,
                **{k: r[k] for k in ("precision", "activation_checkpointing", "optimizer", "batch_size", "grad_accum")},
                "seq_len": r["seq_len"],
                "counted": r.get("counted", 1.0),
                "target_len": r.get("target_len", 0),
                "predicted_mib": e.steady_peak / MIB,
                "measured_mib": r["measured_peak_bytes"] / MIB,
                "error": e.steady_peak / r["measured_peak_bytes"] - 1,
                "phase": e.phase,
                "weights_mib": e.weights / MIB,
                "gradients_mib": e.gradients / MIB,
                "optimizer_mib": e.optimizer_state / MIB,
                "optimizer_measured_mib": r["optimizer_state_bytes"] / MIB,
                "activations_mib": e.activations / MIB,
                "workspace_mib": (e.optimizer_workspace if e.phase == "optimizer step" else e.backward_workspace) / MIB,
            }
        )
        say(
            f"  {rows[-1]['precision']} ckpt={rows[-1]['activation_checkpointing']} {rows[-1]['optimizer']} "
            f"{r['batch_size']}x{r['grad_accum']} len {length(rows[-1])}: predicted {rows[-1]['predicted_mib']:.0f} "
            f"measured {rows[-1]['measured_mib']:.0f} MiB ({rows[-1]['error']:+.1%})"
        )
    return rows


def planted(model: str, data: str, work: Path, say, steps: int) -> list[dict]:
    import dataclasses

    from leantrain.commands.probe import ProbeConfig, probe
    from leantrain.planner.search import PlanRequest, make_plan

    request = PlanRequest(model=model, budget=2**40, global_batch=128, seq_len=64)
    free = make_plan(request)
    by_name = {c.name: c for c in free.candidates}
    lowest = min(c.memory.peak for c in free.candidates)
    baseline = by_name["fp32/no-ckpt/adamw 128x1"].memory.peak
    full = min(c.memory.peak for c in free.candidates if c.grad_accum == 1)
    cases = {
        "generous (everything fits)": 2**40,
        # 20% under the baseline's need: beyond the 15% band in which a near miss is still probed
        "rules out the fp32/AdamW baseline": int(baseline * 0.8),
        "rules out every full micro-batch": int(full * 0.8),
        "between the smallest need and the full micro-batches": (lowest + full) // 2,
        "only the smallest need fits": lowest,
    }
    job = {"model": model, "data": data, "max_length": 64, "cache_dir": str(work / "cache"), "seed": 1}
    out = []
    for i, (case, budget) in enumerate(cases.items()):
        plan = make_plan(dataclasses.replace(request, budget=budget))
        predicted = plan.recommended
        say(f"planted {case}: budget {budget / MIB:.0f} MiB, predicted {predicted.name if predicted else None}")
        probe(plan, job, work / f"case{i}", ProbeConfig(top=3, steps=steps), say=lambda m: None)
        probed = [c for c in plan.candidates if c.measured]
        ok = [c for c in probed if c.measured.get("samples_per_second") and c.measured["peak_bytes"] <= budget]
        truth = max(ok, key=lambda c: c.measured["samples_per_second"]) if ok else None
        out.append(
            {
                "case": case,
                "budget_mib": budget / MIB,
                "predicted": predicted.name if predicted else None,
                "recommended_after_probe": plan.recommended.name if plan.recommended else None,
                "fastest_fitting_probed": truth.name if truth else None,
                "prediction_was_right": bool(predicted and truth and predicted.name == truth.name),
                "probe_recommends_it": bool(plan.recommended and truth and plan.recommended.name == truth.name),
                "probed": [
                    {
                        "name": c.name,
                        "predicted_peak_mib": c.memory.peak / MIB,
                        "measured_peak_mib": (c.measured.get("peak_bytes") or 0) / MIB,
                        "predicted_speed": c.relative_throughput,
                        "samples_per_second": c.measured.get("samples_per_second"),
                    }
                    for c in probed
                ],
            }
        )
        last = out[-1]
        say(f"  -> after probe {last['recommended_after_probe']}; fastest fitting {last['fastest_fitting_probed']}")
    nothing = make_plan(dataclasses.replace(request, budget=lowest // 2))
    out.append({"case": "nothing fits", "budget_mib": lowest / 2 / MIB, "message": nothing.no_fit_message()})
    return out


def context() -> dict:
    from leantrain.commands.bench import environment_context

    ctx = environment_context()
    try:
        import bitsandbytes

        ctx["bitsandbytes"] = bitsandbytes.__version__
    except Exception:
        pass
    lscpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    for line in lscpu.splitlines():
        if line.startswith(("Model name", "CPU(s):", "Flags")) and not line.startswith("Flags"):
            ctx[line.split(":")[0].strip()] = line.split(":", 1)[1].strip()
        if line.startswith("Flags"):  # what bf16 runs on: native instructions (AVX-512 BF16, AMX) or emulation
            wanted = ("avx512_bf16", "amx_bf16", "amx_tile", "amx_fp16")
            have = [f for f in wanted if f in line.split()]
            ctx["bf16 flags"] = ", ".join(have) or "none of " + ", ".join(wanted)
    ctx["load average at start"] = " ".join(Path("/proc/loadavg").read_text().split()[:3])
    return ctx


def write(results: dict, stem: Path) -> None:
    stem.with_suffix(".json").write_text(json.dumps(results, indent=2) + "\n")
    lines = [
        "# Planner accuracy: predicted against measured",
        "",
        "Made by `python benchmarks/planner_accuracy.py`. Memory is the *training memory*: the peak resident size "
        "over a baseline taken before the model is built (so weights count), after a warm-up step in the same "
        "process, with freed tensors handed back to the kernel at once (`MALLOC_MMAP_THRESHOLD_=262144`, as "
        "`--auto` runs do; see docs/planner.md). Predicted: `planner.memory.estimate(...).steady_peak`.",
        "",
    ]
    acc = results.get("accuracy", [])
    if acc:
        worst = max(abs(r["error"]) for r in acc)
        within = sum(abs(r["error"]) <= 0.15 for r in acc)
        lines += [
            f"## Memory: {within} of {len(acc)} within 15% (worst {worst:.1%})",
            "",
            "| model | precision | ckpt | optimizer | micro x accum | length | predicted MiB | measured MiB | error "
            "| peak in | weights | grads | optim (meas.) | activations | workspace |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for r in acc:
            lines.append(
                f"| {r['model']} | {r['precision']} | {'yes' if r['activation_checkpointing'] else 'no'} | "
                f"{r['optimizer']} | {r['batch_size']} x {r['grad_accum']} | {length(r)} | "
                f"{r['predicted_mib']:.1f} | {r['measured_mib']:.1f} | {r['error']:+.1%} | {r['phase']} | "
                f"{r['weights_mib']:.1f} | {r['gradients_mib']:.1f} | {r['optimizer_mib']:.1f} "
                f"({r['optimizer_measured_mib']:.1f}) | {r['activations_mib']:.1f} | {r['workspace_mib']:.1f} |"
            )
        lines.append("")
    if results.get("planted"):
        cases = [c for c in results["planted"] if "predicted" in c]
        right = sum(c["prediction_was_right"] for c in cases)
        probed_right = sum(c["probe_recommends_it"] for c in cases)
        lines += [
            f"## Planted cases (tiny BERT, global batch 128, length 64, --probe top 3, 2 rounds): with --probe the "
            f"recommendation is the fastest fitting probed candidate in {probed_right} of {len(cases)}; the "
            f"prediction alone picked it in {right} of {len(cases)}",
            "",
            "| case | budget MiB | predicted pick | after --probe | fastest fitting probed | prediction right |",
            "|---|---|---|---|---|---|",
        ]
        for c in cases:
            lines.append(
                f"| {c['case']} | {c['budget_mib']:.0f} | {c['predicted']} | {c['recommended_after_probe']} | "
                f"{c['fastest_fitting_probed']} | {'yes' if c['prediction_was_right'] else 'no'} |"
            )
        lines += [
            "",
            "Memory of the probes (real `leantrain train` runs, one-off runtime share included) against the full "
            "prediction is in the table below. Speeds are what a shared 2-core machine gave with neighbours "
            "running (see the load average below): the same candidate can measure 1.5x apart from one case to the "
            "next, so where the prediction and the probe disagree between candidates predicted within ~1.5x of "
            "each other, the probe's ranking is itself within that noise; that is what --probe's two rounds "
            "(fastest run kept) are for.",
        ]
        lines += ["", "Probed candidates (predicted against measured):", ""]
        lines += ["| case | candidate | predicted peak MiB | measured peak MiB | predicted speed | samples/s |"]
        lines.append("|---|---|---|---|---|---|")
        for c in cases:
            for p in c["probed"]:
                sps = f"{p['samples_per_second']:.1f}" if p["samples_per_second"] else "failed"
                lines.append(
                    f"| {c['case']} | {p['name']} | {p['predicted_peak_mib']:.0f} | {p['measured_peak_mib']:.0f} | "
                    f"{p['predicted_speed']:.2f}x | {sps} |"
                )
        for c in results["planted"]:
            if "message" in c:
                lines += ["", f"Budget nothing fits ({c['budget_mib']:.0f} MiB): `{c['message']}`"]
        lines.append("")
    lines += ["## Context", "", "| | |", "|---|---|"]
    lines += [f"| {k} | {v} |" for k, v in results["context"].items()]
    stem.with_suffix(".md").write_text("\n".join(lines) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="tiny,minilm")
    parser.add_argument("--skip-probe", action="store_true")
    parser.add_argument("--probe-only", action="store_true", help="Keep the memory results of the last run.")
    parser.add_argument("--probe-steps", type=int, default=4)
    parser.add_argument("--out", default=str(RESULTS / "planner_accuracy"))
    args = parser.parse_args()

    def say(message: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)

    work = Path(tempfile.mkdtemp(prefix="planner-bench-"))
    tiny = tiny_bert(work / "tiny-bert")
    models = {"tiny": tiny, "minilm": None, **tiny_causal_lms(work), **seq2seq_models(work)}
    results: dict = {"context": context(), "accuracy": [], "planted": []}
    stem = Path(args.out)
    if args.probe_only:
        results["accuracy"] = json.loads(stem.with_suffix(".json").read_text())["accuracy"]
    for kind in [] if args.probe_only else args.models.split(","):
        results["accuracy"] += accuracy(models[kind], kind, say)
        write(results, stem)
    if not args.skip_probe:
        data = ROOT.parent / "shared" / "data" / "sst2" / "train_1k.tsv"
        if not data.is_file():
            sys.path.insert(0, str(ROOT))
            from tests.conftest import make_sentiment_rows, write_csv

            data = write_csv(work / "sentiment.csv", make_sentiment_rows(600))
        results["planted"] = planted(tiny, str(data), work, say, args.probe_steps)
        write(results, stem)
    say(f"written {stem.with_suffix('.md')}")


if __name__ == "__main__":
    main()
