"""Every shipped example config validates; the cheapest runs end to end on the tiny model."""

from pathlib import Path

import pytest

from leantrain import TrainConfig, train

EXAMPLES = sorted((Path(__file__).resolve().parents[1] / "examples").glob("*.yaml"))


def test_there_are_examples():
    assert len(EXAMPLES) >= 5


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_example_config_validates(path):
    TrainConfig.from_yaml(path)


@pytest.mark.parametrize("name", ["sst2.yaml", "memory_lean.yaml"])
def test_cheap_examples_run_on_the_tiny_model(name, tiny_model_dir, shared_data, cache_dir, tmp_path):
    if name == "memory_lean.yaml":
        pytest.importorskip("bitsandbytes")
    cfg = TrainConfig.from_yaml(
        Path(__file__).resolve().parents[1] / "examples" / name,
        overrides={
            "model": str(tiny_model_dir),
            "data": str(shared_data / "sst2" / "train_1k.tsv"),
            "eval_data": str(shared_data / "sst2" / "dev.tsv"),
            "max_steps": 3,
            "output_dir": str(tmp_path / "run"),
            "cache_dir": str(cache_dir),
            "progress": False,
            "limit": None,
            "eval_every": None,
        },
    )
    assert train(cfg).metrics["optimizer_steps"] == 3
