"""The masks leantrain makes from the host's facts (`model.masks`) give the model's own results: a run with them
equals, bitwise, the run where transformers reads each batch to make its masks itself, for padded batches of an
encoder (SDPA and eager attention, fp32 and bf16) and packed rows of a decoder."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from leantrain import TrainConfig, train
from leantrain.model.masks import HostKnownMask


def _run(cfg: TrainConfig, monkeypatch, host_masks: bool, name: str):
    with monkeypatch.context() as m:
        attached: list = []
        real = HostKnownMask.attach.__func__

        def attach(cls, model, autocast=None):
            made = real(cls, model, autocast) if host_masks else None
            attached.append(made)
            return made

        m.setattr(HostKnownMask, "attach", classmethod(attach))
        result = train(cfg.replace(output_dir=str(cfg.output_dir) + name))
    losses = [json.loads(line)["loss"] for line in (result.output_dir / "metrics.jsonl").read_text().splitlines()
              if '"loss"' in line]  # fmt: skip
    return attached, losses, load_file(result.output_dir / "model" / "model.safetensors")


def _same(cfg: TrainConfig, monkeypatch):
    made, losses, weights = _run(cfg, monkeypatch, True, "-host")
    assert made and made[0] is not None, "the masks were not attached: the comparison would prove nothing"
    none, own_losses, own_weights = _run(cfg, monkeypatch, False, "-own")
    assert none == [None]
    assert losses == own_losses
    assert weights.keys() == own_weights.keys()
    assert all(torch.equal(weights[k], own_weights[k]) for k in weights)
    return made[0]


@pytest.mark.parametrize(("attention", "precision"), [("sdpa", "fp32"), ("eager", "fp32"), ("sdpa", "bf16")])
def test_padded_batches_train_as_with_transformers_own_masks(
    tiny_model_dir, sentiment_csv, tmp_path, monkeypatch, attention, precision
):
    cfg = TrainConfig(
        model=str(tiny_model_dir), data=str(sentiment_csv), cache_dir=str(tmp_path / "cache"),
        output_dir=str(tmp_path / "run"), batch_size=8, grad_accum=2, max_steps=4, log_every=1, seed=3,
        attention=attention, precision=precision, progress=False, report=False,
    )  # fmt: skip
    made = _same(cfg, monkeypatch)
    assert not made.causal
    # SDPA gets the masks additive, made once a forward (in the queries' dtype), not converted in every layer
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[precision]
    assert made.additive == (dtype if attention == "sdpa" else None)


def test_packed_rows_train_as_with_transformers_own_masks(tmp_path, monkeypatch):
    from tests.tasks.test_causal_lm import tiny_llama_job

    folder, corpus = tiny_llama_job(tmp_path)
    cfg = TrainConfig(
        task="causal-lm", model=str(folder), data=str(corpus), max_length=64, cache_dir=str(tmp_path / "cache"),
        output_dir=str(tmp_path / "run"), batch_size=4, max_steps=4, log_every=1, seed=3, precision="fp32",
        attention="sdpa", progress=False, report=False,
    )  # fmt: skip
    made = _same(cfg, monkeypatch)
    assert made.causal and made.packs and made.additive == torch.float32


def test_the_packed_mask_is_built_by_broadcasting_not_vmap(monkeypatch):
    """transformers' vmap path for a mask function costs about 3 ms of host time a forward (0.05 by broadcasting):
    the per-document mask must not take it."""
    from transformers import AutoModelForCausalLM, LlamaConfig

    from leantrain.model.masks import _packed_mask

    config = LlamaConfig(
        vocab_size=100, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
        num_key_value_heads=2,
    )  # fmt: skip
    model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa")
    positions = torch.arange(16).repeat(2, 1)
    positions[:, 9:] = torch.arange(7)

    def no_vmap(*args, **kwargs):
        raise AssertionError("torch.vmap called")

    monkeypatch.setattr(torch, "vmap", no_vmap)
    mask = _packed_mask(model, positions)
    assert mask.shape == (2, 1, 16, 16) and not mask[0, 0, 10, 5] and mask[0, 0, 10, 9]
