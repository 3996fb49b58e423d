"""How a mixture's sources are written: `--data path`, `path@weight`, or a mapping with the source's own read options.

The part after a source's last `@` is its weight; a path that exists is read whole, so a name holding `@` still
works. Weights are relative: every source has one, or none has (each source then counts its rows, `repeat` times;
`limit` caps a source), as MosaicML Streaming's `proportion` against its `repeat` and `choose`. Nothing here reads
data: the config checks `--data` with it before a run starts (`data.mixture` mixes the sources' examples).
"""

from __future__ import annotations

import difflib
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from leantrain.errors import ConfigError

MIX_BY = ("examples", "tokens")
#: config fields a source may set for itself (the same names as the flags); the others are the run's
PER_SOURCE_FIELDS = (
    "eval_data",
    "data_config",
    "data_split",
    "eval_split",
    "format",
    "column_names",
    "text_column",
    "text_pair_column",
    "label_column",
    "image_column",
    "audio_column",
    "label_pattern",
    "eval_pattern",
    "eval_fraction",
    "text_glob",
    "text_documents",
    "chat_template",
    "label_separator",
    "limit",
)
#: what only a source has: where it is, what it is called, how much of it to draw, what its label ids mean
MIX_KEYS = ("path", "name", "weight", "repeat", "labels")
#: shorter spellings inside a source's mapping
KEY_ALIASES = {"config": "data_config", "split": "data_split"}
#: the suffixes a source's name drops (the stem of `sms.tsv` is `sms`)
_NAME_SUFFIXES = (".csv", ".tsv", ".tab", ".json", ".jsonl", ".ndjson", ".parquet", ".pq", ".txt")
_NUMBER = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?|[-+]?(nan|inf|infinity)", re.IGNORECASE)


@dataclass(frozen=True)
class SourceSpec:
    """One source of a mixture as the user wrote it."""

    path: str
    name: str
    weight: float | None = None
    repeat: float | None = None
    #: this source's label ids: the class names in id order (a label column of ids 0..k-1 means these)
    labels: tuple[str, ...] | None = None
    #: per-source values of config fields (`PER_SOURCE_FIELDS`), as (field, value) pairs
    options: tuple[tuple[str, Any], ...] = ()

    def option(self, key: str, default: Any = None) -> Any:
        return dict(self.options).get(key, default)

    def recorded(self) -> str | dict[str, Any]:
        """How config.yaml records it: a path alone when that is all there is, else a mapping."""
        plain = self.weight is None and self.repeat is None and self.labels is None and not self.options
        if plain and self.name == default_name(self.path):
            return self.path
        out: dict[str, Any] = {"path": self.path}
        if self.name != default_name(self.path):
            out["name"] = self.name
        for key in ("weight", "repeat"):
            if getattr(self, key) is not None:
                out[key] = getattr(self, key)
        if self.labels is not None:
            out["labels"] = list(self.labels)
        out.update(self.options)
        return out


def parse_sources(value: Any, flag: str = "--data") -> list[SourceSpec]:
    """The sources `--data` (a string, or a list of strings and mappings) names, checked: refused in one line."""
    items = value if isinstance(value, (list, tuple)) else [value]
    if not items:
        raise ConfigError(f"{flag}: an empty list; give at least one source")
    specs = [_parse_item(item, flag) for item in items]
    _check_names(specs, flag)
    _check_shares(specs, flag)
    return specs


def recorded(specs: list[SourceSpec]) -> str | list[Any]:
    """`--data` as config.yaml records it: one plain path stays a string (`data: x.csv`), else a list."""
    if len(specs) == 1 and isinstance(specs[0].recorded(), str):
        return specs[0].path
    return [s.recorded() for s in specs]


def is_mixture(specs: list[SourceSpec]) -> bool:
    """Several sources, or one with what only a mixture's source has (a repeat, an id map, its own options)."""
    return len(specs) > 1 or not isinstance(specs[0].recorded(), str)


def default_name(path: str) -> str:
    """A source's name when it has no `name:`: the file's stem (`corpus.txt` -> corpus), a hub name's last part."""
    tail = re.split(r"[/\\]", path.rstrip("/\\"))[-1] or path
    for suffix in _NAME_SUFFIXES:
        if tail.lower().endswith(suffix) and len(tail) > len(suffix):
            tail = tail[: -len(suffix)]
            break
    return tail.replace(":", "-")


def _parse_item(item: Any, flag: str) -> SourceSpec:
    if isinstance(item, Path):
        item = str(item)
    if isinstance(item, str):
        text = item.strip()
        if text.startswith("{"):  # a mapping on the command line: --data '{path: sms.tsv, weight: 0.2}'
            item = _flow_mapping(text, flag)
        else:
            path, weight = split_weight(text, flag)
            return SourceSpec(path, default_name(path), weight)
    if not isinstance(item, dict):
        raise ConfigError(f"{flag}: a source is a path or a mapping with a 'path' key, got {item!r}")
    return _from_mapping(item, flag)


def _flow_mapping(text: str, flag: str) -> dict[str, Any]:
    import yaml

    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{flag} {text!r}: not a YAML mapping ({str(exc).splitlines()[0]})") from None
    if not isinstance(value, dict):
        raise ConfigError(f"{flag} {text!r}: not a YAML mapping")
    return value


def split_weight(text: str, flag: str = "--data") -> tuple[str, float | None]:
    """'corpus.txt@0.7' -> ('corpus.txt', 0.7). A path that exists is never split (a file named 'a@2' is read
    whole); the part after the last '@' is a weight when it is a number, or when what comes before it exists."""
    if not text:
        raise ConfigError(f"{flag}: an empty source; give a path")
    if "@" not in text or Path(text).expanduser().exists():
        return text, None
    head, tail = text.rsplit("@", 1)
    if not head:
        return text, None
    if _NUMBER.fullmatch(tail.strip()) or (Path(head).expanduser().exists() and not re.search(r"[/\\]", tail)):
        return head, _weight(tail, f"{flag} {text}")
    return text, None


def _weight(value: Any, where: str, key: str = "weight") -> float:
    """A positive finite number (a string from the command line, a number from YAML)."""
    try:
        if isinstance(value, bool):
            raise ValueError
        number = float(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{where}: the {key} {value!r} is not a number; write e.g. 0.3") from None
    if not math.isfinite(number) or number <= 0:
        raise ConfigError(f"{where}: the {key} must be a positive number, got {value!r}")
    return number


def _from_mapping(item: dict[str, Any], flag: str) -> SourceSpec:
    values = {KEY_ALIASES.get(str(k).replace("-", "_"), str(k).replace("-", "_")): v for k, v in item.items()}
    known = (*MIX_KEYS, *PER_SOURCE_FIELDS)
    for key in values:
        if key not in known:
            hint = difflib.get_close_matches(key, known, n=1)
            fix = f"did you mean '{hint[0]}'?" if hint else f"a source takes {', '.join(known)}"
            raise ConfigError(f"{flag}: a source has an unknown key '{key}'; {fix}")
    path = values.pop("path", None)
    if not isinstance(path, (str, Path)) or not str(path).strip():
        raise ConfigError(f"{flag}: a source mapping needs a 'path' (got {item!r})")
    path = str(path).strip()
    where = f"{flag} {path}"
    name = values.pop("name", None)
    if name is not None and (not isinstance(name, (str, int)) or not str(name).strip()):
        raise ConfigError(f"{where}: the name must be a non-empty string, got {name!r}")
    weight = values.pop("weight", None)
    repeat = values.pop("repeat", None)
    labels = values.pop("labels", None)
    if labels is not None:
        if not isinstance(labels, (list, tuple)) or len(labels) < 1:
            raise ConfigError(f"{where}: labels is the class names in id order, e.g. [ham, spam]; got {labels!r}")
        labels = tuple(str(x).strip() for x in labels)
        if len(set(labels)) != len(labels):
            raise ConfigError(f"{where}: labels names a class twice: {list(labels)}")
    if values.get("eval_data") is not None and "eval_fraction" in values:
        raise ConfigError(
            f"{where}: eval_fraction holds out a share of this source, but its eval_data gives its evaluation rows, "
            "so it would be ignored: remove one of the two"
        )
    limit = values.get("limit")
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit <= 0):
        raise ConfigError(f"{where}: limit must be a positive whole number of rows, got {limit!r}")
    return SourceSpec(
        path,
        str(name).strip() if name is not None else default_name(path),
        None if weight is None else _weight(weight, where),
        None if repeat is None else _weight(repeat, where, "repeat"),
        labels,
        tuple(sorted(values.items())),
    )


def _check_names(specs: list[SourceSpec], flag: str) -> None:
    seen: dict[str, str] = {}
    for s in specs:
        if s.name in seen:
            raise ConfigError(
                f"{flag}: two sources are named '{s.name}' ({seen[s.name]}, {s.path}); give each its own name: "
                "in YAML a mapping with a 'name' key, on the command line --data '{path: ..., name: ...}'"
            )
        seen[s.name] = s.path


def _check_shares(specs: list[SourceSpec], flag: str) -> None:
    weighted = [s for s in specs if s.weight is not None]
    if weighted and len(weighted) < len(specs):
        missing = ", ".join(s.path for s in specs if s.weight is None)
        raise ConfigError(
            f"{flag}: weights are given for some sources and not for {missing}; give every source a weight "
            "(path@weight), or none (each source then counts its rows)"
        )
    if weighted:  # the shares are weight / sum: a sum beyond a float gives none (the run then never stepped)
        weights = [float(s.weight) for s in weighted]  # type: ignore[arg-type]
        total = sum(weights)
        if not math.isfinite(total) or min(weights) / total == 0.0:
            raise ConfigError(
                f"{flag}: the weights {', '.join(f'{w:g}' for w in weights)} cannot be made shares in floating point "
                "(too large to add up, or too far apart); weights are relative: write them as shares, e.g. 0.7 and 0.3"
            )
    if weighted and any(s.repeat is not None for s in specs):
        raise ConfigError(
            f"{flag}: a source has both weights and repeat; weights set every source's share, repeat sets one by "
            "its size: use one or the other"
        )
