"""How fast this machine trains a sequence classifier: a few optimizer steps timed once and cached.

The default job sizes its rows from this figure, so its training takes about the same few minutes on any machine
instead of a size chosen per CPU class (CPUs of one class differ by about 2x: two AVX2 EPYCs trained MiniLM at 25-30
and at 51-56 samples/s). The steps are the job's (its precision, batches of its size at the length they pad to on
average, the classifier's last layer at the first token alone, gradients clipped, fused AdamW) on random token ids.
What they cannot tell is how a shared machine's speed drifts: on an EPYC with AVX2 only, fresh processes' probes read
41-74 samples/s where the jobs that followed ran 52-65 (benchmarks/results/quickstart.md). The default job's seconds
(`config.sections.DEFAULT_JOB_SECONDS`) leave room for a probe that reads high.

The first measurement is cached in `~/.cache/leantrain/training_speed.json` (`$LEANTRAIN_CACHE` moves it), keyed by
CPU, the instruction sets torch is held to, thread count, torch version, precision, model and shape, and is kept: a
job sized from it is sized the same in every later run on this machine (re-measured when the file is deleted). A
measurement taken while other processes held half a core or more of this process's CPUs sizes this run only: kept,
a busy first run would shrink every later default job on the machine.
"""

from __future__ import annotations

import contextlib
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from leantrain.telemetry.peak import read_cache, write_cache

#: environment variables that hold torch's kernels to narrower instructions than the CPU has
HELD_ISA_ENV = ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "MKL_ENABLE_INSTRUCTIONS")
#: this process's measurements by key, with when they were taken: for a cache file that could not be written, or a
#: measurement not kept
_MEASURED: dict[str, tuple[float, str]] = {}


def cache_file() -> Path:
    from leantrain.paths import leantrain_cache

    return leantrain_cache() / "training_speed.json"


def measure_training_speed(
    model_path: str,
    precision: str,
    batch: int,
    length: int,
    steps: int = 20,
    fast: bool = True,
    freeze: str = "none",
    dropout: float | None = None,
    within: Callable[[Any], Callable[[], contextlib.AbstractContextManager] | None] | None = None,
) -> float:
    """Samples/s of a sequence classifier's optimizer steps as the trainer takes them (forward, backward, gradients
    clipped, fused AdamW) on CPU: the median of `steps` after one warm-up, with the attention kernel `--attention
    auto` picks, with `fast` the job's dropout (`model.dropout`), what `freeze` names frozen (`model.freezing`),
    `dropout` the rate of every dropout (None: the model's own) and the forward run within what `within` gives for
    the model (the task's: a classifier's last layer at the first token alone), where it gives one. The caller's
    random state is left as it was."""
    import torch

    from leantrain.model import attention, freezing
    from leantrain.model.dropout import fast_dropout, set_rate
    from leantrain.model.loading import library_bars_off, load_for_classification

    with torch.random.fork_rng(devices=[]), fast_dropout(fast):
        torch.manual_seed(0)
        with library_bars_off():
            model = load_for_classification(model_path, ["a", "b"])
        if dropout is not None:
            set_rate(model, dropout)
        attention.set_up(model, "auto", "cpu", precision, fast)
        freezing.apply(model, freeze)
        model.train()
        trained = [p for p in model.parameters() if p.requires_grad]
        optimizer = torch.optim.AdamW(trained, lr=1e-5, fused=True)
        context = (within(model) if within else None) or contextlib.nullcontext
        vocab = model.config.vocab_size
        ids = torch.randint(min(1000, vocab - 1), vocab, (batch, length))
        mask = torch.ones_like(ids)
        labels = torch.randint(0, 2, (batch,))
        half = torch.float16 if precision == "fp16" else torch.bfloat16
        seconds = []
        for _ in range(steps + 1):
            started = time.perf_counter()
            with torch.autocast("cpu", dtype=half, enabled=precision in ("bf16", "fp16")), context():
                loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
            loss.backward()
            torch.nn.utils.clip_grad_norm_(trained, 1.0)  # the default --max-grad-norm
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            seconds.append(time.perf_counter() - started)
    return batch / statistics.median(seconds[1:])


def training_speed(
    model_path: str,
    precision: str,
    batch: int,
    length: int,
    fast: bool = True,
    freeze: str = "none",
    dropout: float | None = None,
    within: Callable[[Any], Callable[[], contextlib.AbstractContextManager] | None] | None = None,
) -> tuple[float, str]:
    """This machine's samples/s for the job's shape (cached after the first measurement), and when it was
    measured. `within`: as `measure_training_speed`'s, keyed by whether it is given."""
    import torch

    from leantrain.parallel import cpu_model, threads

    held = ",".join(f"{k}={os.environ[k]}" for k in HELD_ISA_ENV if os.environ.get(k))
    key = " | ".join(
        [
            cpu_model(),  # not its name alone: 'AMD EPYC' covers AVX2 parts 3x slower than AVX-512 BF16 ones
            held or "all instructions",
            f"{torch.get_num_threads()} threads",
            f"torch {torch.__version__}",
            precision,
            str(model_path),
            f"{batch}x{length}",
            "fast dropout" if fast else "torch's dropout",  # figures cached before either: torch's, not keyed
            *([f"frozen {freeze}"] if freeze != "none" else []),  # figures cached before: nothing frozen
            *([f"dropout {dropout:g}"] if dropout is not None else []),  # before: the model's own
            # figures cached before: unclipped, the whole last layer, rows of a length the job's batches did not pad to
            "clipped, first-token tail" if within else "clipped",
        ]
    )
    path = cache_file()
    entry = read_cache(path).get(key)
    if isinstance(entry, dict) and float(entry.get("samples_per_second", 0)) > 0:
        return float(entry["samples_per_second"]), f"measured {entry.get('measured', '?')}, cached in {path}"
    if key in _MEASURED:
        return _MEASURED[key]
    load = threads.neighbour_load()
    speed = measure_training_speed(
        model_path, precision, batch, length, fast=fast, freeze=freeze, dropout=dropout, within=within
    )
    others = load()
    if others is not None and others >= threads.BUSY_CORES:  # a neighbour's slowdown is not this machine's speed
        when = f"measured now while other processes used {others:.1f} cores: not kept, measured again next run"
    else:
        when = "measured now"
        write_cache(path, key, {"samples_per_second": speed, "measured": time.strftime("%Y-%m-%d %H:%M")})
    _MEASURED[key] = (speed, when)
    return speed, when
