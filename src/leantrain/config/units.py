"""Amounts of memory and time as users write them (--memory 8GiB, --max-time 5m) and as leantrain prints them."""

from __future__ import annotations

from collections.abc import Mapping

from leantrain.errors import ConfigError

MIB = 2**20
GIB = 2**30
_UNITS = {
    "": 1,
    "b": 1,
    "k": 1000,
    "kb": 1000,
    "kib": 2**10,
    "m": 1000**2,
    "mb": 1000**2,
    "mib": 2**20,
    "g": 1000**3,
    "gb": 1000**3,
    "gib": 2**30,
    "t": 1000**4,
    "tb": 1000**4,
    "tib": 2**40,
}


def _amount(text: str | int | float, units: Mapping[str, float], flag: str, what: str, examples: str) -> float:
    """A number with one of `units` after it ('' when bare), in the unit `units` maps to 1."""
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        return float(text)
    import re

    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([A-Za-z]*)\s*", str(text))
    if not m or m.group(2).lower() not in units:
        raise ConfigError(f"{flag}: cannot read {text!r} as {what}; write it like {examples}")
    return float(m.group(1)) * units[m.group(2).lower()]


def parse_memory(text: str | int | float, flag: str = "--memory") -> int:
    """Bytes in '8GiB', '512MiB', '8GB', '1.5 GiB', '123456' (bytes). GiB/MiB are powers of 2, GB/MB of 10."""
    n = int(_amount(text, _UNITS, flag, "an amount of memory", "8GiB, 512MiB, 8GB or 2.5GB"))
    if n <= 0:
        raise ConfigError(f"{flag}: must be more than 0 bytes, got {text!r}")
    return n


def format_bytes(n: float) -> str:
    """1.5 GiB, 384 MiB: binary units, as --memory reads them."""
    if abs(n) >= GIB:
        return f"{n / GIB:.2f} GiB"
    return f"{n / MIB:.0f} MiB"


_SECONDS = {"": 1, "s": 1, "sec": 1, "m": 60, "min": 60, "h": 3600}


def parse_duration(text: str | int | float, flag: str = "--max-time") -> float:
    """Seconds in '260', '260s', '4.5m', '1h' (a bare number is seconds)."""
    seconds = _amount(text, _SECONDS, flag, "a time", "260, 260s, 4.5m or 1h")
    if not seconds > 0:
        raise ConfigError(f"{flag}: must be more than 0 seconds, got {text!r}")
    return seconds
