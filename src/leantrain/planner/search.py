"""Enumerate configurations, predict each one's memory and speed, mark those that fit, recommend, explain.

A candidate is precision x activation checkpointing x optimizer x micro-batch, with accumulation set so
that micro-batch x accumulation x processes is the global batch the user asked for: every candidate
trains on the same examples in the same optimizer steps, so the choice changes speed and memory only.
The recommendation is the fastest candidate that fits (measured figures, where `--probe` ran it, win
over predicted ones); ties go to the one that needs less memory.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from leantrain.config.units import format_bytes
from leantrain.errors import ConfigError
from leantrain.model.optimizers import OPTIMIZERS
from leantrain.planner.memory import LoraSpec, MemoryEstimate, ModelFacts, estimate, trainable_inventory
from leantrain.planner.speed import DeviceSpeed, optimizer_step_seconds, step_seconds
from leantrain.telemetry.console import counted

#: the optimizers `--auto-optimizer` may choose among: the registry's planned ones
DEFAULT_OPTIMIZERS = tuple(n for n, e in OPTIMIZERS.items() if e.planned)


@dataclass(frozen=True)
class PlanRequest:
    """What the user asks the planner."""

    #: model folder or hub name (None: the embedded MiniLM)
    model: str | None
    #: bytes the run may use (training memory: weights, gradients, optimizer state, activations, workspace)
    budget: int
    #: examples per optimizer step across processes: held fixed, only its split changes
    global_batch: int
    #: tokens per sequence to plan for (the longest batch is padded to it); an encoder-decoder's sources'
    seq_len: int
    #: "cpu" or "cuda"
    device: str = "cpu"
    #: processes sharing the global batch (each holds a whole replica: the budget is per process)
    num_processes: int = 1
    #: precisions to consider; None: those this device supports
    precisions: tuple[str, ...] | None = None
    #: optimizers to consider
    optimizers: tuple[str, ...] = DEFAULT_OPTIMIZERS
    #: activation checkpointing settings to consider
    checkpointing: tuple[bool, ...] = (False, True)
    #: labels of the classification head
    num_labels: int = 2
    #: LoRA: every candidate trains adapters (and the head) over a frozen, maybe quantized, base
    lora: LoraSpec | None = None
    #: a BERT pooler the run starts as the identity (--pooler): with --lora it trains whole, as the head (LoRA's notes)
    pooler_starts_afresh: bool = False
    #: a text classifier's last encoder layer added to average the tokens (--pooler mean): one layer more to count
    mean_layer: bool = False
    #: --freeze: the names whose parameters keep no gradient or optimizer state (None or "none": nothing)
    freeze: str | None = None
    #: --dropout: every dropout's rate (None: the model's own); a dropout keeps its mask for the backward
    dropout: float | None = None
    #: a causal LM's largest share of a row's positions whose next token counts (instruction tuning counts
    #: completions only): the run computes logits there only, so their memory and FLOPs scale with it
    counted: float = 1.0
    #: forward passes without gradients each step beyond training's own, in training's tokens: a preference task's
    #: live reference (1: every sequence once more), 0 when its log-probabilities are precomputed
    reference_forward: float = 0.0
    #: a frozen copy of the weights beside the policy, in the run's precision (a preference task's reference)
    reference_copy: bool = False
    #: the run's per-optimizer settings (`model.optimizers.SETTINGS`' names: a projection rank sizes GaLore's state)
    optimizer_settings: dict[str, Any] = field(default_factory=dict)
    #: the run's --flat-parameters: with an optimizer that takes them (AdamW, SGD) the gradients stay allocated
    flat_parameters: bool = True
    #: an encoder-decoder's target tokens (--max-target-length; 0: as many as its sources'); other models have none
    target_len: int = 0
    #: whether an encoder-decoder's run fuses its output head with the loss where the model allows: not with
    #: --label-smoothing, whose loss takes the logits (`tasks.seq2seq.Seq2Seq.check_model`)
    fuse_head: bool = True

    @property
    def settings(self) -> Any:
        """The optimizer settings as the registry reads them (attributes)."""
        from types import SimpleNamespace

        return SimpleNamespace(**self.optimizer_settings)

    @property
    def per_process_batch(self) -> int:
        return self.global_batch // self.num_processes


@dataclass
class Candidate:
    """One configuration with its predicted (and, once probed, measured) memory and speed."""

    precision: str
    activation_checkpointing: bool
    optimizer: str
    micro_batch: int
    grad_accum: int
    memory: MemoryEstimate
    #: predicted seconds per optimizer step
    step_seconds: float
    #: predicted throughput relative to the fp32 / no checkpointing / AdamW / one-micro-batch baseline
    relative_throughput: float = 0.0
    #: predicted peak <= budget
    fits: bool = False
    #: filled by the probe: measured peak bytes, samples/s, throughput relative to the fastest probed
    measured: dict[str, Any] | None = None
    #: why it is not the recommendation (empty for the recommendation)
    why_not: str = ""
    #: LoRA's label ("lora r=8", "lora r=8 4bit"), empty for full fine-tuning
    lora: str = ""

    @property
    def name(self) -> str:
        parts = [self.precision, "ckpt" if self.activation_checkpointing else "no-ckpt", self.optimizer]
        parts += [self.lora.replace(" ", "-")] if self.lora else []
        return f"{'/'.join(parts)} {self.micro_batch}x{self.grad_accum}"

    @property
    def techniques(self) -> tuple[str, bool, str]:
        return (self.precision, self.activation_checkpointing, self.optimizer)

    @property
    def peak(self) -> int:
        """The measured peak where probed, else the predicted one."""
        if self.measured and self.measured.get("peak_bytes") is not None:
            return int(self.measured["peak_bytes"])
        return self.memory.peak

    def overrides(self) -> dict[str, Any]:
        """The TrainConfig values this candidate sets."""
        return {
            "precision": self.precision,
            "activation_checkpointing": self.activation_checkpointing,
            "optimizer": self.optimizer,
            "batch_size": self.micro_batch,
            "grad_accum": self.grad_accum,
        }

    def to_dict(self) -> dict[str, Any]:
        out = {k: v for k, v in asdict(self).items() if k != "memory"}
        return {"name": self.name, **out, "memory": self.memory.to_dict()}


@dataclass
class Plan:
    request: PlanRequest
    facts: dict[str, Any]
    candidates: list[Candidate]
    recommended: Candidate | None
    notes: list[str] = field(default_factory=list)
    probed: bool = False

    @property
    def smallest(self) -> Candidate:
        return min(self.candidates, key=lambda c: (c.peak, -c.relative_throughput))  # the fastest of the least

    def no_fit_message(self) -> str:
        s, r = self.smallest, self.request
        lengths = f"--max-length ({r.seq_len})"
        if r.target_len:
            lengths = f"--max-source-length ({r.seq_len}), --max-target-length ({r.target_len})"
        return (
            f"nothing fits in {format_bytes(self.request.budget)}: the smallest configuration ({s.name}: "
            f"{s.precision}, {'with' if s.activation_checkpointing else 'without'} activation checkpointing, "
            f"{s.optimizer}, micro-batch {s.micro_batch} x {s.grad_accum} accumulation) needs "
            f"{format_bytes(s.peak)}; give --memory {_round_up_mib(s.peak)}MiB or more, or lower {lengths} or the "
            "global batch"
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "request": asdict(self.request),
            "facts": self.facts,
            "probed": self.probed,
            "recommended": self.recommended.to_dict() if self.recommended else None,
            "no_fit": None if self.recommended else self.no_fit_message(),
            "notes": self.notes,
            "candidates": [c.to_dict() for c in self.candidates],
        }

    def write(self, directory: Path) -> dict[str, Path]:
        """plan.json (everything) and plan.md (the table and the reasons) in `directory`."""
        directory.mkdir(parents=True, exist_ok=True)
        paths = {"json": directory / "plan.json", "md": directory / "plan.md"}
        paths["json"].write_text(json.dumps(self.to_dict(), indent=2) + "\n")
        paths["md"].write_text("# leantrain plan\n\n```\n" + self.render(all_rows=True).rstrip() + "\n```\n")
        return paths

    def render(self, all_rows: bool = False) -> str:
        return render(self, all_rows)

    def summary(self) -> str:
        """One line for the run's log: what --auto chose and why it fits."""
        c = self.recommended
        if c is None:
            return self.no_fit_message()
        return (
            f"--auto: {c.name} (precision {c.precision}, activation checkpointing "
            f"{'on' if c.activation_checkpointing else 'off'}, {c.optimizer}, micro-batch {c.micro_batch} x "
            f"{c.grad_accum} accumulation): predicted peak {format_bytes(c.peak)} of "
            f"{format_bytes(self.request.budget)}, {c.relative_throughput:.2f}x fp32/AdamW; the other "
            f"{len(self.candidates) - 1} candidates and why they lose are in plan.md"
        )


def _round_up_mib(n: int) -> int:
    return -(-n // 2**20)


def supported_precisions(device: str) -> tuple[str, ...]:
    """fp32, plus the low precisions worth considering on this device (those that are not slower)."""
    from leantrain.parallel import precision_support

    if device == "cuda":
        import torch

        if not torch.cuda.is_available():
            return ("fp32", "bf16")
    support = precision_support(device)
    return ("fp32", *[p for p in ("bf16", "fp16") if support[p].supported and support[p].fast])


def micro_batches(per_process: int) -> list[int]:
    """Every divisor of the per-process batch: each keeps the global batch exact."""
    return [d for d in range(1, per_process + 1) if per_process % d == 0]


def enumerate_candidates(
    request: PlanRequest, facts: ModelFacts, speed: DeviceSpeed, flops_per_sequence: float
) -> list[Candidate]:
    if request.global_batch % request.num_processes:
        raise ConfigError(f"global batch {request.global_batch} is not divisible by {request.num_processes} processes")
    precisions = request.precisions or supported_precisions(request.device)
    inventory = trainable_inventory(facts, request.lora, request.freeze)
    out = []
    for precision in precisions:
        for ckpt in request.checkpointing:
            for opt in request.optimizers:
                for micro in micro_batches(request.per_process_batch):
                    accum = request.per_process_batch // micro
                    mem = estimate(
                        facts, micro, request.seq_len, precision, ckpt, opt, accum, request.device,
                        lora=request.lora, counted=request.counted, settings=request.settings,
                        flat=request.flat_parameters and OPTIMIZERS[opt].flat, freeze=request.freeze,
                        target_len=request.target_len, fuse_head=request.fuse_head,
                    )  # fmt: skip
                    secs = step_seconds(
                        speed,
                        flops_per_sequence,
                        facts.layers,
                        facts.hidden,
                        inventory.numel,  # the optimizer steps only what trains (LoRA's adapters, what is not frozen)
                        micro,
                        accum,
                        request.seq_len + request.target_len,  # the tokens of a sequence (an encoder-decoder's two)
                        precision,
                        ckpt,
                        opt,
                        inventory.step_flops(opt, request.settings),
                    )
                    if request.reference_copy:  # held whole beside the policy, in the candidate's precision
                        copy = facts.params * (4 if precision == "fp32" else 2)
                        mem = replace(mem, weights=mem.weights + copy, peak=mem.peak + copy)
                    fits = mem.peak <= request.budget
                    label = request.lora.label() if request.lora else ""
                    out.append(Candidate(precision, ckpt, opt, micro, accum, mem, secs, fits=fits, lora=label))
    return out


def choose(plan: Plan) -> None:
    """Rank the candidates, pick the recommendation and say why each other candidate loses (in place)."""
    cands = plan.candidates
    base = next(
        (c for c in cands if c.techniques == ("fp32", False, "adamw") and c.grad_accum == 1),
        None,
    )
    base_secs = base.step_seconds if base else max(c.step_seconds for c in cands)
    for c in cands:
        c.relative_throughput = base_secs / c.step_seconds
        failed = c.measured is not None and not c.measured.get("samples_per_second")
        c.fits = not failed and c.peak <= plan.request.budget

    measured = [c for c in cands if c.measured and c.measured.get("samples_per_second")]
    # measured speeds are relative to the fastest probe, predictions to fp32/AdamW: the probes put the predictions on
    # their scale (the median of measured over predicted), so that a probed and an unprobed candidate compare
    scale = (
        statistics.median((c.measured or {})["relative_throughput"] / c.relative_throughput for c in measured)
        if measured
        else 1.0
    )

    def speed(c: Candidate) -> float:
        if c.measured and c.measured.get("samples_per_second"):
            return float(c.measured["relative_throughput"])
        return c.relative_throughput * scale

    fitting = [c for c in (measured or cands) if c.fits]
    if measured and not fitting:  # none of the probed fits: fall back to the predictions for the rest
        fitting = [c for c in cands if c.fits and not c.measured]
    plan.recommended = max(fitting, key=lambda c: (speed(c), -c.peak)) if fitting else None
    cands.sort(key=lambda c: (-c.fits, -speed(c), c.peak))
    for c in cands:
        c.why_not = "" if c is plan.recommended else _why_not(c, plan.recommended, plan.request.budget, speed)


def _why_not(c: Candidate, best: Candidate | None, budget: int, speed) -> str:
    if c.measured is not None and not c.measured.get("samples_per_second"):
        return f"probe failed: {c.measured.get('error') or 'no throughput measured'}"
    if not c.fits:
        over = c.peak - budget
        src = "measured" if c.measured and c.measured.get("peak_bytes") is not None else "predicted"
        return f"does not fit: needs {format_bytes(c.peak)} ({src}), {format_bytes(over)} over the budget"
    if best is None:
        return ""
    ratio = speed(c) / speed(best) if speed(best) else 0.0
    causes = []
    if c.precision != best.precision:
        causes.append(f"{c.precision} instead of {best.precision}")
    if c.activation_checkpointing and not best.activation_checkpointing:
        causes.append("checkpointing recomputes the forward")
    elif best.activation_checkpointing and not c.activation_checkpointing:
        causes.append("no checkpointing")
    if c.optimizer != best.optimizer:
        causes.append(f"{c.optimizer} step instead of {best.optimizer}")
    if c.micro_batch != best.micro_batch:
        causes.append(f"micro-batch {c.micro_batch} x {c.grad_accum} instead of {best.micro_batch} x {best.grad_accum}")
    kind = "measured" if c.measured and best.measured else "predicted"
    if ratio >= 1:  # only probed candidates are recommended once there are probes
        why = ", ".join(causes) or "same techniques"
        return (
            f"not probed: predicted {ratio:.2f}x the recommendation's measured speed ({why}); --probe-top measures more"
        )
    return f"slower: {ratio:.2f}x the recommendation ({kind}; {', '.join(causes) or 'same techniques'})"


def representatives(plan: Plan) -> list[Candidate]:
    """One row per technique combination: its fastest fitting micro-batch, or (nothing fits) its smallest need."""
    rows: dict[tuple, Candidate] = {}
    for c in plan.candidates:  # sorted: fitting first, fastest first
        key = c.techniques
        if key not in rows or (not rows[key].fits and not c.fits and c.peak < rows[key].peak):
            rows[key] = c
    picked = list(rows.values())
    if plan.recommended is not None and plan.recommended not in picked:
        picked.insert(0, plan.recommended)
    return picked


def render(plan: Plan, all_rows: bool = False) -> str:
    """The table: each candidate's predicted memory by part, its peak, throughput, fit, and why it loses."""
    r = plan.request
    mib = 2**20
    rows = plan.candidates if all_rows else representatives(plan)
    width = max([33, *(len(c.name) + 1 for c in rows)])  # LoRA's labels make names longer
    head = (
        f"{'':3}{'configuration':{width}}{'weights':>8}{'grads':>7}{'optim':>7}{'activ':>7}{'work':>6}"
        f"{'peak':>8}{'speed':>7}{'measured':>18}  verdict"
    )
    lines = [
        f"plan for {plan.facts['model']} ({plan.facts['params'] / 1e6:.1f} M parameters) on {r.device}: "
        f"global batch {r.global_batch} ({counted(r.num_processes, 'process', 'processes')}), "
        + (f"sources {r.seq_len} and targets {r.target_len} tokens" if r.target_len else f"length {r.seq_len}")
        + f", budget {format_bytes(r.budget)}",
        "memory in MiB: predicted peak = weights + optimizer state + the larger of backward [activations + "
        "workspace] and the optimizer step [gradients + workspace]; work includes the one-off runtime share; "
        "speed relative to fp32/AdamW in one micro-batch",
        head,
    ]
    for c in rows:
        m = c.memory
        meas = ""
        if c.measured:
            mp = c.measured.get("peak_bytes")
            sps = c.measured.get("samples_per_second")
            meas = f"{mp / mib:.0f}MiB " if mp is not None else "- "
            meas += f"{sps:.1f}/s" if sps else "failed"
        mark = "=>" if c is plan.recommended else ("ok" if c.fits else "--")
        verdict = "recommended" if c is plan.recommended else c.why_not
        lines.append(
            f"{mark:2} {c.name:{width}}{m.weights / mib:8.0f}{m.gradients / mib:7.0f}{m.optimizer_state / mib:7.0f}"
            f"{m.activations / mib:7.0f}{m.workspace / mib:6.0f}{m.peak / mib:8.0f}{c.relative_throughput:6.2f}x"
            f"{meas:>18}  {verdict}"
        )
    if not all_rows and len(rows) < len(plan.candidates):
        lines.append(
            f"({len(plan.candidates)} candidates in all; one row per technique combination: its fastest fitting "
            "micro-batch; --all lists every one)"
        )
    if plan.recommended is not None:
        c = plan.recommended
        lines.append(
            f"recommended: {c.name}: --precision {c.precision} "
            f"{'--activation-checkpointing' if c.activation_checkpointing else '--no-activation-checkpointing'} "
            f"--optimizer {c.optimizer} --batch-size {c.micro_batch} --grad-accum {c.grad_accum} "
            f"({'measured' if c.measured else 'predicted'} peak {format_bytes(c.peak)} of {format_bytes(r.budget)}; "
            f"predicted speed {c.relative_throughput:.2f}x fp32/AdamW"
            + (f", measured {c.measured['samples_per_second']:.1f} samples/s" if c.measured else "")
            + ")"
        )
    else:
        lines.append(plan.no_fit_message())
    lines += [f"note: {n}" for n in plan.notes]
    return "\n".join(lines) + "\n"


def make_plan(request: PlanRequest, speed: DeviceSpeed | None = None, facts: ModelFacts | None = None) -> Plan:
    """Predict every candidate of `request`, recommend the fastest that fits."""
    from leantrain.planner.memory import model_facts
    from leantrain.planner.speed import device_speed

    if request.global_batch <= 0 or request.seq_len <= 0:
        raise ConfigError("the global batch and the sequence length must be positive")
    facts = facts or model_facts(request.model, request.num_labels)
    if request.mean_layer:
        from leantrain.planner.memory import with_mean_layer

        facts = with_mean_layer(facts)
    if request.dropout is not None:  # the proxies count what the run's dropouts save
        from leantrain.planner.memory import with_dropout

        facts = with_dropout(facts, request.dropout)
    # an encoder-decoder's targets: as long as its sources unless said; other models have none
    request = replace(request, target_len=(request.target_len or request.seq_len) if facts.kind == "seq2seq" else 0)
    speed = speed or device_speed(request.device)
    per_seq = flops_per_sequence(request, facts)
    plan = Plan(
        request=request,
        facts={
            "model": facts.name,
            "model_type": facts.model_type,
            "params": facts.params,
            "layers": facts.layers,
            "hidden": facts.hidden,
            "intermediate": facts.intermediate,
            "heads": facts.heads,
            "flops_per_sequence": per_seq,
        },
        candidates=enumerate_candidates(request, facts, speed, per_seq),
        recommended=None,
        notes=_plan_notes(request, facts, speed),
    )
    choose(plan)
    if request.lora is None:
        plan.notes += lora_notes(request, facts)
    plan.notes.append(optimizer_note(request, facts, speed))
    return plan


def flops_per_sequence(request: PlanRequest, facts: ModelFacts) -> float:
    """FLOPs of one training sequence (an encoder-decoder's source and target), as the run's telemetry counts them."""
    from leantrain.model import freezing
    from leantrain.planner.memory import _build, _config_from_json, trained_net
    from leantrain.telemetry.flops import counted_flop_model, encoder_flop_model, flop_model, is_encoder_config

    config = _config_from_json(facts.config_json)
    meta = None
    if request.lora is not None or freezing.patterns(request.freeze):  # as the run's telemetry counts it: frozen
        meta = trained_net(facts.config_json, request.lora, request.freeze)  # weights get no weight gradient
        flop = flop_model(meta)
    elif is_encoder_config(config):
        head = "token" if facts.kind == "token-classifier" else "sequence"
        flop = encoder_flop_model(config, request.num_labels, head=head)
    else:  # counted as the run's telemetry counts it: the matmuls of a meta-device copy, attention's s^2 included;
        meta = _build(config, "meta")  # an encoder-decoder's in its source and target lengths (`pair_flop_model`)
        flop = flop_model(meta) if facts.kind == "seq2seq" else counted_flop_model(meta)
    per_seq = flop.batch_flops(1, request.seq_len) + flop.target_flops(request.seq_len, request.target_len)
    if facts.kind == "causal-lm" and request.counted < 1.0 and meta is not None:  # the head only where a token counts
        from leantrain.planner.memory import counted_positions
        from leantrain.telemetry.flops import row_flops

        uncounted = request.seq_len - counted_positions(request.seq_len, request.counted)
        per_seq -= uncounted * row_flops(meta.get_output_embeddings().parameters())
    return per_seq * (1 + request.reference_forward / 3)  # a forward without backward: a third of training's FLOPs


def _plan_notes(request: PlanRequest, facts: ModelFacts, speed: DeviceSpeed) -> list[str]:
    """What the plan's figures rest on: the speed model, the proxies, per-process memory, a reference, the LM head."""
    notes = [
        f"speed model: {speed.source}",
        "activations counted on 1- and 2-layer proxies of the model; workspace calibrated on CPU "
        "(benchmarks/results/planner_accuracy.md)",
    ]
    if request.num_processes > 1:
        notes.append("memory is per process: each holds a whole replica (no sharding)")
    trained = trainable_inventory(facts, None, request.freeze).numel
    if request.lora is None and trained < facts.params:
        notes.append(
            f"--freeze {request.freeze}: {(facts.params - trained) / 1e6:.1f} M of {facts.params / 1e6:.1f} M "
            "parameters keep no gradient or optimizer state; their activations are counted as if they trained "
            "(an overestimate)"
        )
    if request.reference_forward:
        notes.append(
            f"reference model: {request.reference_forward:g} more forward pass(es) a step without gradients "
            f"(+{request.reference_forward / 3:.0%} of the step's FLOPs)"
            + ("; a frozen copy of the weights in each candidate's precision" if request.reference_copy else "")
        )
    if facts.kind == "seq2seq":
        notes.append(
            f"sequence-to-sequence: sources of {request.seq_len} tokens through the encoder, targets of "
            f"{request.target_len} through the decoder, logits over a vocabulary of {facts.vocab:,} at target tokens"
            + ("" if request.fuse_head else " (kept whole: --label-smoothing's loss takes them)")
        )
    if facts.kind == "causal-lm":
        notes.append(f"causal LM: rows of {request.seq_len} tokens, logits over a vocabulary of {facts.vocab:,}")
        if request.counted < 1.0:
            notes.append(f"logits at {request.counted:.0%} of a row's positions at most: those whose next token counts")
    return notes


def optimizer_note(request: PlanRequest, facts: ModelFacts, speed: DeviceSpeed) -> str:
    """Every registered optimizer's state for this model (with the run's settings, e.g. a projection rank) and its
    predicted step, beside AdamW's: what --optimizer would change (the candidates keep the planned ones)."""
    inv = trainable_inventory(facts, request.lora, request.freeze)
    adamw = inv.state_bytes("adamw")
    parts = []
    for name, entry in OPTIMIZERS.items():
        if request.lora is not None and entry.no_lora:  # what train refuses with --lora is not priced
            parts.append(f"{name} refused with --lora")
            continue
        state = inv.state_bytes(name, request.settings)
        step_ms = 1e3 * optimizer_step_seconds(speed, name, inv.numel, inv.step_flops(name, request.settings))
        parts.append(f"{name} {format_bytes(state)} ({state / max(adamw, 1):.2f}x), step ~{step_ms:.0f} ms")
    return "optimizer state and step for this model (--optimizer NAME; see `leantrain train --help`): " + "; ".join(
        parts
    )


def lora_notes(request: PlanRequest, facts: ModelFacts) -> list[str]:
    """LoRA beside the other techniques: it changes what trains, so the planner never picks it; the
    notes say what it would need at the baseline's configuration (fp32, AdamW, the whole per-process batch)."""
    import importlib.util

    pooler = request.pooler_starts_afresh
    specs = [LoraSpec(pooler_whole=pooler)]
    if importlib.util.find_spec("bitsandbytes") is not None:
        specs += [LoraSpec(quantize="4bit", pooler_whole=pooler), LoraSpec(quantize="8bit", pooler_whole=pooler)]
    micro = request.per_process_batch

    def baseline(spec: LoraSpec | None) -> MemoryEstimate:
        return estimate(
            facts, micro, request.seq_len, "fp32", False, "adamw", 1, request.device, lora=spec,
            counted=request.counted, target_len=request.target_len, fuse_head=request.fuse_head,
        )  # fmt: skip

    full = baseline(None)
    parts = []
    for spec in specs:
        m = baseline(spec)
        parts.append(
            f"{spec.label()}: peak {format_bytes(m.peak)} ({m.peak / full.peak:.2f}x), weights "
            f"{format_bytes(m.weights)}, optimizer state {format_bytes(m.optimizer_state)}"
        )
    return [
        f"LoRA (--lora; every Linear layer; it changes what trains, so --auto never picks it), at fp32/no-ckpt/"
        f"adamw {micro}x1 against full fine-tuning's {format_bytes(full.peak)}: " + "; ".join(parts)
    ]
