"""Optimizers: one registry entry each (its builder, what its state costs, how fast it steps, the names the HF
Trainer knows it by, what it refuses), parameter groups, and the bytes an optimizer's state holds.

The registry is the one table the rest reads: the config's `--optimizer` choices and checks, the planner's memory and
speed models, `leantrain bench`, checkpoint sizing, the TrainingArguments `optim=` names and the trainer's switch
to averaged weights around evaluations and saves. A new optimizer is one `register(OptimizerEntry(...))` plus its
builder; nothing else changes (tests/test_optimizer_registry.py registers one from a test file). torch is imported
inside the builders, so reading the table (`--help`, the config's checks) costs nothing.

Some optimizers treat the *hidden matrices* apart: the 2-D weights inside the model's repeated blocks (attention
and feed-forward projections), never the embeddings, the head, norms or biases. Muon orthogonalises their updates,
GaLore and APOLLO project their gradients to a low rank (with --projection-embeddings the input embedding matrix's
too); everything else steps with AdamW inside the same optimizer. `hidden_matrices` picks them by the model's
structure and `treated_apart` adds what the settings add, the same way for the builders and the planner.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from leantrain.errors import ConfigError

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class OptimizerEntry:
    """One optimizer leantrain can train with."""

    #: the `--optimizer` name
    name: str
    #: builds it: (model, its parameter groups with weight decay set per group, the learning rate, the run's
    #: settings: any object with the config's optimization fields, or None for the defaults) -> the optimizer
    build: Callable[[Any, list[dict], float, Any], Any]
    #: bytes of state it keeps for one parameter tensor of this shape once it has stepped (its state is lazy)
    state_bytes: Callable[[tuple[int, ...]], int]
    #: one line for `--help`, `plan` and `bench`: what it is and when to use it
    summary: str
    #: bytes of state for a hidden matrix of this shape, for optimizers that treat them apart: (shape, settings)
    hidden_state_bytes: Callable[[tuple[int, ...], Any], int] | None = None
    #: state shared by every parameter (bitsandbytes' quantisation maps), counted once
    shared_state_bytes: int = 0
    #: the step's temporaries, in fp32 copies of the largest parameter tensor (the planner's optimizer workspace)
    temporaries: float = 0.0
    #: and in fp32 copies of the largest hidden matrix (Muon's orthogonalisation, GaLore's SVD at a refresh)
    hidden_temporaries: float = 0.0
    #: and in fp32 copies of all the trainable parameters (a batched step's whole-list intermediate)
    all_temporaries: float = 0.0
    #: seconds a step takes per parameter on a CPU core pair and on a GPU (the planner's speed model)
    cpu_seconds_per_param: float = 0.0
    gpu_seconds_per_param: float = 0.0
    #: and the bf16 matmul FLOPs its step spends on a hidden matrix of this shape (Muon's orthogonalisation, which
    #: grows with a matrix's width, not its size: the planner times it at the device's bf16 matmul speed)
    hidden_flops: Callable[[tuple[int, ...]], float] | None = None
    #: TrainingArguments `optim=` values that mean this optimizer
    hf_names: tuple[str, ...] = ()
    #: whether `--auto --auto-optimizer` may pick it (it changes results, so only the usual memory-savers)
    planned: bool = False
    #: what its `state_dict()` holds, which an exact resume restores (documentation and tests read it)
    resume_state: str = ""
    # -- what it refuses (checked in one place: `check`)
    #: what it does to the hidden matrices, for those that treat them apart (they are refused on a model with none)
    hidden_rule: str = ""
    #: the settings field that holds its projection rank (refused above a hidden matrix's smaller side)
    rank_setting: str | None = None
    #: the per-optimizer settings (`SETTINGS` names) it reads: given to a run of another optimizer they are refused
    settings: tuple[str, ...] = ()
    #: the only --scheduler values it takes (None: any), and why
    schedulers: tuple[str, ...] | None = None
    schedulers_why: str = ""
    #: why it cannot run under --shard fsdp ("" : it can)
    no_fsdp: str = ""
    #: why it cannot train LoRA adapters ("": it can)
    no_lora: str = ""
    #: switches the model between the weights it evaluates and saves ("eval") and those it trains ("train"):
    #: schedule-free's average and its gradient point. None: they are the same weights
    switch_weights: Callable[[Any, str], None] | None = None
    #: it updates each number from that number's gradient and state alone, so a group's parameters may be stepped
    #: as one flat tensor (`model.flat`: one kernel call a step instead of one a tensor)
    flat: bool = False


#: name -> entry, in registration order (the order of `--help` and `bench`)
OPTIMIZERS: dict[str, OptimizerEntry] = {}


def register(entry: OptimizerEntry) -> OptimizerEntry:
    """Add an optimizer (or replace the one of the same name); returns it."""
    OPTIMIZERS[entry.name] = entry
    return entry


def names() -> tuple[str, ...]:
    return tuple(OPTIMIZERS)


def entry(name: str) -> OptimizerEntry:
    """The registered optimizer `name`, refused in one line when unknown."""
    try:
        return OPTIMIZERS[name]
    except KeyError:
        raise ConfigError(f"--optimizer {name!r} is unknown; choose one of: {', '.join(OPTIMIZERS)}") from None


# -- settings ----------------------------------------------------------------------------------------------------

#: per-optimizer settings and their defaults: each is a field of the config's optimization section (same name,
#: `--muon-lr` etc.), which a builder reads from the run's settings through `setting`
SETTINGS: dict[str, Any] = {
    "muon_lr": None,  # None: --lr (the update-size rule makes AdamW's learning rate a sensible start)
    "muon_momentum": 0.95,
    "muon_lr_rule": "match_rms_adamw",
    "projection_rank": 128,
    "projection_update_interval": 200,
    "projection_scale": None,  # None: the optimizer's own (GaLore 0.25, APOLLO 1.0)
    "projection_embeddings": False,  # the papers' rule: the embeddings keep AdamW's state
}
MUON_LR_RULES = ("match_rms_adamw", "original")


def setting(settings: Any, name: str) -> Any:
    """A per-optimizer setting of the run (`settings`: the config or any object with its fields), else its default."""
    value = getattr(settings, name, None) if settings is not None else None
    return SETTINGS[name] if value is None else value


def unread_settings(values: dict[str, Any], names: tuple[str, ...]) -> dict[str, tuple[str, ...]]:
    """The per-optimizer settings `values` gives (other than their defaults) that none of the optimizers `names`
    reads, each with the optimizers that do: without one of those they would be silently ignored."""
    return {
        name: tuple(n for n, e in OPTIMIZERS.items() if name in e.settings)
        for name, default in SETTINGS.items()
        if values.get(name, default) != default and not any(name in entry(n).settings for n in names)
    }


# -- parameters --------------------------------------------------------------------------------------------------


def parameter_groups(model: torch.nn.Module, weight_decay: float) -> list[dict]:
    """Decay matrices; never biases, norms (LayerNorm/RMSNorm weights) or other 1-D parameters."""
    import torch

    norm_types = (torch.nn.LayerNorm, torch.nn.GroupNorm, torch.nn.BatchNorm1d)
    no_decay_ids = set()
    for module in model.modules():
        is_norm = isinstance(module, norm_types) or "norm" in type(module).__name__.lower()
        for name, p in module.named_parameters(recurse=False):
            if is_norm or name.endswith("bias") or p.ndim < 2:
                no_decay_ids.add(id(p))
    decay: list[torch.nn.Parameter] = []
    no_decay: list[torch.nn.Parameter] = []
    for p in model.parameters():
        if p.requires_grad:
            (no_decay if id(p) in no_decay_ids else decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def block_lists(model: torch.nn.Module) -> list[tuple[str, torch.nn.ModuleList]]:
    """The model's repeated blocks: each outermost ModuleList whose modules are all of one class and hold
    parameters (BERT's `encoder.layer`, Llama's `model.layers`, an encoder-decoder's two stacks)."""
    import torch

    found: list[tuple[str, torch.nn.ModuleList]] = []
    for name, module in model.named_modules():
        if not isinstance(module, torch.nn.ModuleList) or not len(module):
            continue
        if any(name.startswith(outer + ".") for outer, _ in found):
            continue  # inside a stack already found
        kinds = {type(m) for m in module}
        if len(kinds) == 1 and any(True for _ in module.parameters()):
            found.append((name, module))
    return found


def hidden_matrices(model: torch.nn.Module) -> dict[int, str]:
    """The trainable 2-D weights inside the model's repeated blocks, by id: their names. Never the input or output
    embeddings (tied or not), nor anything outside the blocks (the head, a pooler, norms, biases)."""
    embeddings = set()
    for getter in ("get_input_embeddings", "get_output_embeddings"):
        module = getattr(model, getter, lambda: None)()
        if module is not None and getattr(module, "weight", None) is not None:
            embeddings.add(id(module.weight))
    out: dict[int, str] = {}
    for prefix, blocks in block_lists(model):
        for name, p in blocks.named_parameters():
            if p.ndim == 2 and p.requires_grad and id(p) not in embeddings:
                out[id(p)] = f"{prefix}.{name}" if prefix else name
    return out


def input_embedding(model: torch.nn.Module) -> dict[int, str]:
    """The input embedding matrix, by id: its name (empty when the model has none trainable)."""
    module = getattr(model, "get_input_embeddings", lambda: None)()
    weight = getattr(module, "weight", None) if module is not None else None
    if weight is None or weight.ndim != 2 or not weight.requires_grad:
        return {}
    names = {id(p): n for n, p in model.named_parameters()}
    return {id(weight): names.get(id(weight), "input embeddings")}


def projects_embeddings(name: str, settings: Any = None) -> bool:
    """Whether the optimizer `name` projects the input embedding matrix too (GaLore and APOLLO with
    --projection-embeddings: a small encoder's largest tensor, MiniLM's half its weights)."""
    return entry(name).rank_setting is not None and bool(setting(settings, "projection_embeddings"))


def treated_apart(model: torch.nn.Module, name: str, settings: Any = None) -> dict[int, str]:
    """The parameters the optimizer `name` gives its own rule, by id: the hidden matrices, and the input embedding
    matrix where it `projects_embeddings` (the rest step with AdamW)."""
    apart = hidden_matrices(model)
    if projects_embeddings(name, settings):
        apart.update(input_embedding(model))
    return apart


def split_hidden(groups: list[dict], hidden: dict[int, str]) -> tuple[list[dict], list[dict]]:
    """(the groups of the hidden matrices, the groups of the rest), each keeping its weight decay; empty ones
    dropped."""
    inside = [{**g, "params": [p for p in g["params"] if id(p) in hidden]} for g in groups]
    outside = [{**g, "params": [p for p in g["params"] if id(p) not in hidden]} for g in groups]
    return [g for g in inside if g["params"]], [g for g in outside if g["params"]]


def describe_split(model: torch.nn.Module, name: str, settings: Any = None) -> str:
    """One line for the run's start: which parameters an optimizer that treats hidden matrices apart gives its own
    rule, and which step with AdamW ("" for the others)."""
    chosen = entry(name)
    if not chosen.hidden_rule:
        return ""
    hidden = hidden_matrices(model)
    apart = treated_apart(model, name, settings)
    embedding = [n for i, n in apart.items() if i not in hidden]
    trainable = [p for p in model.parameters() if p.requires_grad]
    inside = sum(p.numel() for p in trainable if id(p) in apart)
    rest = [p for p in trainable if id(p) not in apart]
    stacks = ", ".join(f"{n or 'the model'} ({len(b)} blocks)" for n, b in block_lists(model))
    also = f" and the input embeddings {embedding[0]}" if embedding else ""
    others = "other embeddings, head, norms, biases" if embedding else "embeddings, head, norms, biases"
    return (
        f"{name}: {chosen.hidden_rule} on {len(hidden)} hidden matrices in {stacks}{also} ({inside / 1e6:.2f} M "
        f"parameters); AdamW on the other {len(rest)} tensors ({others}: {sum(p.numel() for p in rest) / 1e6:.2f} M)"
    )


# -- refusals ----------------------------------------------------------------------------------------------------


def check(name: str, settings: Any, model: torch.nn.Module | None = None) -> None:
    """Everything the optimizer `name` refuses, in one line each: a scheduler it cannot take, --shard fsdp,
    --lora; with the model, no hidden matrices and a projection rank larger than a matrix."""
    chosen = entry(name)
    scheduler = getattr(settings, "scheduler", None)
    if chosen.schedulers is not None and scheduler is not None and scheduler not in chosen.schedulers:
        raise ConfigError(
            f"--optimizer {name} with --scheduler {scheduler}: {chosen.schedulers_why}; use --scheduler "
            f"{' or '.join(chosen.schedulers)}"
        )
    if chosen.no_fsdp and getattr(settings, "shard", "none") == "fsdp":
        raise ConfigError(f"--optimizer {name} with --shard fsdp: {chosen.no_fsdp}; use --shard none")
    if chosen.no_lora and getattr(settings, "lora", False):
        raise ConfigError(f"--optimizer {name} with --lora: {chosen.no_lora}")
    if getattr(settings, "projection_embeddings", False) and chosen.rank_setting is None:
        projecting = " or ".join(n for n, e in OPTIMIZERS.items() if e.rank_setting is not None)
        raise ConfigError(f"--projection-embeddings is for --optimizer {projecting}; drop it for --optimizer {name}")
    if model is not None:
        _check_model(chosen, settings, model)


def _check_model(chosen: OptimizerEntry, settings: Any, model: torch.nn.Module) -> None:
    if not chosen.hidden_rule:
        return
    hidden = hidden_matrices(model)
    if not hidden:
        raise ConfigError(
            f"--optimizer {chosen.name}: {type(model).__name__} has no trainable 2-D weight matrices inside repeated "
            f"blocks for its rule (the embeddings and the head step with AdamW); use --optimizer adamw"
        )
    if chosen.rank_setting is None:
        return
    rank = setting(settings, chosen.rank_setting)
    flag = "--" + chosen.rank_setting.replace("_", "-")
    if not (isinstance(rank, int) and rank > 0):
        raise ConfigError(f"{flag} must be a positive integer, got {rank!r}")
    apart = treated_apart(model, chosen.name, settings)
    if setting(settings, "projection_embeddings") and len(apart) == len(hidden):
        raise ConfigError(
            f"--projection-embeddings: {type(model).__name__} has no trainable input embedding matrix to project; "
            "drop the flag"
        )
    for p in model.parameters():
        if id(p) in apart and rank > min(p.shape):
            kind = "hidden matrix" if id(p) in hidden else "input embedding matrix"
            raise ConfigError(
                f"{flag} {rank} is larger than the {kind} {apart[id(p)]} ({p.shape[0]} x {p.shape[1]}); "
                f"give at most {min(p.shape)}"
            )


# -- building ----------------------------------------------------------------------------------------------------


def build_optimizer(model: Any, name: str = "adamw", lr: float = 5e-5, weight_decay: float = 0.0, settings=None):
    """The optimizer `name` over `parameter_groups(model, weight_decay)`; `settings`: the run's config (or any object
    with its optimization fields), for optimizers with settings of their own; refused in one line (`check`) where
    the optimizer cannot train this model so.

    Every optimizer takes its weight decay from the groups, so biases and norm weights never decay.
    Empty groups (e.g. a model with no matrices left trainable) are dropped.
    """
    chosen = entry(name)
    check(name, settings, model)
    groups = [g for g in parameter_groups(model, weight_decay) if g["params"]]
    if not groups:
        raise ConfigError("the model has no trainable parameters: nothing to optimize")
    return chosen.build(model, groups, lr, settings)


@contextlib.contextmanager
def evaluation_weights(name: str, optimizer: Any) -> Iterator[None]:
    """The model holds the weights to evaluate and save inside, the weights to train after (schedule-free's average
    and its gradient point; nothing changes for the other optimizers). Leaving restores training weights."""
    switch = entry(name).switch_weights
    if switch is None:
        yield
        return
    switch(optimizer, "eval")
    try:
        yield
    finally:
        switch(optimizer, "train")


def use_weights(name: str, optimizer: Any, mode: str) -> None:
    """Put the model's "train" or "eval" weights in place (before training starts; for the end of the run)."""
    switch = entry(name).switch_weights
    if switch is not None:
        switch(optimizer, mode)


# -- state bytes -------------------------------------------------------------------------------------------------


def predicted_state_bytes(
    shapes: Iterable[tuple[int, ...]], name: str, hidden: Iterable[bool] | None = None, settings: Any = None
) -> int:
    """Bytes of optimizer state for trainable parameters of these shapes (`hidden`: which the optimizer treats apart,
    `treated_apart`; none when not given), once the first step has run: the registry's count, which `state_bytes` of
    a real optimizer equals (tests/planner checks it)."""
    opt = entry(name)
    shapes = [tuple(s) for s in shapes]
    flags = list(hidden) if hidden is not None else [False] * len(shapes)
    total = 0
    for shape, is_hidden in zip(shapes, flags, strict=True):
        if is_hidden and opt.hidden_state_bytes is not None:
            total += opt.hidden_state_bytes(shape, settings)
        else:
            total += opt.state_bytes(shape)
    return total + (opt.shared_state_bytes if shapes else 0)


def predicted_temporaries(largest: int, largest_hidden: int, numel: int, name: str) -> int:
    """Bytes of the optimizer step's temporaries (the planner's optimizer workspace): the registry's fitted copies
    of the largest parameter tensor, of the largest hidden matrix and of all parameters (elements given)."""
    opt = entry(name)
    return int(4 * (opt.temporaries * largest + opt.hidden_temporaries * largest_hidden + opt.all_temporaries * numel))


def predicted_step_flops(shapes: Iterable[tuple[int, ...]], name: str, hidden: Iterable[bool]) -> float:
    """The matmul FLOPs of the optimizer's step on the hidden matrices among these shapes (`hidden`: which it treats
    apart); 0 for an optimizer whose step is per parameter alone."""
    opt = entry(name)
    if opt.hidden_flops is None:
        return 0.0
    return sum(opt.hidden_flops(tuple(s)) for s, h in zip(shapes, hidden, strict=True) if h)


def newton_schulz_flops(shape: tuple[int, ...], steps: int = 5) -> float:
    """torch's Muon: each of its 5 quintic Newton-Schulz steps on an m x n matrix (m the smaller side) multiplies
    X X^T (2m²n), that square by itself (2m³) and the result by X (2m²n)."""
    m, n = sorted(shape[-2:])
    return steps * (4 * m * m * n + 2 * m**3)


def model_state_bytes(model: Any, name: str, settings: Any = None) -> int:
    """`predicted_state_bytes` of a model's trainable parameters (what is treated apart picked as the builders do)."""
    hidden = treated_apart(model, name, settings)
    trainable = [p for p in model.parameters() if p.requires_grad]
    return predicted_state_bytes(
        [tuple(p.shape) for p in trainable], name, [id(p) in hidden for p in trainable], settings
    )


def _state_tensors(value, depth: int = 0):
    import torch

    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, dict):
        for v in value.values():
            yield from _state_tensors(v, depth)
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _state_tensors(v, depth)
    elif hasattr(value, "__dict__") and depth < 2:  # a projector object (GaLore's, APOLLO's): its tensors
        yield from _state_tensors(vars(value), depth + 1)


def state_bytes(optimizer: torch.optim.Optimizer) -> int:
    """Bytes held by the tensors in `optimizer.state`: moments, step counters, projection matrices, and for
    bitsandbytes the quantisation maps and per-block absmax. A tensor shared between parameters (bitsandbytes'
    qmaps) counts once. Zero until the first step, since optimizers create their state lazily."""
    seen = set()
    total = 0
    for param_state in optimizer.state.values():
        for t in _state_tensors(param_state):
            t = t.to_local() if hasattr(t, "to_local") else t  # sharded (--shard fsdp): this process's shard
            key = (t.device, t.data_ptr(), t.dtype, tuple(t.shape), t.stride()) if t.data_ptr() else id(t)
            if key in seen:
                continue
            seen.add(key)
            total += t.numel() * t.element_size()
    return total


def state_bytes_per_param(optimizer: torch.optim.Optimizer) -> float:
    """`state_bytes` divided by the number of parameter elements the optimizer updates."""
    n = sum(p.numel() for g in optimizer.param_groups for p in g["params"])
    return state_bytes(optimizer) / n if n else 0.0


# -- the optimizers ------------------------------------------------------------------------------------------------


def _adamw(model, groups: list[dict], lr: float, settings) -> torch.optim.Optimizer:
    from leantrain.model.optimizer_kinds import torch_adamw

    return torch_adamw(groups, lr)


def _sgd(model, groups: list[dict], lr: float, settings) -> torch.optim.Optimizer:
    import torch

    from leantrain.model.optimizer_kinds import fused_supported

    # Plain SGD (no momentum): the equivalence tests rely on its update being exactly p -= lr * g, which the fused
    # kernel computes too; fused, a non-finite step is skipped on the device (training.guards)
    first = groups[0]["params"][0]
    fused = fused_supported(first.device) and not hasattr(first, "to_local")  # sharded (DTensor): no fused SGD
    return torch.optim.SGD(groups, lr=lr, momentum=0.0, fused=fused or None)


def _adafactor(model, groups: list[dict], lr: float, settings) -> torch.optim.Optimizer:
    from transformers.optimization import Adafactor

    # An explicit learning rate (so schedules apply as for AdamW); factored second moments, no first
    # moment: state is O(rows + cols) per matrix instead of AdamW's 2 x numel.
    return Adafactor(groups, lr=lr, scale_parameter=False, relative_step=False, warmup_init=False)


def _adamw8bit(model, groups: list[dict], lr: float, settings) -> torch.optim.Optimizer:
    # bitsandbytes rather than torchao: both keep 8-bit blockwise-quantised moments (about 2 bytes a parameter
    # instead of 8), but on this CPU bitsandbytes 0.50 steps in 480-540 ms for 22.7 M params while torchao's
    # AdamW8bit takes ~780 ms and compiles for 60-70 s on its first step (docs/measurements.md).
    from leantrain.model.lora import quiet_kernel_lookup

    quiet_kernel_lookup()
    try:
        import bitsandbytes.optim as bnb_optim
    except Exception as e:  # ImportError, or a broken native library raising something else on import
        raise ConfigError("--optimizer adamw8bit needs bitsandbytes: pip install 'leantrain[8bit]'") from e
    return bnb_optim.AdamW8bit(groups, lr=lr)


#: bitsandbytes keeps fp32 state for tensors under this many elements (its `min_8bit_size`)
BNB_MIN_8BIT_SIZE = 4096
#: bitsandbytes' blockwise quantisation block: one fp32 absmax per block and moment
BNB_BLOCK = 256


def _adamw_bytes(shape: tuple[int, ...]) -> int:
    return 8 * math.prod(shape) + 4  # exp_avg, exp_avg_sq (fp32) and a fp32 step tensor


def _adamw8bit_bytes(shape: tuple[int, ...]) -> int:
    n = math.prod(shape)
    if n < BNB_MIN_8BIT_SIZE:
        return 8 * n
    return 2 * n + 2 * 4 * math.ceil(n / BNB_BLOCK)  # two uint8 moments, two fp32 absmax per block


def _adafactor_bytes(shape: tuple[int, ...]) -> int:
    # transformers' Adafactor without beta1: factored second moments for matrices, full for vectors (and a 0-dim
    # fp32 RMS tensor per parameter)
    if len(shape) >= 2:
        return 4 * (math.prod(shape[:-1]) + math.prod(shape[:-2] + shape[-1:])) + 4
    return 4 * math.prod(shape) + 4


# Step costs: docs/measurements.md, 22.7 M parameters on 2 Sapphire Rapids cores; on a GPU memory-bound elementwise
# kernels, about 16 bytes read and written per parameter for AdamW at about 1 TB/s. Temporaries: a one-time fit to
# measurements of MiniLM and a tiny BERT (benchmarks/planner_accuracy.py): Adafactor builds its update and its
# factored estimate; bitsandbytes on CPU dequantises both moments of a tensor to fp32 (5.0 on both models).
register(
    OptimizerEntry(
        "adamw",
        _adamw,
        _adamw_bytes,
        "AdamW (fused kernel where torch has one): 8 bytes of state a parameter; the default",
        cpu_seconds_per_param=0.025 / 22.7e6,
        gpu_seconds_per_param=2e-11,
        hf_names=("adamw_torch", "adamw_torch_fused", "adamw_hf"),
        planned=True,
        resume_state="step, exp_avg, exp_avg_sq per parameter",
        flat=True,
    )
)
register(
    OptimizerEntry(
        "adafactor",
        _adafactor,
        _adafactor_bytes,
        "Adafactor (transformers'): factored second moments, far less state than AdamW, a slower step",
        temporaries=2.0,
        cpu_seconds_per_param=0.150 / 22.7e6,
        gpu_seconds_per_param=5e-11,
        hf_names=("adafactor",),
        planned=True,
        resume_state="step, exp_avg_sq_row, exp_avg_sq_col (or exp_avg_sq), RMS per parameter",
    )
)
register(
    OptimizerEntry(
        "adamw8bit",
        _adamw8bit,
        _adamw8bit_bytes,
        "AdamW with 8-bit blockwise moments (bitsandbytes): about 2 bytes a parameter, a slower step on CPU",
        shared_state_bytes=2 * 256 * 4,  # the two dynamic quantisation maps
        temporaries=5.0,
        cpu_seconds_per_param=0.500 / 22.7e6,
        gpu_seconds_per_param=2e-11,
        hf_names=("adamw_bnb_8bit", "adamw_8bit"),
        planned=True,
        resume_state="step, state1, state2, absmax1, absmax2, qmap1, qmap2 per parameter",
    )
)
register(
    OptimizerEntry(
        "sgd",
        _sgd,
        lambda shape: 0,
        "plain SGD without momentum: no state (the equivalence tests' exact update)",
        cpu_seconds_per_param=0.008 / 22.7e6,
        gpu_seconds_per_param=1e-11,
        hf_names=("sgd",),
        resume_state="nothing",
        flat=True,
    )
)

# -- Muon, schedule-free, Lion, GaLore, APOLLO (model/optimizer_kinds.py builds them) -------------------------------


def _muon(model, groups: list[dict], lr: float, settings) -> torch.optim.Optimizer:
    from leantrain.model import optimizer_kinds

    hidden, rest = split_hidden(groups, hidden_matrices(model))
    muon_lr = setting(settings, "muon_lr") or lr
    return optimizer_kinds.muon(
        hidden, rest, lr, muon_lr, setting(settings, "muon_momentum"), setting(settings, "muon_lr_rule")
    )


def _schedule_free(kind: str):
    def build(model, groups: list[dict], lr: float, settings) -> torch.optim.Optimizer:
        from leantrain.model import optimizer_kinds

        return getattr(optimizer_kinds, kind)(groups, lr)

    return build


def _switch_schedule_free(optimizer, mode: str) -> None:
    # schedulefree's own switch (Accelerate's wrapper passes it on); each is a no-op when already in that mode
    optimizer.eval() if mode == "eval" else optimizer.train()


def _lion(model, groups: list[dict], lr: float, settings) -> torch.optim.Optimizer:
    from leantrain.model import optimizer_kinds

    return optimizer_kinds.lion(groups, lr)


#: the projection's scale when --projection-scale is not given: each method's published default (and the HF
#: Trainer's: GaLore 0.25, APOLLO 1.0)
PROJECTION_SCALE = {"galore": 0.25, "apollo": 1.0}


def _projected(kind: str, name: str):
    def build(model, groups: list[dict], lr: float, settings) -> torch.optim.Optimizer:
        from leantrain.model import optimizer_kinds

        hidden, rest = split_hidden(groups, treated_apart(model, name, settings))
        rank, interval = setting(settings, "projection_rank"), setting(settings, "projection_update_interval")
        scale = setting(settings, "projection_scale") or PROJECTION_SCALE[kind]
        return getattr(optimizer_kinds, kind)(hidden, rest, lr, rank, interval, scale)

    return build


def _projected_bytes(extra: int = 0):
    def count(shape: tuple[int, ...], settings) -> int:
        # both moments in the projected space (rank x the larger side) and the projection (rank x the smaller side)
        rank, (m, n) = setting(settings, "projection_rank"), shape
        return 4 * rank * (2 * max(m, n) + min(m, n)) + extra

    return count


_HIDDEN_REFUSALS: dict[str, Any] = dict(
    no_fsdp="its projection works on each whole gradient matrix (an SVD or a random projection), which FSDP "
    "shards across processes",
    no_lora="it keeps low-rank optimizer state for full fine-tuning; LoRA's adapters are low-rank already (use "
    "--optimizer adamw with --lora, or drop --lora)",
)
_PROJECTION_SETTINGS = ("projection_rank", "projection_update_interval", "projection_scale", "projection_embeddings")

# Step costs: the optimizer's seconds a step inside MiniLM's training (time_to_target.md, 2 cores); temporaries:
# benchmarks/optimizer_steps.py (MiniLM's 22.7 M parameters and tiny-llama's on this machine's 2 cores,
# benchmarks/results/optimizer_steps.md); on a GPU the elementwise ones as AdamW, Muon's and GaLore's matmuls more.
register(
    OptimizerEntry(
        "muon",
        _muon,
        _adamw_bytes,  # what is not a hidden matrix steps with AdamW
        "Muon on the hidden layers' weight matrices (orthogonalised momentum), AdamW on embeddings, head, norms "
        "and biases: 4 bytes of state a hidden weight; often fewer steps to a given loss",
        hidden_state_bytes=lambda shape, settings: 4 * math.prod(shape),  # the momentum buffer
        hidden_temporaries=3.0,
        # the elementwise part as AdamW's; the orthogonalisation from its FLOPs: MiniLM's 36 matrices, 102 GFLOP,
        # took 410 ms (0.25 TFLOP/s in bf16 on 2 EPYC cores), tiny-llama's 28, 21 GFLOP, 97 ms
        cpu_seconds_per_param=0.025 / 22.7e6,
        gpu_seconds_per_param=6e-11,
        hidden_flops=newton_schulz_flops,
        resume_state="momentum_buffer per hidden matrix; step, exp_avg, exp_avg_sq per other parameter",
        hidden_rule="Muon",
        settings=("muon_lr", "muon_momentum", "muon_lr_rule"),
    )
)
register(
    OptimizerEntry(
        "schedule-free-adamw",
        _schedule_free("schedule_free_adamw"),
        lambda shape: 8 * math.prod(shape),  # z and exp_avg_sq
        "schedule-free AdamW (Meta's schedulefree): no schedule and no end fixed in advance; evaluations and the "
        "saved model use its averaged weights; AdamW's 8 bytes a parameter",
        all_temporaries=1.0,
        cpu_seconds_per_param=0.068 / 22.7e6,
        gpu_seconds_per_param=3e-11,
        hf_names=("schedule_free_adamw",),
        resume_state="z, exp_avg_sq per parameter; k, weight_sum, lr_max, train_mode per group",
        schedulers=("constant", "constant_with_warmup"),
        schedulers_why="schedule-free takes no schedule (it averages its iterates instead; the warm-up is kept)",
        switch_weights=_switch_schedule_free,
    )
)
register(
    OptimizerEntry(
        "schedule-free-sgd",
        _schedule_free("schedule_free_sgd"),
        lambda shape: 4 * math.prod(shape),  # z
        "schedule-free SGD with momentum 0.9: no schedule; 4 bytes a parameter (its learning rate is SGD's, large)",
        cpu_seconds_per_param=0.03 / 22.7e6,
        gpu_seconds_per_param=2e-11,
        hf_names=("schedule_free_sgd",),
        resume_state="z per parameter; k, weight_sum, lr_max, train_mode per group",
        schedulers=("constant", "constant_with_warmup"),
        schedulers_why="schedule-free takes no schedule (it averages its iterates instead; the warm-up is kept)",
        switch_weights=_switch_schedule_free,
    )
)
register(
    OptimizerEntry(
        "lion",
        _lion,
        lambda shape: 4 * math.prod(shape),  # exp_avg
        "Lion (pytorch-optimizer's): the sign of an interpolated momentum, 4 bytes of state a parameter; use a "
        "learning rate 3-10x smaller than AdamW's",
        all_temporaries=1.0,
        cpu_seconds_per_param=0.06 / 22.7e6,
        gpu_seconds_per_param=2e-11,
        hf_names=("lion_32bit",),
        resume_state="exp_avg per parameter; step per group",
    )
)
register(
    OptimizerEntry(
        "galore-adamw",
        _projected("galore", "galore-adamw"),
        lambda shape: 8 * math.prod(shape),  # exp_avg, exp_avg_sq (no step tensor)
        "GaLore (pytorch-optimizer's): AdamW with each hidden matrix's moments in a rank --projection-rank "
        "subspace of its gradient, refreshed by SVD every --projection-update-interval steps",
        hidden_state_bytes=_projected_bytes(),
        hidden_temporaries=2.0,  # the SVD of the largest projected matrix at a refresh
        all_temporaries=1.0,
        cpu_seconds_per_param=0.10 / 22.7e6,
        gpu_seconds_per_param=5e-11,
        hf_names=("galore_adamw",),
        resume_state="exp_avg, exp_avg_sq (projected) and the projector (ortho_matrix, last_svd_step) per hidden "
        "matrix; exp_avg, exp_avg_sq per other parameter; step per group",
        hidden_rule="GaLore's low-rank projection",
        rank_setting="projection_rank",
        settings=_PROJECTION_SETTINGS,
        **_HIDDEN_REFUSALS,
    )
)
register(
    OptimizerEntry(
        "apollo-adamw",
        _projected("apollo", "apollo-adamw"),
        lambda shape: 8 * math.prod(shape),
        "APOLLO (apollo-torch, the authors'): AdamW's moments of each hidden matrix in a random rank "
        "--projection-rank space, only to scale its full gradient channel by channel; SGD-like memory",
        hidden_state_bytes=_projected_bytes(extra=4),  # and the norm-growth limiter's last norm
        temporaries=2.0,  # its AdamW path's per-tensor intermediates
        hidden_temporaries=1.0,
        cpu_seconds_per_param=0.095 / 22.7e6,
        gpu_seconds_per_param=5e-11,
        hf_names=("apollo_adamw",),
        resume_state="exp_avg, exp_avg_sq (projected), scaled_grad and the projector (ortho_matrix, seed) per "
        "hidden matrix; exp_avg, exp_avg_sq per other parameter; step per parameter",
        hidden_rule="APOLLO's random low-rank scaling",
        rank_setting="projection_rank",
        settings=_PROJECTION_SETTINGS,
        **_HIDDEN_REFUSALS,
    )
)
