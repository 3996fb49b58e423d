"""Techniques change cost, not the result: exact equivalences on a tiny dropout-free BERT in fp32.

Every exact comparison is per tensor, relative to how far that tensor moved (`assert_trained_alike`), and
checks that the weights moved at all; the technique tests check that the technique really ran.
"""

import json

import pytest
import torch
from safetensors.torch import load_file

from leantrain import TrainConfig, train
from tests.conftest import EXACT_JOB, assert_trained_alike, make_sentiment_rows, write_csv

TOL = 1e-5


@pytest.fixture()
def run(tiny_model_dir, sentiment_csv, cache_dir, tmp_path):
    count = iter(range(100))

    def go(**changes):
        base = dict(
            model=str(tiny_model_dir),
            data=str(sentiment_csv),
            cache_dir=str(cache_dir),
            output_dir=str(tmp_path / f"run{next(count)}"),
            report=False,
            **EXACT_JOB,
        )
        result = train(TrainConfig(**{**base, **changes}))
        return result, load_file(result.model_dir / "model.safetensors")

    return go


@pytest.fixture()
def start(run):
    """The weights a run starts from (the seeded head included): the same run with a learning rate so small
    that no float32 weight can move."""

    def go(**changes):
        return run(**{**changes, "lr": 1e-30})[1]

    return go


def log_rows(result) -> list[dict]:
    return [json.loads(x) for x in (result.output_dir / "metrics.jsonl").read_text().splitlines()]


def loss_log(result) -> list[float]:
    return [r["loss"] for r in log_rows(result) if "loss" in r]


def grad_norms(result) -> list[float]:
    return [r["grad_norm"] for r in log_rows(result) if "grad_norm" in r]


#: static shapes (on with --compile): lengths padded to buckets, short micro-batches filled with masked rows
STATIC = pytest.mark.parametrize("static_shapes", ["off", "on"])


@STATIC
def test_gradient_accumulation_equals_the_big_batch(run, start, static_shapes):
    big, w_big = run(batch_size=24, grad_accum=1, max_steps=6, static_shapes=static_shapes)
    small, w_small = run(batch_size=6, grad_accum=4, max_steps=6, static_shapes=static_shapes)
    assert small.metrics["micro_steps"] == 4 * big.metrics["micro_steps"]
    assert_trained_alike(w_big, w_small, start(batch_size=24, max_steps=6))
    assert loss_log(small) == pytest.approx(loss_log(big), abs=TOL)
    assert grad_norms(small) == pytest.approx(grad_norms(big), rel=1e-4)


@STATIC
def test_uneven_micro_batches_and_the_short_last_step_are_exact(run, start, static_shapes):
    # 216 training rows, global batch 28: seven full steps, then a step of 20 examples that the split
    # run takes as three micro-batches of 7, 7 and 6 (not four); with static shapes the 20 and the 6 are filled
    # with masked rows to 28 and 7, which must change nothing
    big, w_big = run(batch_size=28, grad_accum=1, epochs=1, static_shapes=static_shapes)
    small, w_small = run(batch_size=7, grad_accum=4, epochs=1, static_shapes=static_shapes)
    assert big.metrics["optimizer_steps"] == small.metrics["optimizer_steps"] == 8
    assert small.metrics["micro_steps"] == 7 * 4 + 3
    assert big.metrics["train_examples"] == small.metrics["train_examples"] == 216  # no example counted twice
    assert_trained_alike(w_big, w_small, start(batch_size=28, epochs=1))


def test_gradient_accumulation_with_clipping_is_exact_under_sgd(run, start):
    # The big batch's pre-clip norms here run 0.04-0.96: a limit of 0.3 clips some steps and not others,
    # so a gradient-scale error in the split run shows in the unclipped steps (clipping alone hides scale).
    job = dict(max_steps=6, max_grad_norm=0.3)
    big, w_big = run(batch_size=24, grad_accum=1, **job)
    small, w_small = run(batch_size=6, grad_accum=4, **job)
    norms = grad_norms(big)
    assert min(norms) < 0.3 < max(norms)  # clipping really triggers, and not on every step
    assert grad_norms(small) == pytest.approx(norms, rel=1e-4)
    assert_trained_alike(w_big, w_small, start(batch_size=24, **job))


def test_gradient_accumulation_with_clipping_and_adamw_stays_close(run):
    job = dict(max_steps=4, optimizer="adamw", lr=1e-3, max_grad_norm=1.0)
    big, w_big = run(batch_size=16, grad_accum=1, **job)
    small, w_small = run(batch_size=4, grad_accum=4, **job)
    # Adam and clipping both hide a gradient's scale; the logged pre-clip norm does not
    assert grad_norms(small) == pytest.approx(grad_norms(big), rel=1e-4)
    # Adam divides by sqrt(v): rounding differences near zero gradients are magnified, so not 1e-5
    assert max((w_big[k] - w_small[k]).abs().max().item() for k in w_big) <= 1e-3


@pytest.fixture(scope="module")
def mixture(tmp_path_factory) -> list[str]:
    """Two sources at 0.7/0.3: 180 and 36 training rows, so that the small one is used up and restarts within the
    first few steps."""
    root = tmp_path_factory.mktemp("mixture")
    big = write_csv(root / "big.csv", make_sentiment_rows(200, seed=21))
    small = write_csv(root / "small.csv", make_sentiment_rows(40, seed=22))
    return [f"{big}@0.7", f"{small}@0.3"]


def source_log(result) -> list[dict]:
    return [row["sources"] for row in log_rows(result) if "loss" in row]


def test_a_mixture_accumulated_equals_its_big_batch(run, start, mixture):
    # one epoch: 216 examples (the rows of both), 65 of them from the 36 rows of the small source
    big, w_big = run(data=mixture, batch_size=24, epochs=1)
    small, w_small = run(data=mixture, batch_size=6, grad_accum=4, epochs=1)
    assert big.metrics["optimizer_steps"] == 9 and small.metrics["micro_steps"] == 4 * big.metrics["micro_steps"]
    assert_trained_alike(w_big, w_small, start(data=mixture, batch_size=24, epochs=1))
    assert loss_log(small) == pytest.approx(loss_log(big), abs=TOL)
    # each source's rows, loss and realised shares, step by step, are the big batch's
    for a, b in zip(source_log(small), source_log(big)):
        assert a.keys() == b.keys() == {"big", "small"}
        for name in a:
            assert a[name].pop("loss") == pytest.approx(b[name].pop("loss"), abs=TOL)
        assert a == b
    drawn = big.metrics["sources"]["small"]
    assert drawn["examples"] == drawn["epoch_examples"] == 65 and drawn["train_rows"] == 36
    assert drawn["epochs"] == pytest.approx(65 / 36)  # the small source restarted inside the epoch
    assert drawn["share_examples"] == 65 / 216 and drawn["weight"] == 0.3


def test_activation_checkpointing_trains_identically(run, start):
    plain, w_plain = run(batch_size=16, max_steps=5)
    ckpt, w_ckpt = run(batch_size=16, max_steps=5, activation_checkpointing=True)
    assert loss_log(ckpt) == pytest.approx(loss_log(plain), abs=TOL)
    assert_trained_alike(w_plain, w_ckpt, start(batch_size=16, max_steps=5))


def test_local_sgd_with_one_process_is_a_no_op_that_says_so(run, capsys):
    _plain, w_plain = run(batch_size=16, max_steps=4)
    _local, w_local = run(batch_size=16, max_steps=4, local_sgd_steps=2)
    assert "local SGD off" in capsys.readouterr().err
    assert all(torch.equal(w_plain[k], w_local[k]) for k in w_plain)


class Observed:
    """What the model really ran, seen through a global forward hook in training mode: the dtypes of the linear
    layers' outputs, and how many times each encoder layer's feed-forward block ran (twice per training
    micro-batch when activations are recomputed in backward; transformers recomputes a layer's inside, so the
    layer's own call is counted once either way)."""

    def __init__(self):
        self.train_dtypes: set[torch.dtype] = set()
        self.layer_calls = 0

    def __call__(self, module, inputs, output):
        if not module.training:
            return
        if isinstance(module, torch.nn.Linear):
            self.train_dtypes.add(output.dtype)
        if type(module).__name__ == "BertIntermediate":
            self.layer_calls += 1


def observed(go, **changes):
    seen = Observed()
    handle = torch.nn.modules.module.register_module_forward_hook(seen)
    try:
        result, _ = go(**changes)
    finally:
        handle.remove()
    return result, seen


# (technique, how far its dev loss may drift from fp32/AdamW's): bf16 and fp16 round every matmul, the
# 8-bit and factored optimizers change the update; accumulation and checkpointing only reorder sums
TECHNIQUES = [
    (dict(precision="bf16"), 0.05),
    (dict(precision="fp16"), 0.02),
    (dict(grad_accum=2, batch_size=8), 1e-3),
    (dict(activation_checkpointing=True), 1e-4),
    (dict(optimizer="adafactor"), 0.1),
    (dict(optimizer="adamw8bit"), 0.02),
    (dict(precision="bf16", grad_accum=2, batch_size=8, activation_checkpointing=True, optimizer="adafactor"), 0.1),
]
COMMON = dict(optimizer="adamw", lr=3e-3, epochs=4, batch_size=16, max_grad_norm=1.0)


@pytest.fixture(scope="module")
def baseline(tiny_model_dir, sentiment_csv, tmp_path_factory):
    """fp32 AdamW, run once for every technique below."""
    root = tmp_path_factory.mktemp("technique-baseline")

    def go(**changes):
        cfg = dict(model=str(tiny_model_dir), data=str(sentiment_csv), cache_dir=str(root / "cache"), report=False)
        result = train(TrainConfig(**{**cfg, **EXACT_JOB, "output_dir": str(root / "run"), **changes}))
        return result, None

    return observed(go, **COMMON)


@pytest.mark.parametrize(
    "changes, drift", TECHNIQUES, ids=["bf16", "fp16", "accum", "ckpt", "adafactor", "8bit", "all"]
)
def test_every_technique_runs_and_trains_close_to_the_baseline(run, baseline, changes, drift):
    if changes.get("optimizer") == "adamw8bit":
        pytest.importorskip("bitsandbytes")
    base, seen_base = baseline
    other, seen = observed(run, **{**COMMON, **changes})
    assert seen_base.train_dtypes == {torch.float32}
    # the technique really ran
    want_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(changes.get("precision", "fp32"), torch.float32)
    assert seen.train_dtypes == {want_dtype}
    assert other.metrics["precision"] == changes.get("precision", "fp32")
    layers = 2  # the tiny BERT's encoder layers: each runs once per training forward, again when recomputed
    assert seen_base.layer_calls == layers * base.metrics["micro_steps"]
    runs = 2 if changes.get("activation_checkpointing") else 1
    assert seen.layer_calls == layers * other.metrics["micro_steps"] * runs
    state, base_state = other.metrics["optimizer_state_bytes"], base.metrics["optimizer_state_bytes"]
    if changes.get("optimizer") == "adafactor":
        assert state < base_state / 20  # factored second moments, no first moment
    elif changes.get("optimizer") == "adamw8bit":
        assert state < base_state / 3  # 8-bit moments (small tensors stay fp32)
    else:
        assert state == base_state
    # and the result stays close
    assert other.metrics["eval_loss"] == pytest.approx(base.metrics["eval_loss"], abs=drift)
    assert other.metrics["eval_accuracy"] >= base.metrics["eval_accuracy"] - 0.05
