"""The rotary embedding run as a roll (`model.rotary`) gives the model's own bits, forward and backward, in fewer
operators; models whose rotation is another (interleaved) keep their own; a leantrain run with it equals one
without, bitwise."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file
from torch.utils._python_dispatch import TorchDispatchMode

from leantrain import TrainConfig, train
from leantrain.model import rotary

SHAPE = dict(vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4)


def _model(kind: str):
    from transformers import AutoModelForCausalLM, CohereConfig, LlamaConfig, Qwen3Config

    config = {"llama": LlamaConfig, "qwen3": Qwen3Config, "cohere": CohereConfig}[kind](num_key_value_heads=2, **SHAPE)
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config, attn_implementation="sdpa").train()


class _Count(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.calls = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.calls += 1
        return func(*args, **(kwargs or {}))


def _step(model, modules, autocast: bool):
    """The loss, every gradient and the operators dispatched, forward and backward, on fixed ids."""
    ids = (torch.arange(2 * 12).view(2, 12) * 7 + 3) % 96 + 1
    model.zero_grad(set_to_none=True)
    with _Count() as count, rotary.rolled(modules):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
    return loss.detach(), [p.grad for p in model.parameters()], count.calls


@pytest.mark.parametrize("kind", ["llama", "qwen3"])
@pytest.mark.parametrize("autocast", [False, True], ids=["fp32", "bf16"])
def test_the_rolled_rotation_gives_the_models_own_bits_in_fewer_operators(kind, autocast):
    model = _model(kind)
    modules = rotary.modules_for(model)
    assert [m.__name__.rsplit(".", 1)[-1] for m in modules] == [f"modeling_{kind}"]
    own = modules[0].apply_rotary_pos_emb
    loss, grads, calls = _step(model, (), autocast)
    rolled_loss, rolled_grads, rolled_calls = _step(model, modules, autocast)
    assert modules[0].apply_rotary_pos_emb is own  # put back
    assert torch.equal(loss, rolled_loss)
    assert all(torch.equal(a, b) for a, b in zip(grads, rolled_grads, strict=True))
    # 2 layers x (query and key): seven operators forward become four, twelve backward fewer
    assert rolled_calls <= calls - 2 * 2 * 6, (calls, rolled_calls)


def test_an_interleaved_rotation_keeps_its_own_function():
    """Cohere rotates interleaved pairs (x[..., ::2], x[..., 1::2]): the random probe tells it apart."""
    assert rotary.modules_for(_model("cohere")) == ()


def test_a_call_for_part_of_the_head_goes_to_the_models_own_function():
    """Phi-style partial rotation hands the function cos and sin narrower than the head: not a roll of the head."""
    calls = []

    def own(q, k, cos, sin, unsqueeze_dim=1, **kwargs):
        calls.append(q.shape[-1])
        return q, k

    q = torch.randn(1, 2, 3, 8)
    rolled = rotary._rolled(own)
    rolled(q, q, torch.randn(1, 3, 4), torch.randn(1, 3, 4))
    rolled(q, q, torch.randn(1, 3, 8), torch.randn(1, 3, 8), 1, extra=True)
    assert calls == [8, 8]


@pytest.mark.parametrize("checkpointing", [False, True], ids=["", "activation-checkpointing"])
def test_a_run_with_the_rolled_rotation_equals_one_without(tmp_path, monkeypatch, checkpointing):
    """With activation checkpointing too: the layers' recomputation in the backward runs the same function as their
    forward did (a forward rolled and a recomputation not would pair the wrong saved tensors: wrong gradients)."""
    from tests.tasks.test_causal_lm import tiny_llama_job

    folder, corpus = tiny_llama_job(tmp_path)
    cfg = TrainConfig(
        task="causal-lm", model=str(folder), data=str(corpus), max_length=64, cache_dir=str(tmp_path / "cache"),
        batch_size=4, max_steps=3, log_every=1, seed=3, precision="bf16", progress=False, report=False,
        activation_checkpointing=checkpointing,
    )  # fmt: skip
    real_modules, real_signs = rotary.modules_for, rotary._signs
    runs = {}
    for name, on in (("rolled", True), ("own", False)):
        rolled_calls: list = []
        with monkeypatch.context() as m:
            m.setattr(rotary, "modules_for", lambda model, on=on: real_modules(model) if on else ())
            m.setattr(
                rotary,
                "_signs",
                lambda sin, calls=rolled_calls: calls.append(torch.is_grad_enabled()) or real_signs(sin),
            )
            result = train(cfg.replace(output_dir=str(tmp_path / name)))
        # 3 steps x 2 layers at least, each micro-batch's forward through the roll, and the evaluation's (without
        # gradients); none without it
        assert (rolled_calls.count(True) >= 3 * 2) == on, "the roll was not used: the comparison proves nothing"
        assert (False in rolled_calls) == on, "the evaluation did not roll"
        lines = (result.output_dir / "metrics.jsonl").read_text().splitlines()
        losses = [json.loads(line)["loss"] for line in lines if '"loss"' in line]
        runs[name] = losses, load_file(result.output_dir / "model" / "model.safetensors"), result.metrics["eval_loss"]
    (losses, weights, scored), (own_losses, own_weights, own_scored) = runs["rolled"], runs["own"]
    assert losses == own_losses and weights.keys() == own_weights.keys() and scored == own_scored
    assert all(torch.equal(weights[k], own_weights[k]) for k in weights)
