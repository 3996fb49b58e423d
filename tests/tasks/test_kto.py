"""`--task kto` on a tiny Llama in fp32: its loss is the KTO formula, its KL baseline is the whole step's (so
accumulation is exact), and a label that is not boolean is refused in one line."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from leantrain import TrainConfig, train
from leantrain.tasks.kto import kto_losses, mismatched
from tests.conftest import EXACT_JOB, assert_trained_alike
from tests.tasks.test_dpo import _cli, _one_line, llama_dir, pair_rows, write_jsonl  # noqa: F401 (a fixture)


def judgement_rows(n: int, seed: int = 0) -> list[dict]:
    """Each pair's prompt with its chosen completion (desirable) or its rejected one (undesirable), at random."""
    rng = random.Random(seed)
    out = []
    for row in pair_rows(n, seed):
        good = rng.random() < 0.6
        out.append({"prompt": row["prompt"], "completion": row["chosen" if good else "rejected"], "label": good})
    return out


@pytest.fixture(scope="module")
def judgements(tmp_path_factory) -> Path:
    return write_jsonl(tmp_path_factory.mktemp("kto") / "kto.jsonl", judgement_rows(96))


@pytest.fixture()
def run(llama_dir, judgements, tmp_path):  # noqa: F811
    count = iter(range(100))

    def go(**changes):
        base = dict(
            task="kto",
            model=str(llama_dir),
            data=str(judgements),
            cache_dir=str(tmp_path / "cache"),
            output_dir=str(tmp_path / f"run{next(count)}"),
            max_length=32,
            report=False,
            **EXACT_JOB,
        )
        result = train(TrainConfig(**{**base, **changes}))
        return result, load_file(result.model_dir / "model.safetensors")

    return go


def train_rows(result) -> list[dict]:
    rows = [json.loads(x) for x in (result.output_dir / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if "loss" in r]


def test_the_loss_is_ktos_formula():
    ratios = torch.tensor([0.5, -1.0, 2.0, 0.0], dtype=torch.float64)
    desirable = torch.tensor([True, True, False, False])
    beta, kl, weights = 0.3, 0.25, (1.5, 0.7)
    sig = lambda x: 1 / (1 + math.exp(-x))  # noqa: E731
    expected = [
        weights[0] * (1 - sig(beta * (r - kl))) if d else weights[1] * (1 - sig(beta * (kl - r)))
        for r, d in zip(ratios.tolist(), desirable.tolist())
    ]
    assert kto_losses(ratios, desirable, kl, beta, weights).tolist() == pytest.approx(expected, rel=1e-9)


def test_only_desirable_rows_are_warned_and_the_undesirables_means_are_undefined(run, tmp_path, capfd):
    """A mean over no rows is NaN, not 0 (a margin equal to the chosen rewards would be invented)."""
    rows = [dict(r, label=True) for r in judgement_rows(24)]
    result, _ = run(data=str(write_jsonl(tmp_path / "good.jsonl", rows)), max_steps=1)
    assert "warning: every training row is desirable (label true)" in capfd.readouterr().err
    m = result.metrics
    assert math.isfinite(m["eval_rewards/chosen"]) and math.isfinite(m["eval_logps/chosen"])
    assert all(math.isnan(m[f"eval_{k}"]) for k in ("rewards/rejected", "logps/rejected", "rewards/margins"))
    # metrics.json is strict JSON (an undefined mean as "nan", as metrics.jsonl writes it), read back as NaN
    from leantrain.run.report import load_run

    text = (result.output_dir / "metrics.json").read_text()
    assert (
        json.loads(text, parse_constant=lambda name: pytest.fail(f"{name} in metrics.json"))["eval_rewards/margins"]
        == "nan"
    )
    assert math.isnan(load_run(result.output_dir).metrics["eval_rewards/margins"])


def test_each_row_is_paired_with_another_rows_completion():
    partner = mismatched(11, seed=3)
    assert sorted(partner.tolist()) == list(range(11)) and (partner != np.arange(11)).all()


def test_accumulation_equals_one_big_batch_with_the_steps_kl_baseline(run):
    """z0 is the whole step's: four micro-batches of 4 give the weights of one of 16 (a per-micro-batch baseline,
    as TRL takes it, would not)."""
    big, w_big = run(batch_size=16, grad_accum=1, max_steps=3, beta=1.0)
    small, w_small = run(batch_size=4, grad_accum=4, max_steps=3, beta=1.0)
    _, start = run(batch_size=16, max_steps=3, lr=1e-30)
    assert_trained_alike(w_big, w_small, start, rel=1e-5)
    for key in ("loss", "kl", "rewards/chosen", "rewards/rejected", "logps/chosen"):
        assert [r[key] for r in train_rows(small)] == pytest.approx(
            [r[key] for r in train_rows(big)], rel=1e-6, abs=1e-6
        )
    assert train_rows(big)[-1]["kl"] > 0  # the baseline is there to be wrong


def test_a_precomputed_reference_trains_alike(run):
    live, w_live = run(batch_size=16, max_steps=3, beta=1.0)
    pre, w_pre = run(batch_size=16, max_steps=3, beta=1.0, precompute_reference=True)
    _, start = run(batch_size=16, max_steps=3, lr=1e-30)
    assert_trained_alike(w_live, w_pre, start, rel=1e-5)
    assert [r["kl"] for r in train_rows(pre)] == pytest.approx([r["kl"] for r in train_rows(live)], abs=1e-6)


@pytest.mark.parametrize(
    ("label", "said"),
    [("maybe", "has label 'maybe'"), (2, "has label 2"), (None, "has no label"), ("", "has no label")],
)
def test_a_label_that_is_not_boolean_is_refused_in_one_line(capsys, llama_dir, tmp_path, label, said):  # noqa: F811
    rows = judgement_rows(8)
    rows[5]["label"] = label
    code, err = _cli(capsys, llama_dir, write_jsonl(tmp_path / "k.jsonl", rows), tmp_path, "--task", "kto")
    _one_line(code, err, "k.jsonl", f"row 6 {said}", "true or false")


def test_a_row_without_a_label_is_said_to_have_none(capsys, llama_dir, tmp_path):  # noqa: F811
    """A row that lacks the key is read as NaN: said as no label, not as a label 'nan'."""
    rows = judgement_rows(8)
    del rows[3]["label"]
    code, err = _cli(capsys, llama_dir, write_jsonl(tmp_path / "k.jsonl", rows), tmp_path, "--task", "kto")
    _one_line(code, err, "k.jsonl", "row 4 has no label")


def test_string_and_integer_booleans_are_read(llama_dir, tmp_path):  # noqa: F811
    from leantrain.tasks.kto import KTO

    rows = judgement_rows(10)
    for i, r in enumerate(rows):
        r["label"] = ["true", "False", 1, 0, True][i % 5]
    cfg = TrainConfig(task="kto", model=str(llama_dir), data=str(write_jsonl(tmp_path / "b.jsonl", rows)),
                      cache_dir=str(tmp_path / "cache"), eval_fraction=0.2, seed=0)  # fmt: skip
    data = KTO(cfg).prepare_data(str(llama_dir), None)
    assert int(data.train.labels.sum()) + int(data.eval.labels.sum()) == 6


def test_static_shapes_pad_judgements_and_their_mismatched_completions_and_change_nothing(run):
    off, w_off = run(batch_size=8, max_steps=3, beta=1.0, static_shapes="off")
    on, w_on = run(batch_size=8, max_steps=3, beta=1.0, static_shapes="on")
    assert on.metrics["padding_fraction"] > off.metrics["padding_fraction"]
    for key in ("loss", "kl", "rewards/chosen"):
        assert [r[key] for r in train_rows(on)] == pytest.approx([r[key] for r in train_rows(off)], abs=1e-6)
    for name, value in w_off.items():
        assert torch.allclose(w_on[name], value, atol=1e-6), name


def test_predict_completes_the_prompts_of_a_file_of_prompts_alone(run, tmp_path, capsys):
    """A file to predict on needs prompts, not judgements: a 'prompt' column alone (here beside an answer) serves,
    and a file without one is refused in one line."""
    from leantrain.commands.cli import main
    from leantrain.inference.api import predict

    result, _ = run(max_steps=1)
    rows = [{"prompt": r["prompt"], "answer": "x"} for r in judgement_rows(5, seed=3)]
    done = predict(str(result.output_dir), data=str(write_jsonl(tmp_path / "p.jsonl", rows)), max_new_tokens=2)
    assert [d["prompt"] for d in done] == [r["prompt"] for r in rows]
    bad = write_jsonl(tmp_path / "q.jsonl", [{"question": r["prompt"]} for r in rows])
    capsys.readouterr()
    assert main(["predict", str(result.output_dir), "--data", str(bad)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "no 'prompt' column" in err and "'question'" in err, err
    assert "chosen" not in err, err  # a KTO run's data holds no pairs: the hint is about prompts alone
