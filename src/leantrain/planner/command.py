"""`leantrain plan`: the command's work, kept out of cli.py (which only parses)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from leantrain.config import TrainConfig
from leantrain.errors import ConfigError
from leantrain.planner.auto import request_for
from leantrain.planner.probe import ProbeConfig, probe
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


def data_length(cfg: TrainConfig) -> int | None:
    """The longest tokenized training example of cfg.data (cut at --max-length), read through the cache."""
    from leantrain import models
    from leantrain.data.prepare import prepare_data

    resolved = cfg.resolved()
    assert resolved.cache_dir is not None  # resolved() fills it
    tokenizer = models.load_tokenizer(models.resolve_model(cfg.model), trust_remote_code=cfg.trust_remote_code)
    data = prepare_data(resolved, tokenizer, Path(resolved.cache_dir))
    return int(max(data.train.lengths)) if len(data.train) else None


def run_plan(cfg: TrainConfig, options: PlanOptions, job: dict[str, Any], say=print) -> tuple[Plan, dict[str, Path]]:
    """Plan `cfg` (and probe it when asked); returns the plan and the files written."""
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
    if cfg.data is not None:
        longest = data_length(cfg)
        if longest is not None and longest < request.seq_len:
            notes.append(f"length {longest}: the longest example of --data (--max-length {cfg.max_length})")
            request = _replace(request, seq_len=longest)
    plan = make_plan(request)
    plan.notes[:0] = notes
    paths: dict[str, Path] = {}
    if options.probe:
        import tempfile

        root = Path(options.plan_dir) if options.plan_dir else Path(tempfile.mkdtemp(prefix="leantrain-probe-"))
        probe(plan, job, root / "probes", ProbeConfig(top=options.probe_top, steps=options.probe_steps), say=say)
    if options.plan_dir:
        paths = plan.write(Path(options.plan_dir))
    return plan, paths


def _replace(request, **changes):
    import dataclasses

    return dataclasses.replace(request, **changes)
