"""The docs say what the code does: CLI reference up to date, public API as documented, site builds."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import leantrain

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.slow  # launches a Python process
def test_cli_reference_is_generated_from_the_current_parser():
    proc = subprocess.run([sys.executable, str(REPO / "scripts" / "gen_cli_docs.py"), "--check"])
    assert proc.returncode == 0, "docs/reference/cli.md is stale: run python scripts/gen_cli_docs.py"


def test_api_reference_is_generated_from_the_current_config():
    proc = subprocess.run([sys.executable, str(REPO / "scripts" / "gen_api_docs.py"), "--check"])
    assert proc.returncode == 0, "docs/reference/api.md is stale: run python scripts/gen_api_docs.py"
    page = (REPO / "docs" / "reference" / "api.md").read_text()
    from dataclasses import fields

    for f in fields(leantrain.TrainConfig):
        assert f"| `{f.name}` | `--{f.name.replace('_', '-')}` |" in page


def test_every_config_field_has_help_text():
    from dataclasses import fields

    missing = [f.name for f in fields(leantrain.TrainConfig) if len(f.metadata.get("help", "").strip()) < 10]
    assert not missing, f"TrainConfig fields without help text: {missing}"


def test_public_api_is_what_the_docs_say():
    assert sorted(leantrain.__all__) == [
        "LeantrainError",
        "TrainConfig",
        "TrainResult",
        "__version__",
        "evaluate",
        "predict",
        "train",
    ]
    api_page = (REPO / "docs" / "reference" / "api.md").read_text()
    for name in ("TrainConfig", "train", "TrainResult", "evaluate", "predict", "LeantrainError"):
        assert f".{name}" in api_page
        assert getattr(leantrain, name) is not None


def test_every_config_key_is_a_documented_flag():
    from dataclasses import fields

    page = (REPO / "docs" / "reference" / "cli.md").read_text()
    for f in fields(leantrain.TrainConfig):
        assert "--" + f.name.replace("_", "-") in page


@pytest.mark.skipif(
    shutil.which("mkdocs") is None and not (Path(sys.executable).parent / "mkdocs").exists(),
    reason="mkdocs not installed",
)
@pytest.mark.slow  # launches mkdocs
def test_site_builds_strictly(tmp_path):
    mkdocs = shutil.which("mkdocs") or str(Path(sys.executable).parent / "mkdocs")
    proc = subprocess.run(
        [mkdocs, "build", "--strict", "-q", "-d", str(tmp_path / "site")],
        cwd=REPO,
        capture_output=True,
        text=True,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "site" / "techniques" / "gradient-accumulation" / "index.html").is_file()


def test_the_metrics_page_lists_every_metric_for_the_problems_that_report_it():
    """docs/metrics-and-losses.md's table: a row per metric, 'yes' under each problem type whose table has it."""
    from leantrain.tasks.scoring import TABLES

    page = (REPO / "docs" / "metrics-and-losses.md").read_text()
    rows = {}
    for line in page.splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if len(cells) == 6 and cells[0].startswith("`"):
            rows[cells[0].strip("`")] = cells[1:5]
    assert set(rows) == {name for table in TABLES.values() for name in table}
    for name, marks in rows.items():
        for problem, mark in zip(("single-label", "regression", "multi-label", "generation"), marks):
            # a seq2seq task computes its loss (per target token) itself; its table scores generated text
            reported = name in TABLES[problem] or (problem == "generation" and name == "loss")
            assert (mark == "yes") == reported, (name, problem)


def test_every_repository_path_the_pages_name_exists():
    """A file of this repository named in README.md or docs/ (`src/...`, `tests/...`, `benchmarks/...`, ...) is there:
    a newcomer who opens it finds it (a module moved into a folder left its old path in the pages)."""
    import re

    named = re.compile(r"`((?:src|tests|benchmarks|scripts|examples)/[\w./-]+?)(?:::\w+)?`")
    missing = [
        f"{page.relative_to(REPO)}: {path}"
        for page in [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
        for path in named.findall(page.read_text())
        if not (REPO / path).exists()
    ]
    assert not missing, missing
