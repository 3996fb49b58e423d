"""The package's shape: no import cycles (lazy imports inside functions included), no function over 80 lines
but declarative tables, and a trainer that knows tasks only through their interface."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "leantrain"
MAX_LINES = 80
#: declarative tables, long by nature: the CLI's argument table
TABLES = {"leantrain.cli:build_parser"}


def modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def imports(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The package's modules that `name` imports anywhere in its file (in functions too)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
            prefix = node.module or ""
            if node.level:
                prefix = ".".join(base[: len(base) - node.level + 1] + ([node.module] if node.module else []))
            targets = [prefix] + [f"{prefix}.{a.name}" for a in node.names]
        else:
            continue
        for target in targets:
            while target and target not in known:
                target = target.rpartition(".")[0]
            # a package importing its own submodules, or a module its own package, is not a cycle
            if target and target != name and not name.startswith(target + ".") and not target.startswith(name + "."):
                out.add(target)
    return out


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    return found


def test_no_import_cycles():
    known = modules()
    graph = {name: imports(name, path, known) for name, path in known.items()}
    assert cycles(graph) == []


def test_the_cycle_finder_finds_a_cycle_through_a_lazy_import():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [["a", "b", "c"]]
    # and the reader sees imports inside functions
    known = modules()
    assert "leantrain.planner.auto" in imports("leantrain.api", known["leantrain.api"], known)


def test_no_function_is_longer_than_80_lines():
    long = []
    for name, path in modules().items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_LINES and f"{name}:{node.name}" not in TABLES:
                    long.append(f"{name}:{node.name} ({lines} lines)")
    assert long == []


def test_the_trainer_knows_tasks_only_through_their_interface():
    known = modules()
    for name, path in known.items():
        if name.startswith("leantrain.training"):
            tasks = {m for m in imports(name, path, known) if m.startswith("leantrain.tasks")}
            assert tasks <= {"leantrain.tasks.base"}, f"{name} imports {tasks}"


@pytest.mark.parametrize("module", ["leantrain.training.trainer"])
def test_the_trainer_never_names_a_workload(module):
    source = modules()[module].read_text()
    for word in ("text-classification", "image-classification", "audio-classification", "pixel_values", "tokenizer"):
        assert word not in source, word
