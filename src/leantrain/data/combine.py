"""The one way every task turns `--data` into its training and evaluation examples: each source read by the task's
own single-source reader (with the source's read options), then duplicates and contamination counted (and dropped
when asked), labels merged into one head, and the sources mixed (`data.mixture`). One source stays what it always
was: the same examples, batched by `GlobalBatchSampler`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from leantrain.data.dedupe import Overlap, overlap
from leantrain.data.mixture import SourceSpan, merged_names, mix, pooled_eval
from leantrain.data.prepare import Examples
from leantrain.data.spec import SourceSpec, is_mixture, parse_sources
from leantrain.errors import ConfigError, DataError


@dataclass
class SourceData:
    """One source as the task's reader gives it: training and evaluation rows (`Examples`, or units such as a
    language model's documents that `finish` turns into examples), their label names and what to tell the user."""

    train: Any
    eval: Any
    notes: list[str] = field(default_factory=list)
    label_names: list[str] = field(default_factory=list)
    #: the codec that encoded this source's labels (its names may have grown with evaluation rows)
    codec: Any = None


@dataclass
class Prepared:
    """The run's data: what the trainer batches and evaluates, the head's labels and the notes."""

    train: Any
    eval: Examples
    label_names: list[str]
    notes: list[str]
    specs: list[SourceSpec]
    overlap: Overlap | None = None

    def facts(self) -> dict[str, dict[str, Any]]:
        """Per source of a mixture (empty for one source): its rows, the share asked of it, what an epoch draws,
        its duplicates and its evaluation rows that training holds too."""
        if len(self.specs) < 2:
            return {}
        spans = {s.name: s for s in spans_of(self.eval)}
        mixed = {s.name: s for s in getattr(self.train, "sources", [])}
        requested = self.train.requested() if hasattr(self.train, "requested") else {}
        out: dict[str, dict[str, Any]] = {}
        for spec in self.specs:
            row: dict[str, Any] = {"path": spec.path, "weight": requested.get(spec.name)}
            if spec.name in mixed and hasattr(mixed[spec.name], "span"):
                row.update(train_rows=len(mixed[spec.name].span), epoch_examples=mixed[spec.name].quota)
            if spec.name in spans:
                row["eval_rows"] = len(spans[spec.name])
            if self.overlap is not None:
                row["duplicate_train_rows"] = self.overlap.within[spec.name] + self.overlap.across[spec.name]
                row["contaminated_eval_rows"] = self.overlap.eval_hits.get(spec.name, 0)
            out[spec.name] = row
        return out


def sources_of(cfg) -> list[SourceSpec]:
    from leantrain.data.sources import EMBEDDED_DATA

    return parse_sources(cfg.data if cfg.data is not None else EMBEDDED_DATA)


def single_source(cfg, task: str) -> None:
    """Refuse a mixture for a task that reads one source (`task`: its name, for the message)."""
    specs = sources_of(cfg)
    if is_mixture(specs):
        raise ConfigError(
            f"--data: --task {task} reads one source, not a mixture of {len(specs)}; join the files into one "
            "(with the same columns) and give it once"
        )


def source_config(cfg, spec: SourceSpec):
    """The run's config as one source sees it: its path as --data and its own read options over the run's."""
    return cfg.replace(data=spec.path, **dict(spec.options))


def refuse_unread_choices(cfg, folders: str = "dataset") -> None:
    """Refuse a split or configuration that a source has none of (`--data train.csv --data-split validation` would
    train on all of train.csv), in one line naming the flag and the source; `folders`: how the task reads a plain
    folder (`sources.PLAIN_FOLDERS`). Not asked of a trained run's recorded config, which evaluate reads back."""
    from leantrain.data.sources import read_options, unread_choice

    specs = sources_of(cfg)
    mixed = is_mixture(specs)
    for spec in specs:
        sub = source_config(cfg, spec) if mixed else cfg
        _refuse_unread_reading(sub, spec, mixed)
        for role, source in (("train", sub.data or spec.path), ("eval", sub.eval_data)):
            options = read_options(sub, role)
            found = None if source is None else unread_choice(source, options, folders)
            if found is not None:
                where = f"--data source {spec.name} ({spec.path}): " if mixed else ""
                raise ConfigError(where + _unread_message(spec, role, options, found))


def _refuse_unread_reading(sub, spec: SourceSpec, mixed: bool) -> None:
    """--format or --column-names where neither of a source's files (training, evaluation) is a file they read: a
    folder or a hub data set, read as its own files say, would ignore them without a word."""
    from leantrain.data.sources import read_options, unread_reading

    sources = [s for s in (sub.data or spec.path, sub.eval_data) if s is not None]
    found = unread_reading(sources, read_options(sub, "train"))
    if found is not None:
        key, value, what = found
        flag = "--" + key.replace("_", "-") if spec.option(key) is None else key  # else the source's own key
        where = f"--data source {spec.name} ({spec.path}): " if mixed else ""
        raise ConfigError(f"{where}{flag} {value}: {what}; leave {flag} out (it is for a file's own reading)")


def _unread_message(spec: SourceSpec, role: str, options, found: tuple[str, str, str]) -> str:
    from leantrain.data.sources import unread_message

    key = {"config": "data_config", "split": "data_split" if role == "train" else "eval_split"}[found[0]]
    flag = "--" + key.replace("_", "-") if spec.option(key) is None else key  # else the source's own key
    value = options.config if found[0] == "config" else options.split
    return unread_message(flag, value, found, "--data (or --eval-data)" if role == "train" else "--eval-data")


#: how a task reads one source: (the source's config, the label codec to use or None) -> SourceData
Reader = Callable[[Any, Any], SourceData]


def prepare_sources(
    cfg,
    read: Reader,
    *,
    codec: Callable[[], Any] | None = None,
    finish: Callable[[Any, Any], tuple[Examples, Examples]] | None = None,
    tokens: bool = True,
    what: str = "text",
) -> Prepared:
    """Read every source of `cfg.data` with `read`, then count and drop duplicates, merge labels and mix.

    `codec` makes a label codec (None: the task's labels are class ids, or it has none); `finish` turns a source's
    training and evaluation units into examples after deduplication (a language model packs its documents);
    `tokens`: whether examples have tokens (`--mix-by tokens`); `what`: the kind of rows, for messages."""
    specs = sources_of(cfg)
    _check_run(cfg, specs, tokens, what)
    mixed = is_mixture(specs)
    loaded = [_read_one(cfg, spec, read, codec, mixed) for spec in specs]
    if getattr(loaded[0].train, "streaming", False):
        return _streamed(cfg, specs, loaded, mixed)
    notes = [note for d in loaded for note in d.notes]
    found = _overlap(cfg, specs, loaded, notes)
    finished = [_finish(d, finish) for d in loaded]
    _check_alike(specs, finished)
    label_names = _merge_labels(specs, loaded, finished, codec) if mixed else list(loaded[0].label_names)
    for spec, (train, _) in zip(specs, finished):
        if len(train) == 0:
            raise DataError(f"{spec.path}: source '{spec.name}' yields no training rows; fix it or drop it")
    if not mixed or (len(specs) == 1 and (specs[0].repeat or 1) == 1):
        return Prepared(finished[0][0], finished[0][1], label_names, notes, specs, found)
    mixture = mix([(s.name, t) for s, (t, _) in zip(specs, finished)], specs, getattr(cfg, "mix_by", "examples"))
    evaluation = pooled_eval([(s.name, e) for s, (_, e) in zip(specs, finished)])
    notes.append(describe(mixture))
    return Prepared(mixture, evaluation, label_names, notes, specs, found)


def _streamed(cfg, specs: list[SourceSpec], loaded: list[SourceData], mixed: bool) -> Prepared:
    """--streaming: one stream as it is, or several mixed window by window (`data.stream_mixture`)."""
    if not mixed:
        return Prepared(loaded[0].train, loaded[0].eval, list(loaded[0].label_names), loaded[0].notes, specs)
    from leantrain.data.stream_mixture import mix_streams

    streams, evaluation, labels, notes = mix_streams(cfg, specs, loaded)
    return Prepared(streams, evaluation, labels, notes, specs)


def _check_run(cfg, specs: list[SourceSpec], tokens: bool, what: str) -> None:
    """What a run's settings cannot do with these sources: refused in one line before anything is read."""
    if getattr(cfg, "mix_by", "examples") == "tokens" and not tokens:
        raise ConfigError(f"--mix-by tokens: {what} has no tokens; weigh the sources by examples (--mix-by examples)")
    if len(specs) > 1 and cfg.eval_data:
        raise ConfigError(
            "--eval-data with several sources: give each source its own (eval_data: in its mapping), or let each hold "
            "out --eval-fraction of its rows"
        )
    for flag in ("dedupe", "decontaminate"):
        if getattr(cfg, flag, False) and (getattr(cfg, "streaming", False) or not tokens):
            why = "a stream is never whole" if getattr(cfg, "streaming", False) else f"{what} has no text to compare"
            raise ConfigError(f"--{flag} compares the texts of every row; {why}: drop --{flag}")


def _read_one(cfg, spec: SourceSpec, read: Reader, codec: Callable[[], Any] | None, mixed: bool) -> SourceData:
    from leantrain.data.labels import SourceClassLabels

    sub = source_config(cfg, spec) if mixed else cfg
    if not mixed:
        return read(sub, codec() if codec is not None else None)
    if spec.labels is not None and codec is not None:
        raise ConfigError(f"--data {spec.path}: labels (an id map) is for single-label classification")
    own = codec() if codec is not None else SourceClassLabels(spec.labels, spec.path)
    data = read(sub, own)
    data.codec = own
    return data


def _finish(data: SourceData, finish: Callable[[Any, Any], tuple[Examples, Examples]] | None):
    return (data.train, data.eval) if finish is None else finish(data.train, data.eval)


def _check_alike(specs: list[SourceSpec], finished: list[tuple[Examples, Examples]]) -> None:
    """Sources feed one model: text pairs in all of them or in none."""
    paired = [getattr(t.features, "token_type_ids", None) is not None for t, _ in finished]
    if any(paired) and not all(paired):
        pairs = ", ".join(s.name for s, p in zip(specs, paired) if p)
        single = ", ".join(s.name for s, p in zip(specs, paired) if not p)
        raise DataError(
            f"--data: sources {pairs} hold text pairs and {single} single texts; a model trains on one kind: give "
            "every source the same kind of text columns"
        )


def _overlap(cfg, specs: list[SourceSpec], loaded: list[SourceData], notes: list[str]) -> Overlap | None:
    """Duplicates and contamination by text hashes (rows without hashes: none to find); drops rows when asked."""
    train = [getattr(d.train, "hashes", None) for d in loaded]
    evaluation = [getattr(d.eval, "hashes", None) for d in loaded]
    if any(h is None for h in train + evaluation):
        return None
    names = [s.name for s in specs]
    found = overlap(list(zip(names, train)), list(zip(names, evaluation)))  # type: ignore[arg-type]
    dedupe, clean = bool(getattr(cfg, "dedupe", False)), bool(getattr(cfg, "decontaminate", False))
    notes.extend(found.notes(dedupe, clean))
    for name, data in zip(names, loaded):
        drop = np.zeros(len(data.train), dtype=bool)
        if dedupe:
            drop[found.duplicate_rows[name]] = True
        if clean:
            drop[found.contaminated_rows[name]] = True
        if drop.any():
            data.train = data.train.subset(np.flatnonzero(~drop))
    return found


def _merge_labels(
    specs: list[SourceSpec],
    loaded: list[SourceData],
    finished: list[tuple[Examples, Examples]],
    codec: Callable[[], Any] | None,
) -> list[str]:
    """The head's labels, the union of the sources'; each source's label ids (or multi-hot columns) re-encoded."""
    if codec is not None and not hasattr(loaded[0].codec, "names"):  # numbers (regression): nothing to merge
        return list(loaded[0].label_names)
    per_source = [list(d.codec.names) for d in loaded]
    if not any(per_source):  # a task without labels (a language model's rows)
        return []
    merged = merged_names(specs, per_source, [sorted(set(d.codec.names)) for d in loaded])
    index = {name: i for i, name in enumerate(merged)}
    for names, pair in zip(per_source, finished):
        remap = np.array([index[n] for n in names], dtype=np.int64)
        for examples in pair:
            if examples.labels.ndim == 2:  # multi-hot rows: each source's columns into the head's
                wide = np.zeros((len(examples.labels), len(merged)), dtype=examples.labels.dtype)
                wide[:, remap] = examples.labels
                examples.labels = wide
            elif len(examples.labels):
                examples.labels = remap[examples.labels]
    return merged


def describe(mixture) -> str:
    """One line: each source's requested share, its examples an epoch and the passes over its rows that makes."""
    requested = mixture.requested()
    by = f"weighted by {mixture.mix_by}" if mixture.sources[0].weight is not None else "each counting its rows"
    parts = [
        f"{s.name} {requested[s.name]:.0%} ({s.quota:,} of {len(s.span):,} rows an epoch, "
        f"{s.quota / len(s.span):.2g} pass{'' if s.quota == len(s.span) else 'es'})"
        for s in mixture.sources
    ]
    return (
        f"mixture of {len(mixture.sources)} sources, {by}: "
        + "; ".join(parts)
        + (f"; an epoch is {mixture.epoch_size:,} examples")
    )


def spans_of(examples: Any) -> tuple[SourceSpan, ...]:
    return tuple(getattr(examples, "spans", ()) or ())
