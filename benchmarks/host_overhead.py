"""What the host costs per optimizer step: a host-bound model trained by a hand-written PyTorch loop (the floor),
by leantrain (eager and --compile) and by the HF Trainer, each in its own process, in alternating rounds.

The models are as deep as BERT-base and a 12-layer Llama, with their operator graphs, but 32 wide, on 8 rows of 16
tokens in fp32 with 2 threads: the arithmetic is negligible, so a step's time is what the framework does on the
host (Python, dispatch, launches). Per runner: milliseconds per step (the median of the steps after a warm-up) and
host operator calls per step (aten operators dispatched, counted in a separate pass with a TorchDispatchMode) and
host syncs per step (telemetry.syncs).

    python benchmarks/host_overhead.py                       # writes benchmarks/results/host_overhead.{md,json}
    python benchmarks/host_overhead.py --rounds 1 --steps 20 --models bert   # quick
    python benchmarks/host_overhead.py --device cuda --runners leantrain,leantrain-compile,hf   # on a GPU

The hand loop: forward, backward, fused AdamW, zero_grad; nothing else. leantrain: `leantrain.train` on the same
model (saved to a folder) and the same token rows, logging every 1,000 steps. The HF Trainer: the same model and
rows, `adamw_torch_fused`, no logging, saving or evaluation.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "src"))

RUNNERS = ("hand", "leantrain", "leantrain-compile", "hf")
MODELS = ("bert", "llama")
ROWS, LENGTH, LAYERS, WIDTH = 8, 16, 12, 32


# -- the models and their data -----------------------------------------------------------------------------------
def write_model(kind: str, folder: Path) -> Path:
    """BERT-base's or a Llama's 12 layers at width 32, random weights (seeded), with a word-level tokenizer."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import (
        BertConfig,
        BertForSequenceClassification,
        LlamaConfig,
        LlamaForCausalLM,
        PreTrainedTokenizerFast,
    )

    words = [f"w{i}" for i in range(500)]
    vocab = {w: i for i, w in enumerate(["[PAD]", "[UNK]", "[CLS]", "[SEP]", *words])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    kw = dict(unk_token="[UNK]", pad_token="[PAD]")
    if kind == "bert":
        tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, cls_token="[CLS]", sep_token="[SEP]", **kw)
    else:
        tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="[SEP]", bos_token="[CLS]", **kw)
    shape = dict(hidden_size=WIDTH, num_hidden_layers=LAYERS, num_attention_heads=2, intermediate_size=2 * WIDTH)
    torch.manual_seed(0)
    if kind == "bert":
        config = BertConfig(vocab_size=len(vocab), max_position_embeddings=64, num_labels=2, **shape)
        model = BertForSequenceClassification(config)
    else:
        config = LlamaConfig(
            vocab_size=len(vocab), max_position_embeddings=64, num_key_value_heads=1, pad_token_id=0,
            bos_token_id=2, eos_token_id=3, tie_word_embeddings=True, **shape,
        )  # fmt: skip
        model = LlamaForCausalLM(config)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def write_data(kind: str, folder: Path, rows: int) -> Path:
    """Every row 16 tokens of one document, as the hand loop's: BERT's texts of 30 words cut to 16 tokens, the
    Llama's documents of 15 words and EOS, so that packing lays exactly one in each row (longer documents would
    give rows of two or three, whose per-document attention is work the other runners' rows do not ask for)."""
    import random

    rng = random.Random(0)
    if kind == "bert":
        path = folder / "train.csv"
        lines = [
            "text,label",
            *(f"{' '.join(f'w{rng.randrange(500)}' for _ in range(30))},{i % 2}" for i in range(rows)),
        ]
    else:
        path = folder / "train.txt"
        lines = [" ".join(f"w{rng.randrange(500)}" for _ in range(LENGTH - 1)) + "\n" for _ in range(rows)]
    path.write_text("\n".join(lines) + "\n")
    return path


def token_rows(kind: str, device):
    import torch

    g = torch.Generator().manual_seed(0)
    ids = torch.randint(4, 504, (ROWS, LENGTH), generator=g)
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    batch["labels"] = ids.clone() if kind == "llama" else torch.randint(0, 2, (ROWS,), generator=g)
    return {k: v.to(device) for k, v in batch.items()}


# -- counting operators and syncs ------------------------------------------------------------------------------------
def counting():
    """A dispatch mode counting every aten operator (and, through HostSyncs, the syncs). HostSyncs comes from this
    checkout's file, so that a baseline leantrain (--baseline-src) is counted alike."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("host_syncs", REPO / "src" / "leantrain" / "telemetry" / "syncs.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    HostSyncs = module.HostSyncs

    class Ops(HostSyncs):
        def __init__(self):
            super().__init__()
            self.ops = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if not self.paused:
                self.ops += 1
            return super().__torch_dispatch__(func, types, args, kwargs)

    return Ops()


# -- the runners (each in its own process) ---------------------------------------------------------------------------
def run_hand(kind: str, model_dir: Path, steps: int, device: str, compile_: bool) -> dict:
    import torch
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification

    auto = AutoModelForCausalLM if kind == "llama" else AutoModelForSequenceClassification
    model = auto.from_pretrained(model_dir).to(device).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    batch = token_rows(kind, device)
    forward = torch.compile(model) if compile_ else model

    def step():
        loss = forward(**batch).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    times = []
    for _ in range(steps):
        start = time.perf_counter()
        step()
        if device == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    with counting() as ops:
        step()
    return {"step_times": times, "ops_per_step": ops.ops, "syncs_per_step": ops.ours}


def _hooks(ops=None):
    """leantrain Hooks that note, when each optimizer step's first micro-batch starts (a step ends where the next
    begins), the time and, given a counting mode, the operators and leantrain's syncs so far."""
    from leantrain.training import Hooks

    class Clock(Hooks):
        def __init__(self):
            self.starts: list[float] = []
            self.ops: list[int] = []
            self.syncs: list[int] = []
            self.model_syncs: list[int] = []
            self._new = True

        def on_micro_batch(self, model, batch):
            if self._new:
                self.starts.append(time.perf_counter())
                if ops is not None:
                    self.ops.append(ops.ops)
                    self.syncs.append(ops.ours)
                    self.model_syncs.append(ops.total - ops.ours)
                self._new = False

        def before_optimizer_step(self, step):
            self._new = True

    return Clock()


def run_leantrain(kind: str, model_dir: Path, data: Path, steps: int, device: str, compile_: bool) -> dict:
    from leantrain import TrainConfig, train

    work = Path(tempfile.mkdtemp(prefix="host-overhead-"))
    job = dict(
        model=str(model_dir), data=str(data), max_length=LENGTH, batch_size=ROWS, optimizer="adamw", lr=1e-4,
        precision="fp32", log_every=1000, progress=False, report=False, cache_dir=str(work / "c"),
        compile=compile_, seed=0, warmup_ratio=0.0,
    )  # fmt: skip
    if kind == "llama":
        job.update(task="causal-lm")
    clock = _hooks()
    result = train(TrainConfig(**job, max_steps=steps, output_dir=str(work / "timed")), hooks=clock)
    times = [b - a for a, b in zip(clock.starts, clock.starts[1:])]
    with counting() as ops:  # a few more steps, counted: the operators and syncs of a quiet step (the third)
        counted = _hooks(ops)
        train(TrainConfig(**job, max_steps=5, output_dir=str(work / "counted")), hooks=counted)
    return {
        "step_times": times,
        "ops_per_step": counted.ops[3] - counted.ops[2],
        "syncs_per_step": counted.syncs[3] - counted.syncs[2],
        "model_syncs_per_step": counted.model_syncs[3] - counted.model_syncs[2],
        "compiled_graphs": result.metrics.get("compiled_graphs"),
        "padding_fraction": result.metrics.get("padding_fraction"),
    }


def run_hf(kind: str, model_dir: Path, steps: int, device: str) -> dict:
    from transformers import (
        AutoModelForCausalLM,
        AutoModelForSequenceClassification,
        Trainer,
        TrainerCallback,
        TrainingArguments,
    )

    auto = AutoModelForCausalLM if kind == "llama" else AutoModelForSequenceClassification
    model = auto.from_pretrained(model_dir)
    one = {k: v.cpu() for k, v in token_rows(kind, "cpu").items()}
    rows = [{k: v[i] for k, v in one.items()} for i in range(ROWS)] * (steps + 4)

    class Clock(TrainerCallback):
        def __init__(self):
            self.starts: list[float] = []

        def on_step_begin(self, args, state, control, **kw):
            self.starts.append(time.perf_counter())

    work = Path(tempfile.mkdtemp(prefix="host-overhead-hf-"))
    args = TrainingArguments(
        output_dir=str(work), per_device_train_batch_size=ROWS, max_steps=steps, learning_rate=1e-4,
        optim="adamw_torch_fused", report_to=[], logging_strategy="no", save_strategy="no", eval_strategy="no",
        dataloader_num_workers=0, use_cpu=device == "cpu", disable_tqdm=True, seed=0,
    )  # fmt: skip
    clock = Clock()
    trainer = Trainer(model=model, args=args, train_dataset=rows, callbacks=[clock])
    trainer.train()
    times = [b - a for a, b in zip(clock.starts, clock.starts[1:])]
    trainer.args.max_steps = 4
    clock.starts.clear()
    with counting() as ops:
        marks: list[int] = []

        class Marks(TrainerCallback):
            def on_step_begin(self, args, state, control, **kw):
                marks.append(ops.ops)

        trainer.add_callback(Marks())
        trainer.train()
    return {"step_times": times, "ops_per_step": marks[3] - marks[2] if len(marks) > 3 else None}


def child(argv: list[str]) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("runner", choices=[*RUNNERS, *(f"{r}@base" for r in RUNNERS)])
    p.add_argument("model", choices=MODELS)
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--result", type=Path, required=True)
    p.add_argument("--src", type=Path, help="import leantrain from this src/ (a baseline checkout)")
    a = p.parse_args(argv)
    if a.src is not None:
        sys.path.insert(0, str(a.src))
        sys.modules.pop("leantrain", None)
    import torch

    if a.device == "cpu":
        torch.set_num_threads(a.threads)
    root = Path(tempfile.mkdtemp(prefix="host-overhead-model-"))
    model_dir = write_model(a.model, root / "model")
    runner = a.runner.removesuffix("@base")
    if runner == "hand":
        out = run_hand(a.model, model_dir, a.steps, a.device, compile_=False)
    elif runner == "hf":
        out = run_hf(a.model, model_dir, a.steps, a.device)
    else:
        data = write_data(a.model, root, rows=ROWS * (a.steps + 8))
        out = run_leantrain(a.model, model_dir, data, a.steps, a.device, compile_=runner == "leantrain-compile")
    a.result.write_text(json.dumps(out))
    return 0


# -- the rounds and the page -----------------------------------------------------------------------------------------
def machine() -> dict:
    import platform

    import torch
    import transformers

    import leantrain

    flags, model = "", platform.processor()
    try:
        info = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
        for line in info.splitlines():
            if line.startswith("Model name:"):
                model = line.split(":", 1)[1].strip()
            if line.startswith("Flags:"):
                flags = line
    except OSError:
        pass
    features = [f for f in ("avx512_bf16", "amx_bf16", "amx_tile", "avx512f") if f" {f}" in flags]
    return {
        "cpu": model, "cpu_features": ", ".join(features) or "none of avx512f/avx512_bf16/amx", "cores": os.cpu_count(),
        "python": platform.python_version(), "torch": torch.__version__, "transformers": transformers.__version__,
        "leantrain": leantrain.__version__,
    }  # fmt: skip


def measure(args) -> list[dict]:
    runs = []
    with tempfile.TemporaryDirectory(prefix="host-overhead-") as tmp:
        for r in range(args.rounds):
            for kind in args.models:
                order = args.runners if r % 2 == 0 else list(reversed(args.runners))  # alternate who goes first
                for runner in order:
                    result = Path(tmp) / f"{r}-{kind}-{runner}.json"
                    cmd = [sys.executable, __file__, "--child", runner, kind, "--steps", str(args.steps)]
                    cmd += ["--device", args.device, "--threads", str(args.threads), "--result", str(result)]
                    if runner.endswith("@base"):
                        cmd += ["--src", str(args.baseline_src)]
                    load = os.getloadavg()[0]
                    started = time.perf_counter()
                    done = subprocess.run(cmd, capture_output=True, text=True)
                    if done.returncode != 0:
                        print(done.stderr[-3000:], file=sys.stderr)
                        continue
                    row = json.loads(result.read_text())
                    steady = row.pop("step_times")[args.warmup :]
                    row.update(round=r + 1, model=kind, runner=runner, load_before=load, load_after=os.getloadavg()[0])
                    row.update(ms_per_step=1000 * statistics.median(steady), seconds=time.perf_counter() - started)
                    runs.append(row)
                    print(json.dumps(row), flush=True)
    return runs


def page(runs: list[dict], args) -> list[str]:
    lines = [
        "# Host overhead per optimizer step",
        "",
        f"Models as deep as BERT-base and a 12-layer Llama at width {WIDTH}, {ROWS} rows of {LENGTH} tokens, fp32, "
        f"{args.threads} threads, {args.device}: the host's work decides the step. Median ms per step after "
        f"{args.warmup} warm-up steps of {args.steps}, each runner in its own process, {args.rounds} alternating "
        "rounds (the median over rounds shown); operator calls and host syncs counted in a separate pass.",
        "",
        "| model | runner | ms/step | x hand loop | operators/step | host syncs/step (+ model's) | graphs | padding |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for kind in args.models:
        mine = [r for r in runs if r["model"] == kind]
        hand = statistics.median([r["ms_per_step"] for r in mine if r["runner"] == "hand"] or [float("nan")])
        for runner in args.runners:
            rows = [r for r in mine if r["runner"] == runner]
            if not rows:
                continue
            ms = statistics.median(r["ms_per_step"] for r in rows)
            last = rows[-1]
            syncs = last.get("syncs_per_step")
            model_syncs = last.get("model_syncs_per_step")
            shown = "-" if syncs is None else f"{syncs}" + (f" (+{model_syncs})" if model_syncs else "")
            lines.append(
                f"| {kind} | {runner} | {ms:.1f} | {hand / ms:.2f} | {last.get('ops_per_step') or '-'} | {shown} | "
                f"{last.get('compiled_graphs') or '-'} | "
                f"{'-' if last.get('padding_fraction') is None else format(last['padding_fraction'], '.1%')} |"
            )
    loads = [r["load_before"] for r in runs] + [r["load_after"] for r in runs]
    lines += ["", f"Load (1-minute average) around the runs: {min(loads):.2f} to {max(loads):.2f}.", ""]
    return lines


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--child"]:
        return child(argv[1:])
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--steps", type=int, default=60, help="optimizer steps a run (default: %(default)s)")
    p.add_argument("--warmup", type=int, default=15, help="steps left out of the median (default: %(default)s)")
    p.add_argument("--models", type=lambda s: s.split(","), default=list(MODELS))
    p.add_argument("--runners", type=lambda s: s.split(","), default=list(RUNNERS))
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--baseline-src", type=Path, help="src/ of a baseline checkout: adds leantrain@base runners")
    p.add_argument("--out-dir", type=Path, default=REPO / "benchmarks" / "results")
    args = p.parse_args(argv)
    if args.baseline_src is not None:
        args.runners += ["leantrain@base"]  # the eager loop before this change (the figure to beat)
    from benchmarks._results import write_results

    started = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    runs = measure(args)
    context = {**machine(), "run": started, "command": "python benchmarks/host_overhead.py " + " ".join(argv)}
    print(write_results(args.out_dir, "host_overhead", page(runs, args), context, {"runs": runs}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
