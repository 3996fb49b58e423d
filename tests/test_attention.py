"""--attention (issue #16): auto follows the measured table, a forced choice is the kernel that trains, the results
are the same up to rounding, and a packed causal LM's guard checks the kernel that will run."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from safetensors.torch import load_file

from leantrain import TrainConfig, train
from leantrain.commands.cli import main as cli_main
from leantrain.errors import ConfigError
from leantrain.model import attention
from tests.conftest import EXACT_JOB, assert_trained_alike


def model_with(dropout: float | None = 0.0, implementation: str | None = "sdpa"):
    config = SimpleNamespace(_attn_implementation=implementation)
    if dropout is not None:
        config.attention_probs_dropout_prob = dropout
    return SimpleNamespace(config=config)


@pytest.mark.parametrize(
    "device, precision, dropout, native_bf16, fast_dropout, chosen",
    [
        ("cuda", "bf16", 0.0, False, False, "sdpa"),  # the GPU: SDPA measured fastest
        ("cuda", "fp32", 0.1, False, False, "sdpa"),
        ("cpu", "bf16", 0.0, True, False, "eager"),  # native bf16, no attention dropout: SDPA's flash kernel is slow
        ("cpu", "bf16", 0.1, True, False, "sdpa"),  # dropout sends SDPA down another path
        ("cpu", "fp32", 0.0, True, False, "sdpa"),
        ("cpu", "bf16", 0.0, False, False, "sdpa"),  # emulated bf16 (this project's AMD CPUs): measured alike
        ("cpu", "fp32", 0.1, False, True, "eager"),  # SDPA would draw its dropout with torch's bernoulli_
        ("cpu", "bf16", 0.1, True, True, "eager"),
        ("cpu", "fp32", 0.0, False, True, "sdpa"),  # no attention dropout: nothing to draw
    ],
)
def test_auto_follows_the_measured_table(monkeypatch, device, precision, dropout, native_bf16, fast_dropout, chosen):
    monkeypatch.setattr(attention, "_cpu_has_native_bf16", lambda: native_bf16)
    name, why = attention.choose("auto", model_with(dropout), device, precision, fast_dropout)
    assert name == chosen and why.startswith("auto")


def test_a_forced_choice_is_kept_and_a_model_without_one_is_left_alone():
    assert attention.choose("flex_attention", model_with(), "cuda", "bf16")[0] == "flex_attention"
    with pytest.raises(ConfigError, match="no backward pass on a CPU"):
        attention.choose("flex_attention", model_with(), "cpu", "fp32")
    assert attention.choose("eager", model_with(), "cpu", "fp32") == ("eager", "--attention")
    assert attention.choose("auto", model_with(implementation=None), "cpu", "fp32")[0] is None
    assert attention.choose("auto", SimpleNamespace(), "cpu", "fp32")[0] is None  # a custom model without a config


def test_flex_attention_is_refused_for_training_on_a_cpu(tiny_model_dir, sentiment_csv, tmp_path):
    """torch's flex attention has no CPU backward: one line before any work, not a traceback at the first step."""
    with pytest.raises(ConfigError, match=r"^--attention flex_attention: flex attention has no backward pass on a CPU"):
        run(tiny_model_dir, sentiment_csv, tmp_path, "flex", attention="flex")
    assert not (tmp_path / "flex" / "model").exists()


def test_a_kernel_the_model_cannot_run_is_one_line(tiny_model_dir):
    from transformers import AutoModelForSequenceClassification

    model = AutoModelForSequenceClassification.from_pretrained(tiny_model_dir)

    def refuse(name):
        raise ValueError(f"{name} is not supported\nmore detail")

    model.set_attn_implementation = refuse
    with pytest.raises(ConfigError, match=r"^--attention flex_attention: BertForSequenceClassification cannot run it"):
        attention.apply(model, "flex_attention")
    # auto's choice falls back to what the model runs already
    assert attention.apply(model, "eager", forced=False) == model.config._attn_implementation == "sdpa"


def test_the_flag_takes_flex_for_flex_attention_and_refuses_other_names(capsys):
    assert TrainConfig(attention="flex").attention == "flex_attention"
    assert cli_main(["train", "--attention", "flash", "--max-steps", "1"]) == 2
    err = capsys.readouterr().err
    assert "--attention must be one of auto, eager, sdpa, flex_attention; got 'flash'" in err
    assert "Traceback" not in err


def run(tiny_model_dir, sentiment_csv, tmp_path, name: str, **over):
    cfg = TrainConfig(
        model=str(tiny_model_dir),
        data=str(sentiment_csv),
        output_dir=str(tmp_path / name),
        cache_dir=str(tmp_path / "cache"),
        report=False,
        **{"max_steps": 4, "batch_size": 8, **EXACT_JOB, **over},
    )
    return train(cfg)


def test_eager_and_sdpa_train_to_the_same_weights(tiny_model_dir, sentiment_csv, tmp_path, capsys, monkeypatch):
    """The choice changes cost, not results (the tiny model has no dropout): and the forced kernel is what ran."""
    from transformers.models.bert import modeling_bert

    ran: set[str] = set()
    original = modeling_bert.eager_attention_forward

    def spy(*args, **kwargs):
        ran.add("eager")
        return original(*args, **kwargs)

    monkeypatch.setattr(modeling_bert, "eager_attention_forward", spy)
    eager = run(tiny_model_dir, sentiment_csv, tmp_path, "eager", attention="eager")
    assert "attention: eager (--attention)" in capsys.readouterr().err
    assert eager.metrics["attention"] == "eager"  # metrics.json records the kernel that trained
    assert ran == {"eager"}
    ran.clear()
    sdpa = run(tiny_model_dir, sentiment_csv, tmp_path, "sdpa", attention="sdpa")
    assert ran == set()  # SDPA never calls the eager function
    from transformers import AutoModelForSequenceClassification

    start = {
        k: v.clone() for k, v in AutoModelForSequenceClassification.from_pretrained(tiny_model_dir).state_dict().items()
    }
    a = load_file(eager.output_dir / "model" / "model.safetensors")
    b = load_file(sdpa.output_dir / "model" / "model.safetensors")
    start = {k: start[k] for k in a}
    assert_trained_alike(a, b, start)


def test_a_packed_causal_lm_is_checked_with_the_kernel_that_will_run(tmp_path, monkeypatch):
    from leantrain.tasks.causal_lm import CausalLM

    seen = []
    monkeypatch.setattr(CausalLM, "check_model", lambda self, model: seen.append(model.config._attn_implementation))
    llama_run(tmp_path, attention="eager")
    assert seen == ["eager"]


def llama_run(tmp_path, **over):
    """One step of a tiny Llama on 40 short documents (packed unless `over` says)."""
    from tests.tasks.test_causal_lm import documents, write_tiny_llama

    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n\n".join(documents(40, seed=0)) + "\n")
    settings = dict(max_steps=1, batch_size=4, max_length=32, report=False, progress=False)
    return train(
        TrainConfig(
            model=str(write_tiny_llama(tmp_path / "llama")),
            data=str(corpus),
            output_dir=str(tmp_path / "run"),
            cache_dir=str(tmp_path / "cache"),
            **{**settings, **over},
        )
    )


def test_evaluate_runs_the_kernel_the_run_forced(tiny_model_dir, sentiment_csv, tmp_path, monkeypatch):
    """A run trained with --attention eager is evaluated with eager too (auto's runs keep the model's default)."""
    from transformers.models.bert import modeling_bert

    from leantrain import evaluate

    result = run(tiny_model_dir, sentiment_csv, tmp_path, "eager", attention="eager", max_steps=1)
    ran: list[str] = []
    original = modeling_bert.eager_attention_forward

    def spy(*args, **kwargs):
        ran.append("eager")
        return original(*args, **kwargs)

    monkeypatch.setattr(modeling_bert, "eager_attention_forward", spy)
    evaluate(str(result.output_dir), str(sentiment_csv))
    assert ran  # the model evaluated with eager attention, as it trained
    ran.clear()
    auto = run(tiny_model_dir, sentiment_csv, tmp_path, "auto", max_steps=1)
    assert auto.metrics["attention"] == "sdpa"  # auto resolved, on this fp32 CPU run
    evaluate(str(auto.output_dir), str(sentiment_csv))
    assert not ran  # auto trained with SDPA here, and evaluation keeps the default


def test_auto_evaluates_with_sdpa_where_eager_trains(tiny_model_dir, sentiment_csv, tmp_path, monkeypatch, capsys):
    """Where auto trains eager (a CPU with native bf16, as made here), evaluations run SDPA (no backward pass: its
    forward measured faster), the model trains eager again after each, and `leantrain evaluate` scores the run's model
    with SDPA too, to the same loss."""
    from transformers.models.bert import modeling_bert

    from leantrain import evaluate

    monkeypatch.setattr(attention, "_cpu_has_native_bf16", lambda: True)
    modes: list[bool] = []  # the `training` flag of each eager call
    original = modeling_bert.eager_attention_forward

    def spy(module, *args, **kwargs):
        modes.append(module.training)
        return original(module, *args, **kwargs)

    monkeypatch.setattr(modeling_bert, "eager_attention_forward", spy)
    result = run(
        tiny_model_dir, sentiment_csv, tmp_path, "auto", precision="bf16", eval_every=2, eval_data=str(sentiment_csv)
    )
    said = capsys.readouterr().err
    assert "attention: eager (auto: on a CPU with native bf16" in said and "evaluations: sdpa (no backward)" in said
    assert result.metrics["attention"] == "eager"
    # (the set-up's probes of the model run eager in evaluation mode, before the first step)
    trained = modes[modes.index(True) :]
    assert trained == [True] * 4 * 2  # 4 steps of 2 layers; the evaluations at steps 2 and 4 never ran eager
    modes.clear()
    again = evaluate(str(result.output_dir), str(sentiment_csv))
    assert modes == []  # SDPA: eager's function never ran
    assert again["loss"] == result.metrics["eval_loss"]


@pytest.mark.parametrize("packing", [None, False])
def test_a_packed_causal_lm_evaluates_with_the_kernel_it_trains_with(tmp_path, monkeypatch, packing):
    """Its packing guard checked the training kernel, so a packed run (packing unset: on for a causal LM) keeps it
    for evaluations; with --no-packing evaluations run SDPA."""
    monkeypatch.setattr(attention, "_cpu_has_native_bf16", lambda: True)
    result = llama_run(tmp_path, precision="bf16", packing=packing)
    assert result.metrics["attention"] == "eager"
    assert result.metrics["eval_attention"] == ("eager" if packing is None else "sdpa")
