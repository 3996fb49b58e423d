"""What every task that tunes a causal LM as a *policy* needs: preference tuning (DPO, KTO) and online RL alike.

Four pieces, each small:

- **Sequences** (`sequence_batch`, from `data.preferences`): prompt + completion token sequences as one batch for
  one forward, each sequence its own row (padded, with an attention mask) or several to a row (packed: position ids
  restart at each sequence, no attention mask, so transformers' packed-sequence detection keeps them apart).
  `labels` count the completion's tokens only (the prompt is masked, as instruction tuning masks it);
  `sequence_ids` say which sequence each token belongs to.
- **Log-probabilities** (`CompletionLogps`): a causal LM's log-probability of each sequence's completion, summed
  over its counted tokens (`SequenceLogps`: the sums, the token counts, and every counted token's own value). The
  output head runs only at the positions whose next token counts (never at the prompt, padding or a sequence's
  last token), fused with its log-softmax where the model allows (`losses.head_token_logps`: chunks of rows, the
  (rows, vocabulary) logits never whole); else the head's rows are cut; else the full logits.
- **The reference model** (`Reference`), the frozen policy a tuned policy is compared with, in one of three forms
  behind one method (`logps(model, batch)`): `AdaptersOff` (with LoRA, the model itself with its adapters
  disabled: no second copy of the weights), `Precomputed` (log-probabilities computed once before training,
  `precompute`, read from the batch: no reference model in memory while training), `FrozenCopy` (a copy of the
  initial model in the run's precision); `NoReference` for reference-free losses.
- **Rendering** (`encode_prompt`, `encode_completion`, `shared_prompt`, from `data.instructions`): plain text, or
  chat messages rendered with the model's chat template; a completion's tokens follow the prompt's exactly as
  generation continues them.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from leantrain.data.instructions import encode_completion, encode_prompt, shared_prompt
from leantrain.data.preferences import sequence_batch
from leantrain.tasks.base import same_logits
from leantrain.tasks.causal_lm import IGNORE, head_rows, head_rows_work, next_token_targets

__all__ = [
    "AdaptersOff",
    "CompletionLogps",
    "FrozenCopy",
    "NoReference",
    "Precomputed",
    "Reference",
    "SequenceLogps",
    "Unchanged",
    "encode_completion",
    "encode_prompt",
    "precompute",
    "sequence_batch",
    "shared_prompt",
]

#: the model inputs a sequence batch holds
MODEL_INPUTS = ("input_ids", "attention_mask", "position_ids")


# -- log-probabilities -----------------------------------------------------------------------------------------
@dataclass
class SequenceLogps:
    """A causal LM's log-probabilities of a batch's completions."""

    #: (sequences,) fp32: each completion's log-probability, summed over its counted tokens
    total: torch.Tensor
    #: (sequences,): counted tokens of each completion
    tokens: torch.Tensor
    #: (counted tokens,) fp32: each counted token's log-probability, in row-major order of the batch's positions
    per_token: torch.Tensor
    #: (counted tokens,): the sequence each counted token belongs to
    sequence: torch.Tensor

    @property
    def mean(self) -> torch.Tensor:
        """Each completion's log-probability per counted token."""
        return self.total / self.tokens.clamp(min=1)


@contextlib.contextmanager
def head_logps(
    model: torch.nn.Module, keep: torch.Tensor, targets: torch.Tensor, temperature: float = 1.0
) -> Iterator[None]:
    """Within: the model's output head returns the log-probability of `targets` at the positions `keep` marks
    (row-major), fused with its log-softmax (`losses.head_token_logps`), in place of logits; with `temperature`, of
    softmax(logits / temperature) (the head's input and bias scaled: the same logits / temperature)."""
    from leantrain.model.losses import head_token_logps
    from leantrain.telemetry.flops import unwrap

    head = unwrap(model).get_output_embeddings()
    if temperature == 1.0:
        head.forward = lambda hidden: head_token_logps(hidden[keep], head.weight, head.bias, targets)
    else:
        head.forward = lambda hidden: head_token_logps(
            hidden[keep] / temperature, head.weight, None if head.bias is None else head.bias / temperature, targets
        )
    try:
        yield
    finally:
        del head.forward


def head_logps_work(model: Any) -> bool:
    """Whether `head_logps` gives the log-softmax of the model's own logits at the chosen positions: a plain linear
    head whose output the model hands on unchanged. One short row, fused against the model's logits."""
    from leantrain.telemetry.flops import unwrap

    head = getattr(unwrap(model), "get_output_embeddings", lambda: None)()
    if type(head) is not torch.nn.Linear:
        return False
    vocab = int(unwrap(model).config.vocab_size)
    ids = ((torch.arange(6) * 7 + 3) % vocab).unsqueeze(0).to(head.weight.device)
    keep = torch.tensor([[False, True, True, False, True, False]], device=ids.device)
    targets = ids[keep].flip(0)

    def fused() -> torch.Tensor:
        with head_logps(model, keep, targets):
            return model(input_ids=ids, use_cache=False).logits

    def whole() -> torch.Tensor:
        logits = model(input_ids=ids, use_cache=False).logits[keep]
        return torch.log_softmax(logits.float(), -1).gather(1, targets[:, None]).squeeze(1)

    return same_logits(model, whole, fused)


class CompletionLogps:
    """Computes `SequenceLogps` of sequence batches with one model (see the module doc); `mode` says how, chosen once
    from the model as it will run: "fused" (the head fused with its log-softmax at the counted positions), "rows"
    (the head at the counted positions only) or "full" (every position's logits). `compiled`: a compiled model keeps
    one graph, so every position's logits. `temperature`: the log-probabilities of softmax(logits / temperature), the
    distribution completions are sampled from."""

    def __init__(self, model: torch.nn.Module, compiled: bool = False, temperature: float = 1.0):
        self.temperature = temperature
        if compiled or not head_rows_work(model):
            self.mode = "full"
        else:
            self.mode = "fused" if head_logps_work(model) else "rows"

    def __call__(self, model: torch.nn.Module, batch: dict[str, Any]) -> SequenceLogps:
        targets = next_token_targets(batch["labels"])
        keep = targets != IGNORE
        wanted = targets[keep]
        owner = next_token_targets(batch["sequence_ids"])[keep]
        inputs = {k: batch[k] for k in MODEL_INPUTS if k in batch}
        if self.mode == "fused":
            with head_logps(model, keep, wanted, self.temperature):
                per_token = model(**inputs, use_cache=False).logits
        else:
            with head_rows(model, keep) if self.mode == "rows" else contextlib.nullcontext():
                logits = model(**inputs, use_cache=False).logits
            if self.mode == "full":
                logits = logits[keep]
            logits = logits.float() if self.temperature == 1.0 else logits.float() / self.temperature
            per_token = torch.log_softmax(logits, -1).gather(1, wanted[:, None]).squeeze(1)
        # the batch's sequences: one `sequence_index` each, a shape the host knows (reading the ids' max is a sync)
        index = batch.get("sequence_index")
        count = int(index.shape[0]) if index is not None else int(batch["sequence_ids"].max()) + 1
        total = per_token.new_zeros(count).index_add(0, owner, per_token)
        tokens = torch.bincount(owner, minlength=count)
        return SequenceLogps(total, tokens, per_token, owner)

    def rows_of(self, batch: dict[str, Any]) -> int | None:
        """On how many rows the head runs (FLOP counting); None: every position's."""
        return None if self.mode == "full" else int((next_token_targets(batch["labels"]) != IGNORE).sum())


# -- the reference model ---------------------------------------------------------------------------------------
class Reference:
    """The frozen model a policy is compared with: `logps(model, batch)` gives its log-probability of each of the
    batch's completions, (sequences,) fp32, without gradients. `model` is the policy being trained."""

    #: how it is held: "adapters-off", "precomputed", "frozen-copy", "none"
    kind: ClassVar[str]

    def logps(self, model: torch.nn.Module, batch: dict[str, Any]) -> torch.Tensor:
        raise NotImplementedError

    def describe(self) -> str:
        raise NotImplementedError

    def token_logps(self, model: torch.nn.Module, batch: dict[str, Any]) -> torch.Tensor:
        """Its log-probability of each counted token of the batch (`SequenceLogps.per_token`'s order), fp32, without
        gradients: what a per-token penalty (online RL's KL) compares with."""
        raise NotImplementedError(f"the {self.kind} reference keeps no per-token log-probabilities")


@contextlib.contextmanager
def evaluating(model: torch.nn.Module) -> Iterator[None]:
    """Within: `model` in evaluation mode (no dropout), without gradients; its mode restored after."""
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            yield
    finally:
        model.train(was_training)


class AdaptersOff(Reference):
    """With LoRA: the policy itself, its adapters disabled (peft's `disable_adapter`), in evaluation mode. The base is
    frozen, so this is the initial model at every step, and no weight is held twice."""

    kind = "adapters-off"

    def __init__(self, computer: CompletionLogps):
        self.computer = computer

    def logps(self, model: torch.nn.Module, batch: dict[str, Any]) -> torch.Tensor:
        from leantrain.telemetry.flops import unwrap

        peft_model = unwrap(model)
        with evaluating(peft_model), peft_model.disable_adapter():
            return self.computer(peft_model, batch).total

    def describe(self) -> str:
        return "the reference is the model with its LoRA adapters disabled (no second copy of the weights)"

    def token_logps(self, model: torch.nn.Module, batch: dict[str, Any]) -> torch.Tensor:
        from leantrain.telemetry.flops import unwrap

        peft_model = unwrap(model)
        with evaluating(peft_model), peft_model.disable_adapter():
            return self.computer(peft_model, batch).per_token


class FrozenCopy(Reference):
    """A copy of the initial policy, frozen, in evaluation mode, its weights in `dtype` (the run's precision)."""

    kind = "frozen-copy"

    def __init__(self, model: torch.nn.Module, dtype: torch.dtype, compiled: bool = False):
        from leantrain.parallel import sharding
        from leantrain.telemetry.flops import unwrap

        policy = unwrap(model)
        if sharding.is_sharded(policy):  # --shard fsdp: sharded alike, each process holding its part
            self.model = sharding.frozen_copy(policy, dtype)
        else:
            self.model = copy.deepcopy(policy).to(dtype).eval()
            self.model.requires_grad_(False)
        self.dtype = dtype
        self.computer = CompletionLogps(self.model, compiled=compiled)

    def autocast(self):
        """Its weights are in the run's precision already; autocast runs its matmuls as the policy's run."""
        device = next(self.model.parameters()).device.type
        low = self.dtype in (torch.bfloat16, torch.float16)
        return torch.autocast(device, dtype=self.dtype) if low else contextlib.nullcontext()

    def logps(self, model: torch.nn.Module, batch: dict[str, Any]) -> torch.Tensor:
        with torch.no_grad(), self.autocast():
            return self.computer(self.model, batch).total

    def describe(self) -> str:
        from leantrain.telemetry.memory import tensor_bytes

        size = tensor_bytes(self.model.parameters()) / 2**20
        return f"the reference is a frozen copy of the initial model ({size:,.1f} MiB of {str(self.dtype)[6:]} weights)"

    def token_logps(self, model: torch.nn.Module, batch: dict[str, Any]) -> torch.Tensor:
        with torch.no_grad():
            return self.computer(self.model, batch).per_token


class Precomputed(Reference):
    """Log-probabilities computed before training (`precompute`) and carried by each batch as `reference_logps`
    (sequences,): nothing to hold or run while training."""

    kind = "precomputed"

    def logps(self, model: torch.nn.Module, batch: dict[str, Any]) -> torch.Tensor:
        return batch["reference_logps"].float()

    def describe(self) -> str:
        return "the reference's log-probabilities were computed once before training (no reference model in memory)"


class Unchanged(Reference):
    """The policy itself as it is now, in evaluation mode: before training, what `precompute` reads (the initial model)
    without a copy of it."""

    kind = "initial"

    def __init__(self, computer: CompletionLogps):
        self.computer = computer

    def logps(self, model: torch.nn.Module, batch: dict[str, Any]) -> torch.Tensor:
        from leantrain.telemetry.flops import unwrap

        inner = unwrap(model)
        with evaluating(inner):
            return self.computer(inner, batch).total

    def describe(self) -> str:
        return "the initial model"


class NoReference(Reference):
    """A reference-free loss (SimPO, ORPO): nothing to compare with."""

    kind = "none"

    def logps(self, model: torch.nn.Module, batch: dict[str, Any]) -> torch.Tensor:
        raise RuntimeError("a reference-free loss has no reference log-probabilities")

    def describe(self) -> str:
        return "reference-free loss: no reference model"


def precompute(
    reference: Reference,
    model: torch.nn.Module,
    batches: Iterable[dict[str, Any]],
    autocast: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext,
) -> dict[int, float]:
    """`reference`'s log-probability of every sequence in `batches` (each batch's `sequence_index` (sequences,) names
    its sequences): {sequence index: log-probability}."""
    out: dict[int, float] = {}
    for batch in batches:
        with autocast():
            values = reference.logps(model, batch)
        for index, value in zip(batch["sequence_index"].tolist(), values.double().cpu().tolist()):
            out[int(index)] = value
    return out
