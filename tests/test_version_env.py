"""`leantrain --version` and the version and cache paths in `leantrain env`."""

import re
from pathlib import Path

import leantrain
from leantrain.commands.cli import main

REPO = Path(__file__).resolve().parents[1]


def test_version_flag_prints_the_package_version(capsys):
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"leantrain {leantrain.__version__}"
    # one version: the package's and the distribution's agree
    declared = re.search(r'^version = "([^"]+)"', (REPO / "pyproject.toml").read_text(), re.M)
    assert declared and declared[1] == leantrain.__version__


def test_cache_paths_follow_the_variables_that_move_them(monkeypatch, tmp_path):
    from huggingface_hub import constants

    from leantrain.paths import cache_paths

    monkeypatch.setenv("LEANTRAIN_CACHE", str(tmp_path / "lt-cache"))
    rows = dict(cache_paths())
    assert rows["leantrain cache"].split()[0] == str(tmp_path / "lt-cache")
    assert rows["hub cache"].split()[0] == str(constants.HF_HUB_CACHE)


def test_env_shows_the_version_and_the_caches(capsys):
    assert main(["env"]) == 0
    out = capsys.readouterr().out
    assert re.search(rf"leantrain\W+{re.escape(leantrain.__version__)}", out)
    for label in ("leantrain cache", "hub cache", "datasets cache"):
        assert label in out
