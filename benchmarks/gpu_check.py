"""The GPU check: `leantrain bench`'s technique matrix and MFU for a BERT-base-sized model on a lent GPU.

Run through `benchmarks/gpu_check.sh` (which sets up the environment); this script does the work:

1. builds a BERT-base classifier from `BertConfig()` with random weights (FLOPs and memory do not depend
   on the weights, and the lent machine reaches no hub) and a word-level tokenizer for synthetic data;
2. writes a synthetic two-class data set (sentences of 24-120 words, the label given by which of two
   word lists is more frequent, so the loss falls and the accuracy column means something);
3. runs `leantrain bench` over the technique matrix at sequence length 128 (padded to it, so every step
   is the same 128-token shape that MFU is quoted for), then bf16 and fp16 at several micro-batch sizes;
4. writes bench.md/.csv/.json/.png and a summary (gpu_check.md) into --out.

The goal that the summary checks: bf16 MFU >= 45% for BERT-base at sequence length 128, MFU over the
data-sheet dense bf16 peak of the GPU (telemetry/peak.py).

    python benchmarks/gpu_check.py --out "$OUT"              # on the GPU machine (via gpu_check.sh)
    python benchmarks/gpu_check.py --smoke --out /tmp/gpu    # anywhere: a tiny model, 3 steps, to test the script
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

MFU_GOAL = 0.45
SEQ_LEN = 128
WORDS = [f"w{i}" for i in range(4000)]
POSITIVE, NEGATIVE = WORDS[:200], WORDS[200:400]


def write_data(path: Path, rows: int, seed: int = 0) -> None:
    rng = random.Random(seed)
    lines = ["text,label"]
    for _ in range(rows):
        n = rng.randint(24, 120)
        label = rng.randint(0, 1)
        cue = POSITIVE if label else NEGATIVE
        words = [rng.choice(cue) if rng.random() < 0.15 else rng.choice(WORDS[400:]) for _ in range(n)]
        lines.append(f"{' '.join(words)},{label}")
    path.write_text("\n".join(lines) + "\n")


def write_model(folder: Path, smoke: bool) -> str:
    """A BERT-base (or, with --smoke, a tiny BERT) classifier with random weights and a word tokenizer."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import BertConfig, BertForSequenceClassification, PreTrainedTokenizerFast

    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    vocab = {tok: i for i, tok in enumerate(specials + WORDS)}
    core = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    core.post_processor = processors.BertProcessing(("[SEP]", vocab["[SEP]"]), ("[CLS]", vocab["[CLS]"]))
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core,
        pad_token="[PAD]",
        unk_token="[UNK]",
        cls_token="[CLS]",
        sep_token="[SEP]",
        mask_token="[MASK]",
        model_max_length=512,
    )
    if smoke:
        config = BertConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128)
    else:
        config = BertConfig()  # bert-base: 12 layers, hidden 768, 12 heads, intermediate 3072, vocab 30522
    config.num_labels = 2
    model = BertForSequenceClassification(config)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    params = sum(p.numel() for p in model.parameters())
    return f"BERT-{'tiny' if smoke else 'base'} from BertConfig ({params / 1e6:.1f} M parameters)"


def techniques(smoke: bool) -> dict[str, dict]:
    """The matrix: each technique alone and useful combinations at micro-batch 64, then a micro-batch sweep."""
    from leantrain import bench

    extra = {
        "bf16+compile": {"precision": "bf16", "compile": True},
        "bf16 b32": {"precision": "bf16", "batch_size": 32},
        "bf16 b128": {"precision": "bf16", "batch_size": 128},
        "bf16 b256": {"precision": "bf16", "batch_size": 256},
        "fp16 b256": {"precision": "fp16", "batch_size": 256},
        "bf16+compile b256": {"precision": "bf16", "compile": True, "batch_size": 256},
    }
    bench.TECHNIQUES.update(extra)
    names = [*bench.DEFAULT_TECHNIQUES, *extra]
    if smoke:  # the script's paths, not the numbers: compile is minutes on a CPU
        names = ["baseline", "bf16", "grad_accum4", "bf16 b32"]
    return {n: bench.TECHNIQUES[n] for n in names}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True, help="where the results go ($OUT on the GPU machine)")
    p.add_argument("--steps", type=int, default=40, help="optimizer steps per configuration")
    p.add_argument("--rows", type=int, default=8_000, help="synthetic training rows (tokenized once, cached)")
    p.add_argument("--work", type=Path, default=Path("/tmp/leantrain_gpu_check"), help="scratch folder")
    p.add_argument("--smoke", action="store_true", help="tiny model, 3 steps, 4 configurations (tests the script)")
    args = p.parse_args(argv)
    if args.smoke:
        args.steps, args.rows = 3, 400

    from leantrain import bench

    args.out.mkdir(parents=True, exist_ok=True)
    args.work.mkdir(parents=True, exist_ok=True)
    model_dir, data = args.work / "model", args.work / "data.csv"
    started = time.perf_counter()
    model_name = write_model(model_dir, args.smoke)
    write_data(data, args.rows)
    print(f"gpu_check: {model_name}; {args.rows:,} synthetic rows; {args.steps} steps per configuration", flush=True)

    matrix = techniques(args.smoke)
    base = {
        "model": str(model_dir),
        "data": str(data),
        "max_length": SEQ_LEN,
        "pad_to_max_length": True,  # every step is batch x 128: MFU is quoted at sequence length 128
        "batch_size": 64,
        "lr": 1e-4,
        "report": False,
        "cache_dir": str(args.work / "cache"),
    }
    rows = bench.run_bench(base, list(matrix), args.steps, args.work / "bench", say=lambda m: print(m, flush=True))
    records = bench.table_rows(rows)
    context = {
        **bench.environment_context(),
        "model": model_name,
        "job": f"synthetic 2-class text, {args.rows:,} rows, length {SEQ_LEN} (padded), micro-batch 64 unless "
        f"the technique says, lr 1e-4, {args.steps} optimizer steps, steady figures after the warm-up steps",
        "command": "bash benchmarks/gpu_check.sh" + (" --smoke" if args.smoke else ""),
    }
    bench.write_outputs(records, args.out, context)
    summary = summarise(rows, context, time.perf_counter() - started)
    (args.out / "gpu_check.md").write_text(summary)
    print("\n" + bench.render(records) + "\n" + summary, flush=True)
    return 0


def summarise(rows, context: dict, seconds: float) -> str:
    lines = [
        "# GPU check",
        "",
        f"{context['model']} on {context['device']}; {context['job']}.",
        "",
        "| configuration | samples/s | MFU (steady) | model TFLOP/s | peak memory | peak TFLOP/s (source) |",
        "|---|---|---|---|---|---|",
    ]
    best_bf16 = 0.0
    for r in rows:
        if r.metrics is None:
            lines.append(f"| {r.name} | failed: {r.error} | | | | |")
            continue
        m = r.metrics
        mfu = m.get("steady_mfu") or 0.0
        if r.overrides.get("precision") == "bf16":
            best_bf16 = max(best_bf16, mfu)
        peak = m.get("peak_memory_bytes") or m.get("peak_memory_over_baseline_bytes") or 0
        lines.append(
            f"| {r.name} | {m['steady_samples_per_second']:.0f} | {mfu:.1%} "
            f"| {m.get('steady_model_tflops_per_second') or 0:.1f} | {peak / 2**30:.2f} GiB "
            f"| {m.get('peak_tflops', 0):.1f} ({str(m.get('peak_source', '?')).split(' (cached')[0]}) |"
        )
    verdict = "met" if best_bf16 >= MFU_GOAL else "NOT met"
    lines += [
        "",
        f"Goal: bf16 MFU >= {MFU_GOAL:.0%} at sequence length {SEQ_LEN}: best bf16 configuration {best_bf16:.1%} "
        f"({verdict}).",
        "",
        "| context | |",
        "|---|---|",
        *[f"| {k} | {v} |" for k, v in context.items()],
        f"| wall time of the check | {seconds:.0f} s |",
        "",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
