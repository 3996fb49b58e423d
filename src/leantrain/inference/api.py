"""`evaluate` and `predict`: a trained run's model (or any model folder a task can load) scored on labelled data, or
applied to new inputs.

Both rebuild the run's own config from what it recorded (`job.for_inference`), resolve its task from the registry,
and run the model as the run's own evaluation runs it: the task's data preparation, the same eval loader and the
same gathering (`tasks.evaluation`), in the run's precision and attention kernel. What differs between workloads
is the task's: `Task.evaluation_data`, `evaluation_report`, `prediction_data`, `prediction_rows` and `predict`.
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from typing import Any

from leantrain.data.sources import ReadOptions
from leantrain.errors import ConfigError, DataError, LeantrainError
from leantrain.model.loading import library_bars_off
from leantrain.parallel import callers_random_states


def _source(data: str, read: ReadOptions | None, run_or_model: str, **columns: Any) -> dict[str, Any]:
    """Config values that point the job at `data`, read as `read` says, with the columns given (else guessed): a
    new source is read on its own terms, not with the training data's columns or format; the run's own training or
    evaluation file, given with no reading setting, is read as the run read it."""
    read = read or ReadOptions()
    values = {
        "data": data,
        "eval_data": data,
        "data_config": read.config,
        "eval_split": read.split,
        "data_split": None,
        "column_names": ",".join(read.column_names) if read.column_names else None,
        "format": read.format,
        "eval_pattern": None,
        # token classification: a new file's columns and tag scheme are its own
        "tokens_column": None,
        "tags_column": None,
        "spans_column": None,
        "tag_column": None,
        "tag_scheme": "auto",
        **{k: v for k, v in columns.items() if v is not None or k not in TOKEN_KEYS},
    }
    if all(values.get(k) in (None, "auto") for k in READ_KEYS):  # told nothing of how to read it
        values.update(_as_its_run_read(run_or_model, data))
    return values


#: how a file is read: what a run's own file is read with again
READ_KEYS = (
    "format", "column_names", "text_column", "text_pair_column", "label_column", "tokens_column", "tags_column",
    "spans_column", "tag_column", "tag_scheme", "source_column", "target_column", "image_column", "audio_column",
    "label_pattern", "reward_column",
)  # fmt: skip


def _as_its_run_read(run_or_model: str, data: str) -> dict[str, Any]:
    """The reading settings (`READ_KEYS`) of the run behind `run_or_model` when `data` is the very file it trained
    on or held out from; else none."""
    from leantrain.config.saved import read_run_values
    from leantrain.model.loading import resolve_model

    try:
        saved = read_run_values(resolve_model(run_or_model)) or {}
        given = Path(data).resolve(strict=True)
        own = [Path(saved[k]).resolve() for k in ("data", "eval_data") if isinstance(saved.get(k), str)]
    except (OSError, LeantrainError, ValueError):  # not a file, or no model there: _job says so in its own words
        return {}
    if given not in own:
        return {}
    return {k: saved[k] for k in READ_KEYS if saved.get(k) is not None}


#: token classification's reading keys that a new source gets afresh unless given
TOKEN_KEYS = ("tokens_column", "tags_column", "spans_column", "tag_column", "tag_scheme")


def _refuse_unread_choice(job, data: str, read: ReadOptions) -> None:
    """A --split or --data-config that `data` has none of (a single file, a folder read whole), or a --format or
    --column-names that a folder or hub data set does not take, refused as `train` refuses them: `data` would be
    read without a word of them."""
    from leantrain.data.sources import unread_choice, unread_message, unread_reading

    found = unread_choice(data, read, job.task.plain_folder)
    if found is not None:
        flag, value = ("--split", read.split) if found[0] == "split" else ("--data-config", read.config)
        raise ConfigError(unread_message(flag, str(value), found, "--data"))
    if (ignored := unread_reading([data], read)) is not None:
        flag = "--" + ignored[0].replace("_", "-")
        raise ConfigError(f"{flag} {ignored[1]}: {ignored[2]}; leave {flag} out (it is for a file's own reading)")


def _given(**values: Any) -> dict[str, Any]:
    return {k: v for k, v in values.items() if v is not None}


def _reading(columns: dict[str, Any], read: ReadOptions | None) -> dict[str, Any]:
    """The reading settings given (columns, --tag-scheme other than auto, --format, --split, ...), by config key."""
    read = read or ReadOptions()
    names = ",".join(read.column_names) if read.column_names else None
    options = {"format": read.format, "column_names": names, "data_config": read.config, "split": read.split}
    return {k: v for k, v in {**columns, **options}.items() if v not in (None, "auto")}


def _refuse_reading_without_data(call: str, reading: dict[str, Any]) -> None:
    """A reading setting given without --data, which nothing would read: evaluate rescores the run's own held-out
    rows as the run read them, predict reads --text or --file as they are."""
    if reading:
        key, value = next(iter(reading.items()))
        flag = "--" + key.replace("_", "-")
        what = (
            "rescores the run's held-out rows as the run read them"
            if call == "evaluate"
            else "reads its inputs as given"
        )
        raise ConfigError(
            f"{flag} {value} is for reading --data, and {call} without --data {what}; give --data, or leave {flag} out"
        )


def _checked(call: str, run_or_model, data, batch_size, read) -> tuple[Any, str | None]:
    """`run_or_model` and `data` as strings (a path is one too); a value of the wrong type, or a batch size that is
    not a positive integer, refused in one line naming the argument, before any model is loaded."""
    path_or_none = (str, os.PathLike, type(None))
    for name, value in (("run_or_model", run_or_model), ("data", data)):
        if not isinstance(value, path_or_none):
            raise ConfigError(f"{call}(): {name} must be a path (str or Path), got {type(value).__name__} {value!r}")
    if batch_size is not None and (isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size <= 0):
        raise ConfigError(f"--batch-size must be a positive integer, got {batch_size!r}")
    if read is not None and not isinstance(read, ReadOptions):
        raise ConfigError(f"{call}(): read must be a leantrain.data.sources.ReadOptions, got {type(read).__name__}")
    return (None if run_or_model is None else str(run_or_model)), None if data is None else str(data)


def _inputs(name: str, value, one: tuple[type, ...]) -> list[str] | None:
    """`texts` or `files` as a list of strings: one string (or, for files, a path) is one input, not a sequence of
    characters; a list, tuple or other iterable of them is several."""
    if value is None:
        return None
    if isinstance(value, one):
        value = [value]
    items = [value] if isinstance(value, (bytes, dict)) or not hasattr(value, "__iter__") else list(value)
    if not items:
        raise ConfigError(f"predict(): {name} is empty; give at least one")
    for x in items:
        if not isinstance(x, one):
            kind = "text" if name == "texts" else "path"
            raise ConfigError(f"predict(): {name} must be a {kind} or a list of them, got {type(x).__name__} {x!r}")
    return [str(x) for x in items]


def _refuse_empty(texts: list[str] | None, task) -> None:
    """An empty --text, where the task would answer for nothing (a label, a translation); a language model
    generates from its BOS token instead (`Task.empty_prompts`)."""
    for x in texts or ():
        if not x.strip() and not task.empty_prompts:
            raise ConfigError(f"--text {x!r} is empty; give the text to predict on, or leave that --text out")


def _job(
    call: str,
    run_or_model: str,
    overrides: dict[str, Any],
    columns: dict[str, Any],
    cache_dir: str | None,
    precision: str | None,
    data: str | None = None,
    read: ReadOptions | None = None,
):
    """The inference job of `call` (evaluate, predict): `overrides` and the `columns` that read `data` (when given)
    as the caller gave them, checked as train checks them; `data` checked for a split or configuration it has none
    of."""
    from leantrain.job import for_inference

    reading = _reading(columns, read)
    given = {*overrides, *reading}  # the rest is the run's own config, read back as it ran
    if data is None:
        _refuse_reading_without_data(call, reading)
    else:
        overrides = {**overrides, **_source(data, read, run_or_model, **columns)}
    job = for_inference(run_or_model, overrides, cache_dir=cache_dir, precision=precision, given=given)
    if not job.from_run and (defaults := job.task.inference_defaults(job.model_config)):
        defaults = {k: v for k, v in defaults.items() if k not in overrides}
        job = for_inference(
            run_or_model, {**defaults, **overrides}, cache_dir=cache_dir, precision=precision, given=given
        )
    if data is not None and read is not None:
        _refuse_unread_choice(job, data, read)
    return job


def _model(job):
    """The trained model, in evaluation mode, with the attention kernel its run evaluated with (the same choice,
    made the same way: `--attention auto` picks by device and precision)."""
    from leantrain.model import attention, dropout
    from leantrain.parallel import device_type

    model = job.task.load_trained(job.model_path)
    cfg, device = job.cfg, device_type()
    training, _ = attention.set_up(model, cfg.attention, device, job.precision, dropout.applies(cfg, device))
    evaluation = attention.for_evaluation(
        model, cfg.attention, training, packing=job.task.packing, compiled=job.compiled
    )
    if evaluation is not None:
        attention.apply(model, evaluation)
    return model


#: examples per batch when neither the call nor the run says
DEFAULT_BATCH_SIZE = 64


def _rows(job, model, data, batch_size: int | None) -> dict[str, Any]:
    """The task's evaluation rows of every example of `data.eval`, as the run's evaluation gathers them (in its
    evaluation batches, unless `batch_size` says otherwise: in bf16 the batches' padding moves the last bits)."""
    from leantrain import parallel
    from leantrain.tasks.evaluation import eval_loader, gather_rows

    batch_size = batch_size or job.cfg.eval_batch_size or DEFAULT_BATCH_SIZE
    # what it may skip (a classifier's last layer beyond the first token), checked as the trainer checks it: before
    # `prepare` wraps the forward in the run's autocast, whose rounding would fail the check where fp32 passed it
    job.task.check_model(model)
    accelerator = parallel.make_accelerator(job.precision)
    model, loader = accelerator.prepare(model, eval_loader(job.task, data, batch_size))
    return gather_rows(model, loader, accelerator, job.task)


@library_bars_off()  # transformers' loading bars would interleave with the result
@callers_random_states()  # generation seeds torch's generator: the caller's is put back
def evaluate(
    run_or_model: str,
    data: str | None = None,
    *,
    text_column: str | None = None,
    text_pair_column: str | None = None,
    label_column: str | None = None,
    max_length: int | None = None,
    batch_size: int | None = None,
    cache_dir: str | None = None,
    image_column: str | None = None,
    audio_column: str | None = None,
    label_pattern: str | None = None,
    metrics: str | None = None,
    label_separator: str | None = None,
    threshold: float | None = None,
    read: ReadOptions | None = None,
    precision: str | None = None,
    task: str | None = None,
    tokens_column: str | None = None,
    tags_column: str | None = None,
    spans_column: str | None = None,
    tag_column: int | None = None,
    tag_scheme: str | None = None,
    source_column: str | None = None,
    target_column: str | None = None,
    reward_column: str | None = None,
    max_target_length: int | None = None,
    generation_max_new_tokens: int | None = None,
) -> dict[str, Any]:
    """Scores of a trained model on a labelled file (or, for images and audio, folder): `metrics` (comma-separated,
    as --metrics; default: the run's own, else accuracy and macro-F1) and the loss; for classifiers the per-class
    report (`per_class`) and the confusion matrix (`confusion_matrix`, rows: true class, columns: predicted, in
    the order of `labels`); for a language model the loss per token and perplexity. `data` None: the run's own
    held-out rows, as it held them out. Multi-label models: `label_separator` and `threshold` default to the run's
    own. `read`: how to read `data` (--format, --column-names, --data-config, --split), as for training.
    `precision` and `batch_size`: default the run's (fp32 and 64 for a model leantrain did not train). A token
    classifier: entity F1, precision, recall (strict IOB2), token accuracy, loss and `per_type`; `data` a CoNLL file
    (`tag_column`), a table of words and tags (`tokens_column`, `tags_column`) or of texts with entity spans
    (`text_column`, `spans_column`), tags in `tag_scheme` (default: detected).
    A sequence-to-sequence model generates for every source (`source_column`, `target_column`: guessed when not given)
    and reports ROUGE (or BLEU and chrF, as its run did), the loss per target token and a few examples; `max_length`
    cuts its sources (in place of the run's --max-source-length), `max_target_length` the targets its loss counts
    (`references_cut` says how many), `generation_max_new_tokens` what it writes (default: the run's, else
    `max_target_length`). A GRPO run scores each prompt's greedy completion with its rewards (`reward_column`: guessed
    when not given). `task`: score as this task, not the run's own (a preference-tuned model as a causal LM on
    instruction rows)."""
    run_or_model, data = _checked("evaluate", run_or_model, data, batch_size, read)
    overrides = _given(
        max_length=max_length, metrics=metrics, label_separator=label_separator, multi_label_threshold=threshold,
        task=task, max_target_length=max_target_length, generation_max_new_tokens=generation_max_new_tokens,
    )  # fmt: skip
    columns = dict(
        text_column=text_column, text_pair_column=text_pair_column, label_column=label_column,
        image_column=image_column, audio_column=audio_column, label_pattern=label_pattern,
        tokens_column=tokens_column, tags_column=tags_column, spans_column=spans_column, tag_column=tag_column,
        tag_scheme=tag_scheme, source_column=source_column, target_column=target_column, reward_column=reward_column,
    )  # fmt: skip
    job = _job("evaluate", run_or_model, overrides, columns, cache_dir, precision, data, read)
    return _evaluated(job, run_or_model, data, batch_size)


def _evaluated(job, run_or_model: str, data: str | None, batch_size: int | None) -> dict[str, Any]:
    """The scores of `job`'s model on `data`, or (None) on its run's own held-out rows."""
    how = job.task
    prepared = _held_out(job, run_or_model) if data is None else how.evaluation_data(job.model_path, job.model_config)
    return _scores(how, _rows(job, _model(job), prepared, batch_size), prepared)


def _scores(task, rows, prepared) -> dict[str, Any]:
    """The task's scores and report of evaluated rows; of a mixture's held-out rows, each source's too."""
    out = {**task.scores(rows), **task.evaluation_report(rows, prepared)}
    spans = getattr(prepared.eval, "spans", ())
    if spans:  # as its run reported them
        from leantrain.tasks.evaluation import scores_by_source

        out["sources"] = scores_by_source(task, rows, spans)
    return out


def _held_out(job, run_or_model: str):
    """The run's own evaluation rows: its data prepared as it prepared them (the same split, from its seed)."""
    if not job.from_run:
        raise DataError(f"{run_or_model}: not a leantrain run, so it has no held-out rows of its own; give --data")
    prepared = job.task.prepare_data(job.model_path, job.model_config)
    trained = list(getattr(job.model_config, "id2label", {}).values()) if prepared.label_names else []
    if prepared.label_names and trained != list(prepared.label_names):
        raise DataError(
            f"{job.cfg.data}: its labels are now {prepared.label_names[:5]}, not the model's {trained[:5]}: the "
            "data changed since the run; give --data"
        )
    prepared.facts.setdefault("examples", len(prepared.eval))
    return prepared


@library_bars_off()
@callers_random_states()
def predict(
    run_or_model: str,
    data: str | None = None,
    *,
    texts: list[str] | str | None = None,
    text_column: str | None = None,
    text_pair_column: str | None = None,
    max_length: int | None = None,
    batch_size: int | None = None,
    files: list[str] | str | None = None,
    image_column: str | None = None,
    audio_column: str | None = None,
    max_new_tokens: int | None = None,
    temperature: float | None = None,
    top_p: float | None = None,
    threshold: float | None = None,
    chat: bool = False,
    read: ReadOptions | None = None,
    precision: str | None = None,
    tokens_column: str | None = None,
    aggregation: str | None = None,
    source_column: str | None = None,
) -> list[dict[str, Any]]:
    """One row per input: the text (or file), the predicted label, its probability and all probabilities; for a
    language model, the prompt and its generated completion (`chat`: each text is a user's message, rendered
    with the model's chat template; a 'messages' column is read as chats); for a sequence-to-sequence model, the
    source (`source_column` of `data`, guessed when not given) and its `generated_text`; for a multi-label model,
    the labels at or above `threshold` (default: the run's --multi-label-threshold); for a token classifier, the
    entities (type, score, text, character offsets) as `pipeline("token-classification",
    aggregation_strategy=aggregation)` groups them (default: the run's --aggregation), of texts or of words
    (`tokens_column`, a CoNLL file; each word's tag too). `max_new_tokens`: 32 for a language model, a
    sequence-to-sequence run's own --generation-max-new-tokens; `max_length` cuts its sources, in place of the run's
    --max-source-length. `read`: how to read `data`, as for training.
    `texts` or `files` a single string (`files`: or a path): that one input."""
    from leantrain.tasks.base import PredictionInputs

    if sum(x is not None for x in (texts, data, files)) != 1:
        raise DataError("predict: give one of --text, --file or --data")
    run_or_model, data = _checked("predict", run_or_model, data, batch_size, read)
    texts, files = _inputs("texts", texts, (str,)), _inputs("files", files, (str, os.PathLike))
    overrides = _given(max_length=max_length, multi_label_threshold=threshold, aggregation=aggregation)
    columns = dict(
        text_column=text_column, text_pair_column=text_pair_column, image_column=image_column,
        audio_column=audio_column, tokens_column=tokens_column, source_column=source_column,
    )  # fmt: skip
    job = _job("predict", run_or_model, overrides, columns, None, precision, data, read)
    task = job.task
    _refuse_empty(texts, task)
    if chat and not task.generates:
        raise DataError(f"{run_or_model}: --chat is for language models, and this is a {task.name} model")
    generation = _given(max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p)
    inputs = PredictionInputs(texts=texts, files=files, chat=chat, generation=generation)
    prepared, shown = task.prediction_data(job.model_path, job.model_config, inputs)
    model = _model(job)
    # a generating task runs the model itself: in the run's precision, as its evaluations generated, under one
    # autocast so that each weight is cast once, not once a token
    with _autocast(job.precision):
        return task.predict(model, prepared, shown, lambda: _rows(job, model, prepared, batch_size), inputs)


def _autocast(precision: str):
    """The autocast of `precision` on this device (none for fp32)."""
    import torch

    from leantrain.parallel import device_type

    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)
    return contextlib.nullcontext() if dtype is None else torch.autocast(device_type(), dtype=dtype)


#: the suffixes `write_predictions` writes: JSON lines, or a table
OUTPUT_SUFFIXES = (".jsonl", ".json", ".csv", ".tsv")


def check_output(path: str) -> Path:
    """Refuse, before any prediction is made, an --output whose format is unknown or whose folder cannot be made
    (made only when the predictions are written: `write_predictions`)."""
    from leantrain.run.directory import output_file

    return output_file(path, OUTPUT_SUFFIXES)


def write_predictions(rows: list[dict[str, Any]], path: str | None, stream) -> None:
    """JSON lines to `stream`, or to `path` (.jsonl/.json) or as CSV (.csv/.tsv) by its suffix."""
    if path is None:
        for row in rows:
            stream.write(json.dumps(row, ensure_ascii=False) + "\n")
        return
    from leantrain.run.directory import output_folder

    target = output_folder(check_output(path))
    try:
        _write_file(rows, target)
    except OSError as exc:
        raise DataError(f"--output {path}: cannot write ({exc.strerror or exc}); choose another path") from None


def _cell(key: str, value: Any) -> Any:
    """A CSV cell: a multi-label row's labels joined by '|'; other lists and mappings (words, tags, entities,
    chats) as JSON, which leantrain's readers take back, not Python's repr."""
    if key == "labels" and isinstance(value, list):
        return "|".join(value)
    if isinstance(value, (list, dict)):
        return json.dumps(value, ensure_ascii=False)
    return value


def _write_file(rows: list[dict[str, Any]], target: Path) -> None:
    if target.suffix.lower() in (".csv", ".tsv"):
        import pandas as pd

        flat = [
            {k: _cell(k, v) for k, v in r.items() if k != "probabilities"}
            | {f"p_{n}": q for n, q in r.get("probabilities", {}).items()}
            for r in rows
        ]
        pd.DataFrame(flat).to_csv(target, index=False, sep="\t" if target.suffix.lower() == ".tsv" else ",")
    else:
        with target.open("w", encoding="utf-8") as f:
            for row in rows:
                f.write(json.dumps(row, ensure_ascii=False) + "\n")
