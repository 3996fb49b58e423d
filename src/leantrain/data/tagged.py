"""Read token-labelled data: CoNLL files, tables of word and tag lists, and texts with entity character spans.

- CoNLL (`.conll`, or `--format conll`): one word a line with its tag, whitespace between the columns, a blank line
  between sentences; `-DOCSTART-` lines are skipped. With more than two columns `--tag-column` says which holds the
  tag (counting from 1; -1: the last).
- Tables (JSON, JSONL, Parquet, CSV with JSON lists, `datasets` folders): a list of words and a list of tags per row,
  columns guessed (`tokens`/`words` and `ner_tags`/`tags`) or named (`--tokens-column`, `--tags-column`); tags
  are names, or ids into a `datasets` ClassLabel's names.
- Span rows: a text and its entities as character offsets, as annotation tools export them (`{"start": 0, "end": 5,
  "label": "PER"}` or `[0, 5, "PER"]`), columns guessed (`entities`, `spans`, ...) or named (`--spans-column`); the
  text's words are the tokenizer's (data/alignment.py).

Every problem is refused in one line naming the file and the line or row.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from leantrain.data.sources import ReadOptions, ReadReport, decode_lines
from leantrain.errors import DataError

#: columns guessed for the words, the tags and the span annotations of a row, in order
TOKENS_NAMES = ("tokens", "words")
TAGS_NAMES = ("ner_tags", "tags", "pos_tags", "labels", "label")
SPANS_NAMES = ("entities", "spans", "label", "labels", "annotations", "ner")
CONLL_SUFFIXES = (".conll", ".conll03", ".conllu", ".iob", ".bio", ".bioes")
#: the keys of a span's type in a span dict, in the order they are looked for
_SPAN_TYPE_KEYS = ("label", "type", "entity_group", "entity", "tag", "labels")


@dataclass
class TaggedRows:
    """Sentences read from one source: words and their tags, or texts and their entities' character spans."""

    source: str
    #: where each sentence comes from ("line 12", "row 3"), for messages
    where: list[str]
    #: words of each sentence (None for span rows: the tokenizer finds a text's words)
    words: list[list[str]] | None = None
    #: tag names, one per word (None: rows to predict on)
    tags: list[list[str]] | None = None
    #: texts of span rows (or of rows to predict on)
    texts: list[str] | None = None
    #: entities of each text as (start, end, type) character offsets
    char_spans: list[list[tuple[int, int, str]]] | None = None
    report: ReadReport | None = None
    #: how the rows were read (with the column names), for the run's notes
    description: str = ""
    #: what the rows are: "conll" (a CoNLL file), "tokens" (a table of words and tags), "spans" (texts and spans)
    #: or "lines" (a text file to predict on, one text a line)
    kind: str = ""
    notes: list[str] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.where)


@dataclass(frozen=True)
class TaggedColumns:
    """Which columns (or CoNLL column) hold what: given by flags, or None to guess."""

    tokens: str | None = None
    tags: str | None = None
    text: str | None = None
    spans: str | None = None
    tag_column: int | None = None


def is_conll(source: str, options: ReadOptions) -> bool:
    return options.format == "conll" or (
        options.format is None and Path(source).suffix.lower() in CONLL_SUFFIXES and Path(source).is_file()
    )


def read_tagged(
    source: str, split: str, options: ReadOptions, columns: TaggedColumns, require_tags: bool = True
) -> TaggedRows:
    """The sentences of `source`: a CoNLL file, or a table of word/tag lists or of texts with spans; without
    `require_tags` a table may hold words or texts alone (rows to predict on)."""
    if is_conll(source, options):
        return read_conll(Path(source), columns.tag_column, require_tags)
    from leantrain.data.sources import read_table

    df, report = read_table(source, split=split, options=options)
    rows = _rows_of_table(df, source, columns, require_tags)
    rows.report = report
    return rows


#: the reading flags of token rows: the kinds of rows that read each, the field of TaggedColumns it sets, what it
#: is for, and where the flag meant may be
_FLAGS: dict[str, tuple[tuple[str, ...], str, str, str]] = {
    "--tokens-column": (("tokens",), "tokens", "a table's words", ""),
    "--tags-column": (("tokens",), "tags", "a table's tags", " (a CoNLL file's tag column is --tag-column)"),
    "--text-column": (("spans",), "text", "the texts of span rows", ""),
    "--spans-column": (("spans",), "spans", "a table's entity spans", ""),
    "--tag-column": (("conll",), "tag_column", "CoNLL files", " (a table's tags are named with --tags-column)"),
}
_KIND_NAMES = {
    "conll": "a CoNLL file",
    "tokens": "a table of words and tags",
    "spans": "texts with entity spans",
    "lines": "a text file, one text a line",
}


def unread_flag(columns: TaggedColumns, tag_scheme: str, read: list[TaggedRows]) -> str | None:
    """One line refusing a reading flag that none of the sources `read` reads (--tags-column beside a CoNLL file,
    --tag-column beside a table, --tag-scheme beside span rows, whose labels are entity types): it would be ignored
    without a word. None when each flag given is read."""
    kinds = {rows.kind for rows in read}
    given: list[tuple[str, tuple[str, ...], Any, str, str]] = [
        (flag, kinds_, getattr(columns, f), a, b) for flag, (kinds_, f, a, b) in _FLAGS.items()
    ]
    scheme = None if tag_scheme == "auto" else tag_scheme
    given.append(("--tag-scheme", ("conll", "tokens"), scheme, "word tags", " (a span's label is an entity type)"))
    for flag, wanted, value, purpose, hint in given:
        if value is not None and not kinds & set(wanted):
            what = " and ".join(f"{rows.source} is {_KIND_NAMES[rows.kind]}" for rows in read)
            return f"{flag} {value} is for {purpose}, and {what}{hint}; drop {flag}"
    return None


# -- CoNLL -----------------------------------------------------------------------------------------------------------


def read_conll(path: Path, tag_column: int | None, require_tags: bool = True) -> TaggedRows:
    """A CoNLL file's sentences: the first column's words, the tag column's tags (the second of two); without
    `require_tags`, lines of a word alone are words to predict on (and the tags, if any, are not read). A CoNLL-U
    file (`.conllu`): the FORM column's words, its comments, multiword ranges and empty nodes skipped."""
    if not path.is_file():
        raise DataError(f"{path}: no such file; check the path given to --data/--eval-data")
    text, bad = decode_lines(path.read_bytes().replace(b"\r\n", b"\n"))
    rows = TaggedRows(str(path), [], words=[], tags=[], description="CoNLL", kind="conll")
    assert rows.words is not None and rows.tags is not None
    conllu = path.suffix.lower() == ".conllu"
    words: list[str] = []
    tags: list[str] = []
    first_line = 0
    for number, line in enumerate(text.split("\n"), start=1):
        fields = [f.strip() for f in line.split("\t")] if conllu and line.strip() else line.split()
        if conllu and fields and (line.startswith("#") or not fields[0].isdigit()):
            continue  # a comment, a multiword token's range ("1-2") or an empty node ("1.1"): no word of its own
        if not fields or fields[0] == "-DOCSTART-":
            if words:
                rows.words.append(words)
                rows.tags.append(tags)
                rows.where.append(f"line {first_line}")
            words, tags = [], []
            continue
        if not words:
            first_line = number
        words.append(fields[1] if conllu and len(fields) > 1 else fields[0])
        tags.append(_conll_tag(fields, tag_column, path, number, int(conllu)) if require_tags else "")
    if words:
        rows.words.append(words)
        rows.tags.append(tags)
        rows.where.append(f"line {first_line}")
    if not rows.words:
        raise DataError(f"{path}: no sentence in it (one word and its tag a line, a blank line between sentences)")
    if not require_tags:
        rows.tags = None
    rows.report = ReadReport(source=str(path), rows_read=len(rows.words), rows_repaired=len(bad))
    if bad:
        rows.notes.append(f"{path}: {len(bad):,} lines were not UTF-8 and were read as Windows-1252")
    return rows


def _conll_tag(fields: list[str], tag_column: int | None, path: Path, number: int, word: int = 0) -> str:
    """The tag of a line's `fields`, whose word is at index `word` (1 in CoNLL-U, after the ID)."""
    if tag_column is None:
        if len(fields) == 2 and not word:
            return fields[1]
        if len(fields) == 1:
            raise DataError(f"{path}: line {number} holds a word without a tag ({fields[0]!r}); give each word its tag")
        comment = " (a comment? only .conllu files have them: remove it)" if fields[0].startswith("#") else ""
        raise DataError(
            f"{path}: line {number} has {len(fields)} columns ({' '.join(fields)[:80]}){comment}; say which holds the "
            f"tag with --tag-column (counting from 1; -1 for the last{'; 4: UPOS' if word else ''})"
        )
    index = tag_column - 1 if tag_column > 0 else len(fields) + tag_column
    if not 0 <= index < len(fields) or index == word:
        raise DataError(
            f"{path}: line {number} has {len(fields)} columns, so no column {tag_column} (--tag-column) to hold "
            "a tag besides the word"
        )
    return fields[index]


# -- tables ----------------------------------------------------------------------------------------------------------


def _find(df: pd.DataFrame, given: str | None, guesses: tuple[str, ...], flag: str, source: str) -> str | None:
    if given is not None:
        if given not in df.columns:
            raise DataError(f"{source}: no column '{given}' (given by {flag}); columns are {_names(df)}")
        return given
    lower = {str(c).lower(): c for c in df.columns}
    return next((lower[n] for n in guesses if n in lower), None)


def _names(df: pd.DataFrame) -> str:
    return ", ".join(repr(str(c)) for c in df.columns)


def _rows_of_table(df: pd.DataFrame, source: str, columns: TaggedColumns, require_tags: bool) -> TaggedRows:
    tokens = _find(df, columns.tokens, TOKENS_NAMES, "--tokens-column", source)
    if tokens is not None and columns.spans is None:
        tags = _find(df, columns.tags, TAGS_NAMES, "--tags-column", source)
        if tags is None and require_tags:
            raise DataError(
                f"{source}: a '{tokens}' column of words but no column of tags among {_names(df)}; name it with "
                "--tags-column"
            )
        return _token_rows(df, source, tokens, tags)
    from leantrain.data.columns import resolve_columns

    spans = _find(df, columns.spans, SPANS_NAMES, "--spans-column", source)
    if spans is None and require_tags:
        raise DataError(
            f"{source}: no column of words and tags (tokens, ner_tags) nor of entity spans (entities, spans) among "
            f"{_names(df)}; name them with --tokens-column and --tags-column, or --text-column and --spans-column"
        )
    text = resolve_columns(df, source, columns.text, None, None, require_label=False).text
    return _span_rows(df, source, text, spans, require_tags)


def _token_rows(df: pd.DataFrame, source: str, tokens: str, tags: str | None) -> TaggedRows:
    names = df.attrs.get("class_names", {}).get(tags) if tags is not None else None
    rows = TaggedRows(source, [], words=[], tags=[] if tags is not None else None, kind="tokens")
    rows.description = f"words '{tokens}'" + (f", tags '{tags}'" if tags else "")
    assert rows.words is not None
    empty = 0
    for i, value in enumerate(df[tokens].tolist()):
        where = f"row {i + 1}"
        words = [str(w) for w in _as_list(value, source, tokens, where)]
        if rows.tags is not None:
            tag_list = [
                _tag_name(t, names, source, tags, where) for t in _as_list(df[tags].iloc[i], source, tags, where)
            ]
            if len(tag_list) != len(words):
                raise DataError(
                    f"{source}: {where} has {len(words)} words in '{tokens}' but {len(tag_list)} tags in '{tags}'; "
                    "give one tag per word"
                )
        if not words:
            empty += 1
            continue
        rows.words.append(words)
        if rows.tags is not None:
            rows.tags.append(tag_list)
        rows.where.append(where)
    if empty:
        rows.notes.append(f"{source}: skipped {empty:,} rows without words")
    return rows


def _as_list(value: Any, source: str, column: str | None, where: str) -> list:
    parsed = value
    if isinstance(value, str):
        try:
            parsed = json.loads(value)  # a CSV cell holding a JSON list
        except json.JSONDecodeError:
            parsed = None
    if isinstance(parsed, (list, tuple, np.ndarray)):
        return list(parsed)
    raise DataError(f"{source}: {where} of column '{column}' is not a list ({str(value)[:60]!r}); give a list per row")


def _tag_name(tag: Any, names: list[str] | None, source: str, column: str | None, where: str) -> str:
    if isinstance(tag, (int, np.integer)) and not isinstance(tag, bool):
        if names is None:
            raise DataError(
                f"{source}: {where} of column '{column}' holds tag ids ({tag}) without names; write the tags' names, "
                "or give a `datasets` folder whose ClassLabel names them"
            )
        if not 0 <= int(tag) < len(names):
            raise DataError(
                f"{source}: {where} of column '{column}' holds tag id {tag}; its ClassLabel has {len(names)}"
            )
        return names[int(tag)]
    return str(tag).strip()


def _span_rows(df: pd.DataFrame, source: str, text: str, spans: str | None, require_tags: bool = True) -> TaggedRows:
    rows = TaggedRows(source, [], texts=[], char_spans=[] if spans is not None else None, kind="spans")
    rows.description = f"text '{text}'" + (f", entity spans '{spans}'" if spans else "")
    assert rows.texts is not None
    for i, value in enumerate(df[text].tolist()):
        where = f"row {i + 1}"
        if _holds_words(value):  # words, not a text: a table of words and tags misnamed
            tags = f" and the tags' with --tags-column {spans}" if spans and require_tags else ""
            raise DataError(
                f"{source}: {where} of column '{text}' holds a list of words, not a text; name it with "
                f"--tokens-column {text}{tags}"
            )
        content = "" if value is None or (isinstance(value, float) and np.isnan(value)) else str(value)
        if rows.char_spans is not None:
            found = [_span(s, source, spans, where, content) for s in _as_list(df[spans].iloc[i], source, spans, where)]
            rows.char_spans.append(found)
        rows.texts.append(content)
        rows.where.append(where)
    return rows


def _holds_words(value: Any) -> bool:
    """A list, or a CSV cell holding a JSON list of strings: words, where a text was expected."""
    if isinstance(value, (list, tuple, np.ndarray)):
        return True
    if not (isinstance(value, str) and value.lstrip().startswith("[")):
        return False
    try:
        parsed = json.loads(value)
    except json.JSONDecodeError:
        return False
    return isinstance(parsed, list) and bool(parsed) and all(isinstance(w, str) for w in parsed)


def _check_span_label(kind: str, source: str, where: str, item: Any) -> None:
    """A span's label is an entity type: a tag ("B-PER") would train on "B-B-PER" tags, and "O" on an entity of
    type "O"."""
    from leantrain.data.tags import OUTSIDE, parse

    prefix, name = parse(kind)
    if kind == OUTSIDE:
        raise DataError(f"{source}: {where}: the span {str(item)[:80]} is labelled 'O', no entity; leave it out")
    if prefix:
        raise DataError(
            f"{source}: {where}: the span {str(item)[:80]} is labelled with the tag {kind!r}; label a span with its "
            f"entity type ({name!r})"
        )


def _span(item: Any, source: str, column: str | None, where: str, text: str) -> tuple[int, int, str]:
    """(start, end, type) of one entity of a span row, refused in one line unless it lies within its text."""
    kind: Any = None
    if isinstance(item, dict):
        start, end = item.get("start", item.get("start_offset")), item.get("end", item.get("end_offset"))
        kind = next((item[k] for k in _SPAN_TYPE_KEYS if item.get(k) is not None), None)
        if isinstance(kind, (list, tuple, np.ndarray)):  # Label Studio: "labels": ["PER"]
            kind = kind[0] if len(kind) else None
    elif isinstance(item, (list, tuple, np.ndarray)) and len(item) == 3:
        start, end, kind = item
    else:
        start = end = None
    try:
        start, end = int(start), int(end)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise DataError(
            f"{source}: {where} of column '{column}' holds the span {str(item)[:80]}; give each as "
            '{"start": 0, "end": 5, "label": "PER"} or [0, 5, "PER"]'
        ) from None
    if kind is None or not str(kind).strip():
        raise DataError(f"{source}: {where}: the span {str(item)[:80]} in column '{column}' has no label")
    _check_span_label(str(kind).strip(), source, where, item)
    if not 0 <= start < end <= len(text):
        raise DataError(
            f"{source}: {where}: the span [{start}, {end}) ({kind}) lies outside its text of {len(text)} characters; "
            "offsets count characters from 0, the end excluded"
        )
    return start, end, str(kind).strip()
