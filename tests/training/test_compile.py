"""--compile: the model is really compiled, trains as the eager one does, and compiling is timed apart."""

import json

import pytest
import torch

from leantrain import TrainConfig, train
from tests.conftest import EXACT_JOB, max_diff


@pytest.fixture()
def run(dropout_model_dir, sentiment_csv, cache_dir, tmp_path):
    """Runs on the tiny BERT with dropout on: the warm-up step that compiles must draw nothing from the run's
    RNG, or every later dropout mask shifts."""
    from safetensors.torch import load_file

    def go(name, **changes):
        cfg = dict(model=str(dropout_model_dir), data=str(sentiment_csv), cache_dir=str(cache_dir), report=False)
        result = train(TrainConfig(**{**cfg, **EXACT_JOB, "output_dir": str(tmp_path / name), **changes}))
        return result, load_file(result.model_dir / "model.safetensors")

    return go


@pytest.mark.slow  # inductor compiles C++: 13.6-14.9 s alone, 108 s in the CI dry run of a0b384c (coverage, 2 workers)
@pytest.mark.no_cover  # coverage's tracer slows dynamo's own Python ~1.6x (79 s against 48 alone, cold caches)
def test_a_compiled_model_trains_like_the_eager_one(run, monkeypatch):
    # Inductor draws dropout masks from its own generator unless told to use eager's: only then can a compiled
    # run with dropout match an eager one, and only if the warm-up left the RNG where it found it.
    # (config.patch, not monkeypatch: monkeypatch's undo deletes the option, which breaks every later compile)
    # A compiled classifier runs its last layer at every position; so must the eager one here, or it would draw
    # fewer dropout numbers (tasks/classification.py) and the two runs would differ by the sample, not the compiler.
    monkeypatch.setattr("leantrain.tasks.classification.first_token_tail", lambda model: None)
    with torch._inductor.config.patch(fallback_random=True):
        _trains_like_the_eager_one(run)


def _trains_like_the_eager_one(run):
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    # static shapes are on with --compile: the eager run pads alike, or dropout would draw over other shapes; and
    # torch's dropout, which a compiled graph keeps (leantrain's own CPU draws are eager-only: model/dropout.py)
    eager, w_eager = run("eager", batch_size=16, max_steps=3, static_shapes="on", fast_dropout=False)
    assert not counters["stats"]["unique_graphs"]  # nothing compiled in an eager run
    compiled, w_compiled = run("compiled", batch_size=16, max_steps=3, compile=True)
    assert counters["stats"]["unique_graphs"] >= 1  # dynamo really captured and compiled the model
    # inductor fuses and reorders float arithmetic: close, not bitwise
    losses = [compiled.metrics["train_loss"], eager.metrics["train_loss"]]
    assert losses[0] == pytest.approx(losses[1], abs=1e-4)
    assert max_diff(w_eager, w_compiled) <= 1e-4
    assert eager.metrics["compile_seconds"] is None
    assert compiled.metrics["compile_seconds"] > 0  # the warm-up's cost is reported apart from train_seconds


@pytest.mark.slow  # compiles the tiny model two or more times: about 100 s here
@pytest.mark.no_cover
def test_a_step_that_recompiles_is_compile_time_not_training_time(run):
    """A new batch shape after the warm-up (dynamic padding gives every batch its own length) makes dynamo compile
    again inside the run: that step's time goes to compile_seconds and its work out of the throughput, so the
    throughput is the compiled model's (the GPU check's bf16+compile at micro-batch 256 read 233 samples/s against
    3,188 without compile when a recompile fell inside its window)."""
    torch._dynamo.reset()
    # without static shapes (on with --compile), each new length recompiles
    result, _ = run("recompiled", batch_size=16, max_steps=6, compile=True, log_every=1, static_shapes="off")
    m = result.metrics
    assert m["recompiles"] >= 1
    # a recompile takes seconds; six steps of the tiny model take a fraction of one: had the recompiling steps
    # stayed in the training time, it would hold at least one recompile's worth
    assert m["train_seconds"] < m["compile_seconds"] / (m["recompiles"] + 1)
    assert m["train_samples_per_second"] > 0


@pytest.mark.slow  # compiles the tiny model's graphs once or twice: about 60 s here
@pytest.mark.no_cover
def test_a_compiled_run_with_dynamic_lengths_compiles_a_few_graphs_and_none_after_the_first_steps(run):
    """Lengths vary from batch to batch and the epoch's last micro-batch is short (216 training rows, batch 40: five
    full steps and one of 16): static shapes (on with --compile) pad lengths up to buckets and fill the short batch
    with masked rows, and the length is compiled dynamic at once, so the run meets one training graph, compiled in
    the warm-up. Without them, new lengths and the short batch recompile mid-run."""
    torch._dynamo.reset()
    result, _ = run("buckets", batch_size=40, max_steps=9, compile=True, log_every=1)
    rows = [json.loads(x) for x in (result.output_dir / "metrics.jsonl").read_text().splitlines()]
    graphs = [r["compiled_graphs"] for r in rows if "compiled_graphs" in r]
    assert len(graphs) == 9 and graphs[-1] <= 4 and result.metrics["compiled_graphs"] <= 4  # (+ evaluation's)
    assert graphs[2:] == [graphs[-1]] * 7, graphs  # none after the first two steps (step 6 is the short one)
    assert result.metrics["recompiles"] == 0
    assert result.metrics["train_examples"] == 216 + 3 * 40  # the masked rows are no examples


@pytest.mark.slow  # three compiled runs (the later two on a warm cache): 71 s alone on an AVX2 EPYC
@pytest.mark.no_cover
def test_compiled_runs_and_a_compiled_resumption_give_the_same_bits(run):
    """The same seed and settings give the same bits under --compile too, and a resumed compiled run ends where
    the uninterrupted one does (docs/performance.md). Inductor's C++ code summed the embeddings' gradient rows
    with atomic adds from every thread, in the threads' order: two runs differed in the last bits."""
    # fp32: the race is in the sums, whatever the precision (fails in fp32 with the fix taken out), and bf16 is
    # emulated on CPUs with AVX2 alone (107 s against 71 there)
    job = dict(batch_size=16, max_steps=6, save_every=2, compile=True, precision="fp32", optimizer="adamw")
    threads = torch.get_num_threads()
    torch.set_num_threads(2)  # atomics race only between threads: a one-thread test worker would not see them
    try:
        runs = []
        for name, resume in (("first", None), ("second", None), ("resumed", "first")):
            torch._dynamo.reset()  # each run compiles its own graphs, as a fresh process does
            checkpoint = resume and str(runs[0][0].output_dir / "checkpoints" / "step-000004")
            runs.append(run(name, **job, **({"resume": checkpoint} if checkpoint else {})))
    finally:
        torch.set_num_threads(threads)
    assert not torch.are_deterministic_algorithms_enabled()  # the run put torch's setting back
    assert runs[2][0].metrics["train_examples"] == 2 * 16  # really resumed at step 4
    first = runs[0][1]
    for _, other in runs[1:]:
        assert first.keys() == other.keys()
        assert [k for k in first if not torch.equal(first[k], other[k])] == []


def test_torch_deterministic_setting_holds_for_the_run_only():
    """A compiled CPU run turns torch's deterministic algorithms on for itself and puts the setting back; a user's
    own (strict) setting stands."""
    from leantrain.training.determinism import deterministic_compiled_kernels

    with deterministic_compiled_kernels(True):
        assert torch.are_deterministic_algorithms_enabled()
        assert torch.is_deterministic_algorithms_warn_only_enabled()
    assert not torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        with deterministic_compiled_kernels(True):
            assert not torch.is_deterministic_algorithms_warn_only_enabled()
        assert torch.are_deterministic_algorithms_enabled()
    finally:
        torch.use_deterministic_algorithms(False)
