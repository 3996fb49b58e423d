"""The optimizer registry as a user meets it: an optimizer registered in a test file trains, resumes bitwise and is
planned; Muon's split of the parameters on real models; schedule-free's averaged weights in evaluations,
checkpoints and model/; and the one-line refusals.

The tiny BERT (2 layers, hidden 64, MiniLM's tokenizer) in fp32 on CPU, as tests/test_checkpoint.py runs it.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from leantrain import TrainConfig, evaluate, train
from leantrain.commands.cli import main
from leantrain.errors import ConfigError
from leantrain.model import optimizers
from leantrain.model.optimizers import OPTIMIZERS, OptimizerEntry, build_optimizer, hidden_matrices, register
from leantrain.training import Hooks
from tests.conftest import make_sentiment_rows, write_csv


@pytest.fixture()
def job(dropout_model_dir, sentiment_csv, cache_dir, tmp_path):
    def make(name="run", **changes) -> TrainConfig:
        base = dict(
            model=str(dropout_model_dir),
            data=str(sentiment_csv),
            cache_dir=str(cache_dir),
            output_dir=str(tmp_path / name),
            batch_size=24,
            max_steps=8,
            lr=3e-3,
            precision="fp32",
            log_every=1,
            progress=False,
            seed=5,
            report=False,
        )
        return TrainConfig(**{**base, **changes})

    return make


def weights(run_dir: Path, step: int | None = None) -> dict[str, torch.Tensor]:
    folder = Path(run_dir) / ("model" if step is None else f"checkpoints/step-{step:06d}")
    return load_file(folder / "model.safetensors")


def rows(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (Path(run_dir) / "metrics.jsonl").read_text().splitlines()]


# -- an optimizer registered here, touching nothing outside tests/ -------------------------------------------------


@pytest.fixture()
def momentum_sgd():
    """SGD with Nesterov momentum: one fp32 buffer a parameter. One entry and its builder: nothing else."""

    def build(model, groups, lr, settings):
        return torch.optim.SGD(groups, lr=lr, momentum=0.9, nesterov=True)

    entry = register(
        OptimizerEntry(
            "test-nesterov-sgd",
            build,
            lambda shape: 4 * math.prod(shape),
            "SGD with Nesterov momentum (registered by a test)",
            cpu_seconds_per_param=1e-9,
            resume_state="momentum_buffer per parameter",
        )
    )
    yield entry.name
    OPTIMIZERS.pop(entry.name)


def test_an_optimizer_registered_in_a_test_trains_resumes_bitwise_and_is_planned(job, momentum_sgd, tiny_model_dir):
    from leantrain.commands.plan import PlanOptions, run_plan

    whole = train(job("whole", optimizer=momentum_sgd, lr=0.05, save_every=2, eval_every=3))
    resumed = train(job("resumed", optimizer=momentum_sgd, lr=0.05, save_every=2, eval_every=3,
                        resume=str(whole.output_dir / "checkpoints" / "step-000004")))  # fmt: skip
    assert resumed.metrics["train_examples"] == 4 * 24  # it trained the last 4 steps only
    a, b = weights(whole.output_dir), weights(resumed.output_dir)
    assert [k for k in a if not torch.equal(a[k], b[k])] == []
    assert [r["loss"] for r in rows(resumed.output_dir) if "loss" in r] == [
        r["loss"] for r in rows(whole.output_dir) if "loss" in r
    ]
    # the planner counts its state as the real optimizer held it: one fp32 buffer a parameter
    held = whole.metrics["optimizer_state_bytes"]
    assert whole.metrics["optimizer_state_bytes_per_param"] == 4.0
    cfg = TrainConfig(  # nothing frozen, as the job trained (without --data the default job's embeddings would be)
        model=str(tiny_model_dir), optimizer=momentum_sgd, batch_size=24, max_length=64, freeze="none"
    )
    plan, _ = run_plan(cfg, PlanOptions(), job={})
    assert {c.optimizer for c in plan.candidates} == {momentum_sgd}  # an optimizer the planner does not choose: kept
    assert {c.memory.optimizer_state for c in plan.candidates} == {held}
    assert f"{momentum_sgd} " in plan.notes[-1]  # listed beside the others


# -- Muon's split --------------------------------------------------------------------------------------------------


def tiny_llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=96, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True)  # fmt: skip
    return LlamaForCausalLM(config)


def tiny_bert_classifier(path: Path):
    from leantrain.model import loading

    return loading.load_for_classification(str(path), ["neg", "pos"])


@pytest.mark.parametrize("kind", ["bert", "llama"])
def test_muon_takes_the_blocks_matrices_and_adamw_every_other_parameter_once(kind, tiny_model_dir):
    model = tiny_bert_classifier(tiny_model_dir) if kind == "bert" else tiny_llama()
    opt = build_optimizer(model, "muon", lr=1e-3, weight_decay=0.01)
    muon, adamw = opt.parts
    assert isinstance(muon, torch.optim.Muon) and isinstance(adamw, torch.optim.AdamW)
    under_muon = {id(p) for g in muon.param_groups for p in g["params"]}
    under_adamw = {id(p) for g in adamw.param_groups for p in g["params"]}
    names = {id(p): n for n, p in model.named_parameters()}
    assert not under_muon & under_adamw and under_muon | under_adamw == set(names)  # every parameter exactly once
    assert under_muon == set(hidden_matrices(model))
    heads = [model.get_input_embeddings(), model.get_output_embeddings()]
    never = {id(m.weight) for m in heads if m is not None}
    never |= {id(p) for n, p in model.named_parameters() if p.ndim < 2 or n.split(".")[1] not in ("encoder", "layers")}
    assert not under_muon & never, [names[i] for i in under_muon & never]
    # the blocks' attention and feed-forward projections: 4 + 2 (BERT) or 4 + 3 (Llama) per layer
    assert len(under_muon) == 2 * (6 if kind == "bert" else 7)
    if kind == "bert":  # the pooler is outside the blocks: AdamW's, as the classifier
        assert id(model.bert.pooler.dense.weight) in under_adamw
    else:  # tied embeddings: the one tensor is the input embedding and the output layer, AdamW's
        assert model.get_input_embeddings().weight is model.get_output_embeddings().weight


def test_muon_prints_its_split_and_trains_with_its_own_learning_rate(job, capsys):
    result = train(job("muon", optimizer="muon", muon_lr=0.02, muon_lr_rule="original", max_steps=4))
    err = capsys.readouterr().err
    assert "muon: Muon on 12 hidden matrices" in err and "bert.encoder.layer (2 blocks)" in err
    assert "AdamW on the other 29 tensors (embeddings, head, norms, biases" in err
    assert math.isfinite(result.metrics["eval_loss"])
    config = (result.output_dir / "config.yaml").read_text()
    assert "muon_lr: 0.02" in config and "muon_lr_rule: original" in config


@pytest.mark.parametrize("name", ["galore-adamw", "apollo-adamw"])
def test_projection_embeddings_adds_the_input_embeddings_and_nothing_else(name, tiny_model_dir):
    from types import SimpleNamespace

    from leantrain.model.optimizers import describe_split, model_state_bytes

    model = tiny_bert_classifier(tiny_model_dir)
    embedding = model.get_input_embeddings().weight
    sizes = {}
    for on in (False, True):
        settings = SimpleNamespace(projection_rank=8, projection_embeddings=on)
        opt = build_optimizer(model, name, lr=1e-3, weight_decay=0.01, settings=settings)
        projected = {id(p) for g in opt.param_groups if "rank" in g for p in g["params"]}
        assert projected == set(hidden_matrices(model)) | ({id(embedding)} if on else set())
        held = [id(p) for g in opt.param_groups for p in g["params"]]
        assert sorted(held) == sorted(id(p) for p in model.parameters())  # every parameter exactly once
        split = describe_split(model, name, settings)
        assert ("and the input embeddings bert.embeddings.word_embeddings.weight" in split) == on, split
        sizes[on] = model_state_bytes(model, name, settings)
    assert sizes[True] < sizes[False]


def test_projection_embeddings_is_refused_where_it_means_nothing(tiny_model_dir):
    from types import SimpleNamespace

    with pytest.raises(ConfigError, match="--projection-embeddings is for --optimizer galore-adamw or apollo-adamw"):
        TrainConfig(optimizer="muon", projection_embeddings=True)
    settings = SimpleNamespace(projection_rank=8, projection_embeddings=True)
    model = tiny_bert_classifier(tiny_model_dir)
    model.get_input_embeddings().weight.requires_grad_(False)
    with pytest.raises(ConfigError, match="no trainable input embedding matrix to project; drop the flag"):
        build_optimizer(model, "galore-adamw", lr=1e-3, settings=settings)


# -- schedule-free: the averaged weights are what is evaluated, saved and published ---------------------------------


class TrainingWeights(Hooks):
    """The model's weights as the optimizer steps them, at the first micro-batch after optimizer step 3."""

    def __init__(self):
        self.after_step, self.saved = 0, None

    def before_optimizer_step(self, step):
        self.after_step = step

    def on_micro_batch(self, model, batch):
        if self.after_step == 3 and self.saved is None:
            self.saved = {k: v.detach().clone() for k, v in model.state_dict().items()}


def test_schedule_free_evaluates_saves_and_publishes_its_averaged_weights(job, tmp_path):
    eval_csv = write_csv(tmp_path / "eval.csv", make_sentiment_rows(40, seed=9))
    watch = TrainingWeights()
    cfg = job("sf", optimizer="schedule-free-adamw", scheduler="constant", lr=1e-2, max_steps=6, eval_every=3,
              save_every=3, eval_data=str(eval_csv))  # fmt: skip
    result = train(cfg, hooks=watch)
    run = result.output_dir
    averaged = weights(run, 3)
    # the checkpoint holds other weights than those the optimizer steps (else this test could not tell them apart)
    assert max((averaged[k] - watch.saved[k]).abs().max().item() for k in averaged) > 1e-3
    logged = [r for r in rows(run) if "eval_loss" in r]
    at3 = evaluate(str(run / "checkpoints" / "step-000003"), str(eval_csv), cache_dir=cfg.cache_dir)
    assert logged[0]["step"] == 3 and logged[0]["eval_loss"] == pytest.approx(at3["loss"], abs=1e-5)
    # model/ is the average at the end (the last checkpoint's, up to the rounding of switching back and forth once
    # more after that save), and the final evaluation scored it
    final, last = weights(run), weights(run, 6)
    assert all(torch.allclose(final[k], last[k], rtol=1e-6, atol=1e-7) for k in final)
    published = evaluate(str(run), str(eval_csv), cache_dir=cfg.cache_dir)
    assert result.metrics["eval_loss"] == pytest.approx(published["loss"], abs=1e-5)


# -- refusals, one line and exit 2 ---------------------------------------------------------------------------------


def run_cli(capsys, *argv) -> tuple[int, str]:
    code = main(["train", *argv])
    return code, capsys.readouterr().err


@pytest.mark.parametrize(
    "flags, needles",
    [
        (["--optimizer", "schedule-free-adamw", "--scheduler", "cosine"],
         ["--optimizer schedule-free-adamw with --scheduler cosine", "use --scheduler constant"]),
        (["--optimizer", "galore-adamw", "--shard", "fsdp", "--num-processes", "2"],
         ["--optimizer galore-adamw with --shard fsdp", "use --shard none"]),
        (["--optimizer", "apollo-adamw", "--lora"], ["--optimizer apollo-adamw with --lora"]),
        (["--optimizer", "galore-adamw", "--projection-rank", "65"],
         ["--projection-rank 65 is larger than the hidden matrix bert.encoder.layer.0.", "give at most 64"]),
        (["--optimizer", "muon", "--lora", "--lora-targets", "pooler.dense"],
         ["--optimizer muon:", "no trainable 2-D weight matrices inside repeated blocks", "use --optimizer adamw"]),
        (["--optimizer", "muon", "--muon-momentum", "1.5"], ["--muon-momentum must be in [0, 1)"]),
    ],
    ids=["schedule-free-cosine", "galore-fsdp", "apollo-lora", "rank-too-large", "muon-no-hidden", "momentum"],
)  # fmt: skip
def test_what_an_optimizer_cannot_do_is_refused_in_one_line(capsys, tiny_model_dir, sentiment_csv, tmp_path, flags,
                                                            needles):  # fmt: skip
    code, err = run_cli(capsys, "--model", str(tiny_model_dir), "--data", str(sentiment_csv), "--output-dir",
                        str(tmp_path / "run"), "--cache-dir", str(tmp_path / "cache"), "--max-steps", "1",
                        "--no-progress", *flags)  # fmt: skip
    assert code == 2, err
    line = err.strip().splitlines()[-1]
    assert "Traceback" not in err and all(n in line for n in needles), err
    assert not (tmp_path / "run" / "metrics.json").exists()


def test_a_schedule_free_optimizer_with_the_scheduler_left_out_trains_at_constant_and_says_so(
    capsys, tiny_model_dir, sentiment_csv, tmp_path
):
    """--scheduler left out is linear, but for an optimizer that takes only some the first of them (schedule-free:
    constant, its warm-up kept), said in the log and recorded in config.yaml; one given that it cannot take is
    refused above."""
    assert TrainConfig(data="x.csv").resolved().scheduler == "linear"  # as older runs recorded it
    assert TrainConfig(data="x.csv", optimizer="schedule-free-sgd").resolved().scheduler == "constant"
    code, err = run_cli(capsys, "--model", str(tiny_model_dir), "--data", str(sentiment_csv), "--output-dir",
                        str(tmp_path / "run"), "--cache-dir", str(tmp_path / "cache"), "--max-steps", "2",
                        "--no-progress", "--no-report", "--optimizer", "schedule-free-adamw")  # fmt: skip
    assert code == 0, err
    assert "--scheduler left out: constant for --optimizer schedule-free-adamw, as schedule-free takes no" in err
    assert "\nscheduler: constant\n" in (tmp_path / "run" / "config.yaml").read_text()


def test_the_docs_name_the_optimizers_that_refuse_lora():
    """docs/techniques/optimizers.md's list of what refuses --lora is the registry's (Muon trains LoRA adapters)."""
    import re

    text = (Path(__file__).resolve().parents[1] / "docs" / "techniques" / "optimizers.md").read_text()
    named = re.search(r"([^.;(]*) refuse `--lora`", text.replace("\n", " "))
    assert named is not None
    shown = {"muon": "Muon", "galore-adamw": "GaLore", "apollo-adamw": "APOLLO"}
    assert {n for n, word in shown.items() if word in named.group(1)} == {n for n, e in OPTIMIZERS.items() if e.no_lora}


def test_the_refusals_are_the_registrys_in_one_place():
    """Each kind of refusal is a field of the entry that one function (`optimizers.check`) reads."""
    from types import SimpleNamespace

    refusing = {n for n, e in OPTIMIZERS.items() if e.schedulers is not None}
    assert refusing == {"schedule-free-adamw", "schedule-free-sgd"}
    assert {n for n, e in OPTIMIZERS.items() if e.no_fsdp} == {"galore-adamw", "apollo-adamw"}
    for name in refusing:
        with pytest.raises(optimizers.ConfigError, match="--scheduler linear"):
            optimizers.check(name, SimpleNamespace(scheduler="linear"))
        optimizers.check(name, SimpleNamespace(scheduler="constant"))
