"""The planner counts a preference task's reference: a frozen copy's weights in each candidate's precision, a live
reference's forward passes in the step's time, nothing for a precomputed one (`Task.planned_reference`)."""

from __future__ import annotations

import pytest

from leantrain import TrainConfig
from leantrain.planner.auto import reference_of
from leantrain.planner.memory import model_facts
from leantrain.planner.search import PlanRequest, make_plan
from tests.tasks.test_causal_lm import write_tiny_llama


@pytest.fixture(scope="module")
def facts(tmp_path_factory):
    return model_facts(str(write_tiny_llama(tmp_path_factory.mktemp("llama"))), task="dpo")


def _plan(facts, **reference):
    request = PlanRequest(model=None, budget=2**34, global_batch=8, seq_len=64, optimizers=("adamw",), **reference)
    return {c.name: c for c in make_plan(request, facts=facts).candidates}


def test_a_frozen_copy_is_counted_in_each_candidates_precision_and_a_live_reference_in_its_time(facts):
    plain = _plan(facts)
    copied = _plan(facts, reference_forward=1.0, reference_copy=True)
    for name, c in copied.items():
        width = 4 if name.startswith("fp32") else 2
        assert c.memory.weights - plain[name].memory.weights == facts.params * width
        assert c.memory.peak - plain[name].memory.peak == facts.params * width
    name = "fp32/no-ckpt/adamw 8x1"
    assert copied[name].step_seconds > plain[name].step_seconds  # the reference's forward: a third more FLOPs


@pytest.mark.parametrize(
    "changes,expected",
    [
        ({}, (1.0, True)),
        ({"lora": True}, (1.0, False)),
        ({"precompute_reference": True}, (0.0, False)),
        ({"preference_loss": "simpo"}, (0.0, False)),
        ({"task": "kto"}, (3.0, True)),
        ({"task": "kto", "precompute_reference": True}, (1.0, False)),
        ({"task": "reward-model"}, (0.0, False)),
        ({"task": "causal-lm"}, (0.0, False)),
    ],
)
def test_each_form_of_the_reference_is_planned_as_it_runs(changes, expected):
    cfg = TrainConfig(**{"task": "dpo", **changes})
    got = reference_of(cfg)
    assert (got.get("reference_forward", 0.0), got.get("reference_copy", False)) == expected
