"""`--profile-steps N`: a torch.profiler trace of N optimizer steps, and where their time went by kind of work.

The profiler starts after the first optimizer step (its warm-up: allocator growth, lazy initialisation, kernel
selection) and records the next N steps whole: the wait for their data, every micro-batch's forward and backward,
the optimizer step (and an evaluation or checkpoint that falls inside them). It writes `profile/trace.json`
(Chrome trace format: open it in https://ui.perfetto.dev or chrome://tracing) and `profile/summary.json`, and the
run prints the summary.

The summary charges each operator's *self* time (its own, without the operators it called) to one category, so
the categories add up to the time spent in operators; the rest of the wall time is Python and everything the
profiler does not see as an operator. An operator is charged by what it ran inside: everything under
`Optimizer.step`/`zero_grad` is the optimizer, everything under the data loader's `__next__` is data; otherwise
by the outermost ATen operator it belongs to (`aten::linear` -> `aten::addmm` is a matmul, `aten::layer_norm` ->
`aten::native_layer_norm` normalisation), so a composite's pieces stay with it. Eager attention is Python calling
`matmul` and `softmax`: its products count as matmuls and its softmax as attention. On a GPU the host only
launches kernels: the summary then also charges each kernel's time to the operator that launched it
(`device_categories`), and the rest of the wall time to the GPU waiting for the host.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

MATMULS = "matmuls"
ATTENTION = "attention"
NORMS = "normalisation and activations"
CASTS = "dtype casts"
EMBEDDING = "embedding gradient"
LOSS = "loss"
OPTIMIZER = "optimizer step"
DATA = "data and collate"
OTHER_OPS = "other operators (elementwise, copies, reductions)"
FRAMEWORK = "autograd and dispatch (non-operator events)"
PYTHON = "Python and time outside operators"
CATEGORIES = (MATMULS, ATTENTION, NORMS, CASTS, EMBEDDING, LOSS, OPTIMIZER, DATA, OTHER_OPS, FRAMEWORK, PYTHON)

#: (category, substrings of an ATen operator's name), first match wins; embedding before casts and matmuls, a loss's
#: log_softmax before attention's softmax
_OPERATORS = (
    (EMBEDDING, ("embedding_dense_backward", "embedding_backward")),
    (LOSS, ("log_softmax", "cross_entropy", "nll_loss", "mse_loss", "binary_cross_entropy")),
    (ATTENTION, ("scaled_dot_product", "flash_attention", "efficient_attention", "softmax")),
    (MATMULS, ("::mm", "addmm", "bmm", "matmul", "linear", "_int_mm", "conv")),
    (NORMS, ("layer_norm", "rms_norm", "group_norm", "batch_norm", "gelu", "silu", "relu", "tanh", "dropout")),
    (CASTS, ("aten::to", "_to_copy", "_autocast")),
)
#: the profiler's name for `losses.head_cross_entropy_sum` (an autograd Function): the output head fused with its loss
FUSED_HEAD_LOSS = "_HeadCrossEntropy"


def _operator_category(name: str) -> str | None:
    for category, needles in _OPERATORS:
        if any(n in name for n in needles):
            return category
    return None


def categorise(event: Any) -> str:
    """The category of one profiler event (a `FunctionEvent`), from its name and its callers' (see module doc)."""
    chain = []
    node = event
    while node is not None:
        chain.append(node.name)
        node = node.cpu_parent
    if any(n.startswith("Optimizer.") for n in chain):
        return OPTIMIZER
    if any("DataLoader" in n for n in chain):
        return DATA
    operators = [n for n in chain if n.startswith("aten::")]
    if not operators:
        return FRAMEWORK
    if FUSED_HEAD_LOSS in chain:  # the head's products are matmuls; its softmax, gather and one-hot are the loss
        return MATMULS if _operator_category(operators[-1]) == MATMULS else LOSS
    for name in reversed(operators):  # the outermost operator first
        category = _operator_category(name)
        if category is not None:
            return category
    return OTHER_OPS


def summarise(events, wall_seconds: float, steps: int) -> dict[str, Any]:
    """Seconds and shares of wall time per category over the profiled steps: the host's operator time and, on a
    GPU, the kernel time each operator launched (an operator's *self* device time)."""
    seconds = dict.fromkeys(CATEGORIES, 0.0)
    device = dict.fromkeys(CATEGORIES[:-1], 0.0)
    for event in events:
        if event.device_type.name != "CPU" or event.name.startswith("[memory]"):
            continue
        category = categorise(event)
        seconds[category] += event.self_cpu_time_total / 1e6
        device[category] += (getattr(event, "self_device_time_total", 0) or 0) / 1e6
    in_operators = sum(seconds.values())
    seconds[PYTHON] = max(wall_seconds - in_operators, 0.0)
    total = max(wall_seconds, in_operators)  # threads may overlap the main one (CUDA's backward thread)
    summary = {
        "steps": steps,
        "wall_seconds": wall_seconds,
        "categories": {k: {"seconds": v, "share": v / total if total else 0.0} for k, v in seconds.items()},
    }
    busy = sum(device.values())
    if busy > 0:  # on a GPU the host only launches work: what the kernels did is the time that counts
        device[GPU_IDLE] = max(wall_seconds - busy, 0.0)
        total = max(wall_seconds, busy)
        summary["device_categories"] = {k: {"seconds": v, "share": v / total} for k, v in device.items() if v > 0}
    return summary


GPU_IDLE = "GPU idle (waiting for the host)"


def format_summary(summary: dict[str, Any], first_step: int) -> str:
    last = first_step + summary["steps"] - 1
    lines = [
        f"profile of steps {first_step}-{last} ({summary['wall_seconds']:.2f} s; "
        f"{summary['wall_seconds'] / max(summary['steps'], 1) * 1000:.0f} ms a step):"
    ]
    rows = sorted(summary["categories"].items(), key=lambda kv: -kv[1]["seconds"])
    lines += [f"  {v['share']:6.1%}  {v['seconds']:8.3f} s  {k}" for k, v in rows if v["seconds"] > 0]
    if "device_categories" in summary:
        lines.append("GPU kernel time by the operator that launched it:")
        rows = sorted(summary["device_categories"].items(), key=lambda kv: -kv[1]["seconds"])
        lines += [f"  {v['share']:6.1%}  {v['seconds']:8.3f} s  {k}" for k, v in rows]
    return "\n".join(lines)


class StepProfiler:
    """Profiles optimizer steps 2 .. N+1 of a run (`after_step` after each step; `close` at the end)."""

    def __init__(
        self, steps: int | None, out_dir: Path | None, first_step: int = 1, say=None, shown_dir: Path | None = None
    ):
        self.steps, self.out_dir, self.say = steps or 0, out_dir, say
        self.shown_dir = shown_dir or out_dir  # where the run will be once published (out_dir may be its staging)
        self.start_after = first_step  # the warm-up step is left out
        self.profiler: Any = None
        self.started_at = 0.0
        self.profiled = 0
        self.summary: dict[str, Any] | None = None

    @property
    def enabled(self) -> bool:
        return bool(self.steps) and self.out_dir is not None

    def after_step(self, step: int) -> None:
        if not self.enabled or self.summary is not None:
            return
        if self.profiler is None and step == self.start_after:
            self._start()
        elif self.profiler is not None:
            self.profiled += 1
            if self.profiled >= self.steps:
                self.close()

    def _start(self) -> None:
        import torch
        from torch.profiler import ProfilerActivity, profile

        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
        self.profiler = profile(activities=activities)
        self.profiler.start()
        self.started_at = time.perf_counter()

    def close(self) -> dict[str, Any] | None:
        """Stop (also when the run ended before N steps), write the trace and the summary, print it."""
        if self.profiler is None or self.summary is not None:
            return self.summary
        import torch

        if torch.cuda.is_available():
            torch.cuda.synchronize()
        wall = time.perf_counter() - self.started_at
        self.profiler.stop()
        assert self.out_dir is not None
        folder = self.out_dir / "profile"
        folder.mkdir(parents=True, exist_ok=True)
        self.profiler.export_chrome_trace(str(folder / "trace.json"))
        self.summary = summarise(self.profiler.events(), wall, self.profiled)
        (folder / "summary.json").write_text(json.dumps(self.summary, indent=2) + "\n")
        if self.say is not None:
            self.say(format_summary(self.summary, self.start_after + 1))
            shown = (self.shown_dir or folder.parent) / "profile" / "trace.json"
            self.say(f"trace: {shown} (open in https://ui.perfetto.dev or chrome://tracing)")
        return self.summary
