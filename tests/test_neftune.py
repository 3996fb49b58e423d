"""NEFTune: the HF Trainer's noise on the input embeddings, bitwise; in training only; refused beside a reference."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from leantrain import TrainConfig, evaluate, train
from leantrain.errors import ConfigError
from leantrain.model import neftune


def tiny_llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=1, max_position_embeddings=64,
    )  # fmt: skip
    return LlamaForCausalLM(config).train()


def test_the_noise_is_the_hf_trainers_bitwise_and_none_in_evaluation():
    from transformers.integrations.neftune import activate_neftune

    ours, theirs, clean = tiny_llama(), tiny_llama(), tiny_llama()
    neftune.attach(ours, 5.0)
    activate_neftune(theirs, 5.0)
    ids = torch.randint(0, 64, (3, 11), generator=torch.Generator().manual_seed(1))
    losses = {}
    for name, model in (("ours", ours), ("theirs", theirs), ("clean", clean)):
        torch.manual_seed(7)
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        losses[name] = (loss.detach(), model.model.embed_tokens.weight.grad.clone())
    assert torch.equal(losses["ours"][0], losses["theirs"][0]) and torch.equal(losses["ours"][1], losses["theirs"][1])
    assert not torch.equal(losses["ours"][0], losses["clean"][0])  # there is noise, in training
    for model in (ours, clean):
        model.eval()
    with torch.no_grad():
        assert torch.equal(ours(input_ids=ids).logits, clean(input_ids=ids).logits)  # and none in evaluation


@pytest.fixture()
def job(dropout_model_dir, sentiment_csv, cache_dir, tmp_path):
    def make(name: str, **changes) -> TrainConfig:
        base = dict(
            model=str(dropout_model_dir), data=str(sentiment_csv), cache_dir=str(cache_dir),
            output_dir=str(tmp_path / name), batch_size=24, max_steps=3, lr=3e-3, precision="fp32", log_every=1,
            progress=False, report=False, seed=5, dropout=0.0,
        )  # fmt: skip
        return TrainConfig(**{**base, **changes})

    return make


def first_loss(run_dir: Path) -> float:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return next(r["loss"] for r in rows if "loss" in r)


def test_a_run_trains_on_noisy_embeddings_and_evaluates_on_clean_ones(job, capsys):
    noisy = train(job("noisy", neftune_noise_alpha=5.0))
    assert "NEFTune: in training, noise uniform in ±5/sqrt(length x" in capsys.readouterr().err
    plain = train(job("plain"))
    assert first_loss(noisy.output_dir) != first_loss(plain.output_dir)
    # the run's own final evaluation is the published model's, which carries no hook: clean embeddings
    rescored = evaluate(str(noisy.output_dir))
    assert rescored["loss"] == pytest.approx(noisy.metrics["eval_loss"], rel=1e-6)


@pytest.mark.parametrize("task", ["dpo", "kto", "grpo"])
def test_a_task_whose_reference_reads_clean_embeddings_refuses_it(job, task):
    with pytest.raises(ConfigError, match="--neftune-noise-alpha") as info:
        train(
            job("refused", task=task, neftune_noise_alpha=5.0, **({"reward": "exact-match"} if task == "grpo" else {}))
        )
    assert "\n" not in str(info.value)


def test_alpha_must_be_positive():
    with pytest.raises(ConfigError, match=r"--neftune-noise-alpha must be positive, got 0\.0"):
        TrainConfig(neftune_noise_alpha=0.0)


def test_the_trainers_name_sets_it():
    from leantrain.config.hf_names import translate

    assert translate({"neftune_noise_alpha": 5}, "args.yaml") == {"neftune_noise_alpha": 5}


@pytest.mark.slow
def test_a_compiled_model_draws_the_noise_in_its_graph_on_dynamic_lengths():
    """In a graph the length is a symbol (the trainer marks it dynamic): the noise is drawn from it there, without a
    graph break, at every length; evaluation stays clean."""
    ours, clean = tiny_llama(), tiny_llama()
    neftune.attach(ours, 5.0)
    compiled = torch.compile(ours)
    for length in (11, 13):
        ids = torch.randint(0, 64, (3, length), generator=torch.Generator().manual_seed(length))
        torch._dynamo.mark_dynamic(ids, 1)
        noisy, plain = compiled(input_ids=ids, labels=ids).loss, clean(input_ids=ids, labels=ids).loss
        assert not torch.allclose(noisy, plain, rtol=0, atol=1e-4)
        assert abs(float(noisy - plain)) < 0.5  # noise of 5/sqrt(length x 32) a number: a nudge, not a new model
    ours.eval()
    clean.eval()
    ids = torch.randint(0, 64, (3, 11), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        torch.testing.assert_close(compiled(input_ids=ids).logits, clean(input_ids=ids).logits)
