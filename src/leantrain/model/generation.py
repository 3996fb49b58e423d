"""Sampling completions from a causal LM while it trains: batched, with a KV cache, without autograd; and an
encoder-decoder's greedy generation (`greedy_pairs`), whose ended rows leave the batch likewise.

What an online-RL step needs, and what `model.generate` does not give: several completions per prompt whose
tokens depend on (the weights, the prompt, its seed) only, never on which other prompts share the batch, so that
the examples of a step do not depend on how it is split across micro-batches and processes, and a resumed run
samples them again exactly. Each prompt draws its uniforms from its own generator (one per completion per token,
inverse-CDF sampling), and a prompt's completions share one pass over it: the prompt is run once and its KV cache
repeated for its completions. Rows that end (EOS, or the length limit) leave the batch, so the rest run on fewer.

The model runs as it trains (its own weights, no copy; LoRA adapters on), in evaluation mode (no dropout), its
training mode restored after; prompts are left-padded, with position ids that start at each prompt's first token.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch


@dataclass(frozen=True)
class Sampling:
    """How completions are drawn: `temperature` None is greedy decoding."""

    max_new_tokens: int
    eos_token_ids: tuple[int, ...]
    pad_token_id: int
    temperature: float | None = 1.0
    #: sample from the smallest set of most likely tokens whose probability reaches top_p (1: all of them)
    top_p: float = 1.0


def sample(
    model: torch.nn.Module,
    prompts: Sequence[Sequence[int]],
    per_prompt: int,
    sampling: Sampling,
    seeds: Sequence[int] | None = None,
) -> list[list[int]]:
    """`per_prompt` completions of each prompt (token ids, prompt-major: prompt 0's first), each ending at its first
    EOS (kept) or after `sampling.max_new_tokens` tokens. `seeds`: one per prompt (needed unless greedy)."""
    from leantrain.parallel.precision import own_forward
    from leantrain.telemetry.flops import unwrap

    if sampling.temperature is not None and seeds is None:
        raise ValueError("sampling needs a seed per prompt")
    inner = unwrap(model)
    was_training = inner.training
    inner.eval()
    try:
        # no_grad, not inference_mode: under inference_mode autocast does not keep its casts of the weights from one
        # token's forward to the next (the caller's autocast around the generation: 1.3-1.4x faster measured in bf16)
        with torch.no_grad(), own_forward(inner):
            return _sample(inner, prompts, per_prompt, sampling, seeds)
    finally:
        inner.train(was_training)


class _Rows:
    """The rows still being generated: their ids in the output (prompt-major), attention masks and next positions."""

    def __init__(self, mask: torch.Tensor, next_positions: torch.Tensor):
        self.ids = torch.arange(mask.shape[0], device=mask.device)
        self.mask, self.next = mask, next_positions

    def keep(self, alive: torch.Tensor, cache) -> None:
        cache.batch_select_indices(alive)
        self.ids, self.mask, self.next = self.ids[alive], self.mask[alive], self.next[alive]

    def feed(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The attention mask and position ids for feeding each row its newest token."""
        self.mask = torch.cat([self.mask, self.mask.new_ones(self.mask.shape[0], 1)], 1)
        positions, self.next = self.next, self.next + 1
        return self.mask, positions


def cache_keyword(model: Any) -> str:
    """What the model's forward calls its KV cache: transformers 5.24 renamed `past_key_values` to `cache`."""
    import inspect

    base = model.get_base_model() if hasattr(model, "get_base_model") else model  # peft's wrapper passes it on
    return "cache" if "cache" in inspect.signature(type(base).forward).parameters else "past_key_values"


def _sample(model, prompts, per_prompt: int, sampling: Sampling, seeds) -> list[list[int]]:
    from transformers import DynamicCache

    device = next(model.parameters()).device
    ids, mask = left_padded(prompts, sampling.pad_token_id, device)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    cache = DynamicCache(config=model.config)
    with_cache = {cache_keyword(model): cache, "use_cache": True}
    logits = model(input_ids=ids, attention_mask=mask, position_ids=positions, logits_to_keep=1, **with_cache).logits
    logits = logits[:, -1]
    # one pass over each prompt, its cache repeated for its completions
    cache.batch_repeat_interleave(per_prompt)
    logits = logits.repeat_interleave(per_prompt, 0)
    rows = _Rows(mask.repeat_interleave(per_prompt, 0), positions[:, -1:].repeat_interleave(per_prompt, 0) + 1)
    draws = _Draws(seeds, per_prompt) if sampling.temperature is not None else None
    out: list[list[int]] = [[] for _ in range(len(prompts) * per_prompt)]
    eos = torch.tensor(sampling.eos_token_ids, device=device)
    for t in range(sampling.max_new_tokens):
        tokens = choose(logits, sampling, draws.uniforms(rows.ids).to(device) if draws is not None else None)
        for row, token in zip(rows.ids.tolist(), tokens.tolist()):
            out[row].append(token)
        ended = torch.isin(tokens, eos)
        if t + 1 == sampling.max_new_tokens or bool(ended.all()):
            break
        if bool(ended.any()):  # ended rows leave the batch (and the cache)
            alive = (~ended).nonzero().squeeze(1)
            rows.keep(alive, cache)
            tokens = tokens[alive]
        mask, positions = rows.feed()
        logits = model(input_ids=tokens[:, None], attention_mask=mask, position_ids=positions, **with_cache).logits
        logits = logits[:, -1]
    return out


def left_padded(prompts: Sequence[Sequence[int]], pad_token_id: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """Prompts as one left-padded batch: (ids, attention mask), each (prompts, longest prompt)."""
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for r, p in enumerate(prompts):
        if len(p):
            ids[r, width - len(p) :] = torch.as_tensor(list(p), dtype=torch.long)
            mask[r, width - len(p) :] = 1
    return ids.to(device), mask.to(device)


class _Draws:
    """Each prompt's own stream of uniforms: at every token, one per completion of the prompt, drawn whether or not
    that completion has ended, so a prompt's draws never depend on the other prompts of the batch."""

    def __init__(self, seeds: Sequence[int], per_prompt: int):
        self.generators = [torch.Generator().manual_seed(int(s)) for s in seeds]
        self.per_prompt = per_prompt

    def uniforms(self, rows: torch.Tensor) -> torch.Tensor:
        """This token's uniforms for the given output rows (prompt-major ids)."""
        prompts = sorted({r // self.per_prompt for r in rows.tolist()})
        drawn = {p: torch.rand(self.per_prompt, generator=self.generators[p], dtype=torch.float64) for p in prompts}
        return torch.stack([drawn[r // self.per_prompt][r % self.per_prompt] for r in rows.tolist()])


def choose(logits: torch.Tensor, sampling: Sampling, uniforms: torch.Tensor | None) -> torch.Tensor:
    """The next token of each row: the most likely (greedy), or drawn by inverting the cumulative distribution of
    softmax(logits / temperature) (within top_p) at each row's uniform."""
    if uniforms is None:
        return logits.argmax(-1)
    assert sampling.temperature is not None
    probs = torch.softmax(logits.double() / sampling.temperature, -1)
    order = None
    if sampling.top_p < 1.0:  # the most likely tokens whose mass reaches top_p (the first always kept)
        probs, order = probs.sort(-1, descending=True)
        probs = probs.masked_fill(probs.cumsum(-1) - probs >= sampling.top_p, 0.0)
    cdf = probs.cumsum(-1)
    at = torch.searchsorted(cdf, (uniforms * cdf[:, -1]).unsqueeze(1), right=True).squeeze(1)
    at = at.clamp(max=probs.shape[-1] - 1)
    return at if order is None else order.gather(1, at[:, None]).squeeze(1)


def greedy_pairs(
    model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor, start: int, eos: Sequence[int], pad: int,
    max_new_tokens: int,
) -> torch.Tensor:  # fmt: skip
    """An encoder-decoder's greedy generation, (sources, max_new_tokens) ids without the start token, each row
    padded with `pad` after its EOS: `model.generate`'s greedy search (its tokens: each step's most likely, read from
    the logits it reads) where no logits processor applies, with rows that end leaving the batch, as the sampler's
    do. `model.generate` runs every row until the last ends: half the rows' steps of a paraphrase evaluation
    (MRPC, 32 sources a batch) were rows already ended. The source is encoded once; the model runs as it is called
    (evaluation mode, under the caller's no_grad and autocast)."""
    from transformers.modeling_outputs import BaseModelOutput

    out = torch.full((input_ids.shape[0], max_new_tokens), pad, dtype=torch.long, device=input_ids.device)
    hidden = model.get_encoder()(input_ids=input_ids, attention_mask=attention_mask, return_dict=True)[0]
    rows = torch.arange(input_ids.shape[0], device=input_ids.device)
    tokens = torch.full((input_ids.shape[0], 1), start, dtype=torch.long, device=input_ids.device)
    ends = torch.tensor(list(eos), dtype=torch.long, device=input_ids.device)
    keyword = cache_keyword(model)  # the forward's and its output's name for the cache
    cache: dict[str, Any] = {}
    for t in range(max_new_tokens):
        outputs = model(
            encoder_outputs=BaseModelOutput(last_hidden_state=hidden), attention_mask=attention_mask,
            decoder_input_ids=tokens, use_cache=True, **cache,
        )  # fmt: skip
        cache = {keyword: outputs[keyword]}
        chosen = outputs.logits[:, -1].argmax(-1)  # as of the logits in fp32: the conversion is exact
        out[rows, t] = chosen
        ended = torch.isin(chosen, ends)
        if t + 1 == max_new_tokens or bool(ended.all()):
            break
        if bool(ended.any()):  # ended rows leave the batch (and the caches)
            alive = (~ended).nonzero().squeeze(1)
            cache[keyword].batch_select_indices(alive)
            hidden, attention_mask, rows, chosen = hidden[alive], attention_mask[alive], rows[alive], chosen[alive]
        tokens = chosen[:, None]
    return out
