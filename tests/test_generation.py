"""Sampling completions while training (model/generation.py) on a tiny random Llama: greedy decoding is transformers'
`generate`, ended rows leave the batch without changing the others, a prompt's sampled completions depend on its
seed only (not on the prompts beside it), the draw is softmax(logits / temperature) cut at top-p as transformers'
warpers cut it, the model samples in evaluation mode with its training mode restored, and in bf16 each weight is
cast once a generation."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from leantrain.model.generation import Sampling, choose, sample
from tests.casts_helper import WeightCasts
from tests.tasks.test_causal_lm import tiny_llama, write_tiny_llama


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return tiny_llama(write_tiny_llama(Path(tmp_path_factory.mktemp("gen-llama"))))


def prompts_of(vocab: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(0)
    return [torch.randint(3, vocab, (n,), generator=g).tolist() for n in (3, 7, 5, 1, 9)]


def test_greedy_completions_are_transformers_generate_and_ended_rows_leave_the_batch(model):
    prompts = prompts_of(model.config.vocab_size)
    with torch.no_grad():
        first = model.generate(torch.tensor([prompts[0]]), max_new_tokens=10, do_sample=False, pad_token_id=0)
    eos = int(first[0, len(prompts[0]) + 2])  # prompt 0's third token: its row ends early, the others go on
    greedy = Sampling(max_new_tokens=10, eos_token_ids=(eos,), pad_token_id=0, temperature=None)
    out = sample(model, prompts, 2, greedy)
    assert len(out[0]) == 3 and out[0][-1] == eos
    assert any(len(c) == 10 for c in out)  # others ran to the limit after prompt 0's rows had left
    for i, p in enumerate(prompts):
        with torch.no_grad():
            ids = model.generate(
                torch.tensor([p]), max_new_tokens=10, do_sample=False, eos_token_id=eos, pad_token_id=0
            )
        expected = ids[0, len(p) :].tolist()
        expected = expected[: expected.index(eos) + 1] if eos in expected else expected
        assert out[2 * i] == out[2 * i + 1] == expected, i


def test_a_prompts_samples_depend_on_its_seed_alone(model):
    prompts = prompts_of(model.config.vocab_size)
    sampling = Sampling(max_new_tokens=8, eos_token_ids=(5,), pad_token_id=0, temperature=1.0, top_p=0.9)
    seeds = [11, 12, 13, 14, 15]
    together = sample(model, prompts, 3, sampling, seeds)
    alone = [c for p, s in zip(prompts, seeds) for c in sample(model, [p], 3, sampling, [s])]
    assert together == alone
    assert sample(model, prompts[2:4][::-1], 3, sampling, seeds[2:4][::-1]) == together[9:12] + together[6:9]
    again = sample(model, prompts, 3, sampling, [s + 100 for s in seeds])
    assert again != together
    assert len({tuple(c) for c in together[:3]}) > 1  # a prompt's completions differ from each other


@pytest.mark.parametrize("temperature,top_p", [(1.0, 1.0), (0.7, 1.0), (1.3, 0.8)])
def test_the_draw_is_softmax_at_the_temperature_cut_at_top_p_as_transformers_cuts_it(temperature, top_p):
    """Uniforms spread evenly over [0, 1) land on each token as often as transformers' warped distribution says."""
    from transformers.generation.logits_process import TemperatureLogitsWarper, TopPLogitsWarper

    logits = torch.randn(1, 40, generator=torch.Generator().manual_seed(4)) * 2
    warped = TemperatureLogitsWarper(temperature)(None, logits.clone())
    if top_p < 1:
        warped = TopPLogitsWarper(top_p)(None, warped)
    expected = torch.softmax(warped, -1)[0].double()
    n = 200_000
    uniforms = (torch.arange(n, dtype=torch.float64) + 0.5) / n
    sampling = Sampling(max_new_tokens=1, eos_token_ids=(0,), pad_token_id=0, temperature=temperature, top_p=top_p)
    tokens = choose(logits.expand(n, -1), sampling, uniforms)
    frequency = torch.bincount(tokens, minlength=40).double() / n
    assert torch.allclose(frequency, expected, atol=2 / n)
    assert (frequency[expected == 0] == 0).all()


def test_sampling_runs_in_evaluation_mode_and_restores_training_mode(tmp_path):
    """With attention dropout at 0.5, greedy completions in training mode are those of evaluation mode (no dropout),
    every time, and the model is in training mode after."""
    from transformers import AutoConfig, AutoModelForCausalLM

    folder = write_tiny_llama(tmp_path)
    config = AutoConfig.from_pretrained(folder)
    config.attention_dropout = 0.5
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="eager")
    greedy = Sampling(max_new_tokens=6, eos_token_ids=(5,), pad_token_id=0, temperature=None)
    prompts = prompts_of(config.vocab_size)
    expected = sample(model.eval(), prompts, 1, greedy)
    model.train()
    assert sample(model, prompts, 1, greedy) == expected == sample(model, prompts, 1, greedy)
    assert model.training
    with pytest.raises(ValueError, match="seed"):
        sample(model, prompts, 1, Sampling(6, (5,), 0, temperature=1.0))


def test_lora_adapters_are_on_while_sampling(tmp_path):
    from peft import LoraConfig, get_peft_model

    model = tiny_llama(write_tiny_llama(tmp_path))
    prompts = prompts_of(model.config.vocab_size)
    greedy = Sampling(max_new_tokens=6, eos_token_ids=(5,), pad_token_id=0, temperature=None)
    base = sample(model, prompts, 1, greedy)
    peft_model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules="all-linear"))
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 2.0, generator=torch.Generator().manual_seed(len(name)))
    adapted = sample(peft_model, prompts, 1, greedy)
    with peft_model.disable_adapter():
        assert sample(peft_model, prompts, 1, greedy) == base
    assert adapted != base


def test_a_bf16_generation_under_one_autocast_casts_each_weight_once(tmp_path):
    """The model prepared as the trainer prepares it (Accelerate autocasts each forward) and one autocast around the
    generation, as the trainer puts there: each weight is cast to bf16 once for all the tokens, not once a token."""
    from leantrain.parallel import make_accelerator

    model = tiny_llama(write_tiny_llama(tmp_path))
    accelerator = make_accelerator("bf16")
    model = accelerator.prepare(model)
    greedy = Sampling(max_new_tokens=6, eos_token_ids=(), pad_token_id=0, temperature=None)
    with accelerator.autocast(), WeightCasts(model) as casts:
        out = sample(model, prompts_of(model.config.vocab_size), 1, greedy)
    assert all(len(c) == 6 for c in out)  # six forwards
    assert len(casts.counts) >= 4 and casts.most == 1


@pytest.mark.parametrize("temperature", [None, 1.0], ids=["greedy", "sampled"])
def test_under_the_callers_autocast_tokens_come_from_the_models_own_forward(tmp_path, monkeypatch, temperature):
    """Accelerate wraps a bf16 model's forward to autocast and convert every output to fp32 (a generated token's
    whole logits); under the caller's autocast the sampler calls the model's own forward instead, and draws the same
    tokens (bf16 to fp32 is exact). Without an autocast around it, the wrapper stays."""
    import contextlib

    from accelerate.utils import operations

    from leantrain.parallel import make_accelerator, precision

    model = make_accelerator("bf16").prepare(tiny_llama(write_tiny_llama(tmp_path)))
    conversions = []
    convert = operations.convert_to_fp32
    monkeypatch.setattr(operations, "convert_to_fp32", lambda x: conversions.append(1) or convert(x))
    settings = Sampling(max_new_tokens=6, eos_token_ids=(), pad_token_id=0, temperature=temperature)
    prompts = prompts_of(model.config.vocab_size)
    seeds = list(range(len(prompts)))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ours = sample(model, prompts, 2, settings, seeds)
    assert conversions == []
    sample(model, prompts, 2, settings, seeds)  # no autocast around it: the wrapper's, a forward a token
    assert len(conversions) == 6
    monkeypatch.setattr(precision, "own_forward", lambda model: contextlib.nullcontext())
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert sample(model, prompts, 2, settings, seeds) == ours
    assert len(conversions) == 12
