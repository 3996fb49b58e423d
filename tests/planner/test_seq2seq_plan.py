"""The planner on encoder-decoders (T5, BART): their parameters and optimizer state, the activations their task saves,
predicted against measured peaks, FLOPs in two lengths, and `plan` / `train --auto` on a sequence-to-sequence run.

The tiny T5 has more decoder layers than encoder layers (2 + 3) and its head fused with the loss at target tokens,
as the task trains it; the tiny BART adds its `final_logits_bias` to the logits, so its task computes the logits at
target tokens and the loss after them (not fused): both paths of `tasks.seq2seq.Seq2Seq.forward`.
"""

from __future__ import annotations

import csv
import json
import random
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from benchmarks.planner_measure import Trial

from leantrain import TrainConfig, train
from leantrain.commands.cli import main
from leantrain.model.dropout import fast_dropout
from leantrain.planner import memory as M
from tests.planner.test_memory import check_against_measurement, saved_bytes


@pytest.fixture(scope="module")
def pair_models(minilm_dir, tmp_path_factory) -> dict[str, Path]:
    """A 64-wide T5 with 2 encoder and 3 decoder layers and a 64-wide BART with 2 + 2, random weights, MiniLM's
    tokenizer (BERT's [PAD] starts the decoder, [SEP] ends a target), each model's own default dropout."""
    from transformers import (
        AutoTokenizer,
        BartConfig,
        BartForConditionalGeneration,
        T5Config,
        T5ForConditionalGeneration,
    )

    root = tmp_path_factory.mktemp("planner-seq2seq")
    ids = dict(pad_token_id=0, eos_token_id=102, decoder_start_token_id=0)
    t5 = T5Config(
        vocab_size=30522, d_model=64, d_ff=128, num_layers=2, num_decoder_layers=3, num_heads=4, d_kv=16, **ids
    )
    bart = BartConfig(
        vocab_size=30522, d_model=64, encoder_ffn_dim=128, decoder_ffn_dim=128, encoder_layers=2, decoder_layers=2,
        encoder_attention_heads=4, decoder_attention_heads=4, max_position_embeddings=256, bos_token_id=101, **ids,
    )  # fmt: skip
    torch.manual_seed(0)
    tokenizer = AutoTokenizer.from_pretrained(minilm_dir)
    out = {}
    for name, model in (("t5", T5ForConditionalGeneration(t5)), ("bart", BartForConditionalGeneration(bart))):
        model.save_pretrained(root / name)
        tokenizer.save_pretrained(root / name)
        out[name] = root / name
    return out


@pytest.fixture(scope="module")
def summaries(tmp_path_factory) -> Path:
    """120 pairs: sources of 5-40 words, targets of their first 1-12 (the tokenizer makes a word one token)."""
    from tests.tasks.test_seq2seq import WORDS

    rng = random.Random(0)
    path = tmp_path_factory.mktemp("sum") / "sum.csv"
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["source", "target"])
        for _ in range(120):
            source = rng.choices(WORDS, k=rng.randint(5, 40))
            w.writerow([" ".join(source), " ".join(source[: rng.randint(1, 12)])])
    return path


@pytest.mark.parametrize("name", ["t5", "bart"])
def test_an_encoder_decoders_facts_and_optimizer_state_are_the_real_models(pair_models, name):
    """Both stacks' layers, the feed-forward width under each config's name, and the optimizer state of the real
    model byte for byte (AdamW, Adafactor)."""
    from benchmarks.planner_measure import build_model

    from leantrain.model.optimizers import build_optimizer, state_bytes

    facts = M.model_facts(str(pair_models[name]))
    assert (facts.kind, facts.layers, facts.intermediate) == ("seq2seq", 5 if name == "t5" else 4, 128)
    model = build_model(str(pair_models[name]))
    assert type(model).__name__.endswith("ForConditionalGeneration")
    assert facts.params == sum(p.numel() for p in model.parameters())
    for optimizer in ("adamw", "adafactor"):
        opt = build_optimizer(model, optimizer, lr=1e-3)
        for p in model.parameters():
            p.grad = torch.ones_like(p)
        opt.step()
        assert facts.inventory.state_bytes(optimizer) == state_bytes(opt), optimizer


@pytest.mark.parametrize(
    ("name", "precision", "smoothing"),
    [("t5", "fp32", 0.0), ("t5", "bf16", 0.0), ("t5", "fp32", 0.1), ("bart", "fp32", 0.0)],
)
def test_planned_activations_are_what_the_seq2seq_task_saves(pair_models, name, precision, smoothing):
    """The activations planned for 4 pairs of 48 source and 24 target tokens are what the task's own forward and loss
    save (its head at target tokens, fused with the loss for the T5 unless --label-smoothing takes the logits),
    carried from proxies of 1-2 encoder and 1-2 decoder layers at a vocabulary of 512 and 1,024 to the real model's
    2 + 3 layers and 30,522 entries."""
    from leantrain.model import loading
    from leantrain.tasks.seq2seq import Seq2Seq

    path = str(pair_models[name])
    facts = M.model_facts(path)
    fused = name == "t5" and not smoothing
    profile = M.activation_profile(facts.config_json, 48, precision, False, target_len=24, fusable=not smoothing)
    assert profile.fused_head == fused
    planned = profile.saved(4, facts.layers, False)
    model = M._build(loading.load_config(path), "cpu").train()
    task = Seq2Seq(TrainConfig(model=path, data="unused.csv", task="seq2seq", label_smoothing=smoothing))
    task.check_model(model)
    assert task.selects_logits and task.fuses_head_loss == fused
    batch = M.proxy_batch(model.config, 4, 48, torch.Generator().manual_seed(0), target_len=24)
    dtype = torch.bfloat16 if precision == "bf16" else None

    def step():  # as a run on a CPU draws its dropout (--fast-dropout)
        with torch.random.fork_rng(devices=[]), torch.autocast("cpu", dtype=dtype, enabled=dtype is not None):
            torch.manual_seed(0)
            with fast_dropout():
                outputs = task.forward(model, batch)
        return task.loss_sum(outputs, batch)

    measured = saved_bytes(model, step)
    assert planned == pytest.approx(measured, rel=0.03)
    # the targets matter: twice as long, the decoder's layers and the logits save more
    longer = M.activation_profile(facts.config_json, 48, precision, False, target_len=48, fusable=not smoothing)
    assert longer.saved(4, facts.layers, False) > 1.2 * planned


@pytest.mark.parametrize(("freeze", "leading"), [("shared.weight,encoder.block.0.*", 1), ("encoder.block.0.*", 0)])
def test_encoder_layers_frozen_with_everything_before_them_are_planned_without_activations(
    pair_models, freeze, leading
):
    """The T5's shared embedding and first encoder layer frozen: nothing in that layer needs a gradient, so it saves
    nothing, and the plan leaves out an encoder layer's share (not the mean of an encoder's and a decoder's); the
    output layer, tied to that embedding, is frozen too, and its fused loss takes no weight gradient in the forward
    pass (7.8 MiB here). What the task's forward saves is then within 5% of the plan (2.4% over: the frozen
    embedding's dropout mask, a bool a number; counted as before, 74% over). With the embedding training, the frozen
    layer's input needs a gradient: it is counted as if it trained (an overestimate)."""
    from leantrain.model import freezing, loading
    from leantrain.tasks.seq2seq import Seq2Seq

    path = str(pair_models["t5"])
    facts = M.model_facts(path)
    assert M.frozen_leading_layers(facts.config_json, freeze) == leading
    planned = M.estimate(facts, 16, 48, "fp32", False, "adamw", freeze=freeze, target_len=24).activations
    whole = M.estimate(facts, 16, 48, "fp32", False, "adamw", target_len=24).activations
    encoder_layer = M.activation_profile(facts.config_json, 48, "fp32", False, target_len=24).encoder_layer
    head = leading * 4 * facts.vocab * facts.hidden  # (the shared embedding frozen with the layer)
    assert encoder_layer is not None
    assert planned == pytest.approx(whole - leading * 16 * encoder_layer[0] - head, abs=1)
    model = M._build(loading.load_config(path), "cpu").train()
    freezing.apply(model, freeze)
    task = Seq2Seq(TrainConfig(model=path, data="unused.csv", task="seq2seq"))
    task.check_model(model)
    batch = M.proxy_batch(model.config, 16, 48, torch.Generator().manual_seed(0), target_len=24)

    def step():  # as a run on a CPU draws its dropout (--fast-dropout)
        with torch.random.fork_rng(devices=[]), fast_dropout():
            torch.manual_seed(0)
            return task.loss_sum(task.forward(model, batch), batch)

    measured = saved_bytes(model, step)
    assert measured <= planned <= measured * (1.05 if leading else 1.3)


def test_a_seq2seq_plan_counts_flops_in_both_lengths(pair_models, without_lora_notes):
    """The speed model's FLOPs per pair are the run's telemetry's (`pair_flop_model`: source and target lengths,
    cross-attention's s x t), and the table names both lengths."""
    from leantrain.planner.search import PlanRequest, make_plan
    from leantrain.telemetry.flops import pair_flop_model

    facts = M.model_facts(str(pair_models["t5"]))
    one = dict(precisions=("fp32",), optimizers=("adamw",), checkpointing=(False,))
    request = PlanRequest(model=str(pair_models["t5"]), budget=2**30, global_batch=8, seq_len=64, target_len=16, **one)
    plan = make_plan(request, facts=facts)
    flop = pair_flop_model(M._build(M._config_from_json(facts.config_json), "meta"))
    assert plan.facts["flops_per_sequence"] == pytest.approx(flop.batch_flops(1, 64) + flop.target_flops(64, 16))
    assert plan.facts["flops_per_sequence"] > 1.1 * flop.batch_flops(1, 64)  # the decoder's share is counted
    assert "sources 64 and targets 16 tokens" in plan.render() and plan.recommended is not None
    assert plan.candidates[0].memory.peak > 0
    same = make_plan(PlanRequest(model=str(pair_models["t5"]), budget=2**30, global_batch=8, seq_len=64, **one))
    assert same.request.target_len == 64  # targets as long as the sources when the request does not say


@pytest.mark.slow  # measures in a new Python process: 4 trials, each warmed up (150 s at load 4)
def test_t5_predicted_peak_within_15_percent_of_measured(pair_models):
    """The tiny T5 (its logits, 16 x 64 target tokens x 30,522 entries, outweigh its layers): fp32 and bf16, with and
    without checkpointing (measured 2.7-6.1% under, 2026-12-06). Tried: planning the targets as long as the sources
    (128) puts the trials without checkpointing 15% and 23% over; the causal LM's fused-head transient (3 fp32 chunks
    of logits, not 2) puts the fp32 trials 21% and 29% over."""
    m = str(pair_models["t5"])
    check_against_measurement(
        m,
        [
            Trial(m, "fp32", False, "adamw", 16, 1, 128, steps=2, target_len=64),
            Trial(m, "fp32", True, "adamw", 16, 1, 128, steps=2, target_len=64),
            Trial(m, "bf16", False, "adamw", 16, 1, 128, steps=2, target_len=64),
            Trial(m, "bf16", True, "adamw", 16, 1, 128, steps=2, target_len=64),
        ],
    )


@pytest.mark.slow  # measures in a new Python process: 3 trials (90 s at load 4)
def test_bart_predicted_peak_within_15_percent_of_measured(pair_models):
    """The tiny BART, whose logits are computed whole at target tokens: fp32 with and without checkpointing, and
    Adafactor with accumulation (measured 0.4-5.4% under, 2026-12-06)."""
    m = str(pair_models["bart"])
    check_against_measurement(
        m,
        [
            Trial(m, "fp32", False, "adamw", 16, 1, 128, steps=2, target_len=64),
            Trial(m, "fp32", True, "adamw", 16, 1, 128, steps=2, target_len=64),
            Trial(m, "fp32", False, "adafactor", 8, 2, 128, steps=2, target_len=64),
        ],
    )


def test_plan_command_plans_a_seq2seq_run_on_its_pairs(pair_models, summaries, tmp_path, capsys, without_lora_notes):
    """`leantrain plan --task seq2seq --data sum.csv` (refused before: "planned by hand for now"): exit 0, the table,
    a recommendation, planned at the longest source and target of the data; a budget nothing fits names both length
    flags."""
    common = ["plan", "--model", str(pair_models["t5"]), "--task", "seq2seq", "--cache-dir", str(tmp_path / "cache")]
    code = main([*common, "--data", str(summaries), "--memory", "2GB", "--plan-dir", str(tmp_path / "p")])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "configuration" in out and "=>" in out and "recommended: " in out
    plan = json.loads((tmp_path / "p" / "plan.json").read_text())
    source, target = plan["request"]["seq_len"], plan["request"]["target_len"]
    assert 5 < source < 128 and 1 < target < source  # the data's longest, under --max-length's 128
    assert f"sources {source} and targets {target} tokens" in out and "sequence-to-sequence" in out
    assert f"length {source}: the longest example of --data (--max-source-length 128)" in out  # its own flag
    # --label-smoothing takes the logits: the head is not fused with the loss, and the same run needs more
    assert main([*common, "--data", str(summaries), "--memory", "2GB", "--label-smoothing", "0.1"]) == 0
    smoothed = capsys.readouterr().out
    assert "kept whole: --label-smoothing" in smoothed
    peak = lambda text: float(text.split("recommended: ")[1].split("predicted peak ")[1].split(" MiB")[0])  # noqa: E731
    assert peak(smoothed) > peak(out)
    assert main([*common, "--memory", "4MiB", "--max-target-length", "32"]) == 1
    out = capsys.readouterr().out
    assert "nothing fits" in out and "--max-target-length (32)" in out and "--max-source-length (128)" in out


def test_train_auto_picks_a_configuration_for_a_seq2seq_run(pair_models, summaries, tmp_path):
    """--auto on a sequence-to-sequence run plans it (it was refused), trains with the recommendation and records
    it; at 120 MiB the whole batch of 16 does not fit in fp32 without checkpointing."""
    out = tmp_path / "auto"
    job = TrainConfig(
        model=str(pair_models["t5"]), task="seq2seq", data=str(summaries), cache_dir=str(tmp_path / "cache"),
        output_dir=str(out), batch_size=16, max_steps=2, precision="fp32", auto=True, memory="120MiB",
        metrics="loss", progress=False, report=False,
    )  # fmt: skip
    result = train(job)
    plan = json.loads((out / "plan.json").read_text())
    rec = plan["recommended"]
    assert rec is not None and plan["request"]["target_len"] > 0
    assert rec["memory"]["peak"] <= 0.9 * 120 * 2**20
    assert (rec["micro_batch"], rec["activation_checkpointing"]) != (16, False)
    config = yaml.safe_load((out / "config.yaml").read_text())
    assert (config["batch_size"], config["grad_accum"]) == (rec["micro_batch"], rec["grad_accum"])
    assert config["activation_checkpointing"] == rec["activation_checkpointing"]
    assert result.metrics["global_batch"] == 16


def test_a_probe_measures_pairs_padded_to_the_planned_source_and_target_lengths(
    pair_models, summaries, tmp_path, monkeypatch
):
    """`plan --probe` on a seq2seq run trains its candidates on batches of the planned shapes: every source padded to
    the planned source length and every target to the planned target length (the data's longest), not each batch to
    its own longest pair, which would measure a smaller step than the one predicted."""
    from leantrain.commands import bench
    from leantrain.data.batching import ExamplesDataset
    from leantrain.job import assemble

    jobs = []

    def run_job(name, over, base, steps, out_dir, say, timeout, env=None):
        jobs.append({**base, **over})
        metrics = {"steady_samples_per_second": 10.0, "peak_memory_over_baseline_bytes": 1000, "weights_bytes": 10}
        return bench.BenchRow(name, over, metrics)

    monkeypatch.setattr(bench, "run_job", run_job)
    args = ["--model", str(pair_models["t5"]), "--task", "seq2seq", "--data", str(summaries), "--memory", "2GB"]
    cache = ["--cache-dir", str(tmp_path / "cache"), "--plan-dir", str(tmp_path / "p")]
    assert main(["plan", *args, *cache, "--probe", "--probe-top", "1"]) == 0
    request = json.loads((tmp_path / "p" / "plan.json").read_text())["request"]
    source, target = request["seq_len"], request["target_len"]
    probed = TrainConfig(**{**jobs[0], "output_dir": str(tmp_path / "probe")})
    made = assemble(probed)  # the probe's run, as `leantrain train` builds it
    task = made.task
    data = task.prepare_data(made.model_path, made.model_config)
    rows = ExamplesDataset(data.train)
    shortest = np.argsort(data.train.features.lengths)[:4]  # pairs far shorter than the planned lengths
    batch = task.collator(data, train=True)([rows[int(i)] for i in shortest])
    assert batch["input_ids"].shape == batch["attention_mask"].shape == (4, source)
    assert batch["labels"].shape == batch["decoder_input_ids"].shape == batch["target_mask"].shape == (4, target)
