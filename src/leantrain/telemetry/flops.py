"""Model FLOPs of a training step, and model FLOPs utilisation (MFU).

Every model here is summarised as a per-sequence polynomial in the sequence length s:

    FLOPs(one sequence of length s, forward + backward) = per_sequence + per_token * s + per_token_sq * s**2

so a batch costs  B * per_sequence + per_token * sum(s_i) + per_token_sq * sum(s_i**2).
A padded batch of B rows of S tokens has s_i = S for every row: what the device computed on.
The same polynomial over the rows' real lengths gives the useful FLOPs (padding excluded).

BERT-like encoders: the closed form (`encoder_flop_model`)
-----------------------------------------------------------
A matrix multiply of an (m x k) by a (k x n) matrix costs 2*m*k*n FLOPs (a multiply and an add per
term). For a linear layer applied to T tokens that is 2 * T * (its weight count) in the forward pass.
The backward pass does two such products, one for the input gradient and one for the weight
gradient: 4 * T * weights. Forward + backward: 6 FLOPs per parameter per token (Kaplan et al. 2020,
"Scaling laws"; the PaLM paper's MFU uses the same count).

Per encoder layer (hidden h, feed-forward width i) the parameters are
    attention   Q, K, V, output projections   4 * (h*h + h)
    feed-forward in and out                   h*i + i + i*h + h
    two LayerNorms                            2 * 2*h
    total                                     4h^2 + 2hi + 9h + i
and they act on every token: 6 * layers * (4h^2 + 2hi + 9h + i) FLOPs per token. Biases and norms
are elementwise work, counted at the same 6 FLOPs per parameter by convention ("6 x non-embedding
parameters"); they are (9h + i) / (4h^2 + 2hi) of the total: 0.3% for MiniLM-L6, 2% for a 64-wide
test model.

Attention itself has no parameters but two matrix products per layer and sequence, whatever the
number of heads (heads * head_dim = h):
    scores  Q K^T   (s x h) @ (h x s)   2 * s^2 * h
    context P V     (s x s) @ (s x h)   2 * s^2 * h
    forward 4 * s^2 * h, backward twice that: 12 * layers * h * s^2 per sequence (fwd + bwd).
Softmax, masking and dropout are elementwise and not counted. Fused attention kernels (flash,
memory-efficient SDPA) recompute Q K^T in the backward pass: the device then does 14 rather than
12 * h * s^2, but MFU counts the model's FLOPs, not re-computation (nor activation checkpointing's).

Embeddings are table look-ups (no FLOPs); their backward is a scatter-add (not counted). The
position and type embeddings and the embedding LayerNorm are left out with them. ELECTRA-style
models whose embedding width e differs from h add a projection: 6 * (e*h + h) per token.

A token classifier's head is a h x C layer at every token: 6 * (hC + C) more per token, nothing per sequence.

The classification head acts on one vector per sequence (BERT's pooler on [CLS], RoBERTa's and
ELECTRA's dense layer on <s>, DistilBERT's pre-classifier): a dense h x h layer then h x C to the
C labels, 6 * (h^2 + h + h*C + C) per sequence.

So, for L layers:  per_token = 6 L (4h^2 + 2hi + 9h + i),  per_token_sq = 12 L h,
                   per_sequence = 6 (h^2 + h + hC + C).
For MiniLM-L6 (h 384, i 1536, L 6): 63.9 MFLOP per token, plus 27.6 kFLOP * s of attention
(65.5 MFLOP per token at s = 60).

Frozen weights (LoRA, a frozen encoder) get no weight gradient: a frozen layer's backward is the input
gradient alone (4 FLOPs per weight per token, not 6), or nothing where its input needs no gradient either. The
closed form assumes every weight trains, so such models are counted instead (below), which follows autograd.

Encoder-decoders: counted in two lengths (`pair_flop_model`)
-----------------------------------------------------------
A sequence-to-sequence example has a source of s tokens (the encoder's) and a target of t (the decoder's): the
encoder's layers cost in s and s**2, the decoder's self-attention and feed-forward in t and t**2, its
cross-attention's keys and values in s and its scores in s * t. So

    FLOPs(s, t) = per_sequence + per_token * s + per_token_sq * s**2
                  + per_target_token * t + per_target_token_sq * t**2 + per_token_pair * s * t

six coefficients, which six FlopCounterMode counts fix exactly.

Any other model: counted (`counted_flop_model`)
------------------------------------------------
`torch.utils.flop_counter.FlopCounterMode` counts the matrix products (mm, addmm, bmm, attention,
convolutions) of one forward and backward pass. It runs on a copy of the model built on the meta
device (shapes only: no memory, no arithmetic), at three sequence lengths; three counts fix the
three coefficients of the polynomial exactly. The copy runs without SpecAugment and LayerDrop (`_unmasked`), and
a grouped convolution's weight gradient is counted once, not once per group as torch's formula does.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

# Encoders the closed form describes: post-LN or pre-LN transformer layers with one dense
# feed-forward, absolute positions, and a one-vector classification head.
ENCODER_TYPES = frozenset({"bert", "roberta", "xlm-roberta", "camembert", "electra", "distilbert"})


@dataclass(frozen=True)
class FlopModel:
    """FLOPs of one training pass (forward + backward) as a polynomial in the sequence length."""

    per_sequence: float
    per_token: float
    per_token_sq: float
    source: str  # how the figures were obtained, for the report
    #: the share of `per_token` of the model's tail (a language model's output head, an encoder's last layer after
    #: its attention), for tasks that run the tail on fewer rows than tokens (`Task.tail_rows`)
    tail_per_row: float = 0.0
    #: an encoder-decoder's terms in its target length t (and source length s, cross-attention): per_target_token *
    #: t + per_target_token_sq * t**2 + per_token_pair * s * t; 0 for a model of one sequence
    per_target_token: float = 0.0
    per_target_token_sq: float = 0.0
    per_token_pair: float = 0.0

    def target_flops(self, seq_len: int, target_len: int) -> float:
        """An encoder-decoder example's FLOPs in its target (and cross-attention), beyond its source's."""
        t = target_len
        return self.per_target_token * t + self.per_target_token_sq * t * t + self.per_token_pair * seq_len * t

    def sequence_flops(self, lengths: Sequence[int]) -> float:
        """FLOPs for sequences of the given lengths (padded or real)."""
        n = len(lengths)
        total = sum(lengths)
        squares = sum(s * s for s in lengths)
        return n * self.per_sequence + self.per_token * total + self.per_token_sq * squares

    def batch_flops(self, batch_size: int, seq_len: int) -> float:
        """FLOPs for a padded (batch_size x seq_len) batch: what the device computes on."""
        return batch_size * (self.per_sequence + self.per_token * seq_len + self.per_token_sq * seq_len * seq_len)

    def per_padded_token(self, seq_len: int) -> float:
        """FLOPs per token at this padded length (for messages: 'N MFLOP per token'); an encoder-decoder's per
        token of a source and a target of this length each."""
        single = self.per_sequence / seq_len + self.per_token + self.per_token_sq * seq_len
        if not self.per_target_token:
            return single
        return (single * seq_len + self.target_flops(seq_len, seq_len)) / (2 * seq_len)


def _get(config: Any, *names: str) -> Any:
    for name in names:
        value = getattr(config, name, None)
        if value is not None:
            return value
    raise ValueError(f"{type(config).__name__} has none of {names}")


def is_encoder_config(config: Any) -> bool:
    return getattr(config, "model_type", None) in ENCODER_TYPES


def encoder_flop_model(config: Any, num_labels: int | None = None, head: str = "sequence") -> FlopModel:
    """The closed form above, from a BERT-like config (hidden size, layers, feed-forward width). `head`: "sequence"
    (one vector per sequence: a dense layer, then the labels) or "token" (the labels at every token, no dense
    layer: a token classifier's)."""
    h = int(_get(config, "hidden_size", "dim"))
    layers = int(_get(config, "num_hidden_layers", "n_layers"))
    i = int(_get(config, "intermediate_size", "hidden_dim"))
    labels = int(num_labels if num_labels is not None else getattr(config, "num_labels", 2))
    layer_params = 4 * h * h + 2 * h * i + 9 * h + i
    per_token = 6 * layers * layer_params
    embedding = getattr(config, "embedding_size", None)
    if embedding and int(embedding) != h:  # ELECTRA's embeddings_project
        per_token += 6 * (int(embedding) * h + h)
    per_token_sq = 12 * layers * h
    per_sequence = 6 * (h * h + h + h * labels + labels)
    if head == "token":
        per_token += 6 * (h * labels + labels)
        per_sequence = 0
    kind = getattr(config, "model_type", "encoder")
    return FlopModel(
        per_sequence=float(per_sequence),
        per_token=float(per_token),
        per_token_sq=float(per_token_sq),
        source=f"formula: {kind}, {layers} layers, hidden {h}, feed-forward {i}, {labels} labels",
    )


def has_frozen_weights(model) -> bool:
    """Some parameters train and some do not (LoRA, a frozen encoder): their weight gradients are never computed."""
    flags = {p.requires_grad for p in model.parameters()}
    return flags == {True, False}


def _meta_copy(model):
    """The model rebuilt on the meta device: from its config for Transformers models, else a deep copy. A model
    with frozen weights (LoRA) is copied module by module with every tensor replaced by a meta one of the same
    shape and `requires_grad`, so nothing is copied and autograd skips the same weight gradients."""
    import copy

    import torch

    from leantrain.parallel.sharding import own_class

    cls = own_class(model)
    if has_frozen_weights(model) and cls is type(model):
        memo: dict[int, Any] = {
            id(p): torch.nn.Parameter(torch.empty_like(p, device="meta"), requires_grad=p.requires_grad)
            for p in model.parameters()
        }
        memo |= {id(b): torch.empty_like(b, device="meta") for b in model.buffers()}
        clone = copy.deepcopy(model, memo)
        clone.train()
        return _unmasked(clone)
    config = getattr(model, "config", None)
    if config is not None and hasattr(cls, "config_class"):
        config = copy.deepcopy(config)
        with torch.device("meta"):
            clone = cls(config)
        # a sharded model cannot be deep-copied: what it freezes (--freeze) is carried over by name
        trains = {name: p.requires_grad for name, p in model.named_parameters()}
        for name, p in clone.named_parameters():
            p.requires_grad_(trains.get(name, True))
    else:
        clone = copy.deepcopy(model).to("meta")
    clone.train()
    return _unmasked(clone)


def _unmasked(clone):
    """`clone` (a copy: its config is its own) without SpecAugment and LayerDrop (wav2vec2, HuBERT, WavLM): masking
    frames indexes with `nonzero`, which the meta device cannot run, and LayerDrop skips layers at random. Neither
    is matrix work; the count is the whole model's, every step alike."""
    for module in clone.modules():
        config = getattr(module, "config", None)
        if getattr(config, "apply_spec_augment", False):
            config.apply_spec_augment = False
        if getattr(config, "layerdrop", 0):
            config.layerdrop = 0.0
    return clone


class _Total:
    """What torch's FlopCounterMode keeps, less its module tracking (hooks on every module's forward and backward, a
    walk of the module stack at each operator: a third of a meta-device count's time): its registry of formulas,
    one total."""

    def __init__(self):
        import torch
        from torch.utils.flop_counter import flop_registry

        self.flop_registry = dict(flop_registry)
        backward = torch.ops.aten.convolution_backward
        if backward in self.flop_registry:
            self.flop_registry[backward] = _grouped_conv_backward(self.flop_registry[backward])
        self.total = 0

    def _count_flops(self, func_packet, out, args, kwargs):  # torch's FlopCounterMode._count_flops, one total
        formula = self.flop_registry.get(func_packet)
        if formula is not None:
            self.total += formula(*args, **kwargs, out_val=out)
        return out

    def get_total_flops(self) -> int:
        return self.total


def _grouped_conv_backward(formula):
    """torch's count of a convolution's backward, its weight gradient divided by the groups: torch's formula leaves
    the groups out of that term, counting a grouped convolution's (wav2vec2's positional one: 16 groups) 16 times."""

    def count(*args, out_val, **kwargs):
        if len(args) != 11 or kwargs:  # (grad_out, input, weight, bias, stride, padding, dilation, transposed,
            return formula(*args, out_val=out_val, **kwargs)  # output_padding, groups, output_mask), else as torch
        *head, groups, (want_input, want_weight, want_bias) = args
        inputs = formula(*head, groups, [want_input, False, want_bias], out_val=out_val)
        weights = formula(*head, groups, [False, want_weight, False], out_val=out_val)
        return inputs + weights // max(int(groups), 1)

    return count


#: operators that read a tensor's layout, which torch's counting mode declines (returns NotImplemented for)
QUERIES = frozenset(
    f"aten::{name}"
    for name in ("sym_is_contiguous", "is_contiguous", "is_strides_like_format", "is_non_overlapping_and_dense",
                 "size", "sym_size", "stride", "sym_stride", "storage_offset", "sym_storage_offset", "numel",
                 "sym_numel", "dim")
) | {"prim::layout"}  # fmt: skip


@contextlib.contextmanager
def counting():
    """A FLOP count of what runs inside: `with counting() as counter: ...; counter.get_total_flops()`. torch's own
    counting dispatch (`_FlopCounterMode`) keeping a `_Total`; `FlopCounterMode` itself where torch lacks it."""
    try:
        from torch.utils.flop_counter import _FlopCounterMode
    except ImportError:
        from torch.utils.flop_counter import FlopCounterMode

        with FlopCounterMode(display=False) as counter:
            yield counter
        return
    import torch

    implicit = torch._C.DispatchKey.CompositeImplicitAutograd
    decomposes: dict[Any, bool] = {}

    class Mode(_FlopCounterMode):
        """torch's dispatch, which first tries to decompose each operator (entering the mode again to run the
        parts), less that try where the operator has no decomposition: the same operators run and are counted."""

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            delegate = decomposes.get(func)
            if delegate is None:
                delegate = decomposes[func] = (
                    not isinstance(func, torch._ops.OpOverload)
                    or func.name() in QUERIES  # torch's mode declines these
                    or implicit in func.py_kernels
                    or torch._C._dispatch_has_kernel_for_dispatch_key(func.name(), implicit)
                )
            if delegate:
                return super().__torch_dispatch__(func, types, args, kwargs)
            kwargs = kwargs or {}
            out = func(*args, **kwargs)
            return self.counter._count_flops(func._overloadpacket, out, args, kwargs)

    total = _Total()
    with Mode(total):
        yield total


def count_flops(model, seq_len: int, batch_size: int = 1) -> int:
    """FlopCounterMode's count of one forward and backward pass on a meta-device copy of `model`.

    `model` may itself be a meta-device copy (from `_meta_copy`). Tries `input_ids`, then
    `inputs_embeds` (models whose forward reads values, such as a pad-token check, fail on meta
    tensors; embeddings cost no FLOPs, so the count is the same). The embeddings are trainable, so
    the inputs of the first layer need gradients too.
    """
    import torch

    def run(**inputs):
        with counting() as counter:
            out = model(**inputs)
            logits = out.logits if hasattr(out, "logits") else out[0] if isinstance(out, (tuple, list)) else out
            logits.float().sum().backward()
        return counter.get_total_flops()

    ids = torch.zeros(batch_size, seq_len, dtype=torch.long, device="meta")
    try:
        return run(input_ids=ids)
    except (RuntimeError, NotImplementedError, TypeError, ValueError):
        hidden = model.get_input_embeddings().embedding_dim
        embeds = torch.zeros(batch_size, seq_len, hidden, device="meta", requires_grad=True)
        return run(inputs_embeds=embeds)


def _class_name(model) -> str:
    from leantrain.parallel.sharding import own_class

    return own_class(model).__name__


def counted_flop_model(model, lengths: tuple[int, int, int] = (16, 32, 64)) -> FlopModel:
    """Fit the polynomial to FlopCounterMode counts at three sequence lengths (exact for transformers)."""
    import numpy as np

    clone = _meta_copy(model)
    counts = [float(count_flops(clone, s)) for s in lengths]
    a = np.array([[1.0, s, s * s] for s in lengths])
    c0, c1, c2 = np.linalg.solve(a, np.array(counts))
    return FlopModel(
        per_sequence=max(float(c0), 0.0),
        per_token=float(c1),
        per_token_sq=max(float(c2), 0.0),
        source=f"counted: FlopCounterMode on {_class_name(model)} (meta device), "
        f"lengths {', '.join(map(str, lengths))}",
    )


def count_pair_flops(model, seq_len: int, target_len: int) -> int:
    """FlopCounterMode's count of one forward and backward pass of an encoder-decoder (a meta-device copy) on a
    source of `seq_len` and a target of `target_len` tokens."""
    import torch

    source = torch.zeros(1, seq_len, dtype=torch.long, device="meta")
    target = torch.zeros(1, target_len, dtype=torch.long, device="meta")
    with counting() as counter:
        out = model(input_ids=source, decoder_input_ids=target, use_cache=False)
        out.logits.float().sum().backward()
    return counter.get_total_flops()


#: (source, target) lengths whose counts fix the six coefficients of an encoder-decoder
PAIR_LENGTHS = ((16, 16), (32, 16), (64, 16), (16, 32), (16, 64), (32, 32))


def pair_flop_model(model) -> FlopModel:
    """Fit an encoder-decoder's two-length polynomial (module doc) to FlopCounterMode counts at PAIR_LENGTHS; a
    model that cannot run on the meta device (a quantized base) gets a zero model, said in `source`."""
    import numpy as np

    try:
        clone = _meta_copy(model)
        counts = [float(count_pair_flops(clone, s, t)) for s, t in PAIR_LENGTHS]
    except (RuntimeError, NotImplementedError, TypeError, ValueError, AttributeError) as exc:
        return FlopModel(0.0, 0.0, 0.0, source=f"not counted ({type(exc).__name__} on the meta device)")
    a = np.array([[1.0, s, s * s, t, t * t, s * t] for s, t in PAIR_LENGTHS])
    c = np.linalg.solve(a, np.array(counts))
    frozen = "; frozen weights get no gradients" if has_frozen_weights(model) else ""
    return FlopModel(
        per_sequence=max(float(c[0]), 0.0),
        per_token=float(c[1]),
        per_token_sq=max(float(c[2]), 0.0),
        per_target_token=float(c[3]),
        per_target_token_sq=max(float(c[4]), 0.0),
        per_token_pair=max(float(c[5]), 0.0),
        source=f"counted: FlopCounterMode on {_class_name(model)} (meta device), source and target lengths "
        f"{', '.join(f'{s}/{t}' for s, t in PAIR_LENGTHS)}{frozen}",
    )


def unwrap(model):
    """The model inside torch.compile's and DDP's wrappers."""
    while True:
        inner = getattr(model, "_orig_mod", None) or getattr(model, "module", None)
        if inner is None or inner is model:
            return model
        model = inner


def example_flop_model(model, input_shapes: dict[str, tuple[int, ...]]) -> FlopModel:
    """Fixed-size inputs (images, audio): FlopCounterMode's count of one example, all of it per sequence.

    Models that cannot run on the meta device get a zero model (MFU then reads 0), said in `source`.
    """
    import torch

    try:
        clone = _meta_copy(model)
        inputs = {k: torch.zeros(shape, device="meta") for k, shape in input_shapes.items()}
        with counting() as counter:
            out = clone(**inputs)
            logits = out.logits if hasattr(out, "logits") else out[0]
            logits.float().sum().backward()
        count = float(counter.get_total_flops())
    except (RuntimeError, NotImplementedError, TypeError, ValueError, AttributeError) as exc:
        return FlopModel(0.0, 0.0, 0.0, source=f"not counted ({type(exc).__name__} on the meta device)")
    shapes = ", ".join(f"{k} {tuple(v[1:])}" for k, v in input_shapes.items())
    return FlopModel(
        per_sequence=count,
        per_token=0.0,
        per_token_sq=0.0,
        source=f"counted: FlopCounterMode on {_class_name(model)} (meta device), one example of {shapes}",
    )


def flop_model(model, input_shapes: dict[str, tuple[int, ...]] | None = None) -> FlopModel:
    """The closed form for BERT-like encoders, a FlopCounterMode count for anything else.

    `input_shapes` (images, audio: fixed-size inputs of one example) count one example instead of text lengths.
    """
    model = unwrap(model)
    if input_shapes:
        return example_flop_model(model, input_shapes)
    config = getattr(model, "config", None)
    if getattr(config, "is_encoder_decoder", False):
        return pair_flop_model(model)
    if has_frozen_weights(model):
        return _frozen_flop_model(model)
    if config is not None and is_encoder_config(config):
        return encoder_flop_model(config, head=_head_of(model))
    return counted_flop_model(model)


def _frozen_flop_model(model) -> FlopModel:
    """Frozen weights (LoRA) get no weight gradient: their backward is one product, not two (4 FLOPs per weight per
    token, not 6), and a layer whose input needs no gradient does none. The closed form assumes every weight
    trains, so count what autograd does instead."""
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    total = sum(p.numel() for p in model.parameters())
    try:
        with _quiet_meta_quantization():
            counted = counted_flop_model(model)
    except (RuntimeError, NotImplementedError, TypeError, ValueError, AttributeError) as exc:
        # quantized weights (QLoRA) cannot run on the meta device: the architecture's full count, each frozen
        # weight at 4 FLOPs per token instead of 6
        full = _architecture_flop_model(model)
        scale = (4 + 2 * trainable / total) / 6
        note = (
            f"; estimated for frozen weights ({trainable:,} of {total:,} parameters train): x{scale:.2f} per token "
            f"(not counted: {type(exc).__name__} on the meta device)"
        )
        return replace(full, per_token=full.per_token * scale, source=full.source + note)
    note = f"; frozen weights get no gradients ({trainable:,} of {total:,} parameters train)"
    return replace(counted, source=counted.source + note)


@contextlib.contextmanager
def _quiet_meta_quantization():
    """Within: bitsandbytes' warning that a 4-bit layer has no quantization state (".cuda() first"), which its meta
    copy never has. The copy is only counted, and fails (the count is then estimated); the model keeps its state."""
    import logging
    import re

    said = re.compile(r"quantization state not initialized")
    logger = logging.getLogger("bitsandbytes.nn.modules")
    drop = lambda record: not said.search(record.getMessage())  # noqa: E731
    logger.addFilter(drop)
    try:
        yield
    finally:
        logger.removeFilter(drop)


def _head_of(model) -> str:
    """The closed form's head: "token" for a token classifier (labels at every token), else "sequence"."""
    return "token" if type(model).__name__.endswith("ForTokenClassification") else "sequence"


def _architecture_flop_model(model) -> FlopModel:
    """The FLOPs of training every weight of `model`'s architecture (a peft model's base), from its config."""
    import torch

    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    config = base.config
    if is_encoder_config(config):
        return encoder_flop_model(config, head=_head_of(base))
    with torch.device("meta"):
        clone = type(base)(config)
    return counted_flop_model(clone)


def row_flops(parameters) -> float:
    """FLOPs of one row through layers with these parameters, forward + backward: 2 per weight forward, 2 for the
    input's gradient, and 2 for the weight's own when it trains (the closed form's 6 per parameter)."""
    return float(sum((6 if p.requires_grad else 4) * p.numel() for p in parameters))


def mfu(flops: float, seconds: float, peak_flops_per_second: float | None) -> float | None:
    """Model FLOPs utilisation: achieved FLOP/s over the device's peak FLOP/s (None when unknown)."""
    if not peak_flops_per_second or seconds <= 0:
        return None
    return flops / seconds / peak_flops_per_second


class FlopMeter:
    """Counts model FLOPs batch by batch, padded (device work) and useful (padding excluded).

    The useful count needs each row's length; it is summed on the batch's device and read back only
    when `metrics()` is called, so adding a batch never waits for the device.
    """

    def __init__(self, model: FlopModel, peak_flops_per_second: float | None = None):
        self.model = model
        self.peak = peak_flops_per_second
        self.flops = 0.0  # padded: what the device computed
        self.sequences = 0
        self._lengths: Any = 0  # Python ints, or device tensors until read (then a float)
        self._squares: Any = 0
        self._untailed: Any = 0  # real tokens whose row of the model's tail was not computed (`add`'s tail_rows)
        self._targets: Any = 0  # an encoder-decoder's real target tokens, their squares, and source x target
        self._target_squares: Any = 0
        self._pairs: Any = 0
        self._mark = 0.0  # padded FLOPs when the warm-up steps ended

    def add(
        self, input_ids, attention_mask=None, position_ids=None, tail_rows: int | None = None, target_mask=None
    ) -> float:
        """Count one micro-batch; returns its padded FLOPs. Packed rows (position ids restarting at each document,
        no attention mask) count attention's square term per document, as the model's work is per document.
        `tail_rows`: the model's tail ran on that many rows only (`FlopModel.tail_per_row`). `target_mask`: an
        encoder-decoder's targets (batch, target length), True at real tokens; its tail runs on target rows."""
        batch, seq = int(input_ids.shape[0]), int(input_ids.shape[-1])
        padded = self.model.batch_flops(batch, seq)
        real: Any = batch * seq
        lengths: Any = seq
        self.sequences += batch
        if attention_mask is None and position_ids is not None:
            # a document of n tokens has positions 0..n-1, and the sum of 2p+1 over them is n**2: no device sync
            self._squares = self._squares + (2 * position_ids.long() + 1).sum()
        elif attention_mask is None:
            self._squares += batch * seq * seq
        else:
            lengths = attention_mask.sum(dim=-1).long()  # integers: exact, and every device has int64
            real = lengths.sum()
            self._squares = self._squares + (lengths * lengths).sum()
        self._lengths = self._lengths + real
        rows, real_rows = batch * seq, real  # where the tail could run, and where a real token is
        if target_mask is not None:
            padded += batch * self.model.target_flops(seq, int(target_mask.shape[-1]))
            targets = target_mask.sum(dim=-1).long()
            self._targets = self._targets + targets.sum()
            self._target_squares = self._target_squares + (targets * targets).sum()
            self._pairs = self._pairs + (lengths * targets).sum()
            rows, real_rows = target_mask.numel(), targets.sum()
        if tail_rows is not None:
            padded -= self.model.tail_per_row * (rows - tail_rows)
            self._untailed = self._untailed + real_rows - tail_rows
        self.flops += padded
        return padded

    @property
    def useful_flops(self) -> float:
        sums = [float(x) for x in self.snapshot()[2:]]  # read back from the device once
        self._lengths, self._squares, self._untailed, self._targets, self._target_squares, self._pairs = sums
        lengths, squares, untailed, targets, target_squares, pairs = sums
        m = self.model
        single = self.sequences * m.per_sequence + m.per_token * lengths + m.per_token_sq * squares
        pair = m.per_target_token * targets + m.per_target_token_sq * target_squares + m.per_token_pair * pairs
        return single + pair - m.tail_per_row * untailed

    def snapshot(self) -> tuple[Any, ...]:
        return (
            self.flops, self.sequences, self._lengths, self._squares, self._untailed, self._targets,
            self._target_squares, self._pairs,
        )  # fmt: skip

    def discard(self, since: tuple[Any, ...]) -> None:
        """Leave out the batches counted since `since` (a step whose time is compile time)."""
        self.flops, self.sequences, self._lengths, self._squares, self._untailed = since[:5]
        self._targets, self._target_squares, self._pairs = since[5:]

    def mark(self) -> None:
        """Call when the warm-up steps end: `steady_metrics` counts the FLOPs done after this."""
        self._mark = self.flops

    def steady_metrics(self, seconds: float) -> dict[str, float | None]:
        """MFU over the steps after the warm-up (one-off costs such as kernel selection excluded)."""
        done = self.flops - self._mark
        return {
            "steady_model_tflops_per_second": done / seconds / 1e12 if seconds > 0 else None,
            "steady_mfu": mfu(done, seconds, self.peak),
        }

    def metrics(self, seconds: float) -> dict[str, float | None]:
        """Row fields over `seconds` of training time (this process's FLOPs, this device's peak)."""
        useful = self.useful_flops
        return {
            "model_tflops": self.flops / 1e12,
            "model_tflops_per_second": self.flops / seconds / 1e12 if seconds > 0 else None,
            "mfu": mfu(self.flops, seconds, self.peak),
            "mfu_useful": mfu(useful, seconds, self.peak),
        }
