"""NEFTune (noisy embeddings fine-tuning, Jain et al. 2023): in training, uniform noise on the input embeddings.

Each number of the input embeddings' output gets noise drawn uniformly from ±alpha / sqrt(L x d), L the batch's
padded length and d the embedding width, in training mode only (evaluation and generation read clean embeddings).
It is transformers' own rule (`neftune_noise_alpha` of the HF Trainer and TRL's SFTTrainer), drawn the same way from
torch's generator, so a run gets the peer's noise bitwise; a checkpoint's saved generator resumes it, as dropout's.
With packed rows L is the row's length, as in TRL's packing. Under --compile (where the length is a symbol of
the graph) the noise follows the same law, drawn as the graph draws it rather than bitwise the peer's.
"""

from __future__ import annotations

import functools
from typing import Any

import torch


@functools.lru_cache(maxsize=256)
def bound(alpha: float, length: int, width: int) -> float:
    """alpha / sqrt(length x width), computed as transformers computes it (a float32 square root), so that the noise
    is bitwise the HF Trainer's."""
    return float(alpha / torch.sqrt(torch.tensor(length * width)))


def _noisy(module: torch.nn.Module, inputs: Any, output: torch.Tensor) -> torch.Tensor:
    if not module.training:
        return output
    alpha, length, width = module.neftune_noise_alpha, output.size(1), output.size(2)
    if torch.compiler.is_compiling():  # the length is a symbol in the graph: the same noise's law, from its symbol
        return output + torch.empty_like(output).uniform_(-1.0, 1.0) * (alpha / (length * width) ** 0.5)
    mag = bound(alpha, length, width)
    return output + torch.zeros_like(output).uniform_(-mag, mag)


def attach(model: Any, alpha: float) -> str:
    """Hook NEFTune's noise onto `model`'s input embeddings (a LoRA model's base's); returns what was done, for the
    log. Hooked after the embeddings' own hooks (a table kept in bf16 casts its lookups back to fp32 first)."""
    embeddings = model.get_input_embeddings()
    embeddings.neftune_noise_alpha = float(alpha)
    embeddings.register_forward_hook(_noisy)
    width = getattr(embeddings, "embedding_dim", "d")
    return (
        f"NEFTune: in training, noise uniform in ±{alpha:g}/sqrt(length x {width}) on the input embeddings "
        f"({type(embeddings).__name__}); evaluation reads them clean"
    )
