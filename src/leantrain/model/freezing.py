"""--freeze: parameters that keep their pretrained values, with no gradient and no optimizer state.

`embeddings` names the model's input embedding table (`get_input_embeddings()`: BERT's word embeddings, a Llama's
`embed_tokens`), the largest tensor of a small encoder; anything else is a glob over parameter names as
`named_parameters()` spells them (`bert.encoder.layer.[0-2].*`). On a CPU the word embeddings cost a fine-tuning
step more than their share: their gradient is a dense table as large as the weights (MiniLM's 11.7 M numbers, a
tenth of them touched by a batch) and AdamW updates every number of it. Frozen, a MiniLM step at batch 16 runs
12-22% faster, at the same accuracy on the default job's tweets (`benchmarks/results/quickstart.md`).

In a bf16 or fp16 run, the frozen weights of matmul layers (`store_frozen`: what --freeze and LoRA freeze) are kept
in that precision rather than fp32: autocast casts a weight that does not train afresh in every forward (it caches
only the ones that do) and autograd keeps the copy for backward, so fp32 costs 4 + 2 bytes a number where the
run's precision costs 2, and the matmuls see the same bits. So are frozen embedding tables whose values the
precision holds exactly (a checkpoint stored in bf16), their lookups cast back to fp32: 2 bytes where 4.
"""

from __future__ import annotations

import fnmatch
from typing import Any

from leantrain.errors import ConfigError

#: --freeze's value that freezes nothing
NOTHING = "none"
#: --freeze's name for the model's input embedding table
EMBEDDINGS = "embeddings"


def patterns(spec: str | None) -> list[str]:
    """The comma-separated names of --freeze; `none` (or nothing) is none."""
    names = [p.strip() for p in (spec or "").split(",") if p.strip()]
    return [] if names == [NOTHING] else names


def apply(model: Any, spec: str | None) -> str | None:
    """Freeze what `spec` names in `model`; returns what was done, for the log, or None for nothing. Refused in one
    line: a name that matches no parameter, or one that would leave nothing to train."""
    names = patterns(spec)
    if not names:
        return None
    named = dict(model.named_parameters())
    frozen: dict[str, Any] = {}
    for name in names:
        if name == EMBEDDINGS:
            table = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
            weight = getattr(table, "weight", None)
            found = {n: p for n, p in named.items() if p is weight}
        else:
            found = {n: p for n, p in named.items() if fnmatch.fnmatchcase(n, name)}
        if not found:
            example = next(iter(named), "")
            raise ConfigError(
                f"--freeze {name}: no parameter of the model is named so; give embeddings or a glob over names such "
                f"as {example.rsplit('.', 1)[0]}.*"
            )
        frozen.update(found)
    if len(frozen) == len(named):
        raise ConfigError(f"--freeze {spec}: that is every parameter, so nothing would train; freeze fewer")
    for parameter in frozen.values():
        parameter.requires_grad_(False)
    count = sum(p.numel() for p in frozen.values())
    total = sum(p.numel() for p in named.values())
    tied = _tied_to_output(model, frozen.values())
    return (
        f"frozen (--freeze {spec}): {len(frozen)} tensor{'s' if len(frozen) > 1 else ''}, {count / 1e6:.1f} M of "
        f"{total / 1e6:.1f} M parameters"
        + ("; the output layer shares the embedding table, so it stays as it was too" if tied else "")
    )


def _tied_to_output(model: Any, frozen: Any) -> bool:
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    weight = getattr(head, "weight", None)
    return weight is not None and any(p is weight for p in frozen)


#: set on an embedding module whose table `store_frozen` keeps in bf16/fp16: its lookups are cast back to fp32
OUTPUT_FP32 = "leantrain_output_fp32"


def stored_low(model: Any, tables: bool = True) -> list[Any]:
    """The frozen floating-point weights `store_frozen` may keep in the run's precision: those held by matmul layers
    (torch's Linear and GPT-2's Conv1D, an addmm), whose forward autocast runs on the weight cast to its dtype, and
    (`tables`) by embedding tables, whose lookups are cast back to fp32, alone. A weight that another kind of module
    holds stays fp32, and so do the layers that subclass these to compute their own way (bitsandbytes' quantized
    layers and their biases, BART's scaled embeddings)."""
    import torch
    from transformers.pytorch_utils import Conv1D

    kinds = (torch.nn.Linear, Conv1D, torch.nn.Embedding) if tables else (torch.nn.Linear, Conv1D)
    held: dict[int, Any] = {}
    elsewhere: set[int] = set()
    for module in model.modules():
        for p in module.parameters(recurse=False):
            if type(module) in kinds:
                held[id(p)] = p
            else:
                elsewhere.add(id(p))
    return [p for key, p in held.items() if key not in elsewhere and not p.requires_grad and p.is_floating_point()]


def store_frozen(model: Any, dtype: Any) -> str | None:
    """Keep `stored_low(model)` in `dtype` (the run's bf16/fp16 autocast dtype; see the module doc), so that every
    forward and gradient stays bitwise as it was: a matmul's weight rounds as autocast's cast rounds it; an embedding
    table only where `dtype` holds its values exactly (a checkpoint stored in bf16), its lookups cast back to fp32.
    Returns the log's line, or None where nothing is kept."""
    import torch

    if dtype not in (torch.bfloat16, torch.float16):
        return None
    tables: dict[int, list[Any]] = {}
    for module in model.modules():
        if type(module) is torch.nn.Embedding:
            tables.setdefault(id(module.weight), []).append(module)
    weights = [p for p in stored_low(model) if p.dtype != dtype and (id(p) not in tables or _held_exactly(p, dtype))]
    if not weights:
        return None
    before = sum(p.numel() * p.element_size() for p in weights)
    for p in weights:
        p.data = p.data.to(dtype)
        for table in tables.get(id(p), []):  # what follows the lookup computes as it did from the fp32 table
            table.register_forward_hook(_as_fp32)
            setattr(table, OUTPUT_FP32, True)
    # A checkpoint's tensors on the CPU are views of its file, mapped whole (safetensors): the mapping, with the fp32
    # pages the cast just read, stays resident while any tensor views it. Copied, the rest lets it go.
    cast = {id(p) for p in weights}
    for t in (*model.parameters(), *model.buffers()):
        if id(t) not in cast and t.device.type == "cpu":
            t.data = t.data.clone()
    name = "bf16" if dtype == torch.bfloat16 else "fp16"
    kept = sum(p.numel() * p.element_size() for p in weights) / 2**20
    n_tables = sum(id(p) in tables for p in weights)
    return (
        f"frozen weights kept in {name}: {len(weights)} tensors"
        + (f" ({n_tables} of them embedding tables)" if n_tables else "")
        + f", {before / 2**20:,.1f} MiB in fp32 now {kept:,.1f} MiB (the same bits; no autocast copy of them)"
    )


def _held_exactly(t: Any, dtype: Any) -> bool:
    """Whether `dtype` holds every value of `t`: its first numbers first (a table stored in fp32 fails there, at no
    cost to a run's start), then the whole."""
    import torch

    values = t.data.reshape(-1)
    return all(torch.equal(v.to(dtype).to(v.dtype), v) for v in (values[:4096], values))


def _as_fp32(module: Any, args: Any, output: Any) -> Any:
    return output.float()


def restore_fp32(model: Any, host: bool = False) -> None:
    """The weights `store_frozen` kept in bf16/fp16 back in fp32, in place: a published model/ is in one dtype, and
    LoRA's adapters merge into fp32 weights (a bf16 weight would round most of a small update away). `host`: where
    any was kept low, the model moves to the host first, so that a device the run fitted on thanks to them never
    holds them in fp32."""
    import torch

    low = [p for p in stored_low(model) if p.dtype in (torch.bfloat16, torch.float16)]
    if low and host:
        model.to("cpu")
        low = [p for p in stored_low(model) if p.dtype in (torch.bfloat16, torch.float16)]
    for p in low:
        p.data = p.data.float()
