"""Where leantrain's eager step goes, part by part, against a hand-written loop's forward, backward, step and clear,
in one process (the machine's speed moves between processes; within one it holds better).

Runs host_overhead.py's host-bound model (BERT-base's or a 12-layer Llama's operator graph at width 32, 8 rows of 16
tokens, fp32, 2 threads) through `leantrain.train` with a wall clock around each part of the step (the trainer's,
the task's, the NaN guard's, the metrics logger's and the mixed-precision helper's methods), then through the hand
loop of host_overhead.py. Prints milliseconds per optimizer step for each; parts nest (`fb` holds `task.forward`
and `amp.backward`; `close` holds the clip, `nan.step(opt)` and the clearing).

    python benchmarks/step_parts.py bert 400
    python benchmarks/step_parts.py bert 400 --no-hand   # leantrain's parts only; time the hand loop in a process
                                                         # of its own (after leantrain, in one process, it ran slower)
"""

from __future__ import annotations

import collections
import functools
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import host_overhead as H
import torch

TOTALS: collections.Counter = collections.Counter()


def clocked(owner, name: str, label: str) -> None:
    """Wrap owner.name so that its wall time adds up under `label`."""
    f = getattr(owner, name)

    @functools.wraps(f)
    def timed(*args, **kwargs):
        start = time.perf_counter()
        try:
            return f(*args, **kwargs)
        finally:
            TOTALS[label] += time.perf_counter() - start

    setattr(owner, name, timed)


def leantrain_parts(kind: str, model_dir: Path, data: Path, steps: int, root: Path) -> float:
    from leantrain import TrainConfig, train
    from leantrain.training import guards, metrics_logger
    from leantrain.training import trainer as trainer_module

    Trainer = trainer_module.Trainer
    for name, label in (("train_step", "train_step"), ("forward_backward_step", "fb"), ("_close_step", "close")):
        clocked(Trainer, name, label)
    for name in ("before_step", "verdict"):
        clocked(guards.NanGuard, name, f"nan.{name}")
    clocked(guards.NanGuard, "step", "nan.step(opt)")
    for name in ("micro_batch", "add_step", "maybe_log"):
        clocked(metrics_logger.MetricsLogger, name, f"log.{name}")
    built = Trainer.__init__

    def init(self, *args, **kwargs):
        built(self, *args, **kwargs)
        for name in ("forward", "loss_sum"):
            clocked(self.task, name, f"task.{name}")
        clocked(self.amp, "backward", "amp.backward")
        clocked(self.amp, "unscale_and_clip", "amp.clip")
        clocked(self.amp, "zero_grad", "amp.zero_grad")
        clocked(self.scheduler, "step", "scheduler.step")

    Trainer.__init__ = init
    job = dict(
        model=str(model_dir), data=str(data), max_length=H.LENGTH, batch_size=H.ROWS, optimizer="adamw", lr=1e-4,
        precision="fp32", log_every=1000, progress=False, report=False, cache_dir=str(root / "c"), seed=0,
        warmup_ratio=0.0, max_steps=steps, output_dir=str(root / "out"),
    )  # fmt: skip
    if kind == "llama":
        job.update(task="causal-lm")
    clock = H._hooks()
    train(TrainConfig(**job), hooks=clock)
    times = sorted(b - a for a, b in zip(clock.starts[20:], clock.starts[21:]))
    return times[len(times) // 2]


def hand_parts(kind: str, model_dir: Path, steps: int) -> tuple[float, dict[str, float]]:
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification

    auto = AutoModelForCausalLM if kind == "llama" else AutoModelForSequenceClassification
    model = auto.from_pretrained(model_dir).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    batch = H.token_rows(kind, "cpu")
    parts: collections.Counter = collections.Counter()
    totals = []
    for i in range(steps):
        t0 = time.perf_counter()
        loss = model(**batch).loss
        t1 = time.perf_counter()
        loss.backward()
        t2 = time.perf_counter()
        opt.step()
        t3 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        t4 = time.perf_counter()
        if i >= 20:
            for name, seconds in (("forward", t1 - t0), ("backward", t2 - t1), ("step", t3 - t2), ("clear", t4 - t3)):
                parts[name] += seconds / (steps - 20)
            totals.append(t4 - t0)
    totals.sort()
    return totals[len(totals) // 2], dict(parts)


def main() -> int:
    kind = sys.argv[1] if len(sys.argv) > 1 else "bert"
    steps = int(sys.argv[2]) if len(sys.argv) > 2 else 400
    torch.set_num_threads(2)
    root = Path(tempfile.mkdtemp(prefix="step-parts-"))
    model_dir = H.write_model(kind, root / "model")
    data = H.write_data(kind, root, rows=H.ROWS * (steps + 8))
    median = leantrain_parts(kind, model_dir, data, steps, root)
    print(f"leantrain: median step {1000 * median:.2f} ms; mean per step by part:")
    for label, seconds in sorted(TOTALS.items(), key=lambda kv: -kv[1]):
        print(f"  {label:18s} {1000 * seconds / steps:.3f} ms")
    if "--no-hand" in sys.argv:
        return 0
    median, parts = hand_parts(kind, model_dir, steps)
    shares = ", ".join(f"{k} {1000 * v:.3f}" for k, v in parts.items())
    print(f"hand loop: median step {1000 * median:.2f} ms; {shares}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
