"""The attention mask a transformers model builds for a batch, built without reading the device.

In eager mode transformers reads the batch once per forward to choose its attention path: a 2D padding mask's
`mask.all()` (no padding: no mask at all, `masking_utils._ignore_*_mask_sdpa`), or, for rows of packed documents
given as `position_ids`, whether any row holds more than one document (`find_packed_sequence_indices`). Each read
is a host sync, which makes a GPU wait for the host. leantrain knows both answers on the host (the batch's CPU
tensors, read while collating: `BatchFacts`), so it hands the model what the read would have led to:
- a padded batch: the 4D mask the model's own `create_bidirectional_mask`/`create_causal_mask` builds, its skip
  turned off (transformers passes a 4D mask through as it is); a batch without padding: no mask;
- packed rows: the causal mask kept within each document, built from the positions on the device; rows of one
  document each (no row's positions restart, or no positions given): transformers' search for documents answers
  "none" without looking (`_one_document_rows`), which a decoder makes whenever it gets no mask.

An encoder-decoder's masks are made inside its stacks (the encoder's, the cross-attention's, the decoder's causal
one), so it is not handed masks: transformers' checks of whether a mask hides anything answer from the host's facts
instead (`_known_padding`: the sources' padding as collated; the decoder's none, as the tasks give it no mask and
the model makes one of ones).

The models a task runs beside the trained one on the same batches (a preference task's frozen reference:
`Task.frozen_models`) get masks of their own, and sub-batches a batch carries (KTO's mismatched completions) theirs
(`TrainingContext.host_masks`).

Under SDPA the boolean mask goes in as the additive one SDPA would make of it (0 and -inf in the queries' dtype), made
once a forward rather than once a layer (two `scalar_tensor` and a `where` per layer: a hundredth of a small model's
step on a CPU).

Only where that gives the model's own results: SDPA or eager attention (eager's additive mask in the dtype of the
input embeddings), no sliding-window layers, and a probe at the start, in the run's autocast, that compares with the
model's own forward bitwise.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch

from leantrain.model.freezing import OUTPUT_FP32

#: the probe batch: 2 rows of 8 tokens; the second padded after 5, or holding two documents of 5 and 3
_PROBE_LENGTH, _PROBE_SPLIT = 8, 5


class HostKnownMask:
    """A forward pre-hook on the model: within `for_batch`, the model's calls get the masks transformers would have
    made of their `attention_mask` or `position_ids`, made from the host's facts; outside it (evaluation, a task's
    own batches) they are left as they are."""

    def __init__(
        self,
        model: torch.nn.Module,
        causal: bool,
        packs: bool,
        additive: torch.dtype | None = None,
        encoder_decoder: bool = False,
    ) -> None:
        self.model, self.causal, self.packs = model, causal, packs
        self.additive = additive  # SDPA: boolean masks handed over as additive ones in this dtype
        self.encoder_decoder = encoder_decoder  # masks made by the model, its checks answered (`_known_padding`)
        self.padded: bool | None = None
        self.packed: bool | None = None
        #: an encoder-decoder's call gave the decoder a mask of its own (whose padding the host does not know)
        self.decoder_masked = False
        model.register_forward_pre_hook(self._prepare, with_kwargs=True)

    @classmethod
    def attach(cls, model: torch.nn.Module, autocast=contextlib.nullcontext) -> HostKnownMask | None:
        """The hook on `model`, or None where it cannot be shown to give the model's own outputs (checked in the
        `autocast` the model trains in)."""
        config = getattr(model, "config", None)
        if config is None or getattr(config, "_attn_implementation", None) not in ("sdpa", "eager"):
            return None  # flash attention and flex take masks of other kinds
        if getattr(config, "sliding_window", None) is not None:
            return None  # sliding layers take masks of their own
        if any(kind != "full_attention" for kind in getattr(config, "layer_types", None) or ()):
            return None
        if getattr(config, "is_encoder_decoder", False):
            return cls(model, False, False, encoder_decoder=True) if _probe_encoder_decoder(model, autocast) else None
        for causal in (False, True):
            if _probe(model, autocast, causal):
                packs = causal and _probe(model, autocast, causal, packed=True)
                return cls(model, causal, packs, _additive_dtype(model, autocast, causal, packs))
        return None

    @contextlib.contextmanager
    def for_batch(self, padded: bool | None, packed: bool | None):
        """Within: the model's calls are of a batch padded (and packed) or not as the host knows (`padded` None: no
        2D mask; `packed` None: no positions given, or rows that start past 0 without restarting: not packed either)."""
        self.padded, self.packed = padded, packed
        known: contextlib.AbstractContextManager
        if self.encoder_decoder:
            known = _known_padding(padded, lambda: self.decoder_masked)
        else:
            known = _one_document_rows() if self.causal and not packed else contextlib.nullcontext()
        try:
            with known:
                yield
        finally:
            self.padded = self.packed = None

    def _prepare(self, module: torch.nn.Module, args: tuple, kwargs: dict[str, Any]):
        if self.encoder_decoder:
            self.decoder_masked = kwargs.get("decoder_attention_mask") is not None
            return None
        mask, positions = kwargs.get("attention_mask"), kwargs.get("position_ids")
        if isinstance(mask, torch.Tensor) and mask.dim() == 2 and self.padded is not None:
            made = _padded_mask(self.model, mask, self.causal) if self.padded else None
            kwargs["attention_mask"] = _as_additive(made, self.additive)
        elif mask is None and isinstance(positions, torch.Tensor) and self.packs and self.packed:
            kwargs["attention_mask"] = _as_additive(_packed_mask(self.model, positions), self.additive)
        else:
            return None
        return args, kwargs


@contextlib.contextmanager
def _one_document_rows():
    """Within: transformers' search for packed documents in a decoder's positions finds none, as the host knows
    (no row's positions restart); its answer, without the read of the device it makes to give it."""
    from transformers import masking_utils

    own = masking_utils.find_packed_sequence_indices
    masking_utils.find_packed_sequence_indices = lambda position_ids: None
    try:
        yield
    finally:
        masking_utils.find_packed_sequence_indices = own


@contextlib.contextmanager
def _known_padding(sources_padded: bool | None, decoder_masked=lambda: False):
    """Within: transformers' checks of whether an encoder-decoder's masks hide anything (to skip them for SDPA's own
    kernels) answer as they would have, from the host's facts rather than a read of each mask: the encoder's and the
    cross-attention's mask is the sources' (`sources_padded`: some position hidden; None: no mask given); the decoder's
    causal one hides nothing but the future (the tasks give it no mask; the model makes one of ones), unless the call
    gave it one (`decoder_masked()`), which is then read as transformers reads it."""
    from transformers import masking_utils

    bidirectional, causal = masking_utils._ignore_bidirectional_mask_sdpa, masking_utils._ignore_causal_mask_sdpa

    def sources(padding_mask, *args, **kwargs):
        return False if sources_padded else bidirectional(None, *args, **kwargs)

    def decoder(padding_mask, *args, **kwargs):
        return causal(padding_mask if decoder_masked() else None, *args, **kwargs)

    masking_utils._ignore_bidirectional_mask_sdpa, masking_utils._ignore_causal_mask_sdpa = sources, decoder
    try:
        yield
    finally:
        masking_utils._ignore_bidirectional_mask_sdpa, masking_utils._ignore_causal_mask_sdpa = bidirectional, causal


def _embeddings_like(model: torch.nn.Module, shape: torch.Size, device: torch.device) -> torch.Tensor:
    """What the mask functions read of the input embeddings: shape, device and dtype (eager's additive mask)."""
    getter = getattr(model, "get_input_embeddings", None)
    try:
        embeddings = getter() if callable(getter) else None
    except NotImplementedError:  # a model without an embedding table (wav2vec2's input is a waveform): fp32
        embeddings = None
    dtype = getattr(getattr(embeddings, "weight", None), "dtype", torch.float32)
    if getattr(embeddings, OUTPUT_FP32, False):  # a table kept in bf16, its lookups cast to fp32 (freezing)
        dtype = torch.float32
    return torch.empty(shape[0], shape[1], 0, dtype=dtype, device=device)


def _padded_mask(model: torch.nn.Module, mask: torch.Tensor, causal: bool) -> Any:
    """transformers' own 4D mask for the 2D padding `mask`, without its read of whether anything is padded."""
    from transformers import masking_utils

    embeds = _embeddings_like(model, mask.shape, mask.device)
    if causal:
        return masking_utils.create_causal_mask(model.config, embeds, mask, None, allow_is_causal_skip=False)
    return masking_utils.create_bidirectional_mask(model.config, embeds, mask, allow_is_bidirectional_skip=False)


def _packed_mask(model: torch.nn.Module, positions: torch.Tensor) -> Any:
    """The causal mask kept within each document of packed rows, the documents found on the device from where the
    positions restart (as `find_packed_sequence_indices` finds them, without its read), built by the attention's own
    mask function as `create_causal_mask` builds it for packed rows: by broadcasting (its vmap path, which a mask
    function passed to `create_causal_mask` would take, costs about 3 ms of host time a forward)."""
    from transformers import masking_utils

    first = positions[:, :1] - 1
    documents = (torch.diff(positions, prepend=first, dim=-1) != 1).cumsum(-1)
    within = masking_utils.and_masks(
        masking_utils.causal_mask_function, masking_utils.packed_sequence_mask_function(documents)
    )
    rows, length = positions.shape
    config: Any = model.config
    return masking_utils.ALL_MASK_ATTENTION_FUNCTIONS[config._attn_implementation](
        batch_size=rows, q_length=length, kv_length=length, q_offset=0, kv_offset=0, mask_function=within,
        attention_mask=None, allow_is_causal_skip=False, config=config, use_vmap=False, device=positions.device,
        dtype=_embeddings_like(model, positions.shape, positions.device).dtype,
    )  # fmt: skip


def _as_additive(mask: Any, dtype: torch.dtype | None) -> Any:
    """A boolean mask as SDPA's additive one (0 where attended, -inf elsewhere) in `dtype`; anything else as it is."""
    if dtype is None or not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool:
        return mask
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill_(mask.logical_not(), float("-inf"))


def _additive_dtype(model: torch.nn.Module, autocast, causal: bool, packs: bool) -> torch.dtype | None:
    """SDPA: the dtype its queries have in training (the first Linear's output, in the run's autocast), where masks
    handed over additive in it give the model's own outputs bitwise; else None (boolean masks, as transformers')."""
    config: Any = model.config
    linear = next((m for m in model.modules() if isinstance(m, torch.nn.Linear)), None)
    if config._attn_implementation != "sdpa" or linear is None:
        return None
    seen: list[torch.dtype] = []
    handle = linear.register_forward_hook(lambda module, args, out: seen.append(out.dtype))
    try:
        probed = _probe(model, autocast, causal)
    finally:
        handle.remove()
    if not (probed and seen):
        return None
    dtype = seen[0]
    if _probe(model, autocast, causal, additive=dtype) and (not packs or _probe(model, autocast, causal, True, dtype)):
        return dtype
    return None


def _probe(
    model: torch.nn.Module, autocast, causal: bool, packed: bool = False, additive: torch.dtype | None = None
) -> bool:
    """Whether the model's outputs are the same, bitwise at every real position, with the masks made here as with
    its own: a padded batch's (`causal` or not) and no mask for an unpadded one; with `packed`, the mask of packed
    rows, and rows of one document with transformers told so (`_one_document_rows`, as `for_batch` tells a decoder
    whenever no row restarts); with `additive`, those masks as SDPA's additive ones in that dtype. In evaluation
    mode, without a gradient, from fixed token ids."""
    vocab = int(getattr(model.config, "vocab_size", 0) or 0)
    if vocab < 2:
        return False
    device = next(model.parameters()).device
    ids = (torch.arange(2 * _PROBE_LENGTH, device=device).view(2, _PROBE_LENGTH) * 7 + 3) % (vocab - 1) + 1
    whole = torch.arange(_PROBE_LENGTH, device=device).expand(2, -1)
    if packed:
        positions = whole.clone()
        positions[1, _PROBE_SPLIT:] = torch.arange(_PROBE_LENGTH - _PROBE_SPLIT, device=device)
        packed_mask = _as_additive(_packed_mask(model, positions), additive)
        cases = [({"position_ids": positions}, {"position_ids": positions, "attention_mask": packed_mask})]
        cases.append(({"position_ids": whole}, {"position_ids": whole}))
    else:
        mask = torch.ones_like(ids)
        mask[1, _PROBE_SPLIT:] = 0
        cases = [
            ({"attention_mask": mask}, {"attention_mask": _as_additive(_padded_mask(model, mask, causal), additive)}),
            ({"attention_mask": torch.ones_like(ids)}, {"attention_mask": None}),
        ]
    # a decoder trains without a cache, as the tasks call it: with one, transformers does not look for documents
    extra = {"input_ids": ids, **({"use_cache": False} if causal else {})}
    was_training = model.training
    model.eval()
    try:
        outputs = []
        with torch.no_grad(), autocast():
            for given, made in cases:
                theirs = _first(model(**given, **extra))
                told = causal and not (packed and "attention_mask" in made)  # as `for_batch` runs such a batch
                with _one_document_rows() if told else contextlib.nullcontext():
                    outputs.append((theirs, _first(model(**made, **extra))))
    except Exception:  # a model that takes no 4D mask, or no mask at all: leave its calls alone
        return False
    finally:
        model.train(was_training)
    real = slice(None) if packed else slice(0, _PROBE_SPLIT)  # a padded row's padding positions are anyone's
    for own, ours in outputs:
        if own.shape != ours.shape:
            return False
        if own.dim() >= 3 and own.shape[1] == _PROBE_LENGTH:  # per token
            if not (torch.equal(own[0], ours[0]) and torch.equal(own[1, real], ours[1, real])):
                return False
        elif not torch.equal(own, ours):
            return False
    return True


def _probe_encoder_decoder(model: torch.nn.Module, autocast) -> bool:
    """Whether an encoder-decoder's outputs are the same, bitwise, with its mask checks answered from the host's
    facts (`_known_padding`) as with its own reads: a batch whose sources are padded and one whose are not, the
    decoder fed 5 tokens. In evaluation mode, without a gradient."""
    from transformers import masking_utils

    config: Any = model.config
    vocab = int(getattr(config, "vocab_size", 0) or getattr(getattr(config, "decoder", None), "vocab_size", 0) or 0)
    names = ("_ignore_bidirectional_mask_sdpa", "_ignore_causal_mask_sdpa")
    if vocab < 2 or not all(callable(getattr(masking_utils, name, None)) for name in names):
        return False
    device = next(model.parameters()).device
    ids = (torch.arange(2 * _PROBE_LENGTH, device=device).view(2, _PROBE_LENGTH) * 7 + 3) % (vocab - 1) + 1
    decoder_ids = ids[:, :_PROBE_SPLIT].flip(-1).contiguous()
    padded = torch.ones_like(ids)
    padded[1, _PROBE_SPLIT:] = 0
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad(), autocast():
            for mask, hides in ((padded, True), (torch.ones_like(ids), False)):
                given = dict(input_ids=ids, attention_mask=mask, decoder_input_ids=decoder_ids, use_cache=False)
                own = _first(model(**given))
                with _known_padding(hides):
                    ours = _first(model(**given))
                if not torch.equal(own, ours):
                    return False
    except Exception:  # a model that takes no such call: leave its calls alone
        return False
    finally:
        model.train(was_training)
    return True


def _first(outputs: Any) -> torch.Tensor:
    return outputs if isinstance(outputs, torch.Tensor) else outputs[0]
