"""`--task reward-model` on a tiny Llama in fp32: the Bradley-Terry loss with and without a margin, exact
accumulation, a model/ that `pipeline("text-classification")` scores as `predict` does, and `evaluate` on pairs."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from leantrain import TrainConfig, train
from leantrain.inference.api import evaluate, predict
from leantrain.tasks.reward_model import bradley_terry_losses
from tests.conftest import EXACT_JOB, assert_trained_alike
from tests.tasks.test_dpo import llama_dir, pair_rows, write_jsonl  # noqa: F401 (a fixture)


@pytest.fixture(scope="module")
def pairs(tmp_path_factory) -> Path:
    rows = pair_rows(96)
    for i, r in enumerate(rows):
        r["margin"] = (i % 4) * 0.5
    return write_jsonl(tmp_path_factory.mktemp("rm") / "pairs.jsonl", rows)


@pytest.fixture()
def run(llama_dir, pairs, tmp_path):  # noqa: F811
    count = iter(range(100))

    def go(**changes):
        base = dict(
            task="reward-model",
            model=str(llama_dir),
            data=str(pairs),
            cache_dir=str(tmp_path / "cache"),
            output_dir=str(tmp_path / f"run{next(count)}"),
            max_length=32,
            report=False,
            **EXACT_JOB,
        )
        result = train(TrainConfig(**{**base, **changes}))
        return result, load_file(result.model_dir / "model.safetensors")

    return go


def test_the_loss_is_bradley_terrys_with_the_margin():
    rewards = torch.tensor([[1.0, -0.5], [0.2, 0.9]], dtype=torch.float64)
    margin = torch.tensor([0.5, 0.0], dtype=torch.float64)
    sig = lambda x: 1 / (1 + math.exp(-x))  # noqa: E731
    expected = [-math.log(sig(1.0 + 0.5 - 0.5)), -math.log(sig(0.2 - 0.9))]
    assert bradley_terry_losses(rewards, margin).tolist() == pytest.approx(expected, rel=1e-12)
    assert bradley_terry_losses(rewards).tolist()[0] == pytest.approx(-math.log(sig(1.5)), rel=1e-12)


def test_accumulation_equals_one_big_batch(run):
    _, w_big = run(batch_size=16, grad_accum=1, max_steps=3)
    _, w_small = run(batch_size=4, grad_accum=4, max_steps=3)
    _, start = run(batch_size=16, max_steps=3, lr=1e-30)
    assert_trained_alike(w_big, w_small, start, rel=1e-5)


def test_the_model_scores_in_a_pipeline_as_predict_and_evaluate_do(run, pairs, tmp_path):
    from transformers import AutoTokenizer, pipeline

    result, _ = run(optimizer="adamw", lr=3e-3, batch_size=16, max_steps=20)
    metrics = result.metrics
    assert {"eval_accuracy", "eval_margin", "eval_mean_reward", "eval_loss"} <= set(metrics)
    rows = [json.loads(x) for x in result.paths["log"].read_text().splitlines()]
    assert {"accuracy", "margin", "mean_reward"} <= set(next(r for r in rows if "loss" in r))
    text = "the cat sat is sun"
    scored = predict(str(result.output_dir), texts=[text, "the dog is moon"])
    tokenizer = AutoTokenizer.from_pretrained(result.model_dir)
    piped = pipeline("text-classification", model=str(result.model_dir))(text + tokenizer.eos_token)[0]
    assert piped["label"] == "reward" and scored[0]["score"] == pytest.approx(piped["score"], abs=1e-5)
    assert scored[0]["score"] != pytest.approx(scored[1]["score"])  # a score of the text, not a constant
    again = evaluate(str(result.output_dir), data=str(pairs))
    assert again["examples"] == 96
    held = evaluate(str(result.output_dir))  # the run's own held-out pairs, as the run scored them
    assert held["accuracy"] == pytest.approx(metrics["eval_accuracy"]) and held["margin"] == pytest.approx(
        metrics["eval_margin"], abs=1e-5
    )


@pytest.mark.slow  # 40 steps: 75 s at load 13, about 25 s quiet
def test_a_reward_model_learns_which_completion_is_preferred(run):
    result, _ = run(optimizer="adamw", lr=3e-3, batch_size=16, max_steps=40, warmup_ratio=0.1)
    assert result.metrics["eval_accuracy"] >= 0.8 and result.metrics["eval_margin"] > 0


def test_an_encoder_reward_model_reads_bert_sentence_pairs(tiny_model_dir, pairs, tmp_path):
    """A BERT tokenizer has no EOS: each sequence is `[CLS] prompt [SEP] completion [SEP]`, BERT's own pair form, so
    the published model scores (prompt, completion) in a pipeline as predict does."""
    from transformers import AutoTokenizer, pipeline

    job = dict(EXACT_JOB, optimizer="adamw", lr=1e-3, max_steps=4, batch_size=16)
    result = train(TrainConfig(task="reward-model", model=str(tiny_model_dir), data=str(pairs), max_length=32,
                               cache_dir=str(tmp_path / "cache"), output_dir=str(tmp_path / "run"), report=False,
                               **job))  # fmt: skip
    assert math.isfinite(result.metrics["eval_loss"])
    tokenizer = AutoTokenizer.from_pretrained(result.model_dir)
    from leantrain.data.instructions import encode_completion

    prompt_ids, completion_ids = encode_completion(tokenizer, "the cat is", " sun")
    assert prompt_ids + completion_ids == tokenizer("the cat is", " sun")["input_ids"]
    piped = pipeline("text-classification", model=str(result.model_dir))({"text": "the cat is", "text_pair": " sun"})
    rows = [{"prompt": "the cat is", "chosen": " sun", "rejected": " moon"}]
    one = write_jsonl(tmp_path / "one.jsonl", rows)
    ours = predict(str(result.output_dir), data=str(one))
    assert ours[0]["score"] == pytest.approx(piped["score"], abs=1e-5)


def test_static_shapes_pad_pairs_to_a_few_widths_and_change_nothing(run):
    """The reward is read at each row's last real token, however much padding --static-shapes adds after it."""
    off, w_off = run(batch_size=8, max_steps=3, static_shapes="off")
    on, w_on = run(batch_size=8, max_steps=3, static_shapes="on")
    assert on.metrics["padding_fraction"] > off.metrics["padding_fraction"]
    assert on.metrics["train_loss"] == pytest.approx(off.metrics["train_loss"], abs=1e-6)
    for name, value in w_off.items():
        assert torch.allclose(w_on[name], value, atol=1e-6), name


def test_a_reward_model_trains_with_its_dropout_off(tiny_model_dir, dropout_model_dir, pairs, tmp_path):
    """As TRL's RewardTrainer: the tiny BERT shipped with dropout 0.1 trains bitwise as the same weights shipped
    with 0 (one attention kernel for both: the choice otherwise reads the config's rate)."""
    job = dict(EXACT_JOB, optimizer="adamw", lr=1e-3, max_steps=3, batch_size=16, attention="eager")
    weights = []
    for name, model in (("shipped-with-dropout", dropout_model_dir), ("shipped-without", tiny_model_dir)):
        result = train(TrainConfig(task="reward-model", model=str(model), data=str(pairs), max_length=32,
                                   cache_dir=str(tmp_path / "cache"), output_dir=str(tmp_path / name), report=False,
                                   **job))  # fmt: skip
        weights.append(load_file(result.model_dir / "model.safetensors"))
    assert weights[0].keys() == weights[1].keys()
    assert [k for k in weights[0] if not torch.equal(weights[0][k], weights[1][k])] == []
