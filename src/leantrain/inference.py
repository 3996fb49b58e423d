"""Evaluate and predict with a trained run (or any sequence-classification model folder)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from leantrain.data.sources import ReadOptions
from leantrain.errors import DataError
from leantrain.models import library_bars_off
from leantrain.problem_inference import evaluate_problem, predict_problem, problem_of


def _load(run_or_model: str):
    from leantrain import models

    path = models.resolve_model(run_or_model)
    tokenizer = models.load_tokenizer(path)
    model, names = models.load_trained(path, "text-classification")
    run_attention(path, model)
    return path, model, tokenizer, names


def _loader(tokens, labels: np.ndarray, tokenizer, batch_size: int):
    from torch.utils.data import DataLoader

    from leantrain.data.batching import Collator, ExamplesDataset, eval_batches
    from leantrain.data.prepare import Examples

    data = Examples(tokens, labels)
    return DataLoader(
        ExamplesDataset(data),
        batch_sampler=eval_batches(data.lengths, batch_size),
        collate_fn=Collator(tokenizer.pad_token_id or 0),
    )


def _task_of(run_or_model: str) -> tuple[str, Any, str]:
    from leantrain import models

    path = models.resolve_model(run_or_model)
    config = models.load_config(path)
    return path, config, models.infer_task(config)


def _load_media(path: str, config, task: str):
    """An image or audio classifier and the processor it was trained with (data/media.py)."""
    from leantrain import models
    from leantrain.data import media

    model, names = models.load_trained(path, task)
    run_attention(path, model)
    return model, media.load_processor(path, model.config, task), names


def _media_loader(features, labels: np.ndarray, task: str, batch_size: int):
    from torch.utils.data import DataLoader

    from leantrain.data.batching import ExamplesDataset, eval_batches
    from leantrain.data.media import MediaCollator
    from leantrain.data.prepare import Examples

    data = Examples(features, labels)
    return DataLoader(
        ExamplesDataset(data),
        batch_sampler=eval_batches(data.lengths, batch_size),
        collate_fn=MediaCollator(task, features.norm),
    )


def _evaluate_media(
    path, config, task, data, label_column, label_pattern, input_column, batch_size, cache_dir, metrics=None, read=None
):
    from leantrain.data.media import load_media_source
    from leantrain.data.tokenize import default_cache_dir

    model, mp, names = _load_media(path, config, task)
    src = load_media_source(
        data,
        mp,
        Path(cache_dir) if cache_dir else default_cache_dir(),
        "eval",
        input_column=input_column,
        label_column=label_column,
        label_pattern=label_pattern,
        options=read,
    )
    label_id = {n: i for i, n in enumerate(names)}
    unseen = sorted(set(src.labels) - set(label_id))
    if unseen:
        raise DataError(f"{data}: labels {unseen[:5]} are unknown to the model (it knows {names})")
    labels = np.array([label_id[x] for x in src.labels], dtype=np.int64)
    probs, y, _ = _run(model, _media_loader(src.features, labels, task, batch_size), task)
    return {**_scores(probs, y, names, metrics), "examples": len(y), "skipped": src.report.rows_dropped}


def _scores(probs: np.ndarray, labels: np.ndarray, names: list[str], metrics: str | None) -> dict[str, Any]:
    """The requested metrics (issue #17), the per-class report and the confusion matrix."""
    from leantrain.scoring import classification_report, parse_metrics
    from leantrain.tasks.classification import classification_metrics

    wanted = tuple(parse_metrics(metrics))
    return {**classification_metrics(probs, labels, wanted), **classification_report(probs, labels, names)}


def _predict_media(path, config, task, files, data, input_column, batch_size, read=None) -> list[dict[str, Any]]:
    from leantrain.data.media import MediaListing, list_source, process_source
    from leantrain.data.sources import ReadReport

    model, mp, names = _load_media(path, config, task)
    if files is not None:
        missing = [f for f in files if not Path(f).is_file()]
        if missing:
            raise DataError(f"{missing[0]}: no such file")
        listing = MediaListing("--file", list(files), list(files), None, "-", "files", ReadReport("--file", len(files)))
    else:
        listing = list_source(data, task, need_labels=False, input_column=input_column, split="eval", options=read)
    src = process_source(listing, mp, strict=files is not None)
    if src.skipped:
        import logging

        logging.getLogger("leantrain").warning(
            "%s: %d unreadable files skipped (%s)", data, src.report.rows_dropped, ", ".join(src.skipped)
        )
    probs, _, index = _run(
        model, _media_loader(src.features, np.zeros(len(src.names), dtype=np.int64), task, batch_size), task
    )
    out: list[dict[str, Any]] = [{} for _ in src.names]
    for p, i in zip(probs, index):
        best = int(p.argmax())
        out[i] = {
            "file": src.names[i],
            "label": names[best],
            "score": float(p[best]),
            "probabilities": {n: round(float(q), 6) for n, q in zip(names, p)},
        }
    return out


def _run(model, loader, task: str = "text-classification", precision: str = "fp32"):
    """Probabilities, labels and example ids of every example in `loader`, through the evaluator's gathering."""
    from leantrain import parallel
    from leantrain.tasks import BUILTIN
    from leantrain.training.evaluator import gather_rows

    accelerator = parallel.make_accelerator(precision)
    model, loader = accelerator.prepare(model, loader)
    runner = BUILTIN[task](None)
    runner.check_model(model)  # what it may skip (a classifier's last layer beyond the first token)
    rows = gather_rows(model, loader, accelerator, runner)
    return rows["probs"], rows["labels"], rows["index"]


def _evaluate_held_out(run_or_model: str, batch_size: int, metrics: str | None) -> dict[str, Any]:
    """The run's own evaluation set again: its --eval-data, or the rows its --eval-fraction held out of --data
    (stratified on the labels, with its seed), prepared as training prepared them, scored by its task."""
    import yaml

    from leantrain import models, parallel
    from leantrain.config import TrainConfig
    from leantrain.data.batching import ExamplesDataset, eval_batches
    from leantrain.errors import ConfigError
    from leantrain.scoring import classification_report
    from leantrain.tasks import resolve
    from leantrain.training.evaluator import gather_rows

    run = Path(run_or_model).expanduser()
    if not ((run / "config.yaml").is_file() and (run / "model").is_dir()):
        raise ConfigError(
            f"{run_or_model}: not a leantrain run directory (no config.yaml beside model/), so there is no held-out "
            "split to score: give --data"
        )
    values = yaml.safe_load((run / "config.yaml").read_text())
    cfg = TrainConfig.from_dict({**values, "model": str(run / "model"), "metrics": metrics or values.get("metrics")})
    model_path = str(run / "model")
    model_config = models.load_config(model_path)
    task = resolve(cfg, model_config)
    data = task.prepare_data(model_path, model_config)
    model = task.build_model(model_path, data)  # the trained weights, with the run's labels
    run_attention(model_path, model)
    accelerator = parallel.make_accelerator("fp32")
    from torch.utils.data import DataLoader

    loader = DataLoader(
        ExamplesDataset(data.eval),
        batch_sampler=eval_batches(data.eval.lengths, batch_size),
        collate_fn=task.collator(data, train=False),
    )
    model, loader = accelerator.prepare(model, loader)
    task.check_model(model)
    rows = gather_rows(model, loader, accelerator, task)
    out: dict[str, Any] = dict(task.scores(rows))
    if "probs" in rows and getattr(task, "problem_type", None) == "single-label":
        out.update(classification_report(rows["probs"], rows["labels"], list(data.label_names)))
    held = f"held out of {cfg.data} ({cfg.eval_fraction:.0%}, stratified, seed {cfg.seed})"
    return {**out, "examples": len(data.eval), "data": cfg.eval_data or held}


@library_bars_off()  # transformers' loading bars would interleave with the result
def evaluate(
    run_or_model: str,
    data: str | None = None,
    *,
    text_column: str | None = None,
    text_pair_column: str | None = None,
    label_column: str | None = None,
    max_length: int | None = None,
    batch_size: int = 64,
    cache_dir: str | None = None,
    image_column: str | None = None,
    audio_column: str | None = None,
    label_pattern: str | None = None,
    metrics: str | None = None,
    label_separator: str | None = None,
    threshold: float | None = None,
    read: ReadOptions | None = None,
) -> dict[str, Any]:
    """Scores of a trained model on a labelled file (or, for images and audio, folder): `metrics` (comma-separated,
    as --metrics; default accuracy and macro-F1) and the loss, the per-class report (`per_class`) and the
    confusion matrix (`confusion_matrix`, rows: true class, columns: predicted, in the order of `labels`).
    Multi-label models: `label_separator` and `threshold` default to the run's own (--label-separator,
    --multi-label-threshold). `read`: how to read `data` (--format, --column-names, --data-config, --split), as
    for training. Without `data`, a run directory is scored on its own evaluation set (its --eval-data, or the
    rows it held out of --data)."""
    from leantrain.data.prepare import load_source
    from leantrain.data.tokenize import default_cache_dir

    if data is None:
        return _evaluate_held_out(run_or_model, batch_size, metrics)
    path, config, task = _task_of(run_or_model)
    if task == "causal-lm":  # --- causal LM (issue #14): loss and perplexity
        from leantrain import lm_inference

        cache = cache_dir or str(default_cache_dir())
        return lm_inference.evaluate(
            path, data, max_length=max_length or lm_max_length(path, config), batch_size=batch_size, cache_dir=cache,
            text_column=text_column, read=read, run=lambda name: run_setting(path, name),
        )  # fmt: skip
    if task != "text-classification":
        column = image_column if task == "image-classification" else audio_column
        return _evaluate_media(
            path, config, task, data, label_column, label_pattern, column, batch_size, cache_dir, metrics, read
        )
    _, model, tokenizer, names = _load(run_or_model)
    src = load_source(
        data,
        tokenizer,
        max_length or run_max_length(path),
        Path(cache_dir) if cache_dir else default_cache_dir(),
        "eval",
        text_column,
        text_pair_column,
        label_column,
        options=read,
    )
    if (problem := problem_of(model)) is not None:  # issue #17: regression and multi-label models
        separator = label_separator if label_separator is not None else run_setting(path, "label_separator")
        cut = run_threshold(path, threshold)
        return evaluate_problem(problem, model, tokenizer, names, src, batch_size, metrics, separator, cut)
    label_id = {n: i for i, n in enumerate(names)}
    unseen = sorted(set(src.labels) - set(label_id))
    if unseen:
        raise DataError(
            f"{data}: labels {unseen[:5]} in column '{src.columns.label}' are unknown to the model (it knows {names})"
        )
    labels = np.array([label_id[x] for x in src.labels], dtype=np.int64)
    probs, y, _ = _run(model, _loader(src.tokens, labels, tokenizer, batch_size))
    return {**_scores(probs, y, names, metrics), "examples": len(y)}


@library_bars_off()
def predict(
    run_or_model: str,
    data: str | None = None,
    *,
    texts: list[str] | None = None,
    text_column: str | None = None,
    text_pair_column: str | None = None,
    max_length: int | None = None,
    batch_size: int = 64,
    files: list[str] | None = None,
    image_column: str | None = None,
    audio_column: str | None = None,
    max_new_tokens: int = 32,
    temperature: float | None = None,
    top_p: float | None = None,
    threshold: float | None = None,
    chat: bool = False,
    read: ReadOptions | None = None,
) -> list[dict[str, Any]]:
    """One row per input: the text (or file), the predicted label, its probability and all probabilities; for a
    language model, the prompt and its generated completion (`chat`: each text is a user's message, rendered
    with the model's chat template; a 'messages' column is read as chats); for a multi-label model, the labels
    at or above `threshold` (default: the run's --multi-label-threshold). `read`: how to read `data`, as for
    training."""
    from leantrain.data.columns import resolve_columns
    from leantrain.data.sources import read_table
    from leantrain.data.tokenize import tokenize

    if sum(x is not None for x in (texts, data, files)) != 1:
        raise DataError("predict: give one of --text, --file or --data")
    path, config, task = _task_of(run_or_model)
    if chat and task != "causal-lm":
        raise DataError(f"{run_or_model}: --chat is for language models, and this is a {task} model")
    if task == "causal-lm":  # --- causal LM (issue #14)
        if files is not None:
            raise DataError(f"{run_or_model}: a language model; give prompts with --text or a table with --data")
        sampling: dict[str, Any] = dict(max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p)
        return _generate(path, texts, data, text_column, read, chat, batch_size, sampling)
    if task != "text-classification":
        if texts is not None:
            what = task.split("-")[0]
            raise DataError(f"{run_or_model}: an {what} classifier; give {what} files with --file or --data")
        column = image_column if task == "image-classification" else audio_column
        return _predict_media(path, config, task, files, data, column, batch_size, read)
    if files is not None:
        raise DataError(f"{run_or_model}: a text classifier; give texts with --text or a table with --data")
    _, model, tokenizer, names = _load(run_or_model)
    pairs = None
    if data is not None:
        df, _ = read_table(data, split="eval", options=read)
        cols = resolve_columns(df, data, text_column, text_pair_column, None, require_label=False)
        df = df[df[cols.text].astype(str).str.strip() != ""]
        texts = df[cols.text].astype(str).tolist()
        pairs = df[cols.text_pair].astype(str).tolist() if cols.text_pair else None
    assert texts is not None
    if not texts:
        raise DataError(f"{data or '--text'}: no text to predict")
    tokens = tokenize(tokenizer, texts, pairs, max_length or run_max_length(path))
    if (problem := problem_of(model)) is not None:  # issue #17: regression and multi-label models
        cut = run_threshold(path, threshold)
        return predict_problem(problem, model, tokenizer, names, texts, pairs, tokens, batch_size, cut)
    probs, _, index = _run(model, _loader(tokens, np.zeros(len(texts), dtype=np.int64), tokenizer, batch_size))
    out: list[dict[str, Any]] = [{} for _ in texts]
    for p, i in zip(probs, index):
        best = int(p.argmax())
        row: dict[str, Any] = {"text": texts[i]}
        if pairs is not None:
            row["text_pair"] = pairs[i]
        row.update(
            {
                "label": names[best],
                "score": float(p[best]),
                "probabilities": {n: round(float(q), 6) for n, q in zip(names, p)},
            }
        )
        out[i] = row
    return out


def _generate(path: str, texts, data, text_column, read, chat: bool, batch_size: int, sampling: dict[str, Any]):
    """A language model's completions of `texts` or of `data`'s prompts (`chat`: each a user's message)."""
    from leantrain.lm_inference import generate

    prompts: list[Any] = texts if texts is not None else _prompts(data, text_column, read)
    if chat:
        prompts = [[{"role": "user", "content": p}] if isinstance(p, str) else p for p in prompts]
    return generate(path, prompts, batch_size=batch_size, attention=run_setting(path, "attention"), **sampling)


def _prompts(data: str | None, column: str | None, read: ReadOptions | None = None) -> list[Any]:
    """The prompts of a table: --text-column, else its 'prompt' column, else the chats of its 'messages' column
    (each up to its last assistant message, which the model is to write), else its one text column."""
    from leantrain.data import instructions
    from leantrain.data.columns import resolve_columns
    from leantrain.data.sources import read_table

    assert data is not None
    df, _ = read_table(data, split="eval", options=read)
    if column is None and instructions.kind_of(df) == "messages":
        return instructions.chat_prompts(df, data)
    if column is None and "prompt" in df.columns:
        column = "prompt"
    cols = resolve_columns(df, data, column, None, None, require_label=False)
    return [str(t) for t in df[cols.text] if str(t).strip()]


#: inputs are cut here when neither --max-length nor the run says otherwise
DEFAULT_MAX_LENGTH = 128


def run_setting(model_path: str, name: str) -> Any:
    """A setting the model was trained with: a checkpoint's manifest, or the run's config.yaml beside model/;
    None for a model leantrain did not train (or a setting its run did not record)."""
    import yaml

    path = Path(model_path)
    try:
        if (path / "checkpoint.json").is_file():
            saved = json.loads((path / "checkpoint.json").read_text())["config"]
        elif (path.parent / "config.yaml").is_file() and (path.parent / "metrics.json").is_file():
            saved = yaml.safe_load((path.parent / "config.yaml").read_text())
        else:
            return None
        return saved.get(name)
    except (OSError, ValueError, KeyError, TypeError, AttributeError, yaml.YAMLError):
        return None


def run_attention(model_path: str, model) -> None:
    """The attention kernel the run forced with --attention (issue #16); auto's runs keep the model's default."""
    from leantrain import attention

    attention.apply_forced(model, run_setting(model_path, "attention"))


def run_max_length(model_path: str) -> int:
    """The --max-length the model was trained with (issue #17); DEFAULT_MAX_LENGTH for a model leantrain did not
    train."""
    try:
        return int(run_setting(model_path, "max_length") or DEFAULT_MAX_LENGTH)
    except (TypeError, ValueError):
        return DEFAULT_MAX_LENGTH


#: the longest rows a language model leantrain did not train is scored in (transformers' run_clm.py blocks text alike)
LM_CONTEXT_CAP = 1024


def lm_max_length(model_path: str, config: Any) -> int:
    """A language model's rows in `evaluate`: the run's --max-length, else the model's context up to
    LM_CONTEXT_CAP tokens (a pretrained base's perplexity depends on how much context each token has)."""
    try:
        trained = int(run_setting(model_path, "max_length") or 0)
    except (TypeError, ValueError):
        trained = 0
    context = getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", None)
    return trained or min(int(context or DEFAULT_MAX_LENGTH), LM_CONTEXT_CAP)


def run_threshold(model_path: str, threshold: float | None) -> float:
    """The multi-label threshold: the one given, else the run's --multi-label-threshold, else 0.5."""
    if threshold is None:
        threshold = run_setting(model_path, "multi_label_threshold")
    value = 0.5 if threshold is None else float(threshold)
    if not 0 < value < 1:
        raise DataError(f"--multi-label-threshold must be between 0 and 1, got {value:g}")
    return value


def write_predictions(rows: list[dict[str, Any]], path: str | None, stream) -> None:
    """JSON lines to `stream`, or to `path` (.jsonl/.json) or as CSV (.csv/.tsv) by its suffix."""
    if path is None:
        for row in rows:
            stream.write(json.dumps(row, ensure_ascii=False) + "\n")
        return
    target = Path(path)
    if target.suffix.lower() in (".csv", ".tsv"):
        import pandas as pd

        flat = [
            {k: "|".join(v) if k == "labels" else v for k, v in r.items() if k != "probabilities"}
            | {f"p_{n}": q for n, q in r.get("probabilities", {}).items()}
            for r in rows
        ]
        pd.DataFrame(flat).to_csv(target, index=False, sep="\t" if target.suffix.lower() == ".tsv" else ",")
    else:
        with target.open("w", encoding="utf-8") as f:
            for row in rows:
                f.write(json.dumps(row, ensure_ascii=False) + "\n")
