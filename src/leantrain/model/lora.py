"""LoRA and QLoRA through peft: freeze the model, train low-rank adapters (and the task's head), publish merged.

The trainer calls `apply` once, right after `Task.build_model`, and `for_publishing` once, when it saves the
run's `model/`. Everything else (optimizer, checkpoints, several processes) sees an ordinary module whose only
trainable parameters are the adapters and the head: frozen weights carry no gradient and no optimizer state.

- **targets**: `auto` is every Linear layer of the model outside its head (peft's `all-linear`); NAMES (comma-
  separated) are module names as peft matches them: a module whose name is, or ends with `.`, one of them.
- **the head** stays fully trainable (peft's `modules_to_save`): the model's children outside its base model
  (`base_model_prefix`) that hold parameters, less the output embeddings (a language model's tied `lm_head` is
  pretrained, not new). A classifier's `classifier`/`score`/`projector`; a task without a head: nothing. A pooler
  that the run started as the identity (`--pooler`) trains whole with it, so that `adapter/` carries it.
- **quantized base** (`--quantize 4bit|8bit`, QLoRA): the frozen Linear layers outside the head become
  bitsandbytes `Linear4bit` (NF4, fp32 compute) or `Linear8bitLt` before the adapters are added.
- **publishing**: `model/` is the merged model (base + B·A·alpha/r, head as trained), a plain transformers model
  that `pipeline` loads; with a quantized base, the adapters are merged into the *dequantized* base weights.
  `--save-adapter` also writes the adapter alone (`adapter/`, peft's `save_pretrained`).
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import torch

from leantrain.errors import ConfigError

AUTO_TARGETS = "auto"
ADAPTER_DIR = "adapter"


def head_modules(model: Any) -> list[str]:
    """The task head: top-level children outside the base model that hold parameters (see module doc). An
    encoder-decoder has none: its output is its pretrained output embeddings (T5's and bert2bert's children are
    the embeddings, the encoder and the decoder, outside any base model)."""
    if getattr(getattr(model, "config", None), "is_encoder_decoder", False):
        return []
    base = getattr(model, "base_model_prefix", "")
    output_embeddings = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    return [
        name
        for name, child in model.named_children()
        if name != base and child is not output_embeddings and any(True for _ in child.parameters())
    ]


def started_afresh(model: Any) -> list[str]:
    """Full names of the modules outside the head that the run started rather than loaded: a BERT-style pooler
    started as the identity (`--pooler`). They train whole, as the head does, so that the adapter carries them: on
    the pretrained base, whose pooler is not the identity, adapters alone would not be the trained model."""
    from leantrain.model.loading import pooler_dense

    dense = pooler_dense(model)
    if dense is None or dense.weight.is_meta:
        return []
    eye = torch.eye(dense.in_features, dtype=dense.weight.dtype, device=dense.weight.device)
    if not torch.equal(dense.weight, eye) or (dense.bias is not None and bool(dense.bias.any())):
        return []
    return [name for name, module in model.named_modules() if module is dense]


def linear_names(model: torch.nn.Module, head: list[str]) -> list[str]:
    """Full names of the Linear layers outside the head (top-level children, or full names of modules)."""
    return [
        name
        for name, module in model.named_modules()
        if isinstance(module, torch.nn.Linear) and not any(name == h or name.startswith(h + ".") for h in head)
    ]


def adaptable(module: torch.nn.Module) -> bool:
    """Whether peft can put a LoRA adapter on `module` (the layer types its LoRA supports)."""
    from transformers.pytorch_utils import Conv1D

    kinds = (torch.nn.Linear, torch.nn.Embedding, torch.nn.Conv1d, torch.nn.Conv2d, torch.nn.Conv3d, Conv1D)
    return isinstance(module, (*kinds, torch.nn.MultiheadAttention))


def resolve_targets(model: torch.nn.Module, spec: str, head: list[str]) -> str | list[str]:
    """peft's `target_modules` for `--lora-targets` (auto: every Linear layer outside the head); refuses names
    that match no module outside the head, or a module that takes no adapter (a LayerNorm, a whole attention
    block), naming some that do."""
    if spec.strip() == AUTO_TARGETS:
        return "all-linear"
    wanted = [n.strip() for n in spec.split(",") if n.strip()]
    outside = [(n, m) for n, m in model.named_modules() if n and not any(n == h or n.startswith(h + ".") for h in head)]

    def matched(w: str) -> list[torch.nn.Module]:
        return [m for n, m in outside if n == w or n.endswith("." + w)]

    missing = [w for w in wanted if not matched(w)]
    unfit = {w: type(m).__name__ for w in wanted for m in matched(w) if not adaptable(m)}
    if missing or unfit or not wanted:
        layers = sorted({n.rsplit(".", 1)[-1] for n, m in outside if adaptable(m)})
        if unfit:
            what = ", ".join(f"{w} ({kind})" for w, kind in unfit.items())
            problem = f"{what} takes no adapter (peft adapts Linear, Conv and Embedding layers)"
        else:
            names = [n for n, _ in model.named_modules()]
            in_head = any(n == w or n.endswith("." + w) for w in missing for n in names)
            where = f" outside its head ({', '.join(head)}, which trains whole)" if in_head else ""
            problem = f"{', '.join(missing) or repr(spec)} names no module of {type(model).__name__}{where}"
        raise ConfigError(
            f"--lora-targets: {problem}; give '{AUTO_TARGETS}' or comma-separated names such as {', '.join(layers[:8])}"
        )
    return wanted


def quiet_kernel_lookup() -> None:
    """Before bitsandbytes is imported (peft imports it): on a CPU with AVX512-BF16 it looks for a faster 4-bit kernel
    on the Hub, and offline logs two warnings about the lookup. Its own kernel then runs: nothing is lost and there
    is nothing for the user to do, so the lines would only alarm."""
    import logging

    for name in ("kernels", "bitsandbytes.backends.cpu.ops"):
        logging.getLogger(name).setLevel(logging.ERROR)


def check_quantization_runs(bits: str, device: torch.device) -> None:
    """Refuse `--quantize` in one line where bitsandbytes is absent or cannot run a quantized layer on `device`."""
    quiet_kernel_lookup()
    try:
        import bitsandbytes as bnb
    except Exception as exc:  # ImportError, or a library that fails to load on this machine
        raise ConfigError(
            f"--quantize {bits}: bitsandbytes cannot be loaded on this {device.type} machine "
            f"({type(exc).__name__}: {str(exc).splitlines()[0][:120] if str(exc) else 'no detail'}); "
            "pip install bitsandbytes, or train without --quantize"
        ) from None
    try:
        layer = _quantized_linear(torch.nn.Linear(64, 64), bits, device)
        layer(torch.ones(2, 64, device=device)).sum().item()
    except Exception as exc:
        raise ConfigError(
            f"--quantize {bits}: bitsandbytes {getattr(bnb, '__version__', '?')} cannot run {bits} layers on "
            f"{device} ({type(exc).__name__}: {str(exc).splitlines()[0][:120] if str(exc) else 'no detail'}); "
            "train without --quantize"
        ) from None


def _quantized_linear(linear: torch.nn.Linear, bits: str, device: torch.device) -> torch.nn.Module:
    """A bitsandbytes copy of `linear`, quantized on `device` (frozen: no gradient to the quantized weight)."""
    import bitsandbytes as bnb

    bias = linear.bias is not None
    weight = linear.weight.data.float().contiguous()
    layer: torch.nn.Module
    if bits == "4bit":
        layer = bnb.nn.Linear4bit(
            linear.in_features, linear.out_features, bias=bias, compute_dtype=torch.float32, quant_type="nf4"
        )
        layer.weight = bnb.nn.Params4bit(weight, requires_grad=False, quant_type="nf4")
        # on a CPU with AVX512-BF16, bitsandbytes repacks the weight in place for a bf16 kernel the first time the
        # layer runs in eval mode, and uses that kernel from then on, in training too: evaluation would compute
        # otherwise than training, and the merge at the end read repacked bytes as NF4 (a garbage model/)
        layer.support_avx512bf16_for_cpu = False
    else:
        layer = bnb.nn.Linear8bitLt(linear.in_features, linear.out_features, bias=bias, has_fp16_weights=False)
        layer.weight = bnb.nn.Int8Params(weight, requires_grad=False, has_fp16_weights=False)
    if bias:
        layer.bias = torch.nn.Parameter(linear.bias.data.float().clone(), requires_grad=False)
    layer = layer.to(device)  # moving the weight is what quantizes it
    layer._register_load_state_dict_pre_hook(_check_frozen_quantized_state, with_module=True)
    return layer


def _check_frozen_quantized_state(module, state_dict, prefix, local_metadata, strict, missing, unexpected, errors):
    """Loading a checkpoint into a quantized layer: bitsandbytes cannot load its quantization state into a layer
    that is already quantized, but the base is frozen and quantizing the same weights gives the same bytes. So
    the saved state is checked to equal the layer's own, bitwise, and its quantization entries are taken out;
    a different base is an error naming the tensor."""
    own = module.state_dict(prefix=prefix, keep_vars=False)
    for key in [k for k in state_dict if k.startswith(prefix)]:  # a leaf: every key under its prefix is its own
        mine = own.get(key)
        theirs = state_dict[key]
        if (
            isinstance(mine, torch.Tensor)
            and isinstance(theirs, torch.Tensor)
            and not torch.equal(mine.cpu(), theirs.cpu())
        ):
            errors.append(f"{key}: the checkpoint's frozen quantized base differs from this run's")
        if key.removeprefix(prefix) not in module._parameters:
            state_dict.pop(key)  # quantization state (absmax, quant map, SCB...): checked, nothing to load


def quantized_names(model: torch.nn.Module, head: list[str]) -> list[str]:
    """The Linear layers --quantize replaces: those outside the head but a causal LM's output layer (`lm_head`),
    which transformers' own quantization leaves as it is too: the fused head loss multiplies by its weight, and it
    may be the input embeddings' tied table."""
    output = getattr(model, "get_output_embeddings", lambda: None)()
    return [n for n in linear_names(model, head) if output is None or model.get_submodule(n) is not output]


def quantize_base(model: torch.nn.Module, bits: str, head: list[str], device: torch.device) -> int:
    """Replace the Linear layers `quantized_names` names by their quantized copies; returns how many were replaced."""
    import logging

    # bitsandbytes logs each 8-bit layer's fp32 -> fp16 input cast on every forward: expected, not news
    logging.getLogger("bitsandbytes.autograd._functions").setLevel(logging.ERROR)
    replaced = 0
    for name in quantized_names(model, head):
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, child, _quantized_linear(getattr(parent, child), bits, device))
        replaced += 1
    # what peft reads to wrap bitsandbytes layers with its quantized LoRA layers
    setattr(model, "is_loaded_in_4bit" if bits == "4bit" else "is_loaded_in_8bit", True)
    return replaced


def apply(
    model: torch.nn.Module, cfg: Any, device: torch.device | None, afresh: list[str] | None = None
) -> torch.nn.Module:
    """The model with LoRA adapters (over a quantized base with --quantize): only adapters and head train.
    `afresh`: the modules `started_afresh` names (the planner's meta-device models have no values to tell by)."""
    quiet_kernel_lookup()
    from peft import LoraConfig, get_peft_model

    head = head_modules(model) + (started_afresh(model) if afresh is None else afresh)
    targets = resolve_targets(model, cfg.lora_targets, head)
    if cfg.quantize is not None:
        assert device is not None  # (None: the planner's proxies, never quantized)
        check_quantization_runs(cfg.quantize, device)
        quantize_base(model.to(device), cfg.quantize, head, device)
        # what stays unquantized (embeddings, norms, head) in fp32, as loaded without --quantize (a bf16/fp16 run
        # then keeps the frozen output layer in its precision: freezing.store_frozen)
        model.float()
    config = LoraConfig(
        r=cfg.lora_r,
        lora_alpha=cfg.lora_alpha,
        lora_dropout=cfg.lora_dropout,
        target_modules=targets,
        exclude_modules=head or None,  # the head trains whole; names would otherwise match inside it
        modules_to_save=head or None,
    )
    with warnings.catch_warnings():  # peft reads a transformers attribute that transformers 5 renamed: noise
        warnings.filterwarnings("ignore", category=FutureWarning, message=".*is_gradient_checkpointing.*")
        return get_peft_model(model, config)


def describe(model: torch.nn.Module, cfg: Any) -> str:
    """One line: what LoRA wraps and how much of the model trains."""
    lora_layers = [n for n, m in model.named_modules() if hasattr(m, "lora_A") and hasattr(m, "base_layer")]
    kinds = sorted({n.rsplit(".", 1)[-1] for n in lora_layers})
    total = sum(p.numel() for p in model.parameters())
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    config = getattr(model, "peft_config", {}).get("default")
    head = list(getattr(config, "modules_to_save", None) or [])
    base = f"{cfg.quantize} base (bitsandbytes)" if cfg.quantize else "frozen base"
    return (
        f"LoRA r={cfg.lora_r} alpha={cfg.lora_alpha:g} dropout={cfg.lora_dropout:g} on {len(lora_layers)} layers "
        f"({', '.join(kinds)}), {base}; head {', '.join(head) or 'none'} train{'s' if len(head) < 2 else ''} whole; "
        f"{trainable:,} of {total:,} parameters train ({trainable / max(total, 1):.2%})"
    )


def _base(model: torch.nn.Module) -> torch.nn.Module:
    """The transformers model inside a PeftModel."""
    inner = getattr(model, "base_model", model)
    return getattr(inner, "model", inner)


def is_lora(model: torch.nn.Module) -> bool:
    """Whether `model` is a peft model (without importing peft for a run that never did)."""
    import sys

    peft = sys.modules.get("peft")
    return peft is not None and isinstance(model, peft.PeftModel)


def for_publishing(model: Any, adapter_dir: Path | None = None) -> Any:
    """What the run's `model/` holds: the adapters merged into the base (dequantized first where it was
    quantized), the head as trained: a plain transformers model. Writes the adapter alone to `adapter_dir`
    first when given. Merges in place: call it once, at the end of the run."""
    if not is_lora(model):
        return model
    if adapter_dir is not None:
        from leantrain.model.loading import library_bars_off

        with library_bars_off():
            model.save_pretrained(adapter_dir, safe_serialization=True)
    from leantrain.model import freezing

    base = _base(model)
    if getattr(base, "is_loaded_in_4bit", False) or getattr(base, "is_loaded_in_8bit", False):
        _merge_into_dequantized(model)
        model.to("cpu")  # no quantized layer is left: the rest (embeddings, norms, the head) joins them on the host
        # no adapter is left to merge; merging (not unload(), which since peft 0.22 keeps the head's untrained
        # original) puts the head's trained copy in its place
        merged = model.merge_and_unload(safe_merge=True)
        for flag in ("is_loaded_in_4bit", "is_loaded_in_8bit"):
            if hasattr(merged, flag):
                delattr(merged, flag)
        freezing.restore_fp32(merged)
        return merged
    # a base kept in bf16/fp16 is merged in fp32 on the host, which held it in fp32 when it loaded: the device, on
    # which the run fitted thanks to the smaller base, never holds the fp32 copy
    freezing.restore_fp32(model, host=True)
    return model.merge_and_unload(safe_merge=True)


def _merge_into_dequantized(model: torch.nn.Module) -> None:
    """Replace every quantized layer (with or without an adapter) by a float Linear on the host holding its
    dequantized weight plus the adapter's update: each layer is dequantized where it is (on a GPU, one layer's fp32
    at a time) and leaves the device at once, so a device that fitted the run thanks to the quantized base never
    holds the fp32 model (a 7 B model's 28 GB)."""
    import bitsandbytes as bnb
    from peft.tuners.lora import LoraLayer
    from peft.utils.integrations import dequantize_bnb_weight

    quantized = (bnb.nn.Linear4bit, bnb.nn.Linear8bitLt)
    adapters = {n for n, m in model.named_modules() if isinstance(m, LoraLayer)}
    # each quantized layer once: the adapter layer that wraps it, or the layer itself where none does
    found = [
        (name, module)
        for name, module in model.named_modules()
        if (name in adapters and isinstance(module.get_base_layer(), quantized))
        or (isinstance(module, quantized) and name.rpartition(".")[0] not in adapters)
    ]
    for name, module in found:
        base = module.get_base_layer() if name in adapters else module
        weight = dequantize_bnb_weight(base.weight, state=getattr(base, "state", None)).float()
        if name in adapters:
            for adapter in module.active_adapters:
                weight = weight + module.get_delta_weight(adapter).float()
        linear = torch.nn.Linear(base.in_features, base.out_features, bias=base.bias is not None, device="cpu")
        with torch.no_grad():
            linear.weight.copy_(weight)
            if base.bias is not None:
                linear.bias.copy_(base.bias.float())
        parent_name, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent_name) if parent_name else model, child, linear)
