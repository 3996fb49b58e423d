"""--kernels: fused kernels in place of a model's own modules. `liger`: Liger's Triton kernels (RMSNorm, RoPE, SwiGLU)
for Llama-family models on CUDA, through the optional `liger-kernel` package (`pip install liger-kernel`).

Liger's fused linear cross-entropy is left off: leantrain's losses already run the head in chunks without the whole
logits (model/losses.py), and its tasks compute the loss from the hidden states rather than the model's own `loss`.
"""

from __future__ import annotations

from typing import Any

from leantrain.errors import ConfigError

KERNELS = ("none", "liger")
#: model types Liger patches as Llama's family (its apply_liger_kernel_to_<type>)
LIGER_TYPES = ("llama", "mistral", "qwen2", "qwen3")


def check(name: str, device_type: str, model_config: Any) -> None:
    """Refuse, in one line, kernels that cannot run here: before any data is read or model loaded."""
    if name == "none":
        return
    if device_type != "cuda":
        raise ConfigError(f"--kernels {name}: Liger's kernels are Triton kernels for CUDA GPUs; this run is on "
                          f"{device_type}: leave --kernels out")  # fmt: skip
    model_type = getattr(model_config, "model_type", None)
    if model_type not in LIGER_TYPES:
        raise ConfigError(
            f"--kernels {name}: for Llama-family models ({', '.join(LIGER_TYPES)}); this model is {model_type}"
        )
    try:
        import liger_kernel.transformers  # noqa: F401
    except ImportError:
        raise ConfigError(f"--kernels {name} needs the liger-kernel package: pip install liger-kernel") from None


def apply(model: Any, name: str) -> str | None:
    """Put the kernels in the model (checked first); returns what was done, for the log."""
    if name == "none":
        return None
    import liger_kernel.transformers as liger

    model_type = model.config.model_type
    patch = getattr(liger, f"apply_liger_kernel_to_{model_type}")
    patch(rope=True, rms_norm=True, swiglu=True, cross_entropy=False, fused_linear_cross_entropy=False, model=model)
    return f"kernels: Liger's RMSNorm, RoPE and SwiGLU in the {model_type} model"
