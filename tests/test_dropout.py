"""Dropout on a CPU from 16-bit draws (`model.dropout`): a dropout's distribution (kept fraction 1 - p, the kept
numbers scaled by the exact inverse, gradients through the kept ones), drawn from torch's generator (a seed and a
saved generator state give the same masks), and what a CPU training run draws with."""

from __future__ import annotations

import math

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from leantrain import TrainConfig, train
from leantrain.model.dropout import LEVELS, dropout, fast_dropout


@pytest.mark.parametrize("p", [0.1, 0.5, 0.9])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_dropout_keeps_one_minus_p_and_scales_by_the_exact_inverse(p, dtype):
    torch.manual_seed(0)
    n = 1 << 22
    out = dropout(torch.ones(n, dtype=dtype), p)
    kept = out != 0
    dropped = round(p * LEVELS)
    keep = 1 - dropped / LEVELS
    # each of the four numbers a 64-bit draw decides, apart: a lane that repeated another would show here
    for lane in range(4):
        share = kept.view(-1, 4)[:, lane].double().mean().item()
        assert abs(share - keep) < 5 * math.sqrt(keep * (1 - keep) / (n // 4)), (lane, share)
    scale = torch.tensor(LEVELS / (LEVELS - dropped), dtype=dtype)
    assert torch.equal(out[kept].unique(), scale.view(1))
    assert abs(out.double().mean().item() - 1) < 5 * math.sqrt((1 - keep) / keep / n) + 4e-3 * (dtype != torch.float32)


def test_the_draws_follow_torchs_generator_and_gradients_flow_through_the_kept_numbers():
    x = torch.randn(1000, requires_grad=True)
    torch.manual_seed(5)
    state = torch.get_rng_state()
    first = dropout(x, 0.3)
    torch.set_rng_state(state)  # as a resumed run or activation checkpointing's replay
    assert torch.equal(dropout(x, 0.3), first)
    assert not torch.equal(dropout(x, 0.3), first)  # the generator moved on
    first.sum().backward()
    assert x.grad is not None
    assert torch.equal(x.grad, (first != 0).float() / (1 - round(0.3 * LEVELS) / LEVELS))


@pytest.mark.parametrize(("dtype", "kept"), [(torch.float32, torch.bool), (torch.bfloat16, torch.bfloat16)])
def test_an_fp32_dropout_keeps_a_bool_mask_for_backward_and_the_products_values(dtype, kept):
    """fp32: zeroed after scaling, autograd keeps a bool a number (not the float mask torch's CPU dropout keeps), and
    the output and the gradient equal the float-mask product's (a dropped number is +0 where the product gives -0 for
    a negative input). 16-bit inputs keep their 2-byte mask:
    bool-masked operators cost a CPU more time than that byte saves."""
    x = torch.randn(64, 33, dtype=dtype, requires_grad=True)
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t.dtype) or t, lambda t: t):
        torch.manual_seed(3)
        out = dropout(x * 1.0, 0.1)
    assert saved == [kept]
    out.backward(torch.ones_like(out))
    dropped = round(0.1 * LEVELS)
    torch.manual_seed(3)
    bits = torch.empty((x.numel() + 3) // 4, dtype=torch.int64).random_(-(1 << 63), (1 << 63) - 1)
    keep = (bits.view(torch.int16)[: x.numel()].view(x.shape) >= dropped - LEVELS // 2).to(dtype)
    keep = keep.mul_(LEVELS / (LEVELS - dropped))
    assert torch.equal(out, x.detach() * keep) and torch.equal(x.grad, keep)


def test_outside_training_and_at_p_zero_it_is_torchs_own():
    x = torch.randn(64)
    assert dropout(x, 0.5, training=False) is x or torch.equal(dropout(x, 0.5, training=False), x)
    assert torch.equal(dropout(x, 0.0), x)
    assert torch.equal(dropout(x, 1.0), torch.zeros_like(x))


class Bernoullis(TorchDispatchMode):
    """Counts torch's bernoulli draws (what its CPU dropout makes each mask with)."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.calls += "bernoulli" in func.__name__
        return func(*args, **(kwargs or {}))


def test_within_the_context_modules_and_functional_calls_draw_16_bits():
    layer = torch.nn.Dropout(0.2).train()
    x = torch.randn(256)
    with Bernoullis() as inside, fast_dropout():
        layer(x)
        torch.nn.functional.dropout(x, 0.2)
    assert inside.calls == 0
    with Bernoullis() as outside:
        layer(x)  # torch's own again
    assert outside.calls == 1


@pytest.mark.parametrize("fast", [True, False])
def test_a_cpu_training_run_draws_its_dropout_as_set(dropout_model_dir, sentiment_csv, tmp_path, fast):
    """--fast-dropout (the default) on a CPU: no bernoulli in the run (eager attention, whose dropout goes through
    it); --no-fast-dropout: torch's dropout in every layer."""
    with Bernoullis() as drawn:
        result = train(
            TrainConfig(
                model=str(dropout_model_dir), data=str(sentiment_csv), cache_dir=str(tmp_path / "cache"),
                output_dir=str(tmp_path / "run"), batch_size=8, max_steps=3, progress=False, report=False,
                fast_dropout=fast, precision="fp32",
            )
        )  # fmt: skip
    assert result.metrics["optimizer_steps"] == 3
    assert (drawn.calls == 0) == fast, drawn.calls
    config = (result.output_dir / "config.yaml").read_text()
    assert f"fast_dropout: {str(fast).lower()}" in config


def _two_training_forwards_agree(model, inputs) -> bool:
    model.train()
    with torch.no_grad():
        return torch.equal(model(**inputs).logits, model(**inputs).logits)


@pytest.mark.parametrize("kind", ["bert", "llama", "t5"])
def test_set_rate_reaches_every_dropout_and_the_config(kind):
    """--dropout's `set_rate`: with every rate at 0 a training-mode forward is deterministic (modules, attention's
    float rate and a classifier's own dropout included), and the config says so; any other rate is set alike."""
    import transformers as tf

    from leantrain.model.dropout import set_rate

    torch.manual_seed(0)
    ids = torch.randint(3, 90, (2, 12))
    if kind == "bert":
        config = tf.BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                               intermediate_size=64, classifier_dropout=0.2)  # fmt: skip
        model, inputs = tf.BertForSequenceClassification(config), {"input_ids": ids}
    elif kind == "llama":
        config = tf.LlamaConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                intermediate_size=64, attention_dropout=0.5)  # fmt: skip
        model, inputs = tf.LlamaForCausalLM(config), {"input_ids": ids}
        model.config._attn_implementation = "eager"  # whose dropout is F.dropout at the module's float rate
    else:
        config = tf.T5Config(vocab_size=100, d_model=32, d_ff=64, num_layers=2, num_heads=2, d_kv=16)
        model, inputs = tf.T5ForConditionalGeneration(config), {"input_ids": ids, "decoder_input_ids": ids[:, :5]}
    assert not _two_training_forwards_agree(model, inputs)  # the model's own dropout draws
    set_rate(model, 0.0)
    assert _two_training_forwards_agree(model, inputs)
    rates = {k: v for k, v in model.config.to_dict().items() if "dropout" in k or "pdrop" in k}
    assert rates and set(rates.values()) == {0.0}, rates
    set_rate(model, 0.25)
    assert not _two_training_forwards_agree(model, inputs)
    modules = {m.p for m in model.modules() if isinstance(m, torch.nn.Dropout)}  # (a Llama has none)
    rates = {k: v for k, v in model.config.to_dict().items() if "dropout" in k or "pdrop" in k}
    assert modules <= {0.25} and set(rates.values()) == {0.25}, (modules, rates)


@pytest.mark.parametrize("task", ["dpo", "reward-model"])
def test_the_preference_tasks_turn_off_attentions_float_rate_and_leave_the_config(task):
    """DPO's and the reward model's dropout off (as TRL's `disable_dropout`) reaches the rate an eager Llama's
    attention reads at forward time, not only dropout modules (a Llama has none); the config keeps the model's own."""
    import transformers as tf

    from leantrain.tasks import TASKS

    config = tf.LlamaConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                            intermediate_size=64, attention_dropout=0.5)  # fmt: skip
    torch.manual_seed(0)
    model = tf.LlamaForCausalLM(config)
    model.config._attn_implementation = "eager"
    inputs = {"input_ids": torch.randint(3, 90, (2, 12))}
    assert not _two_training_forwards_agree(model, inputs)
    policy_task = TASKS[task].load()
    assert policy_task.dropout_off
    policy_task._turn_dropout_off(model)  # what its build_model calls on the model it loaded
    assert _two_training_forwards_agree(model, inputs)
    assert model.config.attention_dropout == 0.5


def test_dropout_zero_trains_as_the_same_model_shipped_without_dropout(
    dropout_model_dir, tiny_model_dir, sentiment_csv, tmp_path
):
    """`--dropout 0` on a model that ships dropout 0.1 trains bitwise as the same weights shipped with dropout off,
    and the published config.json records 0."""
    import json

    from safetensors.torch import load_file

    runs = {}
    for name, model, rate in (("set", dropout_model_dir, 0.0), ("shipped", tiny_model_dir, None)):
        train(
            TrainConfig(
                model=str(model), data=str(sentiment_csv), cache_dir=str(tmp_path / "cache"),
                output_dir=str(tmp_path / name), batch_size=8, max_steps=3, progress=False, report=False,
                precision="fp32", dropout=rate,
            )
        )  # fmt: skip
        runs[name] = load_file(tmp_path / name / "model" / "model.safetensors")
    assert runs["set"].keys() == runs["shipped"].keys()
    assert all(torch.equal(runs["set"][k], runs["shipped"][k]) for k in runs["set"])
    saved = json.loads((tmp_path / "set" / "model" / "config.json").read_text())
    assert saved["hidden_dropout_prob"] == 0.0 and saved["attention_probs_dropout_prob"] == 0.0


def test_the_default_job_trains_without_dropout_and_your_data_with_the_models():
    assert TrainConfig(limit=9).resolved().dropout == 0.0
    assert TrainConfig(limit=9, dropout=0.1).resolved().dropout == 0.1  # asked: kept
    assert TrainConfig(data="mine.csv").resolved().dropout is None


def test_a_dropout_out_of_range_is_refused_in_one_line(capsys):
    from leantrain.commands.cli import main

    assert main(["train", "--dropout", "1.5", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "--dropout must be in [0, 1), got 1.5" in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1, err


def test_a_checkpoint_from_before_dropout_was_recorded_resumes_only_with_the_models_own(tmp_path):
    """An older checkpoint's config has no dropout: its run kept the model's own, so resuming it with the default
    job's dropout 0 is refused by name, and with the model's own it goes on."""
    from leantrain.run.checkpoint import Checkpoint, CheckpointError

    older = Checkpoint(tmp_path, {"config": {"lr": 1e-4}, "facts": {}})
    with pytest.raises(CheckpointError, match=r"dropout differs \(None in the checkpoint, 0\.0 now\)"):
        older.check_matches({"lr": 1e-4, "dropout": 0.0}, {})
    older.check_matches({"lr": 1e-4, "dropout": None}, {})
