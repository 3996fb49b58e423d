"""Predict the peak training memory of one configuration from the model's config, without training it.

The peak is the largest of three moments of an optimizer step:

    backward         weights + optimizer state + activations + gradients alive then + backward workspace
    end of backward  weights + optimizer state + every gradient + the first trained layer's activations and
                     workspace (or the input embedding's dense gradient, on top where it is reused)
    step             weights + optimizer state + gradients + the optimizer's temporaries

plus a fixed *runtime* share (kernels' code, thread pools, allocator arenas: what the first step
of any process costs on CPU, measured once per device kind; CUDA's context lies outside the allocator
and is not counted there either).

Where each part comes from:

- **weights, gradients**: the parameters of the model built on the meta device (shapes only, no
  memory): fp32 weights, fp32 gradients of the trainable ones (autocast never changes them).
- **optimizer state**: per optimizer, from the same parameter shapes (AdamW: two fp32 moments;
  Adafactor: factored second moments, rows + columns of each matrix; bitsandbytes' 8-bit AdamW: two
  uint8 moments plus a per-256-block fp32 scale, fp32 moments for tensors under 4,096 elements; SGD:
  none): the optimizer registry's count (`model.optimizers`), which equals `state_bytes` of a real optimizer
  (tests/planner checks it).
- **activations**: what autograd saves for backward, *counted* on small proxies of the real
  architecture: the model's own config with one and with two layers, at the planned sequence length,
  at two batch sizes, under the planned precision and checkpointing. The saved tensors' bytes are
  recorded through `torch.autograd.graph.saved_tensors_hooks` (each storage once, parameters left
  out). Two layer counts separate the per-layer share from the embeddings and head; two batch sizes
  separate what grows with the batch (activations) from what does not (autocast's bf16 copies of the
  weights). So the coefficients come from the architecture's real kernels (SDPA/flash attention,
  dropout masks, GELU inputs, ...) and carry over to any width, depth, batch or length. With
  activation checkpointing, backward recomputes one layer at a time: its full activations come on top
  of the checkpoint inputs.
- **workspace**: the micro-step's transients beyond what autograd saves (gradients of activations in
  flight, fp32 casts around LayerNorm under autocast), about one fp32 feed-forward activation (tokens x
  intermediate x 4 bytes; more under bf16), and the optimizer's temporaries (Adafactor builds about two
  tensors the size of the largest matrix; bitsandbytes on CPU dequantises a tensor's moments to fp32,
  about five). These few coefficients (WorkspaceModel) are a one-time fit to measurements of MiniLM and
  a tiny BERT on CPU (benchmarks/planner_accuracy.py).

On CPU the prediction is of the resident size when freed tensors go back to the kernel at once
(telemetry.memory.return_freed_memory, which --auto sets): glibc's default keeps them, fragmented, and
the resident size then runs 20-60% above live memory in ways no model of the tensors can follow.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import functools
import json
import math
from dataclasses import asdict, dataclass, field
from typing import Any

from leantrain.config.units import MIB
from leantrain.errors import ConfigError
from leantrain.model import optimizers


@dataclass(frozen=True)
class ParamInventory:
    """The parameters of a model, by shape: enough to size weights, gradients and optimizer state."""

    #: shapes of every trainable parameter tensor
    shapes: tuple[tuple[int, ...], ...]
    #: shapes of the Linear layers' weights: what autocast copies to bf16/fp16
    linear_shapes: tuple[tuple[int, ...], ...]
    #: numel of the buffers (position ids etc.): weights the optimizer does not touch
    buffer_bytes: int = 0
    #: per shape, whether it is a hidden matrix (a 2-D weight in the repeated blocks: Muon's, GaLore's; see
    #: `model.optimizers.hidden_matrices`); empty: none is
    hidden: tuple[bool, ...] = ()
    #: per shape, whether it is the input embedding matrix (projected too with --projection-embeddings)
    embedding: tuple[bool, ...] = ()

    @property
    def numel(self) -> int:
        return sum(math.prod(s) for s in self.shapes)

    @property
    def largest(self) -> int:
        return max((math.prod(s) for s in self.shapes), default=0)

    def flat_numel(self) -> int:
        """Numbers of the parameters flat parameters gather (`model.flat`), whose gradients stay allocated."""
        from leantrain.model.flat import LARGEST

        return sum(n for n in (math.prod(s) for s in self.shapes) if n <= LARGEST)

    def apart(self, optimizer: str, settings: Any = None) -> tuple[bool, ...]:
        """Per shape, whether the optimizer gives it its own rule (`model.optimizers.treated_apart`)."""
        hidden = self.hidden or (False,) * len(self.shapes)
        if not (self.embedding and optimizers.projects_embeddings(optimizer, settings)):
            return hidden
        return tuple(h or e for h, e in zip(hidden, self.embedding, strict=True))

    def largest_apart(self, optimizer: str, settings: Any = None) -> int:
        return max((math.prod(s) for s, h in zip(self.shapes, self.apart(optimizer, settings)) if h), default=0)

    def state_bytes(self, optimizer: str, settings: Any = None) -> int:
        """The optimizer's state for these parameters (the registry's count)."""
        return optimizers.predicted_state_bytes(self.shapes, optimizer, self.apart(optimizer, settings), settings)

    def step_flops(self, optimizer: str, settings: Any = None) -> float:
        """The optimizer step's matmul FLOPs on the matrices it treats apart (Muon's orthogonalisation)."""
        return optimizers.predicted_step_flops(self.shapes, optimizer, self.apart(optimizer, settings))

    def temporaries(self, optimizer: str, settings: Any = None) -> int:
        """The optimizer step's temporaries (the registry's fitted copies)."""
        largest_apart = self.largest_apart(optimizer, settings)
        return optimizers.predicted_temporaries(self.largest, largest_apart, self.numel, optimizer)


@dataclass(frozen=True)
class ActivationProfile:
    """Bytes autograd keeps for backward, per sequence of the planned length, counted on proxies."""

    #: per sequence, per encoder layer
    per_layer: float
    #: per sequence, outside the layers (embeddings, head, loss)
    base: float
    #: independent of the batch: autocast's low-precision weight copies, per layer and outside them
    copies_per_layer: float
    copies_base: float
    #: per sequence, one layer's full activations (without checkpointing): what backward recomputes at once
    layer_full: float
    source: str
    #: a causal LM whose head and loss run fused over chunks of rows: its logits never exceed a chunk
    fused_head: bool = False
    #: an encoder-decoder's encoder layer (per sequence, and its fixed copies): `per_layer` is the mean of both stacks
    encoder_layer: tuple[float, float] | None = None

    def saved(self, micro_batch: int, layers: int, checkpointing: bool, leading: int = 0) -> float:
        """Saved for backward by `layers` layers, the first `leading` of which (an encoder-decoder's: of its encoder)
        save nothing, as nothing before them trains."""
        skipped, copies = self.encoder_layer or (self.per_layer, self.copies_per_layer)
        act = micro_batch * (self.base + layers * self.per_layer) + self.copies_base + layers * self.copies_per_layer
        act -= leading * (micro_batch * skipped + copies)
        if checkpointing:
            act += micro_batch * self.layer_full + self.copies_per_layer
        return act


@dataclass(frozen=True)
class WorkspaceModel:
    """Transient memory, as a one-time fit to measurements (benchmarks/planner_accuracy.py)."""

    #: transient tensors of a micro-step beyond what autograd saves (gradients of activations in backward, fp32
    #: casts around LayerNorm under autocast, kernels' scratch), in fp32 feed-forward activations
    #: (tokens x intermediate x 4 bytes): one such tensor in fp32 (measured 0.8-1.3 on MiniLM and the tiny BERT),
    #: more under bf16 (1.2-2.1 on MiniLM, up to 5 on the tiny BERT)
    transient_ffn: dict[str, float] = field(default_factory=lambda: {"fp32": 1.2, "bf16": 2.5, "fp16": 2.5})
    #: a causal LM's transients at the start of backward, in fp32 logits (tokens x vocabulary x 4 bytes): the
    #: gradients of the per-token loss's log-softmax and of its fp32 input, two such tensors (measured 2.0 in fp32
    #: and 2.1 in bf16 on preset:tiny-llama, benchmarks/results/planner_accuracy.md)
    transient_logits: float = 2.0
    #: the same with the head and loss fused (`losses.head_cross_entropy_sum`), in one chunk's fp32 logits: the
    #: chunk's logits, their log-softmax and the softmax's gradient in its place (fitted: preset:tiny-llama's fp32
    #: trials imply 2.7-3.2, the checkpointed one 3.6; tests/planner/test_memory.py)
    transient_fused_logits: float = 3.0
    #: an encoder-decoder's, by precision: in fp32 the chunk's logits and their log-softmax (the softmax's gradient
    #: written in its place), 2.0 as `losses.head_cross_entropy_sum` allocates them (measured 2.0 on a tiny T5 whose
    #: logits dwarf the rest); in bf16 about one more (measured 3.1: the low-precision matmuls' copies)
    transient_pair_fused_logits: dict[str, float] = field(
        default_factory=lambda: {"fp32": 2.0, "bf16": 3.0, "fp16": 3.0}
    )
    #: one-off memory of the first training step of a run (kernels' code and buffers, thread pools), by device
    #: and precision: 16-21 MiB in fp32 `leantrain train` runs of the tiny BERT and MiniLM on CPU; bf16 adds
    #: oneDNN's cache of JIT-built kernels, one per matmul shape (5-13 MiB for the tiny BERT at one shape). CUDA's
    #: context is outside the allocator, which is what the budget counts there.
    runtime: dict[str, int] = field(
        default_factory=lambda: {"cpu": 20 * MIB, "cpu/bf16": 28 * MIB, "cpu/fp16": 28 * MIB, "cuda": 0}
    )

    def runtime_bytes(self, device: str, precision: str) -> int:
        return self.runtime.get(f"{device}/{precision}", self.runtime.get(device, 0))


DEFAULT_WORKSPACE = WorkspaceModel()


@dataclass(frozen=True)
class MemoryEstimate:
    """Predicted peak training memory of one configuration, in bytes, with its parts."""

    weights: int
    #: all gradients (fp32), alive from the end of backward through the optimizer step
    gradients: int
    optimizer_state: int
    #: saved for backward (with checkpointing: the checkpoint inputs plus one recomputed layer)
    activations: int
    #: transient in backward: gradients of activations in flight
    backward_workspace: int
    #: transient in the optimizer step: its temporaries
    optimizer_workspace: int
    #: one-off memory of the first step in a process (see WorkspaceModel.runtime)
    runtime: int
    #: where the peak falls: "backward", "end of backward" (every gradient made) or "optimizer step"
    phase: str
    peak: int

    @property
    def workspace(self) -> int:
        """Transient memory at the peak, runtime share included (the table's workspace column)."""
        ws = self.optimizer_workspace if self.phase == "optimizer step" else self.backward_workspace
        return ws + self.runtime

    @property
    def steady_peak(self) -> int:
        """The peak without the one-off runtime share: what a warmed-up process adds for this run."""
        return self.peak - self.runtime

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "workspace": self.workspace}


@dataclass(frozen=True)
class ModelFacts:
    """What the memory and speed models need to know about a model, read from its config."""

    name: str
    model_type: str
    hidden: int
    intermediate: int
    heads: int
    layers: int
    inventory: ParamInventory
    #: the config as a JSON string (to build proxies, and a hashable cache key)
    config_json: str
    #: how the planner models it (its task's `planner`): "classifier", "token-classifier", "causal-lm" or "seq2seq":
    #: which head the proxies get and which loss they run
    kind: str = "classifier"
    #: vocabulary size: a causal LM's logits hold one score per token and vocabulary entry
    vocab: int = 0

    @property
    def params(self) -> int:
        return self.inventory.numel


# --- LoRA


@dataclass(frozen=True)
class LoraSpec:
    """What LoRA changes in the memory: which layers get adapters of which rank, and the base's quantization."""

    r: int = 8
    targets: str = "auto"
    #: None, "4bit" or "8bit"
    quantize: str | None = None
    #: dropout on the adapters' input: a new tensor (and mask) per adapter that autograd keeps for backward
    dropout: float = 0.0
    #: a BERT pooler started as the identity (--pooler), which trains whole with the head (`lora.started_afresh`)
    pooler_whole: bool = False

    @classmethod
    def of(cls, cfg: Any) -> LoraSpec | None:
        """The spec of a TrainConfig (None without --lora)."""
        if not getattr(cfg, "lora", False):
            return None
        return cls(cfg.lora_r, cfg.lora_targets, cfg.quantize, cfg.lora_dropout, pooler_starts_afresh(cfg))

    def label(self) -> str:
        return f"lora r={self.r}" + (f" {self.quantize}" if self.quantize else "")


@dataclass(frozen=True)
class LoraInventory:
    """A LoRA model's parameters: the trainable ones (adapters, head) by shape, and the frozen weights' bytes."""

    trainable: ParamInventory
    frozen_bytes: int
    #: elements of the largest quantized Linear weight: a quantized layer dequantizes it whole in each forward
    largest_linear: int


def pooler_starts_afresh(cfg: Any) -> bool:
    """Whether the run starts its pooler as the identity, as `loading.start_pooler` decides (a model without a
    BERT-style pooler has none to start: `_afresh` finds nothing)."""
    from leantrain.model import loading

    setting = getattr(cfg, "pooler", "keep")
    if setting != "auto":
        return setting in ("identity", "mean")
    return loading.is_sentence_transformers(_model_path(cfg))


def _model_path(cfg: Any) -> str:
    """The run's model as `loading`'s checkpoint readers take it: the embedded MiniLM's folder for the default."""
    from leantrain.model import loading

    name = cfg.model
    return str(loading.embedded_model_path()) if name in (None, loading.EMBEDDED_MODEL) else name


def mean_layer_added(cfg: Any) -> bool:
    """Whether a text classifier's run adds the last encoder layer that averages the tokens into the first, as
    `loading.start_pooler` decides (--pooler mean; auto on a checkpoint trained through mean pooling, without
    --lora). An encoder that cannot take it is refused or left alone there, and by `with_mean_layer` here."""
    from leantrain.config.sections import TEXT
    from leantrain.model import loading

    setting = getattr(cfg, "pooler", "keep")
    if getattr(cfg, "task", None) not in (None, *TEXT) or setting not in ("auto", "mean"):
        return False
    return loading.adds_mean_layer(_model_path(cfg), setting, bool(getattr(cfg, "lora", False)))


def with_mean_layer(facts: ModelFacts) -> ModelFacts:
    """`facts` one encoder layer deeper where its encoder is BERT-shaped: the layer `--pooler mean` adds."""
    from leantrain.model.loading import last_bert_layer

    config = _config_from_json(facts.config_json)
    if last_bert_layer(_build(config, "meta"))[0] is None:
        return facts
    config.num_hidden_layers += 1
    return model_facts(facts.name, config=config)


def _afresh(net, spec: LoraSpec) -> list[str]:
    """The pooler's name where the run starts it afresh (it trains whole with the head); else nothing."""
    from leantrain.model.loading import pooler_dense

    dense = pooler_dense(net) if spec.pooler_whole else None
    return [n for n, m in net.named_modules() if dense is not None and m is dense]


def _with_adapters(net, spec: LoraSpec):
    """`net` with peft's LoRA adapters as `leantrain.model.lora.apply` adds them (no quantization: the proxies and the
    meta-device inventory only need shapes and what autograd saves)."""
    from types import SimpleNamespace

    from leantrain.model import lora

    cfg = SimpleNamespace(lora_r=spec.r, lora_alpha=2.0 * spec.r, lora_dropout=spec.dropout, lora_targets=spec.targets)
    return lora.apply(net, SimpleNamespace(**vars(cfg), quantize=None), None, afresh=_afresh(net, spec))


def _quantized_bytes(numel: int, rows: int, bits: str) -> int:
    """bitsandbytes' bytes for one Linear weight: NF4 packs two per byte, plus a block-64 absmax quantized to 8 bits
    (and its fp32 scale per 256 blocks); int8 one byte each plus an fp32 scale per output row."""
    if bits == "4bit":
        return numel // 2 + math.ceil(numel / 64) + 4 * math.ceil(numel / (64 * 256))
    return numel + 4 * rows


@functools.lru_cache(maxsize=16)
def lora_inventory(config_json: str, spec: LoraSpec, trust_remote_code: bool = False) -> LoraInventory:
    from leantrain.model import lora

    net = _build(_config_from_json(config_json), "meta", trust_remote_code)
    head = lora.head_modules(net) + _afresh(net, spec)
    quantized = set(lora.quantized_names(net, head)) if spec.quantize else set()
    frozen, largest = 0, 0
    seen: set[int] = set()  # a tied weight (a causal LM's embeddings and output layer) is stored once
    for name, module in net.named_modules():
        for pname, p in module.named_parameters(recurse=False):
            if id(p) in seen:
                continue
            seen.add(id(p))
            if name in quantized and pname == "weight":
                frozen += _quantized_bytes(p.numel(), p.shape[0], spec.quantize or "")
            else:  # (the head's original copy stays beside its trained one)
                frozen += 4 * p.numel()
        if name in quantized:
            largest = max(largest, module.weight.numel())
    peft_model = _with_adapters(net, spec)
    return LoraInventory(_trainable(peft_model, ()), frozen, largest)


@functools.lru_cache(maxsize=16)
def frozen_inventory(config_json: str, freeze: str, trust_remote_code: bool = False) -> ParamInventory:
    """The parameters that still train under `--freeze` (as `model.freezing.apply` leaves them), by shape."""
    return _trainable(trained_net(config_json, None, freeze, trust_remote_code), ())


def trained_net(config_json: str, lora: LoraSpec | None, freeze: str | None, trust_remote_code: bool = False):
    """The model on the meta device with what the run freezes frozen: LoRA's adapters over the base, or --freeze."""
    from leantrain.model import freezing

    net = _build(_config_from_json(config_json), "meta", trust_remote_code)
    if lora is not None:
        return _with_adapters(net, lora)
    freezing.apply(net, freeze)
    return net


@functools.lru_cache(maxsize=16)
def frozen_leading_layers(config_json: str, freeze: str, trust_remote_code: bool = False) -> int:
    """How many of the model's first layers `--freeze` leaves with nothing before them that trains (the embeddings
    frozen too): no input of theirs needs a gradient and no weight, so autograd saves nothing for them."""
    import torch

    from leantrain.model import freezing

    config = _config_from_json(config_json)
    net = _build(config, "meta", trust_remote_code)
    freezing.apply(net, freeze)
    n = getattr(config, _layers_attr(config))
    layers = next((m for m in net.modules() if isinstance(m, torch.nn.ModuleList) and len(m) == n), None)
    if layers is None:
        return 0
    owner = {id(p): i for i, layer in enumerate(layers) for p in layer.parameters()}
    seen = -1  # the last layer met: parameters come in the order of the forward (embeddings, layers, head)
    for p in net.parameters():
        layer = owner.get(id(p))
        seen = layer if layer is not None else seen
        if p.requires_grad:
            return layer if layer is not None else seen + 1
    return n


def with_dropout(facts: ModelFacts, p: float) -> ModelFacts:
    """`facts` with every dropout rate of its config at `p` (--dropout), which the proxies are built from."""
    from leantrain.model.dropout import set_config_rates

    config = _config_from_json(facts.config_json)
    set_config_rates(config, p)
    return dataclasses.replace(facts, config_json=config.to_json_string())


def trainable_inventory(facts: ModelFacts, lora: LoraSpec | None = None, freeze: str | None = None) -> ParamInventory:
    """What gets gradients and optimizer state: LoRA's adapters and head, what --freeze leaves, or every parameter."""
    from leantrain.model import freezing

    if lora is not None:
        return lora_inventory(facts.config_json, lora).trainable
    if freezing.patterns(freeze):
        return frozen_inventory(facts.config_json, freeze or "")
    return facts.inventory


def _trainable(net, linear: tuple[tuple[int, ...], ...], buffers: int = 0) -> ParamInventory:
    """The trainable parameters of `net` by shape, with which are hidden matrices."""
    hidden, embedding = optimizers.hidden_matrices(net), optimizers.input_embedding(net)
    trainable = [p for p in net.parameters() if p.requires_grad]
    shapes = tuple(tuple(p.shape) for p in trainable)
    flags = (tuple(id(p) in hidden for p in trainable), tuple(id(p) in embedding for p in trainable))
    return ParamInventory(shapes, linear, buffers, *flags)


# --- end LoRA


def _layers_attr(config) -> str:
    for name in ("num_hidden_layers", "n_layers", "num_layers"):
        if hasattr(config, name):
            return name
    raise ConfigError(f"{type(config).__name__}: cannot tell the number of layers; the planner needs a transformer")


#: an encoder-decoder's config fields for its encoder's and its decoder's layer counts: T5's; BART's, mBART's, Marian's
_STACKS = (("num_layers", "num_decoder_layers"), ("encoder_layers", "decoder_layers"))


def stack_layers(config) -> tuple[str, str]:
    """The names of an encoder-decoder's encoder and decoder layer counts in its config; refused in one line for
    one whose config has none (a warm-started `EncoderDecoderModel` holds two configs)."""
    for names in _STACKS:
        if all(isinstance(getattr(config, n, None), int) for n in names):
            return names
    raise ConfigError(
        f"the planner models encoder-decoders whose config gives both layer counts (T5, BART, mBART, Marian); a "
        f"'{getattr(config, 'model_type', '?')}' model is planned by hand for now (leantrain bench)"
    )


def model_facts(
    model: str | None, num_labels: int = 2, trust_remote_code: bool = False, config=None, task: str | None = None
) -> ModelFacts:
    """Read the model's config (or take `config`: a preset's, sized to the run's tokenizer) and count its
    parameters on the meta device (nothing is allocated). `task`: the run's --task (else the model's own)."""
    from leantrain.model import loading

    if config is None:
        path = loading.resolve_model(model)
        config = loading.load_config(
            path, trust_remote_code=trust_remote_code, num_labels=num_labels, problem_type="single_label_classification"
        )
    kind = planner_kind(config, task, model)
    # an encoder-decoder's layers are its encoder's and its decoder's (T5's d_ff, BART's encoder_ffn_dim wide)
    stacks = stack_layers(config) if kind == "seq2seq" else (_layers_attr(config),)
    config = _as_planned(config, kind)
    inventory = _inventory(config.to_json_string(), trust_remote_code)
    hidden = int(getattr(config, "hidden_size", 0) or getattr(config, "dim", 0))
    widths = ("intermediate_size", "hidden_dim", "d_ff", "encoder_ffn_dim")
    return ModelFacts(
        name=str(model) if model else loading.EMBEDDED_MODEL,
        model_type=getattr(config, "model_type", "?"),
        hidden=hidden,
        intermediate=int(next((getattr(config, n) for n in widths if getattr(config, n, 0)), 4 * hidden)),
        heads=int(getattr(config, "num_attention_heads", 0) or getattr(config, "n_heads", 1)),
        layers=sum(int(getattr(config, n)) for n in stacks),
        inventory=inventory,
        config_json=config.to_json_string(),
        kind=kind,
        vocab=int(getattr(config, "vocab_size", 0) or 0),
    )


#: a planner kind -> transformers' table of the class that trains it, for a config's `architectures`
_KIND_MAPPINGS = {
    "classifier": "MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES",
    "token-classifier": "MODEL_FOR_TOKEN_CLASSIFICATION_MAPPING_NAMES",
}


def _as_planned(config, kind: str):
    """`config` naming the architecture the run trains (a token classifier, a sequence classifier), so that the
    proxies built from its JSON are that model whatever architecture the checkpoint was saved as."""
    from transformers.models.auto import modeling_auto

    table = getattr(modeling_auto, _KIND_MAPPINGS.get(kind, ""), {})
    name = table.get(getattr(config, "model_type", None))
    if name is not None:
        config = copy.deepcopy(config)
        config.architectures = [name]
    return config


def _config_from_json(config_json: str, **changes: Any):
    from transformers import AutoConfig

    values = json.loads(config_json)
    values.update(changes)
    model_type = values.pop("model_type")
    return AutoConfig.for_model(model_type, **values)


@contextlib.contextmanager
def _quiet():
    """Transformers' warnings off: a proxy's small vocabulary leaves GPT-2's token ids outside it, harmlessly."""
    from transformers.utils import logging as hf_logging

    level = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        yield
    finally:
        hf_logging.set_verbosity(level)


def _build(config, device: str, trust_remote_code: bool = False):
    """The model the run trains, from `config`: a sequence or token classifier, or a causal LM, as its kind says."""
    import torch
    import transformers

    auto = getattr(transformers, _AUTO_CLASSES[planner_kind(config)])
    with _quiet(), torch.device(device):
        return auto.from_config(config, trust_remote_code=trust_remote_code)


def planner_kind(config, task: str | None = None, model: str | None = None) -> str:
    """How the planner models a model of `config` doing `task` (else its own): the task's `planner` ("classifier",
    "token-classifier", "causal-lm", "seq2seq"); refused in one line for a task the planner does not model (images,
    audio, a reward model, GRPO)."""
    from leantrain import tasks

    chosen = tasks.task_class(tasks.infer(config, task))
    if chosen.planner is None:
        raise ConfigError(
            f"{model or 'the model'}: the planner models text encoders, causal language models and encoder-decoders "
            f"(sequence-to-sequence); a '{getattr(config, 'model_type', '?')}' model ({chosen.name}) is planned by "
            "hand for now (leantrain bench)"
        )
    return chosen.planner


#: a planner kind -> the transformers class that builds its proxies
_AUTO_CLASSES = {
    "classifier": "AutoModelForSequenceClassification",
    "token-classifier": "AutoModelForTokenClassification",
    "causal-lm": "AutoModelForCausalLM",
    "seq2seq": "AutoModelForSeq2SeqLM",
}


def is_token_classifier(config) -> bool:
    """Whether `config` is a token classifier's: a head and a loss at every token."""
    return planner_kind(config) == "token-classifier"


def is_causal_lm(config) -> bool:
    """Whether `config` is a causal LM's: its proxies then get the LM head and the per-token loss."""
    return planner_kind(config) == "causal-lm"


def is_seq2seq(config) -> bool:
    """Whether `config` is an encoder-decoder's trained as sequence-to-sequence: sources and targets, the loss per
    target token."""
    return planner_kind(config) == "seq2seq"


def counted_positions(seq_len: int, counted: float) -> int:
    """Positions of a row whose next token counts, for a `counted` share of them (at least one): every position but
    the last, which predicts nothing, at 1."""
    return max(1, math.ceil(counted * (seq_len - 1)))


def proxy_batch(config, batch: int, seq_len: int, generator, counted: float = 1.0, target_len: int = 0) -> dict:
    """A training batch of the shape a run feeds `net`: a classifier's padded rows with their labels, a causal
    LM's packed rows (two documents a row, position ids restarting at the second), the next token counted at
    every position or, with `counted` below 1, at that share of each row's positions (instruction tuning counts
    completions only), or an encoder-decoder's sources of `seq_len` and targets of `target_len` tokens."""
    import torch

    vocab = int(getattr(config, "vocab_size", 100))
    ids = torch.randint(min(5, vocab - 1), vocab, (batch, seq_len), generator=generator)
    if is_seq2seq(config):
        return pair_batch(ids, target_len or seq_len, vocab, generator)
    if is_token_classifier(config):  # a label at every position
        return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": torch.zeros_like(ids)}
    if not is_causal_lm(config):
        labels = torch.zeros(batch, dtype=torch.long)
        return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": labels}
    half = seq_len // 2
    positions = torch.cat([torch.arange(half), torch.arange(seq_len - half)]).expand(batch, seq_len)
    labels = ids.clone()
    if counted < 1.0:
        from leantrain.tasks.causal_lm import IGNORE

        labels[:, counted_positions(seq_len, counted) + 1 :] = IGNORE  # position t predicts labels[t + 1]
    return {"input_ids": ids, "position_ids": positions, "labels": labels}


def pair_batch(source, target_len: int, vocab: int, generator) -> dict:
    """An encoder-decoder's batch as `data.seq2seq.PairCollator` makes it, every source and target token real (the
    longest pairs a micro-batch can hold): the decoder reads the target shifted right behind a start token."""
    import torch

    labels = torch.randint(min(5, vocab - 1), vocab, (source.shape[0], target_len), generator=generator)
    decoder_ids = torch.cat([torch.zeros_like(labels[:, :1]), labels[:, :-1]], dim=1)
    return {
        "input_ids": source,
        "attention_mask": torch.ones_like(source),
        "decoder_input_ids": decoder_ids,
        "labels": labels,
        "target_mask": torch.ones_like(labels, dtype=torch.bool),
    }


def _pair_loss(net, batch: dict, autocast=None, selected: bool = False, fused: bool = False):
    """An encoder-decoder's summed loss per target token as `tasks.seq2seq` computes it: the output head at target
    tokens only (`selected`), or there fused with the loss (`fused`)."""
    import torch.nn.functional as F

    from leantrain.tasks.causal_lm import head_loss, head_rows

    keep, labels = batch["target_mask"], batch["labels"]
    inputs = {k: batch[k] for k in ("input_ids", "attention_mask", "decoder_input_ids")}
    cut: contextlib.AbstractContextManager = contextlib.nullcontext()
    if selected:
        cut = head_loss(net, keep, labels[keep]) if fused else head_rows(net, keep)
    with autocast or contextlib.nullcontext(), cut:
        logits = net(**inputs, use_cache=False).logits
    if fused:
        return logits  # the summed loss, from the head
    return F.cross_entropy((logits if selected else logits[keep]).float(), labels[keep], reduction="sum")


def proxy_loss(net, batch: dict, autocast=None, tail=None, counted_logits: bool = False, fused: bool = False):
    """The summed training loss of `batch` as the trainer computes it: the forward under `autocast`, the task's loss
    (a classifier's cross-entropy, a causal LM's or an encoder-decoder's per-token loss) outside it, in fp32.
    `tail`: a classifier's `FirstTokenTail`, run at the first token as the task runs it. `counted_logits`: a causal
    LM's logits only at the positions whose next token counts (an encoder-decoder's at its target tokens), as its
    task computes them where the model allows
    (`tasks.causal_lm.head_rows_work`, asked by the caller: it runs the model); `fused`: there, the head and the
    loss in one chunked pass (`tasks.causal_lm.head_loss_works`)."""
    import torch.nn.functional as F

    if is_seq2seq(net.config):
        return _pair_loss(net, batch, autocast, counted_logits, fused)
    inputs = {k: v for k, v in batch.items() if k != "labels"}
    causal = is_causal_lm(net.config)
    if is_token_classifier(net.config):
        return _token_loss(net, batch, inputs, autocast, tail)
    cut: contextlib.AbstractContextManager = contextlib.nullcontext()
    if causal and counted_logits:
        from leantrain.tasks.causal_lm import IGNORE, head_loss, head_rows, next_token_targets

        targets = next_token_targets(batch["labels"])
        keep = targets != IGNORE
        cut = head_loss(net, keep, targets[keep]) if fused else head_rows(net, keep)
    with autocast or contextlib.nullcontext(), tail.cut() if tail is not None else cut:
        logits = net(**inputs, use_cache=False).logits if causal else net(**inputs).logits
    if causal and counted_logits and fused:
        return logits  # the summed loss, from the head
    if causal and counted_logits:
        return F.cross_entropy(logits.float(), targets[keep], reduction="sum")
    if causal:
        from leantrain.tasks.causal_lm import token_losses

        return token_losses(logits, batch["labels"]).sum()
    return F.cross_entropy(logits.float(), batch["labels"], reduction="sum")


def _token_loss(net, batch: dict, inputs: dict, autocast=None, tail=None):
    """A token classifier's summed loss as its task computes it: with `tail`, the last layer after its attention and
    the head at the tagged positions only (`tasks.token_classification`)."""
    import torch.nn.functional as F

    labels = batch["labels"]
    keep = labels != -100
    with autocast or contextlib.nullcontext(), tail.rows(keep) if tail is not None else contextlib.nullcontext():
        logits = net(**inputs).logits
    if tail is not None:
        return F.cross_entropy(logits[0].float(), labels[keep], reduction="sum")
    return F.cross_entropy(logits.float().flatten(0, 1), labels.flatten(), reduction="sum")


@functools.lru_cache(maxsize=16)
def _inventory(config_json: str, trust_remote_code: bool = False) -> ParamInventory:
    import torch

    net = _build(_config_from_json(config_json), "meta", trust_remote_code)
    linear = tuple(tuple(m.weight.shape) for m in net.modules() if isinstance(m, torch.nn.Linear))
    buffers = sum(b.numel() * b.element_size() for b in net.buffers())
    return _trainable(net, linear, buffers)


def _saved_bytes(
    net,
    batch: int,
    seq_len: int,
    precision: str,
    tail=None,
    counted: float = 1.0,
    counted_logits: bool = False,
    fused: bool = False,
    target_len: int = 0,
) -> float:
    """Bytes of the distinct storages autograd saves in one forward (parameters excluded)."""
    import torch

    inputs = proxy_batch(net.config, batch, seq_len, torch.Generator().manual_seed(0), counted, target_len)
    params = {p.untyped_storage().data_ptr() for p in net.parameters()}
    seen: dict[int, int] = {}

    def pack(t):
        storage = t.untyped_storage()
        key = storage.data_ptr()
        if key not in params:
            seen[key] = max(seen.get(key, 0), storage.nbytes())
        return t

    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)
    autocast = torch.autocast("cpu", dtype=dtype) if dtype else torch.autocast("cpu", enabled=False)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        proxy_loss(net, inputs, autocast, tail, counted_logits, fused)
    return float(sum(seen.values()))


def _proxy(config, checkpointing: bool, lora: LoraSpec | None, fusable: bool = True, precision: str = "fp32"):
    """A proxy model from `config`, in training mode, run as its task runs it: (the model, a classifier's
    `FirstTokenTail` or None, whether a causal LM's logits are computed at the counted positions only, whether its
    head and loss are fused there: where the model allows and, `fusable`, the run does). Under LoRA its frozen
    weights are kept in a bf16/fp16 `precision` as the run keeps them (`model.freezing.store_frozen`): autocast then
    makes no copy of them for backward."""
    from leantrain.model import loading
    from leantrain.tasks.causal_lm import head_loss_works, head_rows_work
    from leantrain.tasks.classification import first_token_tail

    net = _build(config, "cpu")
    net.train()
    causal, pair = is_causal_lm(config), is_seq2seq(config)
    # A classifier's last layer runs at the first token only, as the task runs it (not when checkpointed), a token
    # classifier's where a token is tagged; a causal LM's output head only where a token counts
    if is_token_classifier(config):  # a token classifier's where a token is tagged
        from leantrain.tasks.token_classification import labelled_rows_tail

        tail = None if checkpointing else labelled_rows_tail(net)
    else:
        tail = None if causal or pair or checkpointing else first_token_tail(net)
    # an encoder-decoder's output head at target tokens only, as its task runs it (`tasks.seq2seq.check_model`)
    counted_logits = (causal or pair) and head_rows_work(net, decoder=pair)
    fused = fusable and counted_logits and head_loss_works(net, decoder=pair)
    if checkpointing:
        loading.enable_activation_checkpointing(net)
    if lora is not None:  # frozen layers save no inputs for weight gradients; adapters save theirs
        from leantrain.model import freezing
        from leantrain.parallel.precision import frozen_dtype

        net = _with_adapters(net, lora)
        if (low := frozen_dtype(precision, "cpu")) is not None:
            freezing.store_frozen(net, low)
    return net, tail, counted_logits, fused


@functools.lru_cache(maxsize=64)
def activation_profile(
    config_json: str,
    seq_len: int,
    precision: str,
    checkpointing: bool,
    trust_remote_code: bool = False,
    lora: LoraSpec | None = None,
    counted: float = 1.0,
    target_len: int = 0,
    fusable: bool = True,
) -> ActivationProfile:
    """Count saved activations on one- and two-layer proxies of the model at batches 2 and 4 (see module doc).
    `counted`: a causal LM's share of positions whose next token counts; its logits are computed there only.
    `target_len`: an encoder-decoder's target tokens (its sources are `seq_len` long; 0: as long); `fusable`: whether
    its run fuses the output head with the loss where the model allows (not with --label-smoothing)."""
    base_config = _config_from_json(config_json)
    if is_seq2seq(base_config):
        return _pair_profile(config_json, seq_len, target_len or seq_len, precision, checkpointing, lora, fusable)
    # A small vocabulary keeps the proxies cheap. An encoder's embeddings save indices, not the table, so nothing
    # changes; a causal LM's logits (one score per token and vocabulary entry) grow with it, so its proxies run at
    # two vocabularies and that share is carried over to the real one, linearly.
    vocab = int(getattr(base_config, "vocab_size", 512) or 512)
    small = min(vocab, 512)
    causal = is_causal_lm(base_config)
    counts, fused_head = _proxy_counts(config_json, seq_len, precision, checkpointing, lora, counted, small, causal)
    base, layer, copies_base, copies_layer = _split_counts(counts, small, checkpointing)
    full = _split_counts(counts, small, False)[1] if checkpointing else 0.0
    if causal:  # the logits' share per vocabulary entry: per sequence (logits, their fp32 copy) and fixed
        c = checkpointing
        more = {b: counts[(1, b, c, 2 * small)] - counts[(1, b, c, small)] for b in (2, 4)}
        per_seq, fixed = _vocabulary_share(more, small, vocab)
        base, copies_base = base + per_seq, copies_base + fixed
    return ActivationProfile(
        per_layer=layer,
        base=base,
        copies_per_layer=copies_layer,
        copies_base=copies_base,
        layer_full=full,
        source=f"saved tensors counted on 1- and 2-layer proxies at length {seq_len}, {precision}"
        + (f", logits carried from vocabularies {small} and {2 * small} to {vocab}" if causal else ""),
        fused_head=fused_head,
    )


def _vocabulary_share(more: dict[int, float], small: int, vocab: int) -> tuple[float, float]:
    """What the logits' side adds from the proxies' vocabulary `small` to the real `vocab`, carried over linearly
    from `more` (what a proxy at twice `small` saves beyond one at `small`, at batches 2 and 4): (per sequence,
    fixed)."""
    per_entry = (more[4] - more[2]) / 2 / small
    fixed_per_entry = max(more[2] - 2 * (more[4] - more[2]) / 2, 0.0) / small
    return per_entry * (vocab - small), fixed_per_entry * (vocab - small)


@contextlib.contextmanager
def _proxy_runs():
    """Within: one thread (small matmuls: as fast, and the neighbours left alone), a fixed seed (the dropout masks),
    both restored after, and leantrain's CPU dropout (`model.dropout`), which keeps a bool mask for an fp32 input as
    a run's does on a CPU (--fast-dropout, the default) and on a GPU (torch's fused dropout, any dtype): torch's CPU
    dropout keeps a float one."""
    import torch

    from leantrain.model.dropout import fast_dropout

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with torch.random.fork_rng(devices=[]), fast_dropout():
            torch.manual_seed(0)
            yield
    finally:
        torch.set_num_threads(threads)


#: an encoder-decoder's proxies: (encoder layers, decoder layers)
PAIR_PROXIES = ((1, 1), (2, 1), (1, 2))


def _pair_profile(
    config_json: str,
    seq_len: int,
    target_len: int,
    precision: str,
    checkpointing: bool,
    lora: LoraSpec | None,
    fusable: bool = True,
) -> ActivationProfile:
    """An encoder-decoder's profile, counted on proxies of one and two encoder and decoder layers (PAIR_PROXIES) at
    the run's source and target lengths: `per_layer` is the mean over the real model's layers (each encoder layer
    costs in the source length, each decoder layer in the target's and, through cross-attention, the source's);
    a checkpointed model recomputes the larger of an encoder and a decoder layer. Its logits' side (the output head
    at target tokens, fused with the loss) is carried from two vocabularies to the real one, as a causal LM's."""
    config = _config_from_json(config_json)
    names = stack_layers(config)
    real = [int(getattr(config, n)) for n in names]
    vocab = int(config.vocab_size)
    small = min(vocab, 512)
    lengths = (seq_len, target_len)
    counts, fused = _pair_counts(config_json, names, lengths, precision, checkpointing, (lora, fusable), small)
    base, layers, copies_base, copies = _split_pair_counts(counts, small, checkpointing)
    full = max(_split_pair_counts(counts, small, False)[1]) if checkpointing else 0.0
    c, one = checkpointing, PAIR_PROXIES[0]
    more = {b: counts[(one, b, c, 2 * small)] - counts[(one, b, c, small)] for b in (2, 4)}
    per_seq, fixed = _vocabulary_share(more, small, vocab)
    return ActivationProfile(
        per_layer=sum(n * x for n, x in zip(real, layers)) / sum(real),
        base=base + per_seq,
        copies_per_layer=sum(n * x for n, x in zip(real, copies)) / sum(real),
        copies_base=copies_base + fixed,
        layer_full=full,
        source=f"saved tensors counted on encoder-decoder proxies of 1-2 encoder and 1-2 decoder layers at source "
        f"length {seq_len} and target length {target_len}, {precision}, logits carried from vocabularies {small} "
        f"and {2 * small} to {vocab}",
        fused_head=fused,
        encoder_layer=(layers[0], copies[0]),
    )


def _pair_counts(
    config_json: str,
    names: tuple[str, str],
    lengths: tuple[int, int],
    precision: str,
    checkpointing: bool,
    run: tuple[LoraSpec | None, bool],
    small: int,
) -> tuple[dict[tuple[tuple[int, int], int, bool, int], float], bool]:
    """Saved bytes of an encoder-decoder's proxies (PAIR_PROXIES, its layer counts `names` set) on sources and
    targets of `lengths`, at batches 2 and 4, with and without checkpointing (as planned), at the small vocabulary
    (and the smallest proxy at twice it), with the run's LoRA and whether it may fuse the head and the loss (`run`):
    {((encoder, decoder layers), batch, ckpt, vocab): bytes}, and whether the proxies fused them."""
    counts: dict[tuple[tuple[int, int], int, bool, int], float] = {}
    fused_head = False

    def count(stacks: tuple[int, int], ckpt: bool, vocab: int) -> None:
        nonlocal fused_head
        with _quiet():
            config = _config_from_json(config_json, vocab_size=vocab, **dict(zip(names, stacks)))
        net, _, selected, fused_head = _proxy(config, ckpt, *run, precision=precision)
        for batch in (2, 4):
            counts[(stacks, batch, ckpt, vocab)] = _saved_bytes(
                net, batch, lengths[0], precision, None, 1.0, selected, fused_head, lengths[1]
            )

    with _proxy_runs():
        for stacks in PAIR_PROXIES:
            for ckpt in {False, checkpointing}:
                count(stacks, ckpt, small)
        count(PAIR_PROXIES[0], checkpointing, 2 * small)
    return counts, fused_head


def _split_pair_counts(counts: dict, small: int, ckpt: bool) -> tuple[float, tuple, float, tuple]:
    """(base, (per encoder layer, per decoder layer), fixed copies outside the layers, (fixed copies per encoder
    layer, per decoder layer)) per sequence, from total(E, D, B) = B * (base + E * enc + D * dec) + copies_base +
    E * copies_enc + D * copies_dec."""
    per_seq = {k: (counts[(k, 4, ckpt, small)] - counts[(k, 2, ckpt, small)]) / 2 for k in PAIR_PROXIES}
    fixed = {k: counts[(k, 2, ckpt, small)] - 2 * per_seq[k] for k in PAIR_PROXIES}
    one = PAIR_PROXIES[0]
    layers = tuple(per_seq[k] - per_seq[one] for k in PAIR_PROXIES[1:])
    copies = tuple(max(fixed[k] - fixed[one], 0.0) for k in PAIR_PROXIES[1:])
    return per_seq[one] - sum(layers), layers, max(fixed[one] - sum(copies), 0.0), copies


def _proxy_counts(
    config_json: str, seq_len: int, precision: str, checkpointing: bool, lora, counted: float, small: int, causal: bool
) -> tuple[dict[tuple[int, int, bool, int], float], bool]:
    """Saved bytes of proxies with 1 and 2 layers, at batches 2 and 4, with and without checkpointing (as planned),
    at the small vocabulary (and, for a causal LM, one layer at twice it): {(layers, batch, ckpt, vocab): bytes},
    and whether the proxies fused the head and the loss."""
    layers_name = _layers_attr(_config_from_json(config_json))
    counts: dict[tuple[int, int, bool, int], float] = {}
    fused_head = False

    def count(n_layers: int, ckpt: bool, proxy_vocab: int) -> None:
        nonlocal fused_head
        with _quiet():
            config = _config_from_json(config_json, vocab_size=proxy_vocab, **{layers_name: n_layers})
        net, tail, counted_logits, fused_head = _proxy(config, ckpt, lora, precision=precision)
        for batch in (2, 4):
            counts[(n_layers, batch, ckpt, proxy_vocab)] = _saved_bytes(
                net, batch, seq_len, precision, tail, counted, counted_logits, fused_head
            )

    with _proxy_runs():
        for n_layers in (1, 2):
            for ckpt in {False, checkpointing}:
                count(n_layers, ckpt, small)
        if causal:
            count(1, checkpointing, 2 * small)
    return counts, fused_head


def _split_counts(counts: dict, small: int, ckpt: bool) -> tuple[float, float, float, float]:
    """(base, per layer, fixed copies outside the layers, fixed copies per layer) per sequence, from
    total(L, B) = B * (base + L * layer) + copies_base + L * copies_layer."""
    per_seq = {n: (counts[(n, 4, ckpt, small)] - counts[(n, 2, ckpt, small)]) / 2 for n in (1, 2)}
    fixed = {n: counts[(n, 2, ckpt, small)] - 2 * per_seq[n] for n in (1, 2)}
    layer = per_seq[2] - per_seq[1]
    copies_layer = max(fixed[2] - fixed[1], 0.0)
    return per_seq[1] - layer, layer, max(fixed[1] - copies_layer, 0.0), copies_layer


def _logits_backward_peak(
    facts: ModelFacts,
    profile: Any,
    workspace: WorkspaceModel,
    micro_batch: int,
    rows: int,
    checkpointing: bool,
    act: float,
    bwd_ws: float,
    fused_transient: float,
) -> tuple[float, float]:
    """(activations, transients) at the backward peak of a model with an output head over the vocabulary at `rows`
    positions of a micro-batch (a causal LM's, an encoder-decoder's). Its logits dominate the part outside the
    layers, and backward meets them first: the peak is at the loss (everything saved, no layer recomputed yet, the
    logits' gradients in flight) or later in the layers (the logits' tensors freed; a checkpointed layer
    recomputed, the layers' own transients), whichever is larger."""
    recompute = micro_batch * profile.layer_full + profile.copies_per_layer if checkpointing else 0.0
    transient = workspace.transient_logits
    if profile.fused_head:  # the head and loss fused: a chunk of rows at a time, in the forward pass
        from leantrain.model.losses import HEAD_CHUNK_ROWS

        rows, transient = min(rows, HEAD_CHUNK_ROWS), fused_transient
    logits = rows * facts.vocab * 4  # one fp32 copy
    at_loss = (act - recompute, transient * logits)
    in_layers = (act - micro_batch * profile.base, bwd_ws)
    return max(at_loss, in_layers, key=sum)


def _backward(
    facts: ModelFacts,
    micro_batch: int,
    lengths: tuple[int, int],
    precision: str,
    checkpointing: bool,
    workspace: WorkspaceModel,
    lora: LoraSpec | None,
    counted: float,
    freeze: str | None,
    fusable: bool = True,
    late_grads: float = 0.0,
) -> tuple[float, float, tuple[float, float] | None]:
    """(activations, transients) at the backward peak of a micro-step on rows of `lengths` (a source's and, for an
    encoder-decoder, a target's: 0, as long as the source), and the same at the end of backward where that is
    larger (else None); `late_grads`: the gradients alive at the end of backward that the caller does not add
    itself."""
    seq_len, target_len = lengths[0], lengths[1] or lengths[0]
    pair = facts.kind == "seq2seq"
    profile = activation_profile(
        facts.config_json,
        seq_len,
        precision,
        checkpointing,
        lora=lora,
        counted=counted,
        target_len=target_len if pair else 0,
        fusable=fusable or not pair,
    )
    leading = frozen_leading_layers(facts.config_json, freeze) if lora is None and freeze else 0
    still = facts.layers - leading  # the layers that save anything (an encoder-decoder's frozen ones: its encoder's)
    act = saved = profile.saved(micro_batch, facts.layers, checkpointing, leading) - _untaken_head_gradient(
        facts, profile, lora, freeze
    )
    # Transients of the micro-step: about one fp32 feed-forward activation in flight (see WorkspaceModel), of the
    # longer of an encoder-decoder's source and target
    tokens = max(seq_len, target_len) if pair else seq_len
    bwd_ws = layers_ws = workspace.transient_ffn.get(precision, 1.2) * micro_batch * tokens * facts.intermediate * 4
    if facts.kind in ("causal-lm", "seq2seq"):  # the output head at every target token, or where a token counts
        rows = micro_batch * (target_len if pair else counted_positions(seq_len, counted))
        fused = workspace.transient_pair_fused_logits.get(precision, 3.0) if pair else workspace.transient_fused_logits
        act, bwd_ws = _logits_backward_peak(
            facts, profile, workspace, micro_batch, rows, checkpointing, act, bwd_ws, fused
        )
    if still == 0:  # nothing trains below the head: backward ends there
        return act, bwd_ws, None
    embedding = (_embedding_gradient(facts, lora, freeze), _embedding_reused(facts))
    first = 0.0 if lora is not None else _first_layer_gradient(facts.config_json, freeze)
    # the first trained layer's activations (recomputed, under checkpointing); no more than all that is saved (a
    # classifier's only trained layer may run at the first token only)
    layer = micro_batch * (profile.layer_full if checkpointing else profile.per_layer) + profile.copies_per_layer
    end = _backward_end(min(layer, saved), (layers_ws, first), late_grads, embedding)
    return act, bwd_ws, end if sum(end) > act + bwd_ws else None


def _untaken_head_gradient(
    facts: ModelFacts, profile: ActivationProfile, lora: LoraSpec | None, freeze: str | None
) -> float:
    """The fused head's weight gradient, which the proxies take in the forward pass, where `--freeze` freezes the
    output layer (a tied one with the embeddings): then it is not taken. (LoRA's proxies run as the run does.)"""
    from leantrain.model import freezing

    if lora is not None or not profile.fused_head or not freezing.patterns(freeze):
        return 0.0
    return 0.0 if _head_trains(facts.config_json, freeze) else 4.0 * facts.vocab * facts.hidden


@functools.lru_cache(maxsize=16)
def _head_trains(config_json: str, freeze: str, trust_remote_code: bool = False) -> bool:
    """Whether the output layer's weight trains under `--freeze`."""
    head = trained_net(config_json, None, freeze, trust_remote_code).get_output_embeddings()
    return head is not None and head.weight.requires_grad


def _embedding_gradient(facts: ModelFacts, lora: LoraSpec | None, freeze: str | None) -> float:
    """Bytes of the input embedding matrix's gradient: 0 where it does not train (frozen, or under LoRA)."""
    inv = trainable_inventory(facts, lora, freeze)
    return 4.0 * sum(math.prod(s) for s, e in zip(inv.shapes, inv.embedding) if e)


@functools.lru_cache(maxsize=16)
def _first_layer_gradient(config_json: str, freeze: str | None, trust_remote_code: bool = False) -> float:
    """Bytes of the gradients of the first layer that trains (an encoder-decoder's, of its encoder): made while that
    layer's activations are freed, at the end of backward."""
    import torch

    from leantrain.model import freezing

    config = _config_from_json(config_json)
    n = int(getattr(config, stack_layers(config)[0] if is_seq2seq(config) else _layers_attr(config)))
    net = _build(config, "meta", trust_remote_code)
    freezing.apply(net, freeze)
    layers = next((m for m in net.modules() if isinstance(m, torch.nn.ModuleList) and len(m) == n), None)
    trained = [sum(p.numel() for p in layer.parameters() if p.requires_grad) for layer in layers or ()]
    return 4.0 * next((x for x in trained if x), 0)


def _embedding_reused(facts: ModelFacts) -> bool:
    """Whether the input embedding matrix gets a gradient before the end of backward too: an encoder-decoder's is
    shared by its encoder and decoder (and often its head), a causal LM's may be tied to its output layer."""
    return facts.kind == "seq2seq" or (facts.kind == "causal-lm" and _tied_head(facts.config_json))


@functools.lru_cache(maxsize=16)
def _tied_head(config_json: str, trust_remote_code: bool = False) -> bool:
    """Whether the model's output layer is its input embedding matrix (built on the meta device)."""
    net = _build(_config_from_json(config_json), "meta", trust_remote_code)
    head, table = net.get_output_embeddings(), net.get_input_embeddings()
    return head is not None and table is not None and head.weight is table.weight


def _backward_end(
    layer: float, first: tuple[float, float], late_grads: float, embedding: tuple[float, bool]
) -> tuple[float, float]:
    """(activations, transients) at the end of backward: every gradient made (`late_grads`: those the caller does
    not add) but the first trained layer's (`first`: its transients and its gradients, made as its activations
    `layer` are freed), or after that layer the input embedding matrix's dense gradient (`embedding`: its bytes,
    and whether it is reused). A reused matrix already holds a gradient (a tied head's, or the decoder's), so this
    one is a transient on top; else it is the last gradient made, and before it the others only. With its layers
    checkpointed, t5-small at 16 pairs of 128 and 64 tokens peaks here, not at the loss
    (benchmarks/results/planner_accuracy_seq2seq.md); so does a causal LM whose head is its embedding matrix, at
    micro-batches whose activations weigh less than its gradients."""
    (bwd_ws, layer_grads), (size, reused) = first, embedding
    last = 0.0 if reused else min(size, late_grads)  # (with accumulation it exists from the first micro-step)
    own = min(layer_grads, late_grads - last)  # (with accumulation: alive all along, in the caller's share)
    return layer, late_grads - last + max(bwd_ws - own, (size if reused else last) - layer)


def _weight_bytes(
    facts: ModelFacts, lora: LoraSpec | None, freeze: str | None, precision: str, device: str
) -> tuple[int, int]:
    """(the weights' bytes, the bytes of the dequantized copy a quantized base makes of one layer in each forward).
    A bf16/fp16 run keeps its frozen matmul weights in its precision: 2 bytes a number (`freezing.store_frozen`)."""
    from leantrain.model import freezing
    from leantrain.parallel.precision import frozen_dtype

    low = frozen_dtype(precision, device) is not None
    # embedding tables are kept low where the precision holds their values exactly: a checkpoint stored in bf16
    tables = precision == "bf16" and json.loads(facts.config_json).get("dtype") == "bfloat16"
    if lora is None:
        weights = 4 * facts.inventory.numel + facts.inventory.buffer_bytes
        if low and freezing.patterns(freeze):
            weights -= 2 * stored_low_numel(facts.config_json, None, freeze or "", tables)
        return weights, 0
    lora_inv = lora_inventory(facts.config_json, lora)
    weights = lora_inv.frozen_bytes + 4 * lora_inv.trainable.numel + facts.inventory.buffer_bytes
    weights -= 2 * stored_low_numel(facts.config_json, lora, None, tables) if low else 0
    return weights, 4 * lora_inv.largest_linear if lora.quantize else 0


@functools.lru_cache(maxsize=16)
def stored_low_numel(
    config_json: str, lora: LoraSpec | None, freeze: str | None, tables: bool, trust_remote_code: bool = False
) -> int:
    """Numbers of the frozen weights a bf16/fp16 run keeps in its precision (`model.freezing.stored_low`, embedding
    tables with `tables`) under LoRA (less a quantized base's, quantized instead) or --freeze."""
    from leantrain.model import freezing
    from leantrain.model import lora as adapters

    net = _build(_config_from_json(config_json), "meta", trust_remote_code)
    quantized: set[int] = set()
    if lora is not None and lora.quantize:
        names = adapters.quantized_names(net, adapters.head_modules(net) + _afresh(net, lora))
        quantized = {id(p) for n in names for p in net.get_submodule(n).parameters()}
    if lora is not None:
        net = _with_adapters(net, lora)
    else:
        freezing.apply(net, freeze)
    return sum(p.numel() for p in freezing.stored_low(net, tables) if id(p) not in quantized)


def estimate(
    facts: ModelFacts,
    micro_batch: int,
    seq_len: int,
    precision: str,
    checkpointing: bool,
    optimizer: str,
    grad_accum: int = 1,
    device: str = "cpu",
    workspace: WorkspaceModel = DEFAULT_WORKSPACE,
    lora: LoraSpec | None = None,
    counted: float = 1.0,
    settings: Any = None,
    flat: bool = False,
    freeze: str | None = None,
    target_len: int = 0,
    fuse_head: bool = True,
) -> MemoryEstimate:
    """Predicted peak training memory of one configuration (see the module docstring). With `lora`, gradients and
    optimizer state are the adapters' and the head's alone, and the frozen weights count as stored (quantized).
    `counted`: a causal LM's largest share of a row's positions whose next token counts (instruction tuning counts
    completions only): its logits, their copies and gradients are that share of every position's. `settings`: the
    optimizer's (e.g. a projection rank), any object with the config's fields. `flat`: the parameters are kept
    flat (`model.flat`), whose gradients stay allocated between steps. `freeze`: --freeze's names, whose parameters
    keep no gradient or state; the first layers it freezes with everything before them save no activations (later
    frozen layers are counted as if they trained: an overestimate). `target_len`: an encoder-decoder's target tokens
    (its sources are `seq_len` long; 0: as long); `fuse_head`: whether its run fuses the output head with the loss
    where the model allows (--label-smoothing takes the logits: it does not)."""
    weights, dequantized = _weight_bytes(facts, lora, freeze, precision, device)
    inv = trainable_inventory(facts, lora, freeze)
    grads = 4 * inv.numel
    state = inv.state_bytes(optimizer, settings)
    # With accumulation the gradients are alive through the whole backward (flat parameters': the small ones' buffer);
    # without it, each gradient appears as its layer's activations are freed and adds little at the peak.
    grads_in_backward = grads if grad_accum > 1 else (4 * inv.flat_numel() if flat else 0)
    act, bwd_ws, end = _backward(
        facts, micro_batch, (seq_len, target_len), precision, checkpointing, workspace, lora, counted, freeze,
        fuse_head, grads - grads_in_backward,
    )  # fmt: skip
    backward = act + bwd_ws + grads_in_backward + dequantized
    opt_ws = inv.temporaries(optimizer, settings)  # the registry's fitted temporaries
    step = grads + opt_ws
    # the end of backward shows its parts only where it is the peak: else the saved activations are the news
    if end is not None and sum(end) + grads_in_backward + dequantized > max(backward, step):
        (act, bwd_ws), backward = end, sum(end) + grads_in_backward + dequantized
        phase = "end of backward"
    else:
        phase = "backward" if backward >= step else "optimizer step"
    runtime = workspace.runtime_bytes(device, precision)
    return MemoryEstimate(
        weights=weights,
        gradients=grads,
        optimizer_state=state,
        activations=int(act),
        backward_workspace=int(bwd_ws),
        optimizer_workspace=int(opt_ws),
        runtime=runtime,
        phase=phase,
        peak=int(weights + state + runtime + max(backward, step)),
    )
