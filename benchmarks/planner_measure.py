"""Measure the peak memory of a few training steps, the way the planner's memory model is checked.

A *trial* is one configuration (model, precision, activation checkpointing, optimizer, micro-batch,
accumulation, sequence length). It runs the trainer's step (forward under autocast, summed loss
scaled to the step, backward; then unscale, clip, step, schedule, clear: the same calls through the
same Accelerator and mixed precision) on synthetic batches padded to the sequence length, for a few
optimizer steps, so that weights, gradients, optimizer state, activations and the optimizer's own
temporaries have all been live at least once. Used by tests/planner and benchmarks/planner_accuracy.py:
it is a measuring instrument, not part of the package.

What is measured is the *training memory*: peak memory over a baseline taken before the model is
built, so it counts the weights too, which is what the planner predicts and what `--memory` bounds.
CPU: the resident high-water mark (VmHWM, reset through /proc/self/clear_refs) over the resident size
at the baseline, with freed heap pages handed back to the kernel first (`malloc_trim`), so that one
trial's leftovers do not hide the next trial's growth. CUDA: `max_memory_allocated` over the baseline
(telemetry.memory.MemoryMeter does both).

Trials run in a fresh interpreter by default (`measure_trials`): python benchmarks/planner_measure.py
reads a JSON list of trials on stdin and prints one JSON result per line.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class Trial:
    """One configuration whose training memory (and step time) is measured."""

    #: model folder or hub name (None: the embedded MiniLM); the weights are random, only shapes matter
    model: str | None
    #: fp32 | bf16 | fp16
    precision: str = "fp32"
    #: recompute each layer in backward
    activation_checkpointing: bool = False
    #: adamw | adafactor | adamw8bit | sgd
    optimizer: str = "adamw"
    #: examples per micro-batch
    batch_size: int = 8
    #: micro-batches per optimizer step
    grad_accum: int = 1
    #: every batch is padded to this many tokens (the planner's worst case)
    seq_len: int = 128
    #: optimizer steps; the first creates the optimizer state, later ones see everything live at once
    steps: int = 3
    #: labels of the classification head
    num_labels: int = 2
    #: a causal LM's share of positions whose next token counts (instruction tuning: completions only)
    counted: float = 1.0
    #: --dropout: every dropout's rate (None: the model's own)
    dropout: float | None = None
    #: an encoder-decoder's target tokens (its sources are `seq_len` long; 0: as long)
    target_len: int = 0
    #: --freeze: the names whose parameters keep their values (None: every parameter trains)
    freeze: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _trim() -> None:
    from leantrain.telemetry.memory import release_free_memory

    release_free_memory()


def model_config(model: str | None, num_labels: int = 2):
    from leantrain.model import loading

    path = loading.resolve_model(model)
    return loading.load_config(path, num_labels=num_labels, problem_type="single_label_classification")


def build_model(model: str | None, num_labels: int = 2, device: Any = None):
    """The model a run trains (a sequence classifier, or a causal LM for a causal LM's config) with random weights:
    no weights read, shapes only."""
    from leantrain.planner.memory import _build

    net = _build(model_config(model, num_labels), "cpu")
    return net.to(device) if device is not None else net


def measure_trial(trial: Trial) -> dict[str, Any]:
    """Run `trial` in this process; returns the measured peak and the exact sizes of its parts (bytes)."""
    import torch

    from leantrain import parallel
    from leantrain.model import loading
    from leantrain.model.optimizers import build_optimizer, state_bytes
    from leantrain.model.schedules import build_scheduler
    from leantrain.parallel.precision import MixedPrecision
    from leantrain.planner.memory import is_causal_lm, is_seq2seq, proxy_batch, proxy_loss
    from leantrain.tasks.causal_lm import head_loss_works, head_rows_work
    from leantrain.tasks.classification import first_token_tail
    from leantrain.telemetry.memory import MemoryMeter, tensor_bytes

    accelerator = parallel.make_accelerator(trial.precision)
    device = accelerator.device
    amp = MixedPrecision(accelerator, trial.precision)
    gen = torch.Generator().manual_seed(0)
    b, s = trial.batch_size, trial.seq_len
    config = model_config(trial.model, trial.num_labels)  # the batch's kind and vocabulary
    batches = [
        {
            **{k: v.to(device) for k, v in proxy_batch(config, b, s, gen, trial.counted, trial.target_len).items()},
            "step_units": torch.tensor(float(b * trial.grad_accum)),
        }
        for _ in range(trial.grad_accum)
    ]
    _trim()
    meter = MemoryMeter(device)
    meter.start()  # baseline: before the model exists, so the weights count
    model = build_model(trial.model, trial.num_labels, device)
    if trial.dropout is not None:
        from leantrain.model.dropout import set_rate

        set_rate(model, trial.dropout)
    if trial.freeze:  # before the optimizer, as the run freezes them: no gradient and no state
        from leantrain.model import freezing

        freezing.apply(model, trial.freeze)
    # a classifier's last layer at the first token only, as its task runs it (not under checkpointing)
    pair = is_seq2seq(model.config)
    tail = None if trial.activation_checkpointing or pair else first_token_tail(model)
    # a causal LM's logits where a token counts, an encoder-decoder's at target tokens, as their tasks compute them
    counted_logits = (is_causal_lm(model.config) or pair) and head_rows_work(model, decoder=pair)
    fused = counted_logits and head_loss_works(model, decoder=pair)  # and there the head and loss in one chunked pass
    if trial.activation_checkpointing:
        loading.enable_activation_checkpointing(model)
    model.train()
    optimizer = build_optimizer(model, trial.optimizer, lr=1e-5, weight_decay=0.01)
    scheduler = build_scheduler(optimizer, "constant", trial.steps, 0.0)
    model, optimizer, scheduler = accelerator.prepare(model, optimizer, scheduler)
    seconds: list[float] = []
    backward_peak = None
    for _ in range(trial.steps):
        started = time.perf_counter()
        for batch in batches:
            inputs = {k: v for k, v in batch.items() if k != "step_units"}
            loss = proxy_loss(model, inputs, amp.autocast(), tail, counted_logits, fused)
            amp.backward(loss / batch["step_units"])
        grads = tensor_bytes(p.grad for p in model.parameters() if p.grad is not None)
        backward_peak = meter.report()["peak_memory_over_baseline_bytes"]
        amp.unscale_and_clip(model, optimizer, 1.0)
        amp.step(optimizer)
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        seconds.append(time.perf_counter() - started)
    peak = meter.report()
    params = list(accelerator.unwrap_model(model).parameters())
    result = {
        **trial.to_dict(),
        "device": device.type,
        "measured_peak_bytes": peak["peak_memory_over_baseline_bytes"],
        "backward_peak_bytes": backward_peak,
        "weights_bytes": tensor_bytes(params),
        "gradients_bytes": grads,
        "optimizer_state_bytes": state_bytes(optimizer),
        "step_seconds": seconds,
    }
    del model, optimizer, scheduler, batches
    accelerator.free_memory()
    _trim()
    return result


def warm_up(trials: list[Trial]) -> None:
    """Run one step of each distinct (model, precision, optimizer, shape) first and throw the result away.

    The first step of a process loads kernels' code and starts thread pools, and the first step at a
    shape builds that shape's kernels: memory that stays resident, paid once (the memory model's
    `runtime` share), that would otherwise land in whichever trial runs first.
    """
    done = set()
    for t in trials:
        # Kernels are built per shape (oneDNN's bf16 matmuls JIT-compile and cache one per shape: 10-15 MiB
        # for the tiny BERT's shapes), so the warm-up runs each trial's own shape; checkpointing and
        # accumulation run the same kernels.
        key = (t.model, t.precision, t.optimizer, t.batch_size, t.seq_len, t.target_len)
        if key not in done:
            done.add(key)
            measure_trial(
                Trial(t.model, t.precision, False, t.optimizer, t.batch_size, 1, t.seq_len, 1, target_len=t.target_len)
            )


def measure_trials(
    trials: list[Trial], fresh: bool = True, warm: bool = True, timeout: float = 1800
) -> list[dict[str, Any]]:
    """Measure each trial.

    fresh: in one new interpreter (nothing this process holds counts); warm: after `warm_up`, so the
    figures leave out the one-off runtime share; warm=False with one trial per call measures it too.
    """
    if not fresh:
        if warm:
            warm_up(trials)
        return [measure_trial(t) for t in trials]
    proc = subprocess.run(
        [sys.executable, __file__],
        input=json.dumps({"warm": warm, "trials": [t.to_dict() for t in trials]}),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if proc.returncode != 0:
        tail = "\n".join(proc.stderr.strip().splitlines()[-5:])
        raise RuntimeError(f"measuring {len(trials)} trial(s) failed:\n{tail}")
    return [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]


def main() -> None:
    import os

    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    from leantrain.telemetry.memory import return_freed_memory

    return_freed_memory()  # as a run with a memory budget does (see there)
    spec = json.loads(sys.stdin.read())
    trials = [Trial(**t) for t in spec["trials"]]
    if spec.get("warm", True):
        warm_up(trials)
    for t in trials:
        print(json.dumps(measure_trial(t)), flush=True)


if __name__ == "__main__":
    main()
