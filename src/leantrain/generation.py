"""`leantrain predict` for a causal language model: completions of prompts, greedy or sampled."""

from __future__ import annotations

from typing import Any

from leantrain.errors import DataError, LeantrainError


def generate(
    path: str,
    prompts: list[str],
    *,
    max_new_tokens: int = 32,
    temperature: float | None = None,
    top_p: float | None = None,
    batch_size: int = 16,
    seed: int = 0,
    attention: str | None = None,
) -> list[dict[str, Any]]:
    """One row per prompt: the prompt and its completion (greedy without --temperature; sampled, from `seed`,
    with it, optionally from the smallest set of tokens whose probability reaches --top-p). `attention`: the run's
    --attention setting."""
    import torch
    from transformers import AutoModelForCausalLM

    from leantrain import models
    from leantrain.attention import apply_forced

    if max_new_tokens <= 0:
        raise LeantrainError(f"--max-new-tokens must be a positive integer, got {max_new_tokens}")
    if temperature is not None and temperature <= 0:
        raise LeantrainError(f"--temperature must be positive (leave it out for greedy decoding), got {temperature}")
    if top_p is not None and not (0 < top_p <= 1):
        raise LeantrainError(f"--top-p must be in (0, 1], got {top_p}")
    if top_p is not None and temperature is None:
        raise LeantrainError("--top-p samples: give --temperature too (e.g. 1.0), or leave both out for greedy")
    if not prompts:
        raise DataError("predict: no prompt to complete")
    tokenizer = models.load_tokenizer(path)
    tokenizer.padding_side = "left"  # generation continues each prompt from its last token
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    model = AutoModelForCausalLM.from_pretrained(path).eval()
    apply_forced(model, attention)  # the kernel the run forced with --attention, if it did
    sampling: dict[str, Any] = {"do_sample": False}
    if temperature is not None:
        sampling = {"do_sample": True, "temperature": temperature, "top_p": top_p or 1.0, "top_k": 0}
    torch.manual_seed(seed)
    out = []
    for start in range(0, len(prompts), batch_size):
        chunk = prompts[start : start + batch_size]
        enc = tokenizer(chunk, return_tensors="pt", padding=True)
        with torch.no_grad():
            ids = model.generate(**enc, max_new_tokens=max_new_tokens, pad_token_id=tokenizer.pad_token_id, **sampling)
        new = ids[:, enc["input_ids"].shape[1] :]
        texts = tokenizer.batch_decode(new, skip_special_tokens=True)
        out += [{"prompt": p, "completion": t} for p, t in zip(chunk, texts)]
    return out
