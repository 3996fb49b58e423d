"""--pooler: a BERT-style pooler that its checkpoint never trained (a sentence-transformers model's) starts as the
identity, so that a new classification head reads the first token rather than a random projection of it."""

from __future__ import annotations

import dataclasses
import json
import shutil

import pytest
import torch
from safetensors.torch import load_file

from leantrain.errors import ConfigError
from leantrain.model import loading

MODULES = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"}]
POOLING = {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}


@pytest.fixture()
def st_model_dir(tiny_model_dir, tmp_path):
    """The tiny BERT as a sentence-transformers checkpoint: the same weights, with a modules.json beside them."""
    folder = tmp_path / "st-bert"
    shutil.copytree(tiny_model_dir, folder)
    (folder / "modules.json").write_text(json.dumps(MODULES))
    return folder


@pytest.fixture()
def mean_model_dir(st_model_dir):
    """The tiny BERT as a sentence-transformers checkpoint trained through mean pooling (as the embedded MiniLM)."""
    (st_model_dir / "modules.json").write_text(json.dumps([*MODULES, POOLING]))
    (st_model_dir / "1_Pooling").mkdir()
    modes = {"pooling_mode_cls_token": False, "pooling_mode_mean_tokens": True, "pooling_mode_max_tokens": False}
    (st_model_dir / "1_Pooling" / "config.json").write_text(json.dumps({"word_embedding_dimension": 64, **modes}))
    return st_model_dir


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

    with pytest.raises(ConfigError, match=r"--pooler must be one of auto, keep, identity, mean; got 'max'"):
        TrainConfig(pooler="max")


def test_the_pooling_a_sentence_transformers_checkpoint_was_trained_through_is_read(mean_model_dir, tmp_path):
    from leantrain.model.loading import sentence_transformers_pooling as pooling

    assert pooling(str(mean_model_dir)) == "mean"
    assert pooling(str(loading.embedded_model_path())) == "mean"
    config = mean_model_dir / "1_Pooling" / "config.json"
    config.write_text(json.dumps({"pooling_mode_cls_token": True, "pooling_mode_mean_tokens": False}))
    assert pooling(str(mean_model_dir)) == "cls"
    config.write_text("{not json")
    assert pooling(str(mean_model_dir)) is None
    assert pooling(str(tmp_path)) is None  # no modules.json


def _states(model, ids, mask):
    with torch.no_grad():
        return model(input_ids=ids, attention_mask=mask, output_hidden_states=True).hidden_states


def test_the_added_layer_gives_the_first_token_the_mean_of_the_tokens(mean_model_dir):
    """The appended layer's first-token output is the mean of the last layer's states over each row's own tokens
    (padding left out), normalised and scaled as the last layer's output is; the other layers are untouched."""
    model = _classifier(mean_model_dir).eval()
    ids = torch.tensor([[101, 2023, 2003, 1037, 3231, 102], [101, 2307, 2154, 102, 0, 0]])
    mask = (ids != 0).long()
    before = _states(model, ids, mask)
    note = loading.start_pooler(model, str(mean_model_dir), "auto")
    assert "average the tokens into the first" in note and "3 layers now" in note and "trained so" in note
    assert model.config.num_hidden_layers == 3 and _is_identity(model.bert.pooler.dense)
    after = _states(model, ids, mask)
    assert len(after) == len(before) + 1 and all(torch.equal(a, b) for a, b in zip(after, before))
    norm = model.bert.encoder.layer[-2].output.LayerNorm
    for row in range(2):
        tokens = before[-1][row, : int(mask[row].sum())]
        mean = torch.nn.functional.layer_norm(tokens.mean(0), (64,), norm.weight, norm.bias, norm.eps)
        got = after[-1][row, 0]
        # the first token's own state is added at a hundredth of the mean's weight
        assert torch.nn.functional.cosine_similarity(got - norm.bias, mean - norm.bias, dim=0) > 0.999
        assert not torch.allclose(got, before[-1][row, 0], atol=0.1)


def test_mean_asked_of_a_model_it_cannot_serve_is_refused_in_one_line(mean_model_dir, tmp_path):
    from transformers import RobertaConfig, RobertaForSequenceClassification

    with pytest.raises(ConfigError, match=r"--pooler mean adds a layer that a LoRA adapter cannot carry"):
        loading.start_pooler(_classifier(mean_model_dir), str(mean_model_dir), "mean", lora=True)
    for asked in ({"lora": True}, {"auto_mean": False}):  # auto with LoRA, or for a reward model: the pooler alone
        model = _classifier(mean_model_dir)
        assert "starts as the identity" in loading.start_pooler(model, str(mean_model_dir), "auto", **asked)
        assert model.config.num_hidden_layers == 2
    from transformers import AlbertConfig, AlbertForSequenceClassification

    albert = AlbertForSequenceClassification(AlbertConfig(vocab_size=64, embedding_size=8, hidden_size=16,
                                                          num_attention_heads=2, intermediate_size=32))  # fmt: skip
    assert loading.pooler_dense(albert) is not None  # a pooler, but layers of another shape
    with pytest.raises(ConfigError, match=r"--pooler mean: AlbertForSequenceClassification's encoder layers are not"):
        loading.start_pooler(albert, str(tmp_path), "mean")
    config = RobertaConfig(vocab_size=64, hidden_size=16, num_hidden_layers=1, num_attention_heads=2)
    with pytest.raises(ConfigError, match=r"--pooler mean: RobertaForSequenceClassification has no BERT-style"):
        loading.start_pooler(RobertaForSequenceClassification(config), str(tmp_path), "mean")


def test_a_mean_pooled_run_publishes_a_model_the_pipeline_loads_and_resumes_exactly(
    mean_model_dir, sentiment_csv, tmp_path
):
    """The run trains the added layer (its query learns where to attend), `model/` loads with transformers'
    pipeline one layer deeper and gives the run's own evaluation, and a resumed run ends where the whole one does."""
    from transformers import pipeline

    from leantrain import TrainConfig, train
    from tests.test_checkpoint import assert_same_weights, step_dir

    common = dict(model=str(mean_model_dir), data=str(sentiment_csv), max_steps=4, lr=1e-3, batch_size=16,
                  progress=False, report=False, cache_dir=str(tmp_path / "cache"), save_every=2)  # fmt: skip
    whole = train(TrainConfig(**common, output_dir=str(tmp_path / "whole")))
    resumed = train(TrainConfig(**common, output_dir=str(tmp_path / "resumed"),
                                resume=str(step_dir(whole.output_dir, 2))))  # fmt: skip
    assert resumed.metrics["resumed_from"] and resumed.metrics["train_examples"] == 2 * 16
    assert_same_weights(whole.output_dir, resumed.output_dir)
    weights = load_file(whole.model_dir / "model.safetensors")
    assert weights["bert.encoder.layer.2.attention.self.query.weight"].abs().max() > 0  # it trained
    classify = pipeline("text-classification", model=str(whole.model_dir))
    assert classify.model.config.num_hidden_layers == 3
    assert {r["label"] for r in classify(["a lovely film", "dreadful"])} <= {"neg", "pos"}
    card = (whole.model_dir / "README.md").read_text()
    assert "Its encoder has one layer more than the base's: the last, added in training, averages" in card


def test_the_planner_counts_the_added_layer_where_the_run_adds_it(minilm_dir, tiny_model_dir):
    from leantrain import TrainConfig
    from leantrain.planner.auto import request_for
    from leantrain.planner.memory import mean_layer_added, model_facts, with_mean_layer
    from leantrain.planner.search import make_plan
    from tests.planner.test_search import SPEED

    assert mean_layer_added(TrainConfig())  # the default job: the embedded MiniLM, trained through mean pooling
    for other in ({"pooler": "identity"}, {"lora": True}, {"task": "reward-model"}, {"model": str(tiny_model_dir)}):
        assert not mean_layer_added(TrainConfig(**other)), other
    assert mean_layer_added(TrainConfig(model=str(tiny_model_dir), pooler="mean"))
    facts = model_facts(str(minilm_dir))
    deeper = with_mean_layer(facts)
    layer = sum(p.numel() for p in _classifier(minilm_dir).bert.encoder.layer[-1].parameters())
    assert (deeper.layers, deeper.params) == (facts.layers + 1, facts.params + layer)
    request, _ = request_for(TrainConfig(), "cpu", 1)  # and a plan of the default job counts it
    assert request.mean_layer
    plan = make_plan(dataclasses.replace(request, budget=2**34), speed=SPEED, facts=facts)
    assert plan.facts["layers"] == facts.layers + 1
