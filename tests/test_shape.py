"""The package's shape: a folder is a layer and imports run down; no import cycles (lazy imports inside functions and
the package face included); no function over 60 lines but declarative tables; a trainer that knows tasks only
through their interface; no issue numbers in the code."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "leantrain"
MAX_LINES = 60
#: declarative tables, long by nature: the CLI's argument table
TABLES = {"leantrain.commands.cli:build_parser"}
#: the layers, top to bottom, written once: a module may import its own room (its top folder, or itself) and the
#: rooms of the layers below it, never a room of its own layer or of one above
LAYERS: tuple[tuple[str, ...], ...] = (
    ("leantrain.__main__",),
    ("leantrain.commands",),
    ("leantrain.api",),
    ("leantrain.inference", "leantrain.training"),
    ("leantrain.job",),
    ("leantrain.planner",),
    ("leantrain.run",),
    ("leantrain.config",),
    ("leantrain.tasks",),
    ("leantrain.data",),
    ("leantrain.model",),
    ("leantrain.telemetry",),
    ("leantrain.parallel",),
    ("leantrain.errors", "leantrain.paths", "leantrain._version"),
)
#: the modules of `tasks/` that are not workloads: the interface, the registry and what every task shares
TASK_INTERFACE = {
    "leantrain.tasks.base",
    "leantrain.tasks.registry",
    "leantrain.tasks.evaluation",
    "leantrain.tasks.scoring",
}


def modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _type_checking_only(tree: ast.AST) -> set[int]:
    """Line numbers of imports under `if TYPE_CHECKING:`, which never run."""
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for inner in node.body:
                for sub in ast.walk(inner):
                    if isinstance(sub, (ast.Import, ast.ImportFrom)):
                        lines.add(sub.lineno)
    return lines


def imports(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The package's modules that `name` imports anywhere in its file (in functions too): for `from P import X`, the
    module P.X when X is one, else P itself (X is a name P defines: for `leantrain`, the package face)."""
    tree = ast.parse(path.read_text())
    skipped = _type_checking_only(tree)
    out = set()
    for node in ast.walk(tree):
        if not isinstance(node, (ast.Import, ast.ImportFrom)) or node.lineno in skipped:
            continue
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        else:
            base = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
            prefix = node.module or ""
            if node.level:
                prefix = ".".join(base[: len(base) - node.level + 1] + ([node.module] if node.module else []))
            targets = [f"{prefix}.{a.name}" if f"{prefix}.{a.name}" in known else prefix for a in node.names]
        for target in targets:
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != name:
                out.add(target)
    return out


def graph() -> dict[str, set[str]]:
    known = modules()
    return {name: imports(name, path, known) for name, path in known.items()}


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


def room(module: str) -> tuple[int, str]:
    """(layer index, room) of a module; the package face `leantrain` sits above every layer."""
    for i, layer in enumerate(LAYERS):
        for r in layer:
            if module == r or module.startswith(r + "."):
                return i, r
    if module == "leantrain":
        return -1, module
    raise AssertionError(f"{module} is in no layer: add its folder to LAYERS")


def upward(graph: dict[str, set[str]]) -> list[str]:
    """Imports that run sideways or back up the layers."""
    bad = []
    for name, targets in graph.items():
        layer, own = room(name)
        for target in targets:
            their_layer, theirs = room(target)
            if theirs != own and their_layer <= layer:
                bad.append(f"{name} -> {target}")
    return sorted(bad)


def test_no_import_cycles():
    assert cycles(graph()) == []


def test_the_cycle_finder_finds_a_cycle_through_a_lazy_import_and_through_the_package_face():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    known = modules()
    # the reader sees imports inside functions
    assert "leantrain.planner.auto" in imports("leantrain.job", known["leantrain.job"], known)
    # the face is a node: it imports the config at once and the trainer lazily, so a module below that imported
    # a name of the face would close a cycle
    g = graph()
    assert {"leantrain.config", "leantrain.api"} <= g["leantrain"]
    g["leantrain.config.sections"] = g["leantrain.config.sections"] | {"leantrain"}
    assert any("leantrain" in c and "leantrain.config.sections" in c for c in cycles(g))


def test_every_module_is_in_a_layer_and_imports_run_down():
    assert upward(graph()) == []


def test_the_layer_check_finds_an_import_up_and_one_sideways():
    g = graph()
    g["leantrain.data.prepare"] = g["leantrain.data.prepare"] | {"leantrain.training.trainer"}
    g["leantrain.inference.api"] = g["leantrain.inference.api"] | {"leantrain.training.evaluator"}
    assert upward(g) == [
        "leantrain.data.prepare -> leantrain.training.trainer",
        "leantrain.inference.api -> leantrain.training.evaluator",
    ]


def test_inference_never_imports_training():
    for name, targets in graph().items():
        if name.startswith("leantrain.inference"):
            assert not {t for t in targets if t.startswith("leantrain.training")}, name


def test_no_internal_module_imports_the_package_face():
    """`leantrain/__init__.py` is for users: a module of the package that imported a name from it (`from leantrain
    import __version__`) would run the face, and everything it imports, first."""
    users = sorted(name for name, targets in graph().items() if "leantrain" in targets)
    assert users == []


def test_the_face_check_sees_an_import_of_a_name_of_the_face(tmp_path):
    known = {"leantrain": tmp_path / "__init__.py", "leantrain.x": tmp_path / "x.py", "leantrain.y": tmp_path / "y.py"}
    (tmp_path / "x.py").write_text("def f():\n    from leantrain import __version__, y\n")
    assert imports("leantrain.x", known["leantrain.x"], known) == {"leantrain", "leantrain.y"}


def test_no_function_is_longer_than_60_lines():
    long = []
    for name, path in modules().items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_LINES and f"{name}:{node.name}" not in TABLES:
                    long.append(f"{name}:{node.name} ({lines} lines)")
    assert long == []


def test_the_trainer_knows_tasks_only_through_their_interface():
    for name, targets in graph().items():
        if name.startswith("leantrain.training"):
            tasks = {m for m in targets if m.startswith("leantrain.tasks")}
            assert tasks <= TASK_INTERFACE, f"{name} imports {tasks - TASK_INTERFACE}"


@pytest.mark.parametrize("module", ["leantrain.training.trainer", "leantrain.training.metrics_logger"])
def test_the_trainer_never_names_a_workload(module):
    source = modules()[module].read_text()
    words = ("text-classification", "image-classification", "audio-classification", "pixel_values", "tokenizer")
    for word in (*words, "grpo", "reward", "completion"):
        assert word not in source, word


#: "issue #17", "issue 17", "(#17)": the code names the feature, not the ticket that asked for it
ISSUE_NUMBER = re.compile(r"\b[Ii]ssues?\s*#?\s*\d+|\(#\d+\)")


def test_the_code_cites_no_issue_numbers():
    cited = [
        f"{path.relative_to(PACKAGE)}:{i}: {line.strip()}"
        for path in PACKAGE.rglob("*.py")
        for i, line in enumerate(path.read_text().splitlines(), 1)
        if ISSUE_NUMBER.search(line)
    ]
    assert cited == []


def test_the_issue_pattern_finds_the_ways_they_were_cited():
    for line in ("# issue #17: regression", "(issue 14)", "HF Trainer users (#17)", "see issues #3"):
        assert ISSUE_NUMBER.search(line), line
    for line in ("color = '#1f77b4'", "# 17 tests", "step #3 of 5"):
        assert not ISSUE_NUMBER.search(line), line


def test_import_leantrain_and_help_load_neither_torch_nor_transformers():
    """`import leantrain`, reading the task and optimizer registries and building `--help` stay light: the
    registries name their entries without importing them."""
    from tests.imports_helper import imported

    code = (
        "import leantrain; from leantrain import tasks; from leantrain.model import optimizers; "
        "from leantrain.commands.cli import build_parser; build_parser(); tasks.spellings(); optimizers.names()"
    )
    assert imported(code, "torch", "transformers", "datasets", "accelerate") == []
