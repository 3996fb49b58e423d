"""`leantrain plan --probe`: run a few real steps of the top candidates, measure them, re-rank.

Each probed candidate is a short `leantrain train` of the user's own job (model, data, length) in its
own process, through `bench.run_job` (the machinery of `leantrain bench`): steady samples/s after the
first step, and its peak memory as the run reports it (weights plus the peak over the baseline taken
once the model is loaded). Every batch is padded to the planned length (--pad-to-max-length; an
encoder-decoder's sources and targets each to theirs), so the peak is the worst case the plan is for,
and the process frees memory as a budgeted run does (MALLOC_MMAP_THRESHOLD_, see
telemetry.memory.return_freed_memory). Measured beats predicted: the recommendation becomes the fastest
probed candidate whose *measured* peak fits.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from leantrain.planner.search import Candidate, Plan, choose
from leantrain.telemetry.memory import MMAP_THRESHOLD_BYTES

#: the share of the data a probe holds out for its closing evaluation (unless --eval-data names a file)
EVAL_FRACTION = 0.01


@dataclass(frozen=True)
class ProbeConfig:
    """How much to probe."""

    #: fitting candidates to run, fastest predicted first (one per technique combination)
    top: int = 3
    #: also run the fastest candidate predicted not to fit by at most this share of the budget
    #: (the memory model errs both ways by up to ~15%)
    near_miss: float = 0.15
    #: optimizer steps of each probe (the first is left out of its speed)
    steps: int = 5
    #: rounds over the picked candidates; each keeps its fastest round (the one a busy neighbour disturbed
    #: least) and its largest peak
    repeats: int = 2
    #: seconds before a probe is given up
    timeout: float = 1800.0


def pick(plan: Plan, config: ProbeConfig) -> list[Candidate]:
    """The candidates worth measuring: the fastest fitting one of each technique combination, then a near miss."""
    chosen: list[Candidate] = []
    seen = set()
    for c in sorted((c for c in plan.candidates if c.fits), key=lambda c: -c.relative_throughput):
        if c.techniques not in seen:
            seen.add(c.techniques)
            chosen.append(c)
        if len(chosen) == config.top:
            break
    budget = plan.request.budget
    misses = [c for c in plan.candidates if not c.fits and c.memory.peak <= budget * (1 + config.near_miss)]
    if misses:
        best = max(misses, key=lambda c: c.relative_throughput)
        if chosen and best.relative_throughput > chosen[0].relative_throughput:
            chosen.append(best)
    return chosen


def _record(c: Candidate, row) -> None:
    m = row.metrics
    if m is None:
        c.measured = {"peak_bytes": None, "samples_per_second": None, "error": row.error}
        return
    over = m.get("peak_memory_over_baseline_bytes")
    # the run's baseline is taken once the weights are resident: they come on top of its peak over it
    peak = over + m["weights_bytes"] if over is not None else None
    sps = m.get("steady_samples_per_second")
    old = c.measured or {}
    c.measured = {
        "peak_bytes": max(p for p in (peak, old.get("peak_bytes")) if p is not None) if peak is not None else None,
        "samples_per_second": max(sps or 0.0, old.get("samples_per_second") or 0.0) or None,
        "runs": old.get("runs", 0) + 1,
    }


def _slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "_", name).strip("_")


def probe(plan: Plan, base_job: dict[str, Any], work_dir: Path, config: ProbeConfig | None = None, say=print) -> Plan:
    """Measure the picked candidates of `plan` on `base_job` (TrainConfig values) and re-rank it in place."""
    from leantrain.commands import bench

    config = config or ProbeConfig()
    job = {k: v for k, v in base_job.items() if k not in ("auto", "memory", "output_dir", "resume", "save_every")}
    job.update(max_length=plan.request.seq_len, pad_to_max_length=True, report=False, eval_every=None)
    padded = f"{plan.request.seq_len} tokens"
    if plan.request.target_len:  # an encoder-decoder's sources and targets are padded to their own planned lengths
        # (--max-length, which would also name the sources' length, back at its default: train refuses both)
        job.pop("max_length")
        job.update(max_source_length=plan.request.seq_len, max_target_length=plan.request.target_len)
        padded = f"sources of {plan.request.seq_len} and targets of {plan.request.target_len} tokens"
    # what is measured is training: the run's closing evaluation, at the planned length over a tenth of the data,
    # took most of a probe's time (259 of 293 s on the default job), so it scores a token share
    if not job.get("eval_data"):
        job["eval_fraction"] = EVAL_FRACTION
    if job.get("data") is None and job.get("limit") is None:  # the default job: rows for the steps, not a speed test
        job["limit"] = config.steps * plan.request.global_batch
    env = {"MALLOC_MMAP_THRESHOLD_": str(MMAP_THRESHOLD_BYTES)}
    picked = pick(plan, config)
    for _ in range(max(1, config.repeats)):  # round-robin: a neighbour's load hits every candidate alike
        for c in picked:
            if c.measured is not None and c.measured.get("samples_per_second") is None:
                continue  # failed once: not tried again
            row = bench.run_job(
                c.name, c.overrides(), job, config.steps, work_dir / _slug(c.name), say, config.timeout, env=env
            )
            _record(c, row)
    probed = [c for c in plan.candidates if c.measured and c.measured.get("samples_per_second")]
    fastest = max((c.measured["samples_per_second"] for c in probed), default=0.0)  # type: ignore[index]
    for c in probed:
        assert c.measured is not None
        # relative to the fastest probed: only measured candidates are compared with each other
        c.measured["relative_throughput"] = c.measured["samples_per_second"] / fastest if fastest else 0.0
    plan.probed = True
    plan.notes.append(
        f"probed {len(probed)} candidate(s), {config.repeats} x {config.steps} steps each of the real job, padded "
        f"to {padded} (fastest run, largest peak); measured peak and speed replace the predictions"
    )
    choose(plan)
    return plan
