"""Rewards that score generated completions: Python functions of one's own and checkers for answers that can be checked.

`--reward` names one or several, comma-separated, each optionally weighted (`NAME=WEIGHT`, default 1): a built-in
checker (`exact-match`, `regex`, `number`) or `module:function` (`my_rewards:brevity`, or a file:
`path/to/rewards.py:brevity`). A function is called as TRL's `GRPOTrainer` calls one, so the same functions serve
both: `function(prompts=..., completions=..., completion_ids=..., **columns)`, each a list with one entry per
completion (a chat prompt's completion is `[{"role": "assistant", "content": text}]`), the row's other columns
repeated for each of its completions, and returns one number per completion. A completion's reward is the weighted
sum of its functions' rewards.
"""

from __future__ import annotations

import difflib
import importlib
import importlib.util
import math
import re
import sys
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from leantrain.errors import ConfigError

#: the built-in checkers, as --reward names them, and what each needs
BUILT_IN = ("exact-match", "regex", "number")
#: columns --reward-column is looked for in, in order, when not given
REFERENCE_COLUMNS = ("answer", "solution", "completion", "label", "target")
#: the last number in a text: an optional sign, digits (commas between thousands), an optional fraction
NUMBER = re.compile(r"[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|[-+]?\.\d+")


@dataclass
class Reward:
    """One reward function and its weight; `name` is how metrics name it (`rewards/NAME/mean`)."""

    name: str
    weight: float
    spec: str
    function: Callable[..., Sequence[Any]]


def parse(spec: str) -> list[tuple[str, float]]:
    """`--reward` as (name, weight) pairs; refused in one line when a weight is not a number."""
    out = []
    for part in (p.strip() for p in spec.split(",")):
        if not part:
            raise ConfigError(f"--reward {spec!r} has an empty entry; write e.g. exact-match,my_rewards:brevity=0.2")
        name, weight = part, 1.0
        if "=" in part:
            name, _, text = part.rpartition("=")
            try:
                weight = float(text)
            except ValueError:
                raise ConfigError(f"--reward {part!r}: the weight {text!r} is not a number") from None
            if not math.isfinite(weight):
                raise ConfigError(f"--reward {part!r}: the weight must be a finite number")
        name = name.strip()
        if ":" not in name and name.lower().replace("_", "-") in BUILT_IN:
            name = name.lower().replace("_", "-")  # exact_match, as its scores are logged, is exact-match
        if name not in BUILT_IN and ":" not in name:
            near = difflib.get_close_matches(name.lower().replace("_", "-"), BUILT_IN, n=1)
            hint = f"; did you mean {near[0]}?" if near else ""
            raise ConfigError(
                f"--reward {name!r}: neither a built-in ({', '.join(BUILT_IN)}) nor module:function (a Python "
                f"function, e.g. my_rewards:brevity or path/to/rewards.py:brevity){hint}"
            )
        out.append((name, weight))
    return out


def load(spec: str, reference: str | None, pattern: str | None) -> list[Reward]:
    """The rewards `--reward` names, their functions imported (one line naming the module when one does not)."""
    rewards = []
    for name, weight in parse(spec):
        if name == "exact-match":
            rewards.append(Reward("exact_match", weight, name, _needs(reference, name, exact_match)))
        elif name == "number":
            rewards.append(Reward("number", weight, name, _needs(reference, name, number_match)))
        elif name == "regex":
            if not pattern:
                raise ConfigError("--reward regex needs --reward-pattern (the regular expression a completion matches)")
            rewards.append(Reward("regex", weight, name, _regex(re.compile(pattern, re.DOTALL))))
        else:
            function = import_function(name)
            rewards.append(Reward(getattr(function, "__name__", name.rpartition(":")[2]), weight, name, function))
    names = [r.name for r in rewards]
    if len(set(names)) < len(names):
        raise ConfigError(f"--reward {spec!r} names a reward twice ({', '.join(names)}); give each once")
    return rewards


def _regex(pattern: re.Pattern) -> Callable:
    return lambda completions, **_: regex_match(completions, pattern)


def _needs(reference: str | None, name: str, check: Callable) -> Callable:
    if reference is None:
        raise ConfigError(
            f"--reward {name} compares each completion with a column of the data; name it with --reward-column "
            f"(none of {', '.join(REFERENCE_COLUMNS)} was found)"
        )
    return lambda completions, **columns: check(completions, columns[reference])


def import_function(spec: str) -> Callable:
    """`module:function` (a module importable from here or from the current folder) or `path/file.py:function`."""
    module_name, _, function_name = spec.rpartition(":")
    try:
        if module_name.endswith(".py"):
            path = Path(module_name).expanduser()
            if not path.is_file():
                raise ConfigError(f"--reward {spec}: no such file {str(path)!r}")
            loader = importlib.util.spec_from_file_location(f"leantrain_reward_{path.stem}", path)
            assert loader is not None and loader.loader is not None
            module = importlib.util.module_from_spec(loader)
            loader.loader.exec_module(module)
        else:
            if "" not in sys.path and str(Path.cwd()) not in sys.path:  # as `python -m` would find it
                sys.path.insert(0, str(Path.cwd()))
            module = importlib.import_module(module_name)
    except ConfigError:
        raise
    except Exception as exc:  # a module that fails to import for any reason: say which and why, in one line
        raise ConfigError(
            f"--reward {spec}: the module {module_name!r} does not import ({type(exc).__name__}: {_first_line(exc)})"
        ) from None
    function = getattr(module, function_name, None)
    if not callable(function):
        raise ConfigError(f"--reward {spec}: {module_name!r} has no function {function_name!r}")
    return function


def text_of(completion: Any) -> str:
    """A completion's text: itself, or a chat completion's messages' content."""
    if isinstance(completion, str):
        return completion
    return "".join(str(m.get("content", "")) for m in completion)


def exact_match(completions: Sequence[Any], references: Sequence[Any]) -> list[float]:
    """1 where the completion is the reference, surrounding whitespace aside; else 0."""
    return [float(text_of(c).strip() == str(r).strip()) for c, r in zip(completions, references)]


def regex_match(completions: Sequence[Any], pattern: re.Pattern) -> list[float]:
    """1 where the pattern matches somewhere in the completion (`.` spans lines; anchor with ^ and $); else 0."""
    return [float(pattern.search(text_of(c)) is not None) for c in completions]


def last_number(text: str) -> float | None:
    found = NUMBER.findall(text)
    return float(found[-1].replace(",", "")) if found else None


def number_match(completions: Sequence[Any], references: Sequence[Any]) -> list[float]:
    """1 where the completion's last number is the reference's (its last number: '#### 42' is 42), within 1e-6
    relative; else 0."""
    out = []
    for c, r in zip(completions, references):
        got, want = last_number(text_of(c)), last_number(str(r))
        out.append(float(got is not None and want is not None and math.isclose(got, want, rel_tol=1e-6, abs_tol=1e-9)))
    return out


def score(
    rewards: Sequence[Reward],
    prompts: Sequence[Any],
    completions: Sequence[Any],
    completion_ids: Sequence[Sequence[int]],
    columns: Mapping[str, Sequence[Any]],
) -> np.ndarray:
    """(completions, rewards) float64: each function's reward of each completion, checked (one line naming the
    function and the prompt for a wrong number of values or a value that is not a finite number)."""
    out = np.zeros((len(completions), len(rewards)))
    for j, reward in enumerate(rewards):
        values = _call(
            reward, prompts=list(prompts), completions=list(completions), completion_ids=list(completion_ids), **columns
        )
        values = list(values) if values is not None else []
        if len(values) != len(completions):
            raise ConfigError(
                f"--reward {reward.spec}: returned {len(values)} values for {len(completions)} completions (of prompts "
                f"from {_shown(prompts[0])}); return one number per completion"
            )
        for i, value in enumerate(values):
            number = _finite(value)
            if number is None:
                raise ConfigError(
                    f"--reward {reward.spec}: returned {value!r} for the completion {_shown(completions[i])} of the "
                    f"prompt {_shown(prompts[i])}; return a finite number for every completion"
                )
            out[i, j] = number
    return out


def _call(reward: Reward, **arguments: Any) -> Any:
    """A function of the user's that raises is told in one line, with where it raised; a built-in's error is ours,
    its traceback kept."""
    if ":" not in reward.spec:
        return reward.function(**arguments)
    try:
        return reward.function(**arguments)
    except Exception as exc:
        frame = traceback.extract_tb(exc.__traceback__)[-1]
        raise ConfigError(
            f"--reward {reward.spec}: raised {type(exc).__name__}: {_first_line(exc)} "
            f"({Path(frame.filename).name} line {frame.lineno}, in {frame.name}); fix the function"
        ) from None


def _first_line(exc: BaseException) -> str:
    """An exception's message for a one-line refusal: its first line, cut to 160 characters."""
    text = str(exc).strip()
    return text.splitlines()[0][:160] if text else ""


def _finite(value: Any) -> float | None:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def _shown(turn: Any, most: int = 60) -> str:
    text = text_of(turn) if not isinstance(turn, str) else turn
    text = " ".join(text.split())
    return repr(text if len(text) <= most else text[: most - 3] + "...")
