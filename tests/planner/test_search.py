"""The search: candidates keep the global batch, the recommendation is the fastest that fits, probes re-rank.

Speed facts are fixed here (no GEMM probe, no timing): the tests check the logic, the benchmark the figures.
"""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from leantrain.planner import search
from leantrain.planner.memory import model_facts
from leantrain.planner.speed import DeviceSpeed, optimizer_seconds

SPEED = DeviceSpeed(
    "cpu",
    2.5e11,
    {"fp32": 1.0, "bf16": 1.5, "fp16": 0.9},
    optimizer_seconds_per_param=optimizer_seconds("cpu"),
    source="fixed for tests",
)


@pytest.fixture(scope="module")
def facts(tiny_model_dir):
    return model_facts(str(tiny_model_dir))


def plan_for(facts, budget: int, **kw) -> search.Plan:
    request = search.PlanRequest(
        model=None,
        budget=budget,
        global_batch=kw.pop("global_batch", 64),
        seq_len=128,
        precisions=("fp32", "bf16"),
        **kw,
    )
    return search.make_plan(request, speed=SPEED, facts=facts)


def fastest_fitting(plan: search.Plan) -> search.Candidate:
    return max(
        (c for c in plan.candidates if c.memory.peak <= plan.request.budget), key=lambda c: c.relative_throughput
    )


def test_candidates_keep_the_global_batch(facts):
    plan = plan_for(facts, 2**40, global_batch=48, num_processes=2)
    assert {c.micro_batch * c.grad_accum for c in plan.candidates} == {24}
    assert len(plan.candidates) == 2 * 2 * 3 * 8  # precisions x checkpointing x optimizers x divisors of 24
    baseline = next(c for c in plan.candidates if c.name == "fp32/no-ckpt/adamw 24x1")
    assert baseline.relative_throughput == pytest.approx(1.0)


def planted_budgets(facts) -> dict[str, int]:
    """Five budgets, each ruling a different set of candidates out."""
    plan = plan_for(facts, 2**40)
    by_name = {c.name: c for c in plan.candidates}
    lowest = min(c.memory.peak for c in plan.candidates)
    return {
        "everything fits": 2**40,
        "rules out the baseline": by_name["fp32/no-ckpt/adamw 64x1"].memory.peak - 1,
        "rules out the fastest": plan.recommended.memory.peak - 1,
        "rules out full micro-batches": min(c.memory.peak for c in plan.candidates if c.grad_accum == 1) - 1,
        # the smallest need: only the candidates that need the least fit (the micro-batches whose peak is the
        # optimizer step's, which does not depend on the micro-batch, tie)
        "only the smallest": lowest,
    }


def test_planted_cases_recommend_the_fastest_that_fits(facts):
    budgets = planted_budgets(facts)
    for case, budget in budgets.items():
        plan = plan_for(facts, budget)
        assert plan.recommended is not None, case
        assert plan.recommended is fastest_fitting(plan), case
        assert plan.recommended.memory.peak <= budget, case
        for c in plan.candidates:  # every other candidate says why it lost
            assert (c is plan.recommended) == (c.why_not == ""), (case, c.name)
            if not c.fits:
                assert c.why_not.startswith("does not fit"), c.why_not
    assert plan_for(facts, budgets["rules out the baseline"]).recommended.name != "fp32/no-ckpt/adamw 64x1"
    smallest = plan_for(facts, budgets["only the smallest"])
    assert {c.memory.peak for c in smallest.candidates if c.fits} == {budgets["only the smallest"]}
    assert plan_for(facts, budgets["rules out full micro-batches"]).recommended.grad_accum > 1


def test_nothing_fits_names_the_smallest_need(facts):
    plan = plan_for(facts, 2**20)
    assert plan.recommended is None
    smallest = min(c.memory.peak for c in plan.candidates)
    message = plan.no_fit_message()
    assert message.startswith("nothing fits in 1 MiB")
    assert f"--memory {-(-smallest // 2**20)}MiB" in message
    assert plan.smallest.memory.peak == smallest and plan.smallest.name in message
    assert "nothing fits" in plan.render()


def test_render_and_write(facts, tmp_path):
    plan = plan_for(facts, planted_budgets(facts)["rules out the baseline"])
    text = plan.render()
    assert "=>" in text and "recommended:" in text and "slower:" in text
    assert "does not fit" in plan.render(all_rows=True)
    for col in ("weights", "grads", "optim", "activ", "work", "peak", "speed"):
        assert col in text
    paths = plan.write(tmp_path)
    data = json.loads(paths["json"].read_text())
    assert data["recommended"]["name"] == plan.recommended.name
    assert len(data["candidates"]) == len(plan.candidates)
    assert "fp32/no-ckpt/adamw 64x1" in paths["md"].read_text()


def test_probe_measurements_beat_predictions(facts, monkeypatch, tmp_path):
    """Fake probes: the predicted favourite measures slow, another measures over budget; the third wins."""
    from leantrain.commands import bench, probe

    plan = plan_for(facts, 2**40)
    picked = probe.pick(plan, probe.ProbeConfig(top=3))
    assert len(picked) == 3 and len({c.techniques for c in picked}) == 3
    first, second, third = picked
    fake = {
        first.name: {"steady_samples_per_second": 10.0, "peak_memory_over_baseline_bytes": 1000},
        second.name: {"steady_samples_per_second": 50.0, "peak_memory_over_baseline_bytes": 2**41},
        third.name: {"steady_samples_per_second": 20.0, "peak_memory_over_baseline_bytes": 1000},
    }
    calls = []

    def run_job(name, over, base, steps, out_dir, say, timeout, env=None):
        calls.append((name, over, base, env))
        return bench.BenchRow(name, over, {**fake[name], "weights_bytes": 10, "optimizer_steps": steps})

    monkeypatch.setattr(bench, "run_job", run_job)
    probe.probe(plan, {"model": "m", "auto": True, "memory": "1GiB"}, tmp_path, probe.ProbeConfig(top=3, steps=2))
    assert plan.probed and plan.recommended is third
    assert not second.fits and "measured" in second.why_not
    assert first.why_not.startswith("slower: 0.50x") and "measured" in first.why_not
    _, over, base, env = calls[0]
    assert over == first.overrides() and base["pad_to_max_length"] and "auto" not in base and "memory" not in base
    assert env == {"MALLOC_MMAP_THRESHOLD_": "262144"}
    assert "measured" in plan.render()
    # training is measured, not the closing evaluation: a token held-out share; the default job gets the rows its
    # steps need rather than timing this machine first
    assert base["eval_fraction"] == probe.EVAL_FRACTION < 0.1 and base["limit"] == 2 * plan.request.global_batch
    calls.clear()
    own = {"model": "m", "data": "d.csv", "eval_data": "e.csv", "limit": None}
    probe.probe(plan_for(facts, 2**40), own, tmp_path, probe.ProbeConfig(top=1, steps=2, repeats=1))
    base = calls[0][2]
    assert "eval_fraction" not in base and base["limit"] is None  # an evaluation file and the user's rows as given


def test_after_probes_probed_and_unprobed_candidates_compare_on_one_scale(facts, monkeypatch, tmp_path):
    """Measured speeds are relative to the fastest probe, predictions to fp32/AdamW: compared raw, an unprobed
    candidate read "slower: 1.21x the recommendation". The probes scale the predictions: a candidate called slower
    is below 1x, and one predicted faster than the measured recommendation says it was not probed."""
    from leantrain.commands import bench, probe

    plan = plan_for(facts, 2**40)
    first, second = probe.pick(plan, probe.ProbeConfig(top=2))
    sps = {first.name: 5.0, second.name: 20.0}  # the predicted favourite measures slow

    def run_job(name, over, base, steps, out_dir, say, timeout, env=None):
        metrics = {"steady_samples_per_second": sps[name], "peak_memory_over_baseline_bytes": 1000}
        return bench.BenchRow(name, over, {**metrics, "weights_bytes": 10, "optimizer_steps": steps})

    monkeypatch.setattr(bench, "run_job", run_job)
    probe.probe(plan, {"model": "m"}, tmp_path, probe.ProbeConfig(top=2, steps=2, repeats=1))
    assert plan.recommended is second
    verdicts = [c.why_not for c in plan.candidates if c.fits and c is not second]
    slower = [float(v.split()[1].rstrip("x")) for v in verdicts if v.startswith("slower:")]
    assert slower and max(slower) < 1.0, verdicts
    # only the second-fastest prediction probed: the favourite, never measured, is predicted faster than it
    plan = plan_for(facts, 2**40)
    favourite, probed = probe.pick(plan, probe.ProbeConfig(top=2))
    probed.measured = {"samples_per_second": 20.0, "relative_throughput": 1.0, "peak_bytes": 1000}
    search.choose(plan)
    assert plan.recommended is probed
    assert favourite.why_not.startswith("not probed: predicted 1.") and "--probe-top" in favourite.why_not


@pytest.mark.slow  # launches 2 `leantrain train` processes: 30-81 s (load average 4-9, 2 cores)
def test_a_real_probe_measures_the_top_candidates_and_recommends_the_fastest_measured(
    facts, tiny_model_dir, sentiment_csv, tmp_path
):
    """No fake measurements: two real 2-step runs of the tiny BERT; their peaks agree with the memory model and
    the recommendation is the candidate that measured fastest among those that fit."""
    from leantrain.commands import probe

    # fp32 only: on a CPU without fast bf16 (this one emulates it at 0.3 GFLOP/s) a bf16 probe takes minutes
    # batch 128 x 128 tokens: activations dominate the peak, so a probe of an easier job (unpadded short
    # texts) could not pass for the planned one
    request = search.PlanRequest(model=None, budget=2**40, global_batch=128, seq_len=128, precisions=("fp32",))
    plan = search.make_plan(request, speed=SPEED, facts=facts)
    job = {"model": str(tiny_model_dir), "data": str(sentiment_csv), "cache_dir": str(tmp_path / "cache")}
    probe.probe(plan, job, tmp_path / "probes", probe.ProbeConfig(top=2, steps=2, repeats=1), say=lambda *a: None)
    probed = [c for c in plan.candidates if c.measured]
    assert len(probed) == 2 and plan.probed
    for c in probed:
        assert c.measured["runs"] == 1 and c.measured["samples_per_second"] > 0, c.measured
        # the memory model against a real run (benchmarks/results/planner_accuracy.md: within 7% there)
        assert c.measured["peak_bytes"] == pytest.approx(c.memory.peak, rel=0.2), c.name
    fastest = max(probed, key=lambda c: c.measured["samples_per_second"])
    assert plan.recommended is fastest
    assert "measured" in plan.render()


def test_a_failed_probe_does_not_win(facts, monkeypatch, tmp_path):
    from leantrain.commands import bench, probe

    plan = plan_for(facts, 2**40)
    first = probe.pick(plan, probe.ProbeConfig(top=2))[0]

    def run_job(name, over, base, steps, out_dir, say, timeout, env=None):
        if name == first.name:
            return bench.BenchRow(name, over, None, "killed")
        return bench.BenchRow(
            name, over, {"steady_samples_per_second": 1.0, "peak_memory_over_baseline_bytes": 1, "weights_bytes": 1}
        )

    monkeypatch.setattr(bench, "run_job", run_job)
    probe.probe(plan, {}, tmp_path, probe.ProbeConfig(top=2))
    assert plan.recommended is not first and first.why_not == "probe failed: killed"


def test_request_from_config(tmp_path):
    from leantrain import TrainConfig
    from leantrain.planner.auto import request_for

    cfg = TrainConfig(batch_size=8, grad_accum=4, memory="3GiB", max_length=96)
    request, source = request_for(cfg, "cpu", 2)
    assert (request.global_batch, request.budget, request.seq_len, request.precisions) == (64, 3 * 2**30, 96, None)
    assert source == "--memory 3GiB"
    sgd = request_for(dataclasses.replace(cfg, optimizer="sgd", precision="fp32"), "cpu", 1)[0]
    assert sgd.optimizers == ("sgd",) and sgd.precisions == ("fp32",)


def test_the_request_freezes_what_the_run_freezes():
    from leantrain import TrainConfig
    from leantrain.planner.auto import request_for

    assert request_for(TrainConfig(), "cpu", 1)[0].freeze == "embeddings"  # the default job's
    assert request_for(TrainConfig(data="x.csv"), "cpu", 1)[0].freeze == "none"
    assert request_for(TrainConfig(data="x.csv", freeze="bert.pooler.*"), "cpu", 1)[0].freeze == "bert.pooler.*"


def test_the_plan_counts_the_dropout_the_run_trains_with(facts, dropout_model_dir, without_lora_notes):
    """--dropout 0 on a model that ships dropout plans its activations as the same model shipped without (no masks
    kept for the backward); the default job's request asks for it."""
    from leantrain import TrainConfig
    from leantrain.planner.auto import request_for

    def activations(plan):
        return [(c.precision, c.micro_batch, c.memory.activations) for c in plan.candidates]

    shipped = model_facts(str(dropout_model_dir))
    with_masks, without = activations(plan_for(shipped, 2**34)), activations(plan_for(shipped, 2**34, dropout=0.0))
    assert without == activations(plan_for(facts, 2**34))  # tiny_model_dir: the same model, its dropout 0
    assert all(a[2] < b[2] for a, b in zip(without, with_masks, strict=True))
    assert request_for(TrainConfig(), "cpu", 1)[0].dropout == 0.0  # the default job's
    assert request_for(TrainConfig(data="x.csv"), "cpu", 1)[0].dropout is None
    for task in ("dpo", "kto", "reward-model"):  # their models train with dropout off, as TRL's
        assert request_for(TrainConfig(data="x.jsonl", task=task), "cpu", 1)[0].dropout == 0.0
        assert request_for(TrainConfig(data="x.jsonl", task=task, dropout=0.1), "cpu", 1)[0].dropout == 0.1


@pytest.mark.parametrize("freeze", ["embeddings", "bert.encoder.layer.0.*,bert.embeddings.*"])
def test_frozen_parameters_plan_no_gradient_or_optimizer_state(facts, tiny_model_dir, freeze):
    from leantrain.model import freezing, loading
    from leantrain.parallel.precision import frozen_dtype

    model = loading.load_for_classification(str(tiny_model_dir), ["a", "b"])
    freezing.apply(model, freeze)
    trained = sum(p.numel() for p in model.parameters() if p.requires_grad)
    total = sum(p.numel() for p in model.parameters())
    assert trained < total
    adamw = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad])
    for p in model.parameters():
        p.grad = torch.zeros_like(p) if p.requires_grad else None
    adamw.step()  # the state it really keeps
    state = sum(t.numel() * t.element_size() for s in adamw.state.values() for t in s.values())
    whole, frozen = (
        {(c.precision, c.activation_checkpointing, c.micro_batch, c.optimizer): c.memory for c in plan.candidates}
        for plan in (plan_for(facts, 2**34, freeze=f) for f in ("none", freeze))
    )
    # frozen weights are still held: a bf16 run's frozen Linear weights in bf16 (freezing.store_frozen)
    low = 2 * sum(p.numel() for p in freezing.stored_low(model, tables=False))  # (fp32 values: tables stay)
    for key, memory in frozen.items():
        assert memory.weights == whole[key].weights - (low if frozen_dtype(key[0], "cpu") else 0)
        assert memory.gradients == 4 * trained and whole[key].gradients == 4 * total
        if key[3] == "adamw":
            assert memory.optimizer_state == state
        assert memory.peak < whole[key].peak


def test_the_optimizer_step_is_charged_for_what_trains(facts, tiny_model_dir):
    """An optimizer steps only what trains: with the embeddings frozen each candidate's step is the speed model's
    for the trained parameters' count (and the FLOPs the run does), not for every parameter's."""
    from leantrain.model import freezing, loading
    from leantrain.planner.speed import optimizer_step_seconds, step_seconds

    model = loading.load_for_classification(str(tiny_model_dir), ["a", "b"])
    total = sum(p.numel() for p in model.parameters())
    freezing.apply(model, "embeddings")
    trained = sum(p.numel() for p in model.parameters() if p.requires_grad)
    plan = plan_for(facts, 2**34, freeze="embeddings", optimizers=("adamw", "adamw8bit", "adafactor"))
    flops = plan.facts["flops_per_sequence"]
    for c in plan.candidates:
        job = (c.micro_batch, c.grad_accum, 128, c.precision, c.activation_checkpointing, c.optimizer)
        assert c.step_seconds == pytest.approx(step_seconds(SPEED, flops, facts.layers, facts.hidden, trained, *job))
        saved = optimizer_step_seconds(SPEED, c.optimizer, total) - optimizer_step_seconds(SPEED, c.optimizer, trained)
        assert saved > 0


def test_the_plan_counts_the_flops_a_lora_or_frozen_run_does(facts, tiny_model_dir):
    """Frozen weights get no weight gradient: the plan's FLOPs per sequence under --lora and --freeze are what the
    run's own telemetry counts on the model it trains, not full fine-tuning's."""
    from types import SimpleNamespace

    from leantrain.model import freezing, loading, lora
    from leantrain.planner.memory import LoraSpec
    from leantrain.telemetry.flops import flop_model

    def planned(**kw) -> float:
        return plan_for(facts, 2**34, **kw).facts["flops_per_sequence"]

    def run(change) -> float:
        model = loading.load_for_classification(str(tiny_model_dir), ["a", "b"])
        return flop_model(change(model) or model).batch_flops(1, 128)

    settings = SimpleNamespace(lora_r=8, lora_alpha=16.0, lora_dropout=0.0, lora_targets="auto", quantize=None)
    adapted = run(lambda m: lora.apply(m, settings, None, afresh=[]))
    assert planned(lora=LoraSpec()) == pytest.approx(adapted, rel=1e-9) and adapted < 0.9 * planned()
    frozen = run(lambda m: freezing.apply(m, "embeddings,*.layer.0.*") and None)
    assert planned(freeze="embeddings,*.layer.0.*") == pytest.approx(frozen, rel=1e-9) and frozen < planned()


#: Throughput of each technique relative to fp32/AdamW (micro-batch, accumulation, precision, checkpointing,
#: optimizer), measured with `leantrain bench` on MiniLM (batch 64, length 128, padded) on a quiet 2-core AMX
#: CPU: benchmarks/results/bench_minilm_sst2.md, 2026-11-29.
MEASURED_MINILM = {
    (64, 1, "bf16", False, "adamw"): 1.51,
    (64, 1, "fp32", True, "adamw"): 0.62,
    (64, 1, "fp32", False, "adafactor"): 0.96,
    (64, 1, "fp32", False, "adamw8bit"): 0.86,
}


def test_speed_model_predicts_the_measured_ratios(monkeypatch, minilm_dir):
    """The planner's own CPU speed model (device_speed: its constants, not restated here), on MiniLM's FLOP
    count, predicts each technique's measured throughput ratio within 15%. The device is the one measured on:
    an AMX CPU (fast bf16) of about 250 GFLOP/s in fp32 GEMMs."""
    from transformers import AutoConfig

    from leantrain import parallel
    from leantrain.planner.speed import device_speed, step_seconds
    from leantrain.telemetry.flops import encoder_flop_model

    amx = {
        "bf16": parallel.PrecisionSupport(True, True, "AMX-BF16 (the measured machine)"),
        "fp16": parallel.PrecisionSupport(True, False, "no AMX-FP16 (the measured machine)"),
    }
    monkeypatch.setattr(parallel, "precision_support", lambda device_type: amx)
    cpu = device_speed("cpu", peak_fp32=2.5e11)
    config = AutoConfig.from_pretrained(minilm_dir)
    per_seq = encoder_flop_model(config, 2).batch_flops(1, 128)

    def secs(micro, accum, precision, ckpt, opt, hidden=config.hidden_size, params=22_700_000):
        return step_seconds(cpu, per_seq, 6, hidden, params, micro, accum, 128, precision, ckpt, opt)

    baseline = secs(64, 1, "fp32", False, "adamw")
    for case, measured in MEASURED_MINILM.items():
        assert baseline / secs(*case) == pytest.approx(measured, rel=0.15), case
    # a 64-wide BERT spends little of its step in matmuls: bf16 measured no faster (0.49x, noisy:
    # benchmarks/results/planner_accuracy.md); and smaller micro-batches cost time
    assert secs(64, 1, "fp32", False, "adamw", hidden=64) / secs(64, 1, "bf16", False, "adamw", hidden=64) < 1.05
    assert secs(16, 4, "fp32", False, "adamw") > baseline


@pytest.mark.parametrize("shape", [(64, 64), (48, 160), (160, 48)])
def test_muons_step_flops_are_torchs_newton_schulz(shape):
    """The registry's count of Muon's orthogonalisation is the FLOPs torch's own Newton-Schulz performs (torch's
    FLOP counter on the function its Muon calls), for square, wide and tall matrices."""
    import torch
    from torch.optim._muon import DEFAULT_NS_STEPS, _zeropower_via_newtonschulz
    from torch.utils.flop_counter import FlopCounterMode

    from leantrain.model.optimizers import OPTIMIZERS

    muon = OPTIMIZERS["muon"]
    assert muon.hidden_flops is not None
    with FlopCounterMode(display=False) as counter:
        _zeropower_via_newtonschulz(torch.randn(shape), (3.4445, -4.7750, 2.0315), DEFAULT_NS_STEPS, 1e-7)
    assert muon.hidden_flops(shape) == counter.get_total_flops()


def test_muons_predicted_step_grows_with_the_width_not_the_size():
    """Two models of the same parameter count: one 1024-wide hidden matrix costs Muon twice four 512-wide ones
    (its orthogonalisation grows with width x size); AdamW's step is the same for both."""
    from leantrain.planner.memory import ParamInventory
    from leantrain.planner.speed import optimizer_step_seconds

    narrow = ParamInventory(shapes=((512, 512),) * 4, linear_shapes=(), hidden=(True,) * 4)
    wide = ParamInventory(shapes=((1024, 1024),), linear_shapes=(), hidden=(True,))
    assert narrow.numel == wide.numel

    def step(inv, name):
        return optimizer_step_seconds(SPEED, name, inv.numel, inv.step_flops(name))

    assert step(wide, "adamw") == step(narrow, "adamw")
    assert step(wide, "muon") / step(narrow, "muon") == pytest.approx(2.0, rel=0.05)


def test_the_lora_note_counts_what_a_lora_run_trains():
    """The plan's LoRA note (a run without --lora) sizes LoRA as `--lora` plans it: on the embedded MiniLM its pooler,
    started as the identity, trains whole with the head (it was counted as adapted: 1.1 MiB of state short)."""
    from leantrain.config import TrainConfig
    from leantrain.config.units import format_bytes
    from leantrain.planner.auto import request_for
    from leantrain.planner.memory import LoraSpec, estimate

    cfg = TrainConfig(data="x.csv", memory="8GiB")
    request = request_for(cfg, "cpu", 1)[0]
    facts = model_facts(None)
    lora = estimate(
        facts,
        request.per_process_batch,
        request.seq_len,
        "fp32",
        False,
        "adamw",
        lora=LoraSpec.of(cfg.replace(lora=True)),
    )
    note = next(n for n in search.lora_notes(request, facts))
    assert f"lora r=8: peak {format_bytes(lora.peak)}" in note
    assert f"optimizer state {format_bytes(lora.optimizer_state)}" in note


def test_the_optimizer_note_marks_what_lora_refuses(facts):
    """With --lora the note prices only the optimizers a LoRA run accepts: the others are named as refused, as
    `leantrain train --lora --optimizer galore-adamw` refuses them, not priced as if they would run."""
    from leantrain.model.optimizers import OPTIMIZERS
    from leantrain.planner.memory import LoraSpec

    refused = [name for name, entry in OPTIMIZERS.items() if entry.no_lora]
    assert refused
    request = search.PlanRequest(model=None, budget=2**34, global_batch=8, seq_len=32, lora=LoraSpec())
    note = search.optimizer_note(request, facts, SPEED)
    for name in refused:
        assert f"{name} refused with --lora" in note
    assert "): adamw " in note and "; adafactor " in note  # the others are still priced
    whole = search.optimizer_note(dataclasses.replace(request, lora=None), facts, SPEED)
    assert "refused" not in whole


def test_the_table_keeps_its_columns_with_loras_longer_names(facts):
    """A LoRA candidate's name ("bf16/no-ckpt/adafactor/lora-r=8 32x1") is longer than the configuration column
    was: every row's figures still end where the header's columns do."""
    import re

    from leantrain.planner.memory import LoraSpec

    table = search.render(plan_for(facts, 2**34, lora=LoraSpec(), optimizers=("adamw", "adafactor")))
    lines = table.splitlines()
    head = next(line for line in lines if "configuration" in line)
    rows = [line for line in lines if line[:2] in ("=>", "ok", "--")]
    assert any(len(" ".join(line.split()[1:3])) > 33 for line in rows)
    for row in rows:
        speed = re.search(r"\d+\.\d\dx", row)
        assert speed is not None and speed.end() == head.index("speed") + len("speed"), (head, row)
