"""What one optimizer step costs, per registered optimizer: its time, the state it holds against the registry's count
(which the planner and checkpoint sizing use), and the temporaries of its step (the planner's optimizer workspace),
for each optimizer and for GaLore and APOLLO with --projection-embeddings.

On the embedded MiniLM (22.7 M parameters, its 36 hidden matrices 384 x 384 and 384 x 1,536) and on
`preset:tiny-llama`'s model (5 M, tied embeddings), with fixed random gradients: steps are timed after one untimed
step (the state exists), the median of --steps; GaLore's SVD refresh is timed apart (its first step) and amortised
over --projection-update-interval. Temporaries: the resident high-water mark during a step over the resident size
before it, with freed tensors handed back to the kernel at once (telemetry.memory.return_freed_memory), so the mark
follows live tensors; in copies of the largest parameter tensor, the largest hidden matrix and all parameters, as
the registry counts them.

    python benchmarks/optimizer_steps.py            # writes benchmarks/results/optimizer_steps.{json,md}
    python benchmarks/optimizer_steps.py --steps 3 --models tiny-llama   # quick
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import time
from pathlib import Path
from types import SimpleNamespace

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def build_model(kind: str):
    import torch

    torch.manual_seed(0)
    if kind == "minilm":
        from leantrain.model import loading

        return loading.load_for_classification(str(loading.embedded_model_path()), ["neg", "pos"])
    from transformers import AutoModelForCausalLM

    from leantrain.model import presets

    config = presets.preset_config("preset:tiny-llama")
    config.vocab_size = 8192  # the byte-level BPE the preset trains (its largest)
    return AutoModelForCausalLM.from_config(config)


def set_grads(model, seed: int) -> None:
    import torch

    g = torch.Generator().manual_seed(seed)
    for p in model.parameters():
        p.grad = torch.randn(p.shape, generator=g) * 1e-3


def resident() -> int:
    from leantrain.telemetry.memory import _status_kib

    return (_status_kib("VmRSS") or 0) * 1024


def step_peak(opt) -> int:
    """Bytes the step took beyond what was resident before it (its temporaries, once the state exists)."""
    from leantrain.telemetry.memory import _status_kib, release_free_memory

    release_free_memory()
    with contextlib.suppress(OSError):
        Path("/proc/self/clear_refs").write_text("5")
    before = resident()
    opt.step()
    return max((_status_kib("VmHWM") or 0) * 1024 - before, 0)


def measure(kind: str, label: str, steps: int) -> dict:
    """`label`: an optimizer, or a variant of one (time_to_target.VARIANTS: galore-adamw+embeddings, ...)."""
    from benchmarks.time_to_target import base_of
    from leantrain.model import optimizers as O

    name, values = base_of(label)
    settings = SimpleNamespace(**values)
    model = build_model(kind)
    opt = O.build_optimizer(model, name, lr=1e-4, weight_decay=0.01, settings=settings)
    O.use_weights(name, opt, "train")
    set_grads(model, 0)
    started = time.perf_counter()
    # the state is made here (and GaLore's first SVD, APOLLO's first projection): its temporaries are what the
    # step took beyond the state it made
    first_peak = step_peak(opt)
    first = time.perf_counter() - started
    first_temporaries = max(first_peak - O.state_bytes(opt), 0)
    times = []
    for i in range(steps):
        set_grads(model, i + 1)
        t = time.perf_counter()
        opt.step()
        times.append(time.perf_counter() - t)
    set_grads(model, 99)
    temporaries = step_peak(opt)
    hidden = O.treated_apart(model, name, settings)
    trainable = [p for p in model.parameters() if p.requires_grad]
    numel = sum(p.numel() for p in trainable)
    largest = max(p.numel() for p in trainable)
    largest_hidden = max((p.numel() for p in trainable if id(p) in hidden), default=0)
    steady = statistics.median(times)
    entry = O.entry(name)
    refresh = first - steady if entry.rank_setting else 0.0
    amortised = steady + refresh / O.SETTINGS["projection_update_interval"]
    return {
        "model": kind,
        "optimizer": label,
        "parameters": numel,
        "step_ms": 1e3 * steady,
        "first_step_ms": 1e3 * first,
        "amortised_ms": 1e3 * amortised,
        "seconds_per_param": amortised / numel,
        "registry_seconds_per_param": entry.cpu_seconds_per_param,
        "state_bytes": O.state_bytes(opt),
        "predicted_state_bytes": O.model_state_bytes(model, name, settings),
        "adamw_state_bytes": O.model_state_bytes(model, "adamw"),
        "temporaries_bytes": temporaries,
        "first_temporaries_bytes": first_temporaries,
        "predicted_temporaries_bytes": O.predicted_temporaries(largest, largest_hidden, numel, name),
        "largest": largest,
        "largest_hidden": largest_hidden,
    }


def page(rows: list[dict]) -> list[str]:
    mb = 2**20
    lines = [
        "# One optimizer step, per optimizer",
        "",
        "Written by `benchmarks/optimizer_steps.py` (its docstring says how). Fixed random gradients; state after the "
        "first steps; amortised: with GaLore's SVD refresh spread over its 200-step interval.",
        "",
        "| model | optimizer | step ms | first step ms | amortised ms | state MB | predicted | of AdamW's | "
        "temporaries MB: a step | the first | predicted |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        ratio = r["state_bytes"] / r["adamw_state_bytes"]
        lines.append(
            f"| {r['model']} | {r['optimizer']} | {r['step_ms']:.0f} | {r['first_step_ms']:.0f} | "
            f"{r['amortised_ms']:.0f} | {r['state_bytes'] / mb:.1f} | {r['predicted_state_bytes'] / mb:.1f} | "
            f"{ratio:.2f}x | {r['temporaries_bytes'] / mb:.1f} | {r['first_temporaries_bytes'] / mb:.1f} | "
            f"{r['predicted_temporaries_bytes'] / mb:.1f} |"
        )
    return lines


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default="minilm,tiny-llama")
    p.add_argument("--optimizers", default=None, help="comma-separated (default: every registered one)")
    p.add_argument("--steps", type=int, default=7)
    p.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results")
    args = p.parse_args(argv)

    import importlib.util
    import os

    import torch

    from benchmarks._results import write_results
    from benchmarks.time_to_target import VARIANTS, hardware
    from leantrain.model.optimizers import OPTIMIZERS
    from leantrain.telemetry.memory import return_freed_memory

    return_freed_memory()
    torch.set_num_threads(os.cpu_count() or 1)
    names = args.optimizers.split(",") if args.optimizers else [*OPTIMIZERS, *VARIANTS]
    if importlib.util.find_spec("bitsandbytes") is None and "adamw8bit" in names:
        names.remove("adamw8bit")
    load = [os.getloadavg()[0]]
    rows = []
    for kind in args.models.split(","):
        for name in names:
            rows.append(measure(kind, name, args.steps))
            r = rows[-1]
            print(f"{kind} {name}: {r['step_ms']:.0f} ms, state {r['state_bytes']:,} (predicted "
                  f"{r['predicted_state_bytes']:,}), temporaries {r['temporaries_bytes']:,}", flush=True)  # fmt: skip
    load.append(os.getloadavg()[0])
    context = {**hardware(), "load average before, after": f"{load[0]:.2f}, {load[1]:.2f}",
               "threads": str(torch.get_num_threads())}  # fmt: skip
    text = write_results(args.out, "optimizer_steps", page(rows), context, {"rows": rows})
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
