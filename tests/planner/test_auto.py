"""`leantrain plan` and `train --auto`: the table, the plan in the run directory, and the out-of-memory fallback.

The fallback tests: a run that runs out of memory at step k halves its micro-batch, doubles accumulation,
redoes step k and ends with the same weights as a run that used the halved micro-batch from the start (fp32,
dropout off, SGD). Out of memory comes for real (`memory_spike`: the process's resident memory goes over the
--memory budget, which the guard measures) or simulated (tests/hooks.py OutOfMemoryAt, for a chosen rank of several).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json

import numpy as np
import pytest
import yaml
from safetensors.torch import load_file

from leantrain import TrainConfig, train
from leantrain.commands.cli import main
from tests.conftest import EXACT_JOB, max_diff
from tests.hooks import OutOfMemoryAt, site_env

EXACT = {**EXACT_JOB, "report": False}


def weights(run_dir):
    return load_file(run_dir / "model" / "model.safetensors")


def test_plan_command_prints_the_table_and_writes_the_plan(tiny_model_dir, tmp_path, capsys):
    code = main(
        [
            "plan",
            "--model",
            str(tiny_model_dir),
            "--memory",
            "150MiB",
            "--global-batch",
            "64",
            "--max-length",
            "128",
            "--device",
            "cpu",
            "--plan-dir",
            str(tmp_path / "p"),
        ]
    )
    out = capsys.readouterr().out
    assert code == 0, out
    assert "recommended:" in out and "budget 150 MiB" in out and "=>" in out
    data = json.loads((tmp_path / "p" / "plan.json").read_text())
    rec = data["recommended"]
    assert rec["micro_batch"] * rec["grad_accum"] == 64 and rec["memory"]["peak"] <= 150 * 2**20
    assert (tmp_path / "p" / "plan.md").is_file()


def test_plan_says_what_max_time_buys_at_the_measured_speed(
    tiny_model_dir, sentiment_csv, tmp_path, capsys, monkeypatch
):
    """--max-time turns the recommended candidate's measured samples/s into steps and examples; unprobed, the plan's
    speeds are relative and it says how to measure them."""
    from leantrain.commands import bench

    def run_job(name, over, base, steps, out_dir, say, timeout, env=None):  # a probe that measured 10 samples/s
        metrics = {"steady_samples_per_second": 10.0, "peak_memory_over_baseline_bytes": 1000, "weights_bytes": 10}
        return bench.BenchRow(name, over, metrics)

    monkeypatch.setattr(bench, "run_job", run_job)
    common = ["plan", "--model", str(tiny_model_dir), "--data", str(sentiment_csv), "--memory", "1GiB"]
    common += ["--global-batch", "8", "--max-length", "32", "--cache-dir", str(tmp_path / "cache"), "--max-time", "1m"]
    assert main([*common, "--probe", "--probe-top", "1"]) == 0
    out = capsys.readouterr().out
    rows = int(out.split(" epochs of the ")[1].split(" training rows")[0].replace(",", ""))
    assert (
        "--max-time 1m: at the recommended candidate's measured 10.0 samples/s, about 75 optimizer steps of 8 " in out
    )
    assert f"(600 examples, {600 / rows:.2g} epochs of the {rows:,} training rows)" in out
    assert main(common) == 0
    assert "--max-time 1m: the speeds above are relative; --probe measures the candidates" in capsys.readouterr().out


def test_plan_command_says_when_nothing_fits(tiny_model_dir, capsys):
    code = main(["plan", "--model", str(tiny_model_dir), "--memory", "8MiB", "--max-length", "64"])
    out = capsys.readouterr().out
    assert code == 1
    assert "nothing fits in 8 MiB" in out and "needs" in out


def test_plan_command_refuses_a_bad_budget(tiny_model_dir, capsys):
    code = main(["plan", "--model", str(tiny_model_dir), "--memory", "lots"])
    err = capsys.readouterr().err
    assert code == 2 and "--memory" in err and len(err.strip().splitlines()) == 1


def test_train_auto_uses_and_records_the_plan(tiny_model_dir, sentiment_csv, cache_dir, tmp_path, capsys):
    out = tmp_path / "auto"
    result = train(
        TrainConfig(
            model=str(tiny_model_dir),
            data=str(sentiment_csv),
            cache_dir=str(cache_dir),
            output_dir=str(out),
            batch_size=16,
            grad_accum=1,
            max_length=64,
            max_steps=3,
            auto=True,
            memory="120MiB",
            progress=False,
            report=False,
        )
    )
    plan = json.loads((out / "plan.json").read_text())
    rec = plan["recommended"]
    assert "recommended:" in (out / "plan.md").read_text()
    config = yaml.safe_load((out / "config.yaml").read_text())
    for key in ("precision", "optimizer", "activation_checkpointing"):
        assert config[key] == rec[key]
    assert (config["batch_size"], config["grad_accum"]) == (rec["micro_batch"], rec["grad_accum"])
    assert result.metrics["global_batch"] == 16 and result.metrics["oom_recuts"] == []
    assert result.metrics["precision"] == rec["precision"]
    assert (
        f"precision {rec['precision']} (chosen by --auto's plan)" in capsys.readouterr().err
    )  # not "set by --precision"
    # techniques change cost, not results: the user's optimizer stays, and the plan keeps a 10% margin
    assert config["optimizer"] == "adamw"
    assert {c["optimizer"] for c in plan["candidates"]} == {"adamw"}
    assert plan["request"]["budget"] == int(0.9 * 120 * 2**20) and rec["memory"]["peak"] <= 0.9 * 120 * 2**20


def test_train_auto_refuses_a_finished_output_dir_before_preparing_the_data(lm_corpus, tmp_path, monkeypatch):
    """--auto prepares the data to plan on it; a finished run in --output-dir is refused before that work."""
    from leantrain.errors import ConfigError
    from leantrain.run.directory import FINISHED_MARKER
    from leantrain.tasks.causal_lm import CausalLM

    done = tmp_path / "done"
    done.mkdir()
    (done / FINISHED_MARKER).write_text("")
    monkeypatch.setattr(CausalLM, "prepare_data", lambda *a, **k: pytest.fail("the data was prepared"))
    job = TrainConfig(model="preset:tiny-llama", data=str(lm_corpus), output_dir=str(done), auto=True, memory="1GiB")
    with pytest.raises(ConfigError, match="holds a finished run; pass --overwrite"):
        train(job)


def test_auto_replaces_the_optimizer_only_when_allowed(monkeypatch):
    import leantrain.planner.auto as auto

    def auto_request(cfg):
        """The request --auto hands the planner (captured; the plan itself is not needed here)."""
        seen = []
        monkeypatch.setattr(auto, "make_plan", lambda request, facts=None: seen.append(request) or 1 / 0)
        with pytest.raises(ZeroDivisionError):
            auto.plan_run(cfg)
        return seen[0]

    cfg = TrainConfig(memory="1GiB", auto=True)
    kept = auto_request(cfg)
    assert kept.optimizers == ("adamw",) and kept.budget == int(0.9 * 2**30)
    assert set(auto_request(cfg.replace(auto_optimizer=True)).optimizers) >= {"adamw", "adafactor"}
    assert auto.request_for(cfg, "cpu", 1)[0].budget == 2**30  # `leantrain plan` shows the whole budget


def test_train_auto_refuses_when_nothing_fits(tiny_model_dir, sentiment_csv, cache_dir, tmp_path):
    from leantrain.errors import LeantrainError

    with pytest.raises(LeantrainError, match="nothing fits in 4 MiB"):
        train(
            TrainConfig(
                model=str(tiny_model_dir),
                data=str(sentiment_csv),
                cache_dir=str(cache_dir),
                output_dir=str(tmp_path / "x"),
                auto=True,
                memory="4MiB",
                progress=False,
            )
        )


def test_out_of_memory_halves_the_micro_batch_and_ends_where_the_halved_run_ends(
    tiny_model_dir, sentiment_csv, cache_dir, tmp_path, monkeypatch
):
    base = dict(model=str(tiny_model_dir), data=str(sentiment_csv), cache_dir=str(cache_dir), max_steps=5, **EXACT)
    halved = train(TrainConfig(**base, batch_size=4, grad_accum=2, output_dir=str(tmp_path / "halved")))
    auto = train(
        TrainConfig(**base, batch_size=8, grad_accum=1, auto=True, memory="64GiB", output_dir=str(tmp_path / "auto")),
        hooks=OutOfMemoryAt(2),  # at the last micro-step of the third optimizer step
    )
    m = auto.metrics
    assert json.loads((tmp_path / "auto" / "plan.json").read_text())["recommended"]["micro_batch"] == 8
    assert m["oom_recuts"] == [
        {"step": 2, "from": {"batch_size": 8, "grad_accum": 1}, "to": {"batch_size": 4, "grad_accum": 2}}
    ]
    assert (m["final_batch_size"], m["final_grad_accum"], m["global_batch"]) == (4, 2, 8)
    assert m["optimizer_steps"] == halved.metrics["optimizer_steps"] == 5
    assert m["micro_steps"] == 2 + 3 * 2  # two steps of one micro-batch, then three of two
    assert max_diff(weights(auto.output_dir), weights(halved.output_dir)) <= 1e-5
    assert m["train_loss"] == pytest.approx(halved.metrics["train_loss"], abs=1e-5)


@pytest.mark.slow  # launches 2 processes (torchrun)
def test_two_processes_agree_on_the_recut_and_end_where_one_process_ends(
    tiny_model_dir, sentiment_csv, cache_dir, tmp_path
):
    """Only rank 1 runs out of memory (at step 2); both halve, and the run equals one process of batch 16."""
    from tests.parallel.test_data_parallel import flags, run_job

    base = dict(model=str(tiny_model_dir), data=str(sentiment_csv), cache_dir=str(cache_dir), max_steps=4, **EXACT)
    one = train(TrainConfig(**base, batch_size=16, output_dir=str(tmp_path / "one")))
    out = tmp_path / "two"
    rc, _, err = run_job(
        [
            "-m",
            "leantrain",
            "train",
            *flags(**base, batch_size=8, num_processes=2, auto=True, memory="64GiB", output_dir=out),
        ],
        **site_env(LT_TEST_OOM="2:1"),
    )
    assert rc == 0, err[-3000:]
    assert err.count("out of memory; micro-batch 8 x 1 accumulation -> 4 x 2") == 1  # said once, by rank 0
    m = json.loads((out / "metrics.json").read_text())
    assert m["oom_recuts"][0]["step"] == 2 and (m["final_batch_size"], m["final_grad_accum"]) == (4, 2)
    assert m["num_processes"] == 2 and m["global_batch"] == 16 and m["optimizer_steps"] == 4
    assert max_diff(weights(out), weights(one.output_dir)) <= 1e-5


@contextlib.contextmanager
def memory_spike(after_step: int, nbytes: int, hold: bool):
    """After optimizer step `after_step` (counting from 1) of any optimizer in this process, fill `nbytes` of
    fresh memory: the resident size really grows, as when something else in the process allocates. hold=False
    frees it at once (a spike the high-water mark remembers); hold=True keeps it until the block ends.
    Uses torch's global optimizer hook, nothing of leantrain's."""
    from torch.optim.optimizer import register_optimizer_step_post_hook

    steps, held = [0], []

    def hook(optimizer, args, kwargs):
        steps[0] += 1
        if steps[0] == after_step:
            ballast = np.ones(nbytes, dtype=np.uint8)  # ones, not empty: every page is touched, hence resident
            if hold:
                held.append(ballast)
            del ballast

    handle = register_optimizer_step_post_hook(hook)
    try:
        yield
    finally:
        handle.remove()
        held.clear()


def test_real_memory_over_the_budget_halves_the_micro_batch_and_ends_where_the_halved_run_ends(
    tiny_model_dir, sentiment_csv, cache_dir, tmp_path
):
    """No test hook in leantrain: the guard reads the real resident high-water mark, finds it over --memory
    after a 300 MiB spike, re-cuts once (the spike is gone when it measures again) and the run goes on."""
    base = dict(model=str(tiny_model_dir), data=str(sentiment_csv), cache_dir=str(cache_dir), max_steps=5, **EXACT)
    halved = train(TrainConfig(**base, batch_size=4, grad_accum=2, output_dir=str(tmp_path / "halved")))
    with memory_spike(after_step=2, nbytes=300 * 2**20, hold=False):
        auto = train(
            TrainConfig(
                **base, batch_size=8, grad_accum=1, auto=True, memory="200MiB", output_dir=str(tmp_path / "auto")
            )
        )
    m = auto.metrics
    assert json.loads((tmp_path / "auto" / "plan.json").read_text())["recommended"]["micro_batch"] == 8
    assert m["oom_recuts"] == [
        {"step": 2, "from": {"batch_size": 8, "grad_accum": 1}, "to": {"batch_size": 4, "grad_accum": 2}}
    ]
    assert m["optimizer_steps"] == 5 and m["micro_steps"] == 2 + 3 * 2
    assert max_diff(weights(auto.output_dir), weights(halved.output_dir)) <= 1e-5


def test_real_memory_that_stays_over_the_budget_ends_at_a_micro_batch_of_1_with_one_line(
    tiny_model_dir, sentiment_csv, cache_dir, tmp_path, capsys
):
    """Memory taken for good: 8 -> 4 -> 2 -> 1, then the error that nothing is left to halve (exit 2, no traceback)."""
    argv = ["train", "--model", str(tiny_model_dir), "--data", str(sentiment_csv), "--cache-dir", str(cache_dir),
            "--output-dir", str(tmp_path / "run"), "--batch-size", "8", "--max-steps", "6", "--optimizer", "sgd",
            "--precision", "fp32", "--auto", "--memory", "200MiB", "--no-progress", "--no-report"]  # fmt: skip
    with memory_spike(after_step=2, nbytes=300 * 2**20, hold=True):
        code = main(argv)
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err
    for halving in ("8 x 1 accumulation -> 4 x 2", "4 x 2 accumulation -> 2 x 4", "2 x 4 accumulation -> 1 x 8"):
        assert f"step 3: out of memory; micro-batch {halving}" in err
    last = err.strip().splitlines()[-1]
    assert "step 3: out of memory (--memory 200 MiB) with a micro-batch of 1; nothing is left to halve" in last
    assert not (tmp_path / "run" / "metrics.json").exists()


# -- causal language models (issue #14) ----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def lm_corpus(tmp_path_factory):
    from tests.tasks.test_causal_lm import documents

    path = tmp_path_factory.mktemp("lm-plan") / "corpus.txt"
    path.write_text("\n\n".join(documents(200, seed=3)) + "\n")
    return path


def test_plan_command_plans_a_causal_lm_on_its_text(lm_corpus, cache_dir, capsys, without_lora_notes):
    """`plan --model preset:tiny-llama --data corpus.txt` (refused before: "text encoders only", then the preset name
    and the .txt file): planned with the vocabulary of the tokenizer the run trains on that text, not the preset's
    8,192, so the logits and the peak are the run's own."""
    common = ["plan", "--model", "preset:tiny-llama", "--memory", "1GiB", "--max-length", "64", "--batch-size", "16"]
    assert main([*common, "--data", str(lm_corpus), "--cache-dir", str(cache_dir)]) == 0
    out = capsys.readouterr().out
    vocab = int(out.split("note: vocabulary ")[1].split(":")[0].replace(",", ""))
    assert 100 < vocab < 8192 and f"logits over a vocabulary of {vocab:,}" in out
    sized_peak = float(out.split("recommended: ")[1].split("predicted peak ")[1].split(" MiB")[0])
    assert main(common) == 0  # without --data: the preset's largest vocabulary, and a note that says so
    out = capsys.readouterr().out
    assert "logits over a vocabulary of 8,192" in out and "planned at its largest" in out
    assert float(out.split("recommended: ")[1].split("predicted peak ")[1].split(" MiB")[0]) > sized_peak


@pytest.mark.slow  # a run and a second plan: 80 s
def test_train_auto_plans_a_causal_lm_with_the_vocabulary_it_trains(lm_corpus, cache_dir, tmp_path):
    """--auto on a preset causal LM plans with the vocabulary of the tokenizer the run trains on its text, not the
    preset's 8,192: at 330 MiB the whole batch of 16 x 128 tokens fits, where planned at 8,192 (the logits alone 64
    MiB a copy) it would be split in two; and the run keeps within the budget."""
    from transformers import AutoTokenizer

    from leantrain.planner.auto import plan_run

    cfg = TrainConfig(
        model="preset:tiny-llama",
        data=str(lm_corpus),
        cache_dir=str(cache_dir),
        output_dir=str(tmp_path / "auto-lm"),
        batch_size=16,
        max_length=128,
        max_steps=2,
        precision="fp32",  # the split below is fp32's: where bf16 runs natively the planner would choose it
        auto=True,
        memory="330MiB",
        progress=False,
        report=False,
    )
    result = train(cfg)
    plan = json.loads((result.output_dir / "plan.json").read_text())
    vocab = len(AutoTokenizer.from_pretrained(result.model_dir))
    assert vocab < 8192 and f"vocabulary {vocab:,}: the tokenizer this run trains on --data" in plan["notes"]
    assert (plan["recommended"]["micro_batch"], plan["recommended"]["grad_accum"]) == (16, 1)
    config = yaml.safe_load((result.output_dir / "config.yaml").read_text())
    assert (config["batch_size"], config["grad_accum"]) == (16, 1) and result.metrics["global_batch"] == 16
    assert result.metrics["peak_memory_over_baseline_bytes"] <= 330 * 2**20
    at_largest = plan_run(cfg.resolved())[1].recommended  # without the data: the preset's 8,192 entries
    assert at_largest is not None and (at_largest.micro_batch, at_largest.grad_accum) == (8, 2)


def test_instruction_data_plans_the_logits_where_a_token_counts(tmp_path, cache_dir, capsys, without_lora_notes):
    """Instruction tuning counts completions only, and the run computes logits there only: `plan` on prompt /
    completion rows plans the logits at the share of positions the most-counting row has (here a few completions
    packed in a row of 64), not at every position, and predicts a lower peak than the same request counted
    everywhere."""
    import random

    from leantrain.model import loading
    from leantrain.planner.auto import fitted_to_data
    from leantrain.planner.memory import model_facts
    from leantrain.planner.search import PlanRequest, make_plan
    from leantrain.tasks import resolve
    from tests.tasks.test_causal_lm import write_tiny_llama

    rng = random.Random(5)
    rows = []
    for _ in range(120):
        good = rng.random() < 0.5
        words = rng.choices(["great", "lovely", "film", "plot"] if good else ["bad", "dull", "film", "plot"], k=5)
        completion = " positive" if good else " negative"
        rows.append(json.dumps({"prompt": f"Review: {' '.join(words)}\nSentiment:", "completion": completion}))
    data = tmp_path / "sft.jsonl"
    data.write_text("\n".join(rows) + "\n")
    model = str(write_tiny_llama(tmp_path / "llama"))
    common = ["plan", "--model", model, "--memory", "1GiB", "--max-length", "64", "--batch-size", "16"]
    assert main([*common, "--data", str(data), "--cache-dir", str(cache_dir)]) == 0
    out = capsys.readouterr().out
    share = int(out.split("note: logits at ")[1].split("%")[0])
    assert 3 <= share <= 40 and "those whose next token counts" in out
    assert out.count(f"logits at {share}% of a row's positions") == 1, out  # said once
    peak = float(out.split("recommended: ")[1].split("predicted peak ")[1].split(" MiB")[0])

    # the same request and model, every position counted: the logits at every position
    cfg = TrainConfig(model=model, data=str(data), cache_dir=str(cache_dir), max_length=64, batch_size=16).resolved()
    path = loading.resolve_model(cfg.model)
    prepared = resolve(cfg, loading.load_config(path)).prepare_data(path, loading.load_config(path))
    request = PlanRequest(model=cfg.model, budget=2**30, global_batch=16, seq_len=64)
    fitted, facts, _ = fitted_to_data(cfg, request, prepared)
    assert fitted.counted == pytest.approx(share / 100, abs=0.005)  # what `plan` printed, in percent
    assert fitted_to_data(cfg.replace(compile=True), request, prepared)[0].counted == 1.0  # one graph: every logit
    counts = prepared.train.features.counted
    assert fitted.counted >= counts.max() / (fitted.seq_len - 1) > fitted.counted - 1 / 64
    facts = facts or model_facts(cfg.model)
    planned = make_plan(fitted, facts=facts).recommended
    everywhere = make_plan(dataclasses.replace(fitted, counted=1.0), facts=facts).recommended
    assert planned is not None and everywhere is not None
    assert planned.memory.peak / 2**20 == pytest.approx(peak, abs=0.5)  # what `plan` printed, rounded

    def logits_and_activations(m) -> int:
        return m.activations + m.backward_workspace

    # fused with the loss, the head's logits are a chunk at most and what it keeps is the hidden states' gradient:
    # counting fewer positions saves less than with whole logits (1.2x here, not 1.3x), but still saves
    assert logits_and_activations(everywhere.memory) > 1.1 * logits_and_activations(planned.memory)
