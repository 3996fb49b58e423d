"""The GPU check: what can only be measured on a GPU, in one call of a few minutes on a lent machine.

Run through `benchmarks/gpu_check.sh` (which sets up the environment); this script does the work, most
valuable first, and stops starting new work when its time budget (--budget) is spent:

1. **Packed attention**: a Llama (hidden 768, 12 layers, GQA 12/4 heads, vocab 32,000, random
   weights) with each attention implementation transformers offers (eager, sdpa, flex_attention,
   flash_attention_2): three documents packed into one row of 2,048 tokens with restarting position ids must
   give each document the per-token losses it gets alone (fp32 and bf16), leantrain's own packing guard must
   agree, and a control run without position ids must leak (so the comparison can fail). Forward+backward
   tokens/s of each implementation on packed bf16 batches.
2. **BERT-base** (random weights from `BertConfig()`, a word-level tokenizer, synthetic two-class text) through
   `leantrain bench` at sequence length 128 (padded, so MFU is quoted at 128): the core techniques, compile and
   the micro-batch sweep. Goal: bf16 MFU >= 45% of the data-sheet dense bf16 peak.
3. **The causal LM of step 1** through `leantrain bench`: packed rows of 1,024 tokens, bf16, compile and
   activation checkpointing: tokens/s and MFU (attention's sequence-length term counted).
4. **Profiles** (`--profile-steps`) of BERT-base and the LM in bf16: where the GPU's time goes.
5. The rest of the BERT technique matrix, while time is left.

With `--lm-vs-hf`, first of all: **the causal LM against the HF Trainer** in bf16, the Llama of step 1
from scratch on the synthetic documents that fit 1,024 tokens, leantrain's 16 packed rows against the Trainer's
padded batches with `group_by_length`, two alternating pairs (`benchmarks/causal_lm_vs_hf.py`, its page in
--out/lm_vs_hf/).

With `--host` (first) or `--host-only` (alone, in at most 8 minutes): **the host's cost**
(`benchmarks/gpu_host.py`): host syncs per quiet step, BERT-base and the Llama eager, compiled (CUDA graphs),
compiled on dynamic lengths with static shapes (graphs, padding), the Llama with Liger's kernels, and the HF
Trainer on the same jobs.

Outputs in --out: gpu_check.md (everything in one page), then with --pack (the device call) results.tar.gz
(the bench tables, charts, JSON and profile summaries) and traces.tar.gz (the profiler traces), so that the
call's few returned files carry all of it.

    python benchmarks/gpu_check.py --out "$OUT" --pack      # on the GPU machine (via gpu_check.sh)
    python benchmarks/gpu_check.py --smoke --out /tmp/gpu    # anywhere: tiny models, a few steps, tests the script
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import sys
import tarfile
import time
from pathlib import Path
from typing import Any

MFU_GOAL = 0.45
SEQ_LEN = 128
LM_LEN = 1024
PACKED_DOCS = (700, 900, 448)  # one packed row of 2,048 tokens
WORDS = [f"w{i}" for i in range(4000)]
POSITIVE, NEGATIVE = WORDS[:200], WORDS[200:400]
SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "<s>", "</s>"]
IMPLEMENTATIONS = ("eager", "sdpa", "flash_attention_2", "flex_attention")  # flex compiles: last


class Clock:
    """The time budget: sections ask before starting a job."""

    def __init__(self, budget: float):
        self.started, self.budget = time.perf_counter(), budget

    def elapsed(self) -> float:
        return time.perf_counter() - self.started

    def left(self) -> float:
        return self.budget - self.elapsed()


def say(message: str) -> None:
    print(message, flush=True)


# -- models and data ------------------------------------------------------------------------------------------
def word_tokenizer(lm: bool, size: int = 0):
    """A word-level tokenizer over WORDS; `size` fills it with unused tokens up to the model's embedding rows
    (leantrain refuses a tokenizer with under half the model's rows: another model's)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    tokens = SPECIALS + WORDS
    tokens += [f"unused{i}" for i in range(size - len(tokens))]
    vocab = {tok: i for i, tok in enumerate(tokens)}
    core = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    if lm:  # a causal LM's tokenizer adds nothing; leantrain ends each document with EOS
        return PreTrainedTokenizerFast(
            tokenizer_object=core, bos_token="<s>", eos_token="</s>", unk_token="[UNK]", model_max_length=4096
        )
    core.post_processor = processors.BertProcessing(("[SEP]", vocab["[SEP]"]), ("[CLS]", vocab["[CLS]"]))
    return PreTrainedTokenizerFast(
        tokenizer_object=core,
        pad_token="[PAD]",
        unk_token="[UNK]",
        cls_token="[CLS]",
        sep_token="[SEP]",
        mask_token="[MASK]",
        model_max_length=512,
    )


def write_bert(folder: Path, smoke: bool) -> str:
    """A BERT-base (or, with --smoke, a tiny BERT) classifier with random weights and a word tokenizer."""
    from transformers import BertConfig, BertForSequenceClassification

    if smoke:
        config = BertConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128)
    else:
        config = BertConfig()  # bert-base: 12 layers, hidden 768, 12 heads, intermediate 3072
    config.num_labels = 2
    config.vocab_size = len(SPECIALS) + len(
        WORDS
    )  # the word tokenizer's: leantrain refuses a tokenizer that is not the model's
    model = BertForSequenceClassification(config)
    model.save_pretrained(folder)
    word_tokenizer(lm=False).save_pretrained(folder)
    params = sum(p.numel() for p in model.parameters())
    return f"BERT-{'tiny' if smoke else 'base'} from BertConfig ({params / 1e6:.1f} M parameters)"


def lm_config(smoke: bool):
    from transformers import LlamaConfig

    size = (
        dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, intermediate_size=128)
        if smoke
        else dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, num_key_value_heads=4)
    )
    return LlamaConfig(
        vocab_size=32_000 if not smoke else len(SPECIALS) + len(WORDS),
        intermediate_size=size.pop("intermediate_size", 2048),
        max_position_embeddings=4096,
        bos_token_id=SPECIALS.index("<s>"),
        eos_token_id=SPECIALS.index("</s>"),
        pad_token_id=SPECIALS.index("</s>"),
        tie_word_embeddings=False,
        **size,
    )


def write_lm(folder: Path, smoke: bool) -> str:
    """The Llama of the packed-attention check and the LM bench, random weights, with a word tokenizer."""
    import torch
    from transformers import LlamaForCausalLM

    torch.manual_seed(0)
    model = LlamaForCausalLM(lm_config(smoke))
    model.save_pretrained(folder)
    word_tokenizer(lm=True, size=model.config.vocab_size).save_pretrained(folder)
    params = sum(p.numel() for p in model.parameters())
    return f"Llama {'tiny' if smoke else '12x768, GQA 12/4, vocab 32,000'} ({params / 1e6:.1f} M parameters)"


def write_classification_data(path: Path, rows: int, seed: int = 0) -> None:
    rng = random.Random(seed)
    lines = ["text,label"]
    for _ in range(rows):
        n = rng.randint(24, 120)
        label = rng.randint(0, 1)
        cue = POSITIVE if label else NEGATIVE
        words = [rng.choice(cue) if rng.random() < 0.15 else rng.choice(WORDS[400:]) for _ in range(n)]
        lines.append(f"{' '.join(words)},{label}")
    path.write_text("\n".join(lines) + "\n")


def write_text_data(path: Path, docs: int, seed: int = 0) -> None:
    """Documents of 50-1,500 words from a Zipf-like word distribution (so the loss falls), one per CSV row."""
    rng = random.Random(seed)
    weights = [1 / (i + 1) for i in range(len(WORDS))]
    lines = ["text"]
    for _ in range(docs):
        lines.append(" ".join(rng.choices(WORDS, weights, k=rng.randint(50, 1500))))
    path.write_text("\n".join(lines) + "\n")


# -- 1. packed attention --------------------------------------------------------------------------------------
def packed_attention(lm_dir: Path, smoke: bool, clock: Clock) -> list[dict[str, Any]]:
    """Per implementation and precision: the largest per-token loss difference between packed and alone, the
    guard's verdict, and forward+backward tokens/s on packed bf16 batches."""
    import torch
    from transformers import AutoModelForCausalLM

    from leantrain.errors import ConfigError
    from leantrain.tasks.causal_lm import check_packing_separates, token_losses

    device = "cuda" if torch.cuda.is_available() else "cpu"
    lengths = (20, 30, 14) if smoke else PACKED_DOCS
    gen = torch.Generator().manual_seed(1)
    docs = [torch.randint(len(SPECIALS), len(SPECIALS) + len(WORDS), (n,), generator=gen) for n in lengths]
    ids = torch.cat(docs).unsqueeze(0).to(device)
    positions = torch.cat([torch.arange(n) for n in lengths]).unsqueeze(0).to(device)
    rows = []
    for impl in IMPLEMENTATIONS:
        for dtype in (torch.float32, torch.bfloat16):
            row: dict[str, Any] = {"implementation": impl, "dtype": str(dtype).removeprefix("torch.")}
            rows.append(row)
            if clock.left() < 60:
                row["error"] = "skipped: time budget spent"
                continue
            try:
                model = AutoModelForCausalLM.from_pretrained(lm_dir, attn_implementation=impl, dtype=dtype).to(device)
            except Exception as exc:  # flash_attention_2 needs the flash-attn package
                row["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}"
                say(f"packed attention: {impl} {row['dtype']}: {row['error']}")
                continue
            model.eval()
            with torch.no_grad():
                packed = token_losses(model(input_ids=ids, position_ids=positions, use_cache=False).logits, ids)[0]
                leaked = token_losses(model(input_ids=ids, use_cache=False).logits, ids)[0]
                worst = leak = 0.0
                start = 0
                for doc in docs:
                    alone = token_losses(
                        model(input_ids=doc.unsqueeze(0).to(device), use_cache=False).logits,
                        doc.unsqueeze(0).to(device),
                    )[0]
                    span = slice(start, start + len(doc) - 1)  # the last position predicts the next document
                    worst = max(worst, float((packed[span] - alone).abs().max()))
                    leak = max(leak, float((leaked[span] - alone).abs().max()))
                    start += len(doc)
            row.update(max_loss_difference=worst, without_position_ids=leak)
            try:
                check_packing_separates(model)
                row["guard"] = "accepts packing"
            except ConfigError as exc:
                row["guard"] = f"refuses: {exc}"
            if dtype == torch.bfloat16:
                try:
                    row["train_tokens_per_second"] = train_speed(model, ids, positions, smoke)
                except Exception as exc:  # flex_attention has no backward on a CPU
                    row["train_error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}"
            say(f"packed attention: {json.dumps(row)}")
            del model
            if device == "cuda":
                torch.cuda.empty_cache()
    return rows


def train_speed(model, ids, positions, smoke: bool) -> float:
    """Forward+backward tokens/s on a batch of 8 packed rows (median of 5 timed steps after 2 warm-up steps)."""
    import statistics

    import torch

    batch = 2 if smoke else 8
    x, pos = ids.expand(batch, -1).contiguous(), positions.expand(batch, -1).contiguous()
    model.train()
    times = []
    for i in range(7):
        if x.is_cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        loss = model(input_ids=x, position_ids=pos, labels=x, use_cache=False).loss
        loss.backward()
        if x.is_cuda:
            torch.cuda.synchronize()
        if i >= 2:
            times.append(time.perf_counter() - t0)
        model.zero_grad(set_to_none=True)
    return x.numel() / statistics.median(times)


def render_packed(rows: list[dict[str, Any]]) -> list[str]:
    lines = [
        "| attention | dtype | max per-token loss difference, packed vs alone | same without position ids (control) "
        "| leantrain's guard | train tokens/s (bf16, 8 x 2,048 packed) |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['implementation']} | {r['dtype']} | {r['error']} | | | |")
            continue
        speed = r.get("train_tokens_per_second")
        speed_text = f"{speed:,.0f}" if speed else r.get("train_error", "")
        lines.append(
            f"| {r['implementation']} | {r['dtype']} | {r['max_loss_difference']:.2e} "
            f"| {r['without_position_ids']:.2e} "
            f"| {r['guard'][:90]} | {speed_text} |"
        )
    return lines


# -- 2-5. bench jobs ------------------------------------------------------------------------------------------
def bert_techniques(smoke: bool) -> tuple[list[str], list[str]]:
    """The core techniques first (run early), then the rest of the matrix (run while time is left)."""
    from leantrain.commands import bench

    bench.TECHNIQUES.update(
        {
            "bf16+compile": {"precision": "bf16", "compile": True},
            "bf16 b32": {"precision": "bf16", "batch_size": 32},
            "bf16 b128": {"precision": "bf16", "batch_size": 128},
            "bf16 b256": {"precision": "bf16", "batch_size": 256},
            "fp16 b256": {"precision": "fp16", "batch_size": 256},
            "bf16+compile b256": {"precision": "bf16", "compile": True, "batch_size": 256},
        }
    )
    if smoke:  # the script's paths, not the numbers: compile is minutes on a CPU
        return ["baseline", "bf16", "bf16 b32"], ["grad_accum4"]
    core = ["baseline", "bf16", "fp16", "bf16+compile", "bf16 b256", "bf16+compile b256"]
    # adamw8bit needs bitsandbytes, which the GPU image lacks (and whose wheel is too large to carry)
    rest = [n for n in [*bench.DEFAULT_TECHNIQUES, "bf16 b32", "bf16 b128", "fp16 b256"] if n not in core]
    return core, [n for n in rest if n != "adamw8bit"]


def lm_vs_hf(lm_dir: Path, text: Path, out: Path, smoke: bool, clock: Clock) -> None:
    """`benchmarks/causal_lm_vs_hf.py` in bf16 on this machine's GPU (its tokens/s goal), within the budget."""
    import subprocess

    docs = 30 if smoke else 1500  # of the documents that fit LM_LEN tokens (about two thirds)
    cmd = [sys.executable, str(Path(__file__).with_name("causal_lm_vs_hf.py")), "--from-model", str(lm_dir)]
    cmd += ["--from-text", str(text), "--precision", "bf16", "--max-length", str(LM_LEN), "--docs", str(docs)]
    cmd += ["--held-out", "8" if smoke else "100", "--pairs", "1" if smoke else "2", "--no-random", "--out", str(out)]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=max(clock.left() - 120, 60))
        say(proc.stdout[-3000:] if proc.returncode == 0 else f"lm_vs_hf failed:\n{proc.stderr[-3000:]}")
    except subprocess.TimeoutExpired:
        say("lm_vs_hf: stopped at the time budget")


def host_overhead(args, bert_dir: Path, bert_data: Path, lm_dir: Path, lm_data: Path, clock: Clock) -> list[str]:
    """benchmarks/gpu_host.py's section: syncs per step, compile with buckets and CUDA graphs, Liger, the HF
    Trainer on the same jobs; host.json and its lines of the page."""
    import gpu_host

    work = args.work / "host"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    bases = gpu_host.base_jobs(bert_dir, bert_data, lm_dir, lm_data, args.work / "cache", args.smoke)
    bases = {model: job for model, job in bases.items() if model in args.host_models.split(",")}
    runs = args.host_runs.split(",") if args.host_runs else None
    rows = gpu_host.section(bases, 3 if args.smoke else 30, work, clock, say, runs)
    (args.out / "host.json").write_text(json.dumps(rows, indent=2) + "\n")
    steps = 3 if args.smoke else 30
    return [
        f"## The host's cost: leantrain against the HF Trainer, bf16, {steps} steps a run (benchmarks/gpu_host.py)",
        "",
        *gpu_host.render(rows),
        "",
    ]


def run_jobs(names, base, steps, folder: Path, clock: Clock, reserve: float):
    """Each technique as its own `leantrain train` process, while more than `reserve` seconds are left."""
    from leantrain.commands import bench

    rows = []
    for name in names:
        if clock.left() < reserve:
            say(f"bench: {name} skipped (time budget)")
            continue
        rows.append(
            bench.run_job(
                name,
                bench.job_overrides(name, base),
                base,
                steps,
                folder / name.replace("+", "_").replace(" ", "_"),
                say,
                timeout=max(clock.left(), 60),
            )
        )
    return rows


def profile_job(name: str, base: dict, over: dict, steps: int, folder: Path, clock: Clock) -> dict | None:
    from leantrain.commands import bench

    if clock.left() < 45:
        say(f"profile: {name} skipped (time budget)")
        return None
    row = bench.run_job(
        f"profile {name}", {**over, "profile_steps": 3}, base, steps, folder, say, timeout=max(clock.left(), 60)
    )
    summary = folder / "profile" / "summary.json"
    return json.loads(summary.read_text()) if row.metrics and summary.exists() else None


def render_profile(name: str, summary: dict | None) -> list[str]:
    if summary is None:
        return [f"{name}: no profile (skipped or failed; see log.txt)", ""]
    from leantrain.telemetry.profiler import format_summary

    return [f"{name}:", "", "```", format_summary(summary, 2), "```", ""]


def rows_table(rows) -> list[str]:
    lines = [
        "| configuration | samples/s | tokens/s | MFU (steady) | model TFLOP/s | peak memory | peak TFLOP/s (source) |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if r.metrics is None:
            lines.append(f"| {r.name} | failed: {r.error} | | | | | |")
            continue
        m = r.metrics
        peak = m.get("peak_memory_bytes") or m.get("peak_memory_over_baseline_bytes") or 0
        lines.append(
            f"| {r.name} | {m['steady_samples_per_second']:.0f} | {m.get('steady_tokens_per_second') or 0:,.0f} "
            f"| {m.get('steady_mfu') or 0:.1%} | {m.get('steady_model_tflops_per_second') or 0:.1f} "
            f"| {peak / 2**30:.2f} GiB | {m.get('peak_tflops', 0):.1f} "
            f"({str(m.get('peak_source', '?')).split(' (cached')[0]}) |"
        )
    return lines


def best_mfu(rows, precision: str) -> float:
    return max(
        (r.metrics.get("steady_mfu") or 0.0 for r in rows if r.metrics and r.overrides.get("precision") == precision),
        default=0.0,
    )


# -- the whole check ------------------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True, help="where the results go ($OUT on the GPU machine)")
    p.add_argument("--steps", type=int, default=40, help="optimizer steps per bench configuration")
    p.add_argument("--rows", type=int, default=8_000, help="synthetic classification rows (tokenized once, cached)")
    p.add_argument("--budget", type=float, default=390, help="seconds after which no new job starts")
    p.add_argument("--work", type=Path, default=Path("/tmp/leantrain_gpu_check"), help="scratch folder")
    p.add_argument("--smoke", action="store_true", help="tiny models, a few steps (tests the script)")
    p.add_argument("--attention-from", type=Path, help="packed_attention.json of an earlier call: not measured again")
    p.add_argument("--pack", action="store_true", help="pack the results into two archives (the device call)")
    p.add_argument("--lm-vs-hf", action="store_true", help="first, the causal LM against the HF Trainer in bf16")
    p.add_argument("--host", action="store_true", help="first, the host-overhead section (benchmarks/gpu_host.py)")
    p.add_argument("--host-only", action="store_true", help="the host-overhead section alone (budget 380 s)")
    p.add_argument("--host-models", default="bert,llama", help="the host section's models (comma-separated)")
    p.add_argument("--host-runs", help="only these runs of the host section (names, comma-separated; default all)")
    args = p.parse_args(argv)
    if args.smoke:
        args.steps, args.rows = 4, 400
    if args.host_only and args.budget == p.get_default("budget"):
        args.budget = 380  # the section alone, in a call of at most 8 minutes (set-up and packing around it)

    from leantrain.commands import bench

    clock = Clock(args.budget)
    args.out.mkdir(parents=True, exist_ok=True)
    args.work.mkdir(parents=True, exist_ok=True)
    bert_dir, lm_dir = args.work / "bert", args.work / "llama"
    bert_data, lm_data = args.work / "classify.csv", args.work / "text.csv"
    bert_name, lm_name = write_bert(bert_dir, args.smoke), write_lm(lm_dir, args.smoke)
    write_classification_data(bert_data, args.rows)
    write_text_data(lm_data, 60 if args.smoke else 3000)
    context = {
        **bench.environment_context(),
        "command": "bash benchmarks/gpu_check.sh" + (" --smoke" if args.smoke else ""),
    }
    say(f"gpu_check: {bert_name}; {lm_name}; {context['device']}")

    if args.host or args.host_only:
        host_page = host_overhead(args, bert_dir, bert_data, lm_dir, lm_data, clock)
        if args.host_only:
            (args.out / "gpu_check.md").write_text("\n".join([f"# GPU check: the host's cost ({context['device']})",
                                                              "", *host_page, ""]))  # fmt: skip
            say("\n".join(host_page))
            if args.pack:
                pack(args.out, args.work / "host")
            return 0
    if args.lm_vs_hf:
        lm_vs_hf(lm_dir, lm_data, args.out / "lm_vs_hf", args.smoke, clock)
    if args.attention_from:  # measured by an earlier call: the device time goes to the rest
        attention = json.loads(args.attention_from.read_text())
    else:
        attention = packed_attention(lm_dir, args.smoke, clock)
    (args.out / "packed_attention.json").write_text(json.dumps(attention, indent=2) + "\n")

    runs = args.work / "runs"
    shutil.rmtree(runs, ignore_errors=True)  # a trace or a run of an earlier check must not be read as this one's
    cache = str(args.work / "cache")
    bert = {
        "model": str(bert_dir),
        "data": str(bert_data),
        "max_length": SEQ_LEN,
        "pad_to_max_length": True,
        "batch_size": 64,
        "lr": 1e-4,
        "report": False,
        "cache_dir": cache,
    }
    lm_length = 128 if args.smoke else LM_LEN
    lm = {
        "model": str(lm_dir),
        "data": str(lm_data),
        "task": "causal-lm",
        "max_length": lm_length,
        "batch_size": 16,
        "lr": 3e-4,
        "report": False,
        "cache_dir": cache,
        "eval_fraction": 0.02,
    }
    core, rest = bert_techniques(args.smoke)
    bert_rows = run_jobs(core, bert, args.steps, runs / "bert", clock, reserve=150)
    lm_rows = run_jobs(["bf16", "bf16+compile", "bf16+activation_ckpt"], lm, args.steps, runs / "llama", clock, 80)
    profiles = {
        "BERT-base, bf16, micro-batch 64": profile_job(
            "bert", bert, {"precision": "bf16"}, 8, runs / "profile_bert", clock
        ),
        f"Llama, bf16, 16 x {lm_length} packed": profile_job(
            "llama", lm, {"precision": "bf16"}, 8, runs / "profile_llama", clock
        ),
    }
    bert_rows += run_jobs(rest, bert, args.steps, runs / "bert", clock, reserve=25)

    for name, rows, model in (("bert", bert_rows, bert_name), ("llama", lm_rows, lm_name)):
        if rows:
            (args.out / name).mkdir(exist_ok=True)
            bench.write_outputs(bench.table_rows(rows), args.out / name, {**context, "model": model})
    for name, summary in profiles.items():
        if summary:
            (args.out / f"profile_{name.split(',')[0].lower().replace('-', '_')}.json").write_text(
                json.dumps(summary, indent=2)
            )
    page = summarise(context, bert_name, lm_name, attention, bert_rows, lm_rows, profiles, args, clock.elapsed())
    (args.out / "gpu_check.md").write_text(page)
    say("\n" + page)
    if args.pack:
        pack(args.out, runs)
    return 0


def summarise(context, bert_name, lm_name, attention, bert_rows, lm_rows, profiles, args, seconds) -> str:
    bf16 = best_mfu(bert_rows, "bf16")
    lines = [
        "# GPU check",
        "",
        f"{context['device']}; torch {context['torch']}, transformers {context['transformers']}; {context['date']}.",
        "",
        f"## Packed attention ({lm_name}; documents of {', '.join(map(str, PACKED_DOCS))} tokens in one row)",
        "",
        *render_packed(attention),
        "",
        f"## BERT-base through `leantrain bench` ({bert_name}; synthetic 2-class text, {args.rows:,} rows, length "
        f"{SEQ_LEN} padded, micro-batch 64 unless named, lr 1e-4, {args.steps} optimizer steps, steady figures)",
        "",
        *rows_table(bert_rows),
        "",
        f"Goal: bf16 MFU >= {MFU_GOAL:.0%} at length {SEQ_LEN}: best bf16 configuration {bf16:.1%} "
        f"({'met' if bf16 >= MFU_GOAL else 'NOT met'}).",
        "",
        f"## The causal LM through `leantrain bench` ({lm_name}; packed rows, micro-batch 16, {args.steps} steps)",
        "",
        *rows_table(lm_rows),
        "",
        "## Profiles (`--profile-steps 3`)",
        "",
    ]
    for name, summary in profiles.items():
        lines += render_profile(name, summary)
    lines += [
        "| context | |",
        "|---|---|",
        *[f"| {k} | {v} |" for k, v in context.items()],
        f"| wall time of the check | {seconds:.0f} s (budget {args.budget:.0f} s) |",
        "",
    ]
    return "\n".join(lines)


def pack(out: Path, runs: Path) -> None:
    """Everything but the page into results.tar.gz, the traces into traces.tar.gz (the call returns 8 files)."""
    keep = {"gpu_check.md", "env.txt", "log.txt"}
    with tarfile.open(out / "results.tar.gz", "w:gz") as tar:
        for path in sorted(out.rglob("*")):
            if path.is_file() and path.name not in keep and not path.name.endswith(".tar.gz"):
                tar.add(path, arcname=str(path.relative_to(out)))
    with tarfile.open(out / "traces.tar.gz", "w:gz") as tar:
        for trace in sorted(runs.rglob("profile/trace.json")):
            tar.add(trace, arcname=str(trace.relative_to(runs)))
    for path in sorted(out.rglob("*"), reverse=True):
        if path.is_file() and path.name not in keep and not path.name.endswith(".tar.gz"):
            path.unlink()
        elif path.is_dir():
            path.rmdir()


if __name__ == "__main__":
    sys.exit(main())
