"""--pooler: a BERT-style pooler that its checkpoint never trained (a sentence-transformers model's) starts as the
identity, so that a new classification head reads the first token rather than a random projection of it."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file

from leantrain.errors import ConfigError
from leantrain.model import loading

MODULES = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"}]


@pytest.fixture()
def st_model_dir(tiny_model_dir, tmp_path):
    """The tiny BERT as a sentence-transformers checkpoint: the same weights, with a modules.json beside them."""
    folder = tmp_path / "st-bert"
    shutil.copytree(tiny_model_dir, folder)
    (folder / "modules.json").write_text(json.dumps(MODULES))
    return folder


def _classifier(folder):
    return loading.load_for_classification(str(folder), ["neg", "pos"])


def _is_identity(dense) -> bool:
    return torch.equal(dense.weight, torch.eye(dense.in_features)) and not dense.bias.any()


def test_auto_starts_a_sentence_transformers_pooler_as_the_identity_and_keeps_others(st_model_dir, tiny_model_dir):
    model = _classifier(st_model_dir)
    with torch.no_grad():
        model.bert.pooler.dense.bias.fill_(0.5)  # BERT starts its biases at 0: make the reset show
    note = loading.start_pooler(model, str(st_model_dir), "auto")
    assert note is not None and "identity" in note and "--pooler keep" in note
    assert _is_identity(model.bert.pooler.dense)

    model = _classifier(tiny_model_dir)
    before = model.bert.pooler.dense.weight.clone()
    assert loading.start_pooler(model, str(tiny_model_dir), "auto") is None
    assert torch.equal(model.bert.pooler.dense.weight, before)


def test_keep_and_identity_do_what_they_say(st_model_dir, tiny_model_dir):
    model = _classifier(st_model_dir)
    before = model.bert.pooler.dense.weight.clone()
    assert loading.start_pooler(model, str(st_model_dir), "keep") is None
    assert torch.equal(model.bert.pooler.dense.weight, before)

    model = _classifier(tiny_model_dir)
    assert "--pooler identity" in loading.start_pooler(model, str(tiny_model_dir), "identity")
    assert _is_identity(model.bert.pooler.dense)


def test_a_model_without_a_pooler_is_left_alone_or_refused_when_asked(tmp_path):
    from transformers import RobertaConfig, RobertaForSequenceClassification

    config = RobertaConfig(
        vocab_size=64, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32
    )
    model = RobertaForSequenceClassification(config)  # its head reads the first token itself: no pooler
    assert loading.pooler_dense(model) is None
    (tmp_path / "modules.json").write_text(json.dumps(MODULES))
    assert loading.start_pooler(model, str(tmp_path), "auto") is None
    with pytest.raises(ConfigError, match=r"--pooler identity: RobertaForSequenceClassification has no BERT-style"):
        loading.start_pooler(model, str(tmp_path), "identity")


@pytest.mark.parametrize("setting", ["auto", "keep"])
def test_a_run_from_a_sentence_transformers_checkpoint_trains_from_the_pooler_it_says(
    st_model_dir, sentiment_csv, tmp_path, capsys, setting
):
    from leantrain.commands.cli import main

    out = tmp_path / "run"
    args = ["train", "--model", str(st_model_dir), "--data", str(sentiment_csv), "--max-steps", "2", "--lr", "1e-7"]
    code = main([*args, "--pooler", setting, "--output-dir", str(out), "--cache-dir", str(tmp_path / "cache")])
    assert code == 0
    said = "pooler: starts as the identity" in capsys.readouterr().err
    trained = load_file(out / "model" / "model.safetensors")["bert.pooler.dense.weight"]
    start = load_file(st_model_dir / "model.safetensors")["pooler.dense.weight"]
    # two steps at lr 1e-7 move no weight by more than a millionth: model/ shows where the pooler started
    if setting == "auto":
        assert said and torch.allclose(trained, torch.eye(trained.shape[0]), atol=1e-5)
    else:
        assert not said and torch.allclose(trained, start, atol=1e-5)


def test_a_reward_model_from_a_sentence_transformers_checkpoint_starts_its_pooler_as_the_identity(
    st_model_dir, tmp_path
):
    from leantrain import TrainConfig, train
    from tests.tasks.test_dpo import pair_rows, write_jsonl

    pairs = write_jsonl(tmp_path / "pairs.jsonl", pair_rows(24))
    common = dict(task="reward-model", data=str(pairs), max_steps=1, lr=1e-7, batch_size=8, progress=False)
    for folder, identity in ((st_model_dir, True), (st_model_dir.parent / "plain", False)):
        if not identity:  # the same weights without modules.json: a checkpoint whose pooler was trained
            shutil.copytree(st_model_dir, folder)
            (folder / "modules.json").unlink()
        result = train(TrainConfig(**common, model=str(folder), output_dir=str(tmp_path / f"run-{identity}"),
                                   cache_dir=str(tmp_path / "cache"), report=False))  # fmt: skip
        trained = load_file(result.model_dir / "model.safetensors")["bert.pooler.dense.weight"]
        assert torch.allclose(trained, torch.eye(trained.shape[0]), atol=1e-5) == identity


def test_an_unknown_pooler_setting_is_refused():
    from leantrain import TrainConfig

    with pytest.raises(ConfigError, match=r"--pooler must be one of auto, keep, identity; got 'mean'"):
        TrainConfig(pooler="mean")
