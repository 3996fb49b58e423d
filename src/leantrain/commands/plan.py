"""`leantrain plan`: the command's work, kept out of cli.py (which only parses)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from leantrain.commands.probe import ProbeConfig, probe
from leantrain.config import TrainConfig
from leantrain.errors import ConfigError
from leantrain.planner.auto import fitted_to_data, precompute_note, request_for
from leantrain.planner.search import Plan, make_plan


@dataclass(frozen=True)
class PlanOptions:
    """The `plan` command's own flags (the job itself is a TrainConfig)."""

    #: examples per optimizer step; None: --batch-size x --grad-accum x processes
    global_batch: int | None = None
    #: "cpu" or "cuda"; None: this machine's device
    device: str | None = None
    #: run the top candidates for a few steps and re-rank by measurement
    probe: bool = False
    probe_top: int = 3
    probe_steps: int = 5
    #: where plan.json, plan.md and the probes' runs go; None: nothing written (probes: a temporary folder)
    plan_dir: str | None = None


def prepared_data(cfg: TrainConfig):
    """cfg.data as the run's task prepares it (tokenized and cut at --max-length, a causal LM's documents packed),
    read through the cache."""
    from leantrain.job import assemble

    job = assemble(cfg)
    return job.task.prepare_data(job.model_path, job.model_config)


def run_plan(cfg: TrainConfig, options: PlanOptions, job: dict[str, Any], say=print) -> tuple[Plan, dict[str, Path]]:
    """Plan `cfg` (and probe it when asked); returns the plan and the files written."""
    from leantrain.model import presets
    from leantrain.parallel import device_type

    device = options.device or device_type()
    if device not in ("cpu", "cuda"):
        raise ConfigError(f"--device must be cpu or cuda, got '{device}'")
    processes = cfg.num_processes or 1
    request, source = request_for(cfg, device, processes)
    if options.global_batch is not None:
        if options.global_batch <= 0:
            raise ConfigError(f"--global-batch must be a positive integer, got {options.global_batch}")
        request = _replace(request, global_batch=options.global_batch)
    notes = [f"budget: {source}"]
    facts, data = None, None
    if cfg.data is not None:
        data = prepared_data(cfg)
        request, facts, fitted = fitted_to_data(cfg, request, data)
        notes += fitted
    if facts is None and cfg.model and presets.is_preset(cfg.model) and presets.preset_task(cfg.model) == "causal-lm":
        notes.append("a preset's vocabulary is planned at its largest; the tokenizer a run trains may be smaller")
    plan = make_plan(request, facts=facts)
    plan.notes[:0] = notes
    plan.notes += precompute_note(cfg, plan, data)
    paths: dict[str, Path] = {}
    if options.probe:
        import tempfile

        root = Path(options.plan_dir) if options.plan_dir else Path(tempfile.mkdtemp(prefix="leantrain-probe-"))
        probe(plan, job, root / "probes", ProbeConfig(top=options.probe_top, steps=options.probe_steps), say=say)
    plan.notes += time_note(cfg, plan, data)
    if options.plan_dir:
        paths = plan.write(Path(options.plan_dir))
    return plan, paths


def time_note(cfg: TrainConfig, plan: Plan, data: Any) -> list[str]:
    """What --max-time buys: the steps and examples at the recommended candidate's measured speed (the plan's own
    speeds are relative, so without --probe it says how to find out)."""
    if cfg.max_time is None:
        return []
    given = f"--max-time {cfg.max_time}"
    c = plan.recommended
    speed = (c.measured or {}).get("samples_per_second") if c is not None else None
    if c is None or not speed:
        return [f"{given}: the speeds above are relative; --probe measures the candidates and says what it buys"]
    examples = speed * (cfg.max_time_seconds or 0.0)
    batch = plan.request.global_batch
    rows = len(data.train) if data is not None and hasattr(data.train, "__len__") else None
    epochs = f", {examples / rows:.2g} epochs of the {rows:,} training rows" if rows else ""
    return [
        f"{given}: at the recommended candidate's measured {speed:.1f} samples/s, about {int(examples // batch):,} "
        f"optimizer steps of {batch} ({examples:,.0f} examples{epochs}); start-up and evaluation not counted, and a "
        "run with length-grouped batches pads less than the probes (every row at the planned length)"
    ]


def _replace(request, **changes):
    import dataclasses

    return dataclasses.replace(request, **changes)
