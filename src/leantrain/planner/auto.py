"""`leantrain train --auto`: turn a TrainConfig into the planner's request, and its recommendation into the config."""

from __future__ import annotations

import dataclasses
import importlib.util
import math
from pathlib import Path
from typing import Any

import numpy as np

from leantrain.config import TrainConfig
from leantrain.config.units import format_bytes
from leantrain.errors import LeantrainError
from leantrain.model import optimizers
from leantrain.planner.memory import LoraSpec, ModelFacts, mean_layer_added, pooler_starts_afresh
from leantrain.planner.search import DEFAULT_OPTIMIZERS, Plan, PlanRequest, make_plan

#: --auto plans within this share of the budget: the memory model counts tensors, not the allocator's
#: fragmentation or the libraries' own buffers
AUTO_BUDGET_SHARE = 0.9


def default_budget(device: str) -> tuple[int, str]:
    """(bytes, where from) when --memory is not given: the GPU's memory, or what this machine has available."""
    if device == "cuda":
        import torch

        total = torch.cuda.get_device_properties(0).total_memory
        budget = int(total * 0.9)  # CUDA's context and the allocator's cache live outside what is counted
        return budget, f"90% of the GPU's memory ({format_bytes(total)})"
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                n = int(line.split()[1]) * 1024
                return n, f"the memory available now ({format_bytes(n)}, /proc/meminfo)"
    except OSError:
        pass
    raise LeantrainError("--auto: cannot tell how much memory this machine has; give --memory (e.g. --memory 8GiB)")


def available_optimizers() -> tuple[str, ...]:
    """The optimizers the planner may choose here: adamw8bit only where bitsandbytes is installed."""
    have_bnb = importlib.util.find_spec("bitsandbytes") is not None
    return tuple(o for o in DEFAULT_OPTIMIZERS if o != "adamw8bit" or have_bnb)


def request_for(cfg: TrainConfig, device: str, num_processes: int) -> tuple[PlanRequest, str]:
    """The planner's request for this run, and a note on where its budget comes from."""
    if cfg.memory_bytes is not None:
        budget, source = cfg.memory_bytes, f"--memory {cfg.memory}"
    else:
        budget, source = default_budget(device)
    request = PlanRequest(
        model=cfg.model,
        budget=budget,
        global_batch=cfg.batch_size_or_default() * cfg.grad_accum * num_processes,
        # an encoder-decoder's sources and targets (`make_plan` drops the targets of any other model)
        seq_len=cfg.max_source_length or cfg.max_length,
        target_len=cfg.max_target_length,
        fuse_head=not cfg.label_smoothing,  # a smoothed loss takes an encoder-decoder's logits (`tasks.seq2seq`)
        device=device,
        num_processes=num_processes,
        # an explicit precision is kept (auto lets the planner choose); so is an optimizer the planner does not
        # choose among (sgd, muon, schedule-free, ...: their results differ, not only their cost)
        precisions=None if cfg.precision == "auto" else (cfg.precision,),
        optimizers=available_optimizers() if optimizers.entry(cfg.optimizer).planned else (cfg.optimizer,),
        lora=LoraSpec.of(cfg),  # LoRA
        pooler_starts_afresh=pooler_starts_afresh(cfg),
        mean_layer=mean_layer_added(cfg),
        freeze=cfg.freeze_or_default(),
        dropout=dropout_of(cfg),
        **reference_of(cfg),
        optimizer_settings={name: getattr(cfg, name) for name in optimizers.SETTINGS},
        flat_parameters=cfg.flat_parameters,
    )
    return request, source


def dropout_of(cfg: TrainConfig) -> float | None:
    """Every dropout's rate as the run trains (None: the model's own): --dropout, the default job's, or 0 for a task
    that turns dropout off (`Task.dropout_off`)."""
    from leantrain import tasks

    if cfg.dropout is None and cfg.task is not None and tasks.task_class(cfg.task).dropout_off:
        return 0.0
    return cfg.dropout_or_default()


def reference_of(cfg: TrainConfig) -> dict[str, Any]:
    """What a preference task's reference adds to each step (`Task.planned_reference`): its forward passes and the
    frozen copy of the weights, for the request."""
    from leantrain import tasks

    if cfg.task is None:
        return {}
    forward, copy = tasks.task_class(cfg.task).planned_reference(cfg)
    return {"reference_forward": forward, "reference_copy": copy}


def fitted_to_data(
    cfg: TrainConfig, request: PlanRequest, data: Any
) -> tuple[PlanRequest, ModelFacts | None, list[str]]:
    """The request fitted to the prepared data (a task's `TaskData`, as the run will train on it): rows no longer
    than its longest training row, and a preset's vocabulary that of the tokenizer the run trained on its text.
    Returns the request, the model facts to plan with (None: read from the model) and notes on what changed."""
    notes = []
    if not cfg.streaming and len(data.train):
        longest = int(max(data.train.lengths))
        # (a preference pair's row holds both its sequences: up to twice --max-length)
        if longest < request.seq_len or getattr(data.train.features, "parts", 1) > 1:
            seq2seq = getattr(data.train.features, "target_lengths", None) is not None
            flag = (
                f"--max-source-length {request.seq_len}"
                if cfg.max_source_length or seq2seq
                else f"--max-length {cfg.max_length}"
            )
            notes.append(f"length {longest}: the longest example of --data ({flag})")
            request = dataclasses.replace(request, seq_len=longest)
        request, said = _fitted_targets(cfg, request, data)
        notes += said
    # a causal LM's logits are computed where the next token counts (not under --compile, whose one graph keeps every
    # position's): planned at the row that counts the most
    counted = None if cfg.streaming or cfg.compile else getattr(getattr(data.train, "features", None), "counted", None)
    if counted is not None and len(data.train):
        most = int(np.max(counted)) / max(request.seq_len - 1, 1)
        if most < 1.0:
            share = math.ceil(most * 64) / 64  # in 64ths: few activation profiles to count
            request = dataclasses.replace(request, counted=share)  # (the plan's own notes say so)
    facts = None
    if data.model_config is not None:  # a preset trained from scratch: its vocabulary is the run's tokenizer's
        from leantrain.planner.memory import model_facts

        facts = model_facts(cfg.model, config=data.model_config, task=cfg.task)
        notes.append(f"vocabulary {facts.vocab:,}: the tokenizer this run trains on --data")
    return request, facts, notes


def _fitted_targets(cfg: TrainConfig, request: PlanRequest, data: Any) -> tuple[PlanRequest, list[str]]:
    """An encoder-decoder's targets planned no longer than the longest of its training pairs' (its sources are its
    rows' `lengths`)."""
    targets = getattr(data.train.features, "target_lengths", None)
    if targets is None or not len(targets):
        return request, []
    longest = int(max(targets))
    if longest >= request.target_len:
        return request, []
    note = f"targets {longest}: the longest target of --data (--max-target-length {cfg.max_target_length})"
    return dataclasses.replace(request, target_len=longest), [note]


def precompute_note(cfg: TrainConfig, plan: Plan, data: Any) -> list[str]:
    """--precompute-reference: what the one-off pass over the training rows costs, at the recommendation's speed."""
    if not getattr(cfg, "precompute_reference", False) or plan.recommended is None or data is None:
        return []
    request = plan.request  # a row's forward is a third of its share of a step's work
    seconds = len(data.train) / request.num_processes * plan.recommended.step_seconds / request.per_process_batch / 3
    return [
        f"--precompute-reference: one forward pass over the {len(data.train):,} training rows before training, "
        f"about {seconds:,.1f} s at the recommendation's speed (none in the steps, and no reference in memory)"
    ]


def plan_run(cfg: TrainConfig, data: Any = None) -> tuple[TrainConfig, Plan]:
    """The config the planner recommends for `cfg` (same global batch), and the plan; refuses when nothing fits.
    `data`: the run's prepared data (its `TaskData`), which sizes the rows and a preset's vocabulary.

    Every process computes the same plan (it is a pure function of the config, the data and the device kind), so
    they agree without talking. During the run (api.train) the CPU allocator hands freed tensors back at once
    (telemetry.memory.freed_memory_returned), which is what the memory model and the budget assume.
    """
    from leantrain.parallel import device_type, rank_info

    device = device_type()
    _, world = rank_info()
    request, source = request_for(cfg, device, world)
    facts, notes = None, list[str]()
    if data is not None:
        request, facts, notes = fitted_to_data(cfg, request, data)
    # --auto changes cost, not results: the optimizer is replaced only when the user allows it, and the plan
    # keeps a margin below the budget
    budget = int(request.budget * AUTO_BUDGET_SHARE)
    source += f", planned within {AUTO_BUDGET_SHARE:.0%} of it ({format_bytes(budget)})"
    candidates = request.optimizers if cfg.auto_optimizer else (cfg.optimizer,)
    request = dataclasses.replace(request, budget=budget, optimizers=candidates)
    plan = make_plan(request, facts=facts)
    plan.notes[:0] = [f"budget: {source}", *notes]
    plan.notes += precompute_note(cfg, plan, data)
    if plan.recommended is None:
        raise LeantrainError("--auto: " + plan.no_fit_message())
    return cfg.replace(**plan.recommended.overrides()), plan
