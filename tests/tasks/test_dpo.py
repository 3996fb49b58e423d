"""`--task dpo` on a tiny Llama in fp32 without dropout: each loss is its formula, the first step is TRL's DPOTrainer's
(loss and gradients), the reference's three forms train alike, accumulation, two processes and resume are exact,
and bad pairs are refused or skipped in one line."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file

from leantrain import TrainConfig, train
from leantrain.commands.cli import main
from leantrain.errors import DataError
from leantrain.tasks.preference import pair_losses
from tests.conftest import EXACT_JOB, assert_trained_alike
from tests.tasks.test_causal_lm import WORDS, write_tiny_llama

POSITIVE, NEGATIVE = ["great", "fine", "lovely", "good"], ["awful", "bad", "dull", "poor"]


def pair_rows(n: int, seed: int = 0) -> list[dict]:
    """Review prompts of different lengths; the chosen completion names the review's sentiment, the rejected the
    other one, or a longer wrong answer (so completions differ in length too)."""
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        good = i % 2 == 0
        words = [*rng.choices(WORDS, k=rng.randint(1, 12)), rng.choice(POSITIVE if good else NEGATIVE)]
        right, wrong = (" sun", " moon") if good else (" moon", " sun")
        if i % 3 == 0:
            wrong += " and the ball"
        rows.append({"prompt": "the " + " ".join(words) + " is", "chosen": right, "rejected": wrong})
    return rows


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory) -> Path:
    """The tiny Llama with weights (seeded), so that leantrain and TRL start from the very same model."""
    from transformers import AutoConfig, AutoModelForCausalLM

    folder = write_tiny_llama(tmp_path_factory.mktemp("tiny-llama-dpo"))
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(folder)).save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def pairs(tmp_path_factory) -> Path:
    return write_jsonl(tmp_path_factory.mktemp("pairs") / "pairs.jsonl", pair_rows(96))


@pytest.fixture()
def run(llama_dir, pairs, tmp_path):
    count = iter(range(100))

    def go(**changes):
        base = dict(
            task="dpo",
            model=str(llama_dir),
            data=str(pairs),
            cache_dir=str(tmp_path / "cache"),
            output_dir=str(tmp_path / f"run{next(count)}"),
            max_length=32,
            report=False,
            **EXACT_JOB,
        )
        result = train(TrainConfig(**{**base, **changes}))
        return result, load_file(result.model_dir / "model.safetensors")

    return go


def log_rows(result) -> list[dict]:
    """The training rows of metrics.jsonl (not the evaluations')."""
    rows = [json.loads(x) for x in (result.output_dir / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if "loss" in r]


def losses_of(result) -> list[float]:
    return [r["loss"] for r in log_rows(result) if "loss" in r]


# -- the losses are their formulas -------------------------------------------------------------------------------
LOGPS = torch.tensor([[-3.0, -5.5], [-8.0, -2.0], [-1.25, -1.5]], dtype=torch.float64)
REFERENCE = torch.tensor([[-4.0, -4.5], [-6.0, -3.0], [-1.0, -2.5]], dtype=torch.float64)
TOKENS = torch.tensor([[2, 5], [4, 1], [1, 3]])


def by_formula(kind: str, beta: float, eps: float, gamma: float) -> list[float]:
    """Each loss written out from its paper for every pair, in plain Python."""
    out = []
    sig = lambda x: 1 / (1 + math.exp(-x))  # noqa: E731
    for (pc, pr), (rc, rr), (nc, nr) in zip(LOGPS.tolist(), REFERENCE.tolist(), TOKENS.tolist()):
        delta = (pc - rc) - (pr - rr)
        if kind == "sigmoid":
            out.append(-math.log(sig(beta * delta)))
        elif kind == "hinge":
            out.append(max(0.0, 1 - beta * delta))
        elif kind == "ipo":
            out.append(((pc - rc) / nc - (pr - rr) / nr - 1 / (2 * beta)) ** 2)
        elif kind == "robust":
            out.append((-(1 - eps) * math.log(sig(beta * delta)) + eps * math.log(sig(-beta * delta))) / (1 - 2 * eps))
        elif kind == "simpo":
            out.append(-math.log(sig(beta * (pc / nc - pr / nr) - gamma)))
        else:  # orpo: the chosen's mean NLL, and the log odds ratio of the mean per-token probabilities
            odds = lambda lp: math.exp(lp) / (1 - math.exp(lp))  # noqa: E731
            out.append(-pc / nc - beta * math.log(sig(math.log(odds(pc / nc) / odds(pr / nr)))))
    return out


@pytest.mark.parametrize("kind", ["sigmoid", "hinge", "ipo", "robust", "simpo", "orpo"])
def test_each_loss_is_its_formula(kind):
    beta, eps, gamma = 0.7, 0.2, 0.3
    reference = None if kind in ("simpo", "orpo") else REFERENCE
    losses, rewards = pair_losses(kind, LOGPS, reference, TOKENS, beta, eps, gamma)
    assert losses.tolist() == pytest.approx(by_formula(kind, beta, eps, gamma), rel=1e-6)
    expected = beta * (LOGPS - REFERENCE) if reference is not None else beta * LOGPS / TOKENS
    assert torch.allclose(rewards, expected)


@pytest.mark.parametrize("kind", ["sigmoid", "ipo", "simpo"])
def test_the_sft_weight_adds_each_pairs_mean_nll_of_its_chosen(kind):
    reference = None if kind == "simpo" else REFERENCE
    plain, rewards = pair_losses(kind, LOGPS, reference, TOKENS, 0.7, 0.0, 0.3)
    losses, same_rewards = pair_losses(kind, LOGPS, reference, TOKENS, 0.7, 0.0, 0.3, sft_weight=0.4)
    nll = [-pc / nc for (pc, _), (nc, _) in zip(LOGPS.tolist(), TOKENS.tolist())]
    assert losses.tolist() == pytest.approx([p + 0.4 * n for p, n in zip(plain.tolist(), nll)], rel=1e-9)
    assert torch.equal(rewards, same_rewards)  # the rewards (and so the logged margins) are DPO's own


def test_robust_without_flips_is_dpo():
    robust, _ = pair_losses("robust", LOGPS, REFERENCE, TOKENS, 0.5, 0.0)
    assert torch.allclose(robust, pair_losses("sigmoid", LOGPS, REFERENCE, TOKENS, 0.5)[0])


# -- against TRL's DPOTrainer ------------------------------------------------------------------------------------
def trl_first_step(
    llama_dir: Path, rows: list[dict], tmp_path: Path, kind: str, beta: float, smoothing: float, sft: float = 0.0
):
    """TRL's DPOTrainer, one SGD step (lr 1, no clipping) over all `rows` in one batch: its loss and the weights
    after the step (the initial weights minus the gradient). `sft`: the weight of TRL's "sft" loss beside `kind`."""
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import DPOConfig, DPOTrainer

    model = AutoModelForCausalLM.from_pretrained(llama_dir, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(llama_dir)
    args = DPOConfig(
        output_dir=str(tmp_path / "trl"),
        per_device_train_batch_size=len(rows),
        max_steps=1,
        learning_rate=1.0,
        optim="sgd",
        lr_scheduler_type="constant",
        weight_decay=0.0,
        max_grad_norm=0.0,
        beta=beta,
        loss_type=[kind, "sft"] if sft else [kind],
        loss_weights=[1.0, sft] if sft else None,
        label_smoothing=smoothing,
        max_length=32,
        logging_steps=1,
        report_to="none",
        bf16=False,
        use_cpu=True,
        save_strategy="no",
        seed=3,
    )
    trainer = DPOTrainer(model=model, args=args, train_dataset=Dataset.from_list(rows), processing_class=tokenizer)
    trainer.train()
    return trainer.state.log_history[0], {k: v.detach().clone() for k, v in model.state_dict().items()}


@pytest.mark.slow  # TRL's import and two trainings: 20-25 s (load 2)
@pytest.mark.parametrize("kind", ["sigmoid", "ipo", "hinge", "robust", "sigmoid+sft"])
def test_the_first_step_is_trls_dpo_trainers(run, llama_dir, tmp_path, kind):
    """The same model, rows and beta: the first step's loss and every weight after one SGD step of lr 1 (so the
    gradient itself) within 1e-5; and the logged metrics under TRL's names equal TRL's. (With the sft term every
    chosen is " moon", one length: TRL's sft term, a token mean over the batch, is then each pair's mean.)"""
    kind, _, sft = kind.partition("+")
    rows = pair_rows(8, seed=5)
    if sft:
        rows = [{**r, "chosen": " moon", "rejected": r["rejected"].replace("moon", "sun")} for r in rows]
    data = write_jsonl(tmp_path / "eight.jsonl", rows)
    weight = 0.4 if sft else 0.0
    logged, trl_weights = trl_first_step(llama_dir, rows, tmp_path, kind, beta=0.5, smoothing=0.2, sft=weight)
    job = dict(data=str(data), eval_data=str(data), batch_size=8, max_steps=1, lr=1.0, beta=0.5, sft_weight=weight)
    # (TRL's other losses ignore label_smoothing; leantrain refuses it beside them)
    job["label_smoothing"] = 0.2 if kind == "robust" else 0.0
    result, weights = run(preference_loss=kind, **job)
    _, start = run(preference_loss=kind, **{**job, "lr": 1e-30})
    ours = log_rows(result)[0]
    assert ours["loss"] == pytest.approx(logged["loss"], abs=1e-5)
    for key in ("rewards/chosen", "rewards/rejected", "rewards/margins", "logps/chosen", "logps/rejected"):
        assert ours[key] == pytest.approx(logged[key], abs=1e-5), key
    # (TRL logs the metrics of the step's forward, before it moved the weights: step 1's rewards are 0)
    assert ours["rewards/accuracies"] == logged["rewards/accuracies"]
    moved = max((start[k] - weights[k]).abs().max().item() for k in weights)
    assert moved > 1e-3  # the step did move the weights
    for name, value in weights.items():
        assert torch.allclose(value, trl_weights[name], atol=1e-5), name


# -- the reference's forms, accumulation, processes, resume ------------------------------------------------------
def test_a_precomputed_reference_trains_the_same_weights_and_is_cached(run, tmp_path, capsys):
    live, w_live = run(batch_size=16, max_steps=4)
    pre, w_pre = run(batch_size=16, max_steps=4, precompute_reference=True)
    _, start = run(batch_size=16, max_steps=4, lr=1e-30)
    assert "computed and cached" in capsys.readouterr().err
    assert_trained_alike(w_live, w_pre, start, rel=1e-5)
    assert losses_of(pre) == pytest.approx(losses_of(live), abs=1e-6)
    assert pre.metrics["eval_rewards/margins"] == pytest.approx(live.metrics["eval_rewards/margins"], abs=1e-5)
    _again, w_again = run(batch_size=16, max_steps=4, precompute_reference=True)
    assert "loaded from the cache" in capsys.readouterr().err
    assert all(torch.equal(w_pre[k], w_again[k]) for k in w_pre)


def test_the_lora_reference_is_the_base_with_adapters_off(run, capsys):
    """With LoRA the reference is the model itself, adapters disabled: at the first step, before anything moved,
    the policy is the reference (every reward 0), and a run with the reference precomputed trains alike."""
    lora, w_lora = run(batch_size=16, max_steps=3, lora=True, lora_r=4, log_every=1)
    assert "adapters disabled" in capsys.readouterr().err
    first = log_rows(lora)[0]
    assert first["rewards/chosen"] == pytest.approx(0.0, abs=1e-6) and first["loss"] == pytest.approx(math.log(2))
    pre, w_pre = run(batch_size=16, max_steps=3, lora=True, lora_r=4, precompute_reference=True)
    assert losses_of(pre) == pytest.approx(losses_of(lora), abs=1e-6)
    assert max((w_lora[k] - w_pre[k]).abs().max().item() for k in w_lora) < 1e-5


@pytest.mark.parametrize("packing", [True, False], ids=["packed", "padded"])
def test_accumulation_equals_one_big_batch(run, packing):
    big, w_big = run(batch_size=16, grad_accum=1, max_steps=4, packing=packing)
    small, w_small = run(batch_size=4, grad_accum=4, max_steps=4, packing=packing)
    _, start = run(batch_size=16, max_steps=4, packing=packing, lr=1e-30)
    assert small.metrics["micro_steps"] == 4 * big.metrics["micro_steps"]
    assert_trained_alike(w_big, w_small, start, rel=1e-5)
    assert losses_of(small) == pytest.approx(losses_of(big), abs=1e-6)
    for key in ("rewards/margins", "logps/chosen", "rewards/accuracies"):
        assert [r[key] for r in log_rows(small)] == pytest.approx([r[key] for r in log_rows(big)], abs=1e-5)


def test_packed_and_padded_pairs_train_alike(run):
    _packed, w_packed = run(batch_size=8, max_steps=3, packing=True)
    _padded, w_padded = run(batch_size=8, max_steps=3, packing=False)
    _, start = run(batch_size=8, max_steps=3, lr=1e-30)
    assert_trained_alike(w_packed, w_padded, start, rel=1e-5)


@pytest.mark.parametrize(("given", "packed"), [(None, True), (True, True), (False, False)])
def test_pairs_are_packed_unless_no_packing(llama_dir, pairs, given, packed):
    from types import SimpleNamespace

    from leantrain.tasks.preference import DPO

    cfg = TrainConfig(task="dpo", model=str(llama_dir), data=str(pairs), packing=given)  # None: --packing not given
    data = SimpleNamespace(processor=SimpleNamespace(pad_token_id=0))
    assert DPO(cfg).collator(data, train=True).packing is packed


def test_a_resumed_run_equals_the_uninterrupted_one_bitwise(run):
    job = dict(optimizer="adamw", lr=3e-3, max_steps=6, save_every=2, batch_size=8, precompute_reference=True)
    whole, w_whole = run(**job)
    resumed, w_resumed = run(**job, resume=str(whole.output_dir / "checkpoints" / "step-000004"))
    assert resumed.metrics["optimizer_steps"] == 6
    assert all(torch.equal(w_whole[k], w_resumed[k]) for k in w_whole)
    assert log_rows(resumed)[-1] == {**log_rows(whole)[-1], **{k: log_rows(resumed)[-1][k] for k in VOLATILE}}


VOLATILE = (
    "samples_per_second", "tokens_per_second", "elapsed_seconds", "model_tflops_per_second", "mfu", "mfu_useful",
    "time_data_seconds", "time_forward_backward_seconds", "time_optimizer_seconds", "time_eval_seconds",
    "time_checkpoint_seconds", "time_comm_seconds", "time_other_seconds", "time_wall_seconds", "peak_memory_bytes",
    "model_tflops",
)  # fmt: skip


@pytest.mark.slow
def test_two_processes_equal_one_big_batch(run, llama_dir, pairs, tmp_path):
    from tests.parallel.test_data_parallel import flags, run_job, weights

    job = dict(task="dpo", model=llama_dir, data=pairs, cache_dir=tmp_path / "cache", max_length=32, report=False)
    one, w_one = run(batch_size=16, max_steps=3)
    out = tmp_path / "two"
    argv = flags(**job, **EXACT_JOB, max_steps=3, batch_size=8, num_processes=2, output_dir=out)
    rc, _, err = run_job(["-m", "leantrain", "train", *argv])
    assert rc == 0, err[-3000:]
    two = json.loads((out / "metrics.json").read_text())
    assert two["num_processes"] == 2 and two["global_batch"] == 16
    _, start = run(batch_size=16, max_steps=3, lr=1e-30)
    assert_trained_alike(w_one, weights(out), start, rel=1e-5)
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines() if '"loss"' in x]
    assert [r["loss"] for r in rows] == pytest.approx(losses_of(one), abs=1e-6)
    assert [r["rewards/margins"] for r in rows] == pytest.approx(
        [r["rewards/margins"] for r in log_rows(one)], abs=1e-5
    )
    assert two["eval_rewards/accuracies"] == pytest.approx(one.metrics["eval_rewards/accuracies"])


# -- bad input -----------------------------------------------------------------------------------------------------
def _cli(capsys, llama_dir, data: Path, tmp_path: Path, *extra: str) -> tuple[int, str]:
    argv = ["train", "--task", "dpo", "--model", str(llama_dir), "--data", str(data), "--no-progress", "--no-report"]
    argv += ["--output-dir", str(tmp_path / "bad"), "--cache-dir", str(tmp_path / "cache"), "--max-steps", "1", *extra]
    code = main(argv)
    return code, capsys.readouterr().err


def _one_line(code: int, err: str, *needles: str) -> None:
    lines = [line for line in err.strip().splitlines() if line]
    assert code == 2 and len(lines) == 1 and "Traceback" not in err, err
    for needle in needles:
        assert needle in lines[0], lines[0]


def test_a_row_without_rejected_is_refused_in_one_line(capsys, llama_dir, tmp_path):
    rows = pair_rows(6)
    del rows[3]["rejected"]
    code, err = _cli(capsys, llama_dir, write_jsonl(tmp_path / "p.jsonl", rows), tmp_path)
    _one_line(code, err, "p.jsonl", "row 4", "'rejected'")
    no_column = [{k: v for k, v in r.items() if k != "rejected"} for r in pair_rows(6)]
    code, err = _cli(capsys, llama_dir, write_jsonl(tmp_path / "q.jsonl", no_column), tmp_path)
    _one_line(code, err, "q.jsonl", "no 'rejected' column;")
    instructions = [{"prompt": r["prompt"], "completion": r["chosen"]} for r in pair_rows(6)]
    code, err = _cli(capsys, llama_dir, write_jsonl(tmp_path / "instructions.jsonl", instructions), tmp_path)
    _one_line(code, err, "instructions.jsonl", "no 'chosen', 'rejected' columns;")


@pytest.mark.parametrize("task", ["dpo", "kto", "reward-model"])
def test_a_data_mixture_is_refused_in_one_line(capsys, llama_dir, tmp_path, task):
    first, second = write_jsonl(tmp_path / "a.jsonl", pair_rows(6)), write_jsonl(tmp_path / "b.jsonl", pair_rows(6))
    code, err = _cli(capsys, llama_dir, first, tmp_path, "--task", task, "--data", str(second))
    _one_line(code, err, f"--task {task} reads one source, not a mixture of 2", "join the files into one")


def test_pairs_with_chosen_equal_to_rejected_are_counted_and_skipped_and_refused_if_all(capsys, llama_dir, tmp_path):
    rows = pair_rows(40)
    for r in rows[:5]:
        r["rejected"] = r["chosen"]
    data = write_jsonl(tmp_path / "s.jsonl", rows)
    code = main(["train", "--task", "dpo", "--model", str(llama_dir), "--data", str(data), "--max-steps", "1",
                 "--output-dir", str(tmp_path / "ok"), "--cache-dir", str(tmp_path / "cache"),
                 "--no-progress", "--no-report", "--batch-size", "4"])  # fmt: skip
    assert code == 0
    assert "skipped 5 rows whose chosen and rejected are the same" in capsys.readouterr().err
    same = [{**r, "rejected": r["chosen"]} for r in pair_rows(6)]
    code, err = _cli(capsys, llama_dir, write_jsonl(tmp_path / "same.jsonl", same), tmp_path)
    _one_line(code, err, "same.jsonl", "chosen equals rejected in every row")


def test_a_completion_cut_away_by_max_length_is_counted_and_skipped(llama_dir, tmp_path):
    from leantrain.tasks.preference import DPO

    rows = pair_rows(20)
    rows[0]["prompt"] = " ".join(["the big red ball"] * 30)  # far beyond 32 tokens
    cfg = TrainConfig(task="dpo", model=str(llama_dir), data=str(write_jsonl(tmp_path / "c.jsonl", rows)),
                      cache_dir=str(tmp_path / "cache"), max_length=32)  # fmt: skip
    data = DPO(cfg).prepare_data(str(llama_dir), None)
    assert any("skipped 1 rows whose completion lies wholly beyond --max-length 32" in n for n in data.notes)
    assert len(data.train) + len(data.eval) == 19
    lengths = data.train.features.part_lengths()
    assert (lengths[:, 0] + lengths[:, 1:].max(1) <= 32).all()
    with pytest.raises(DataError, match="no row is left to learn"):
        DPO(cfg.replace(max_length=2)).prepare_data(str(llama_dir), None)


def test_chat_pairs_take_the_shared_prompt_from_the_conversations(llama_dir, tmp_path):
    from leantrain.tasks.preference import DPO

    user = lambda text: {"role": "user", "content": text}  # noqa: E731
    bot = lambda text: {"role": "assistant", "content": text}  # noqa: E731
    rows = [
        {"chosen": [user(f"the cat {i}"), bot("sun")], "rejected": [user(f"the cat {i}"), bot("moon ball")]}
        for i in range(6)
    ]
    template = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    template += "{% if add_generation_prompt %}assistant: {% endif %}"
    cfg = TrainConfig(task="dpo", model=str(llama_dir), data=str(write_jsonl(tmp_path / "chat.jsonl", rows)),
                      cache_dir=str(tmp_path / "cache"), chat_template=template, eval_fraction=0.5)  # fmt: skip
    data = DPO(cfg).prepare_data(str(llama_dir), None)
    tok = data.processor
    row = data.train.features.row(0)
    prompt, chosen, rejected = (tok.decode(x) for x in row["parts"])
    # the prompt ends with the template's cue for the answer, as generation continues it
    assert prompt.startswith("user: the cat") and prompt.endswith("\nassistant: ")
    assert chosen == f"sun\n{tok.eos_token}" and rejected == f"moon ball\n{tok.eos_token}"


def test_training_moves_preferences_the_right_way(run):
    """Training on pairs raises the chosen completions' rewards over the rejected ones on held-out pairs."""
    result, _ = run(optimizer="adamw", lr=3e-3, max_steps=30, batch_size=16, beta=0.5)
    assert result.metrics["eval_rewards/margins"] > 0.5
    assert result.metrics["eval_rewards/accuracies"] >= 0.8
    first, last = log_rows(result)[0], log_rows(result)[-1]
    assert last["loss"] < first["loss"] and last["rewards/margins"] > first["rewards/margins"]


def test_by_hand_per_pair_loss_of_the_logged_first_step(run, llama_dir, pairs, tmp_path):
    """The logged first loss is the mean over the step's pairs of -log σ(β Δ) with the policy equal to the reference
    at the start: log 2, whatever the rows (a check that the loss is per pair, not per token or per sequence)."""
    result, _ = run(batch_size=32, grad_accum=2, max_steps=1, lr=1e-30)
    assert losses_of(result)[0] == pytest.approx(math.log(2), abs=1e-6)
    assert float(F.logsigmoid(torch.tensor(0.0))) == pytest.approx(-math.log(2))
    assert np.isfinite(result.metrics["eval_loss"])


def test_evaluate_scores_held_out_pairs_and_predict_generates(run, pairs, tmp_path):
    """`evaluate` rescores the run's held-out pairs as its own evaluation did (its loss and beta, the base model as
    the reference) and any pairs file; `--task causal-lm` scores the model as a language model on instruction rows;
    `predict` completes the pairs' prompts."""
    from leantrain.inference.api import evaluate, predict

    result, _ = run(optimizer="adamw", lr=3e-3, max_steps=6, batch_size=16, beta=0.5, preference_loss="ipo")
    held = evaluate(str(result.output_dir))
    for key in ("loss", "rewards/margins", "rewards/accuracies", "logps/chosen"):
        assert held[key] == pytest.approx(result.metrics[f"eval_{key}"], rel=1e-4, abs=1e-5), key
    assert evaluate(str(result.output_dir), data=str(pairs))["examples"] == 96
    rows = pair_rows(12, seed=9)
    instructions = write_jsonl(
        tmp_path / "sft.jsonl", [{"prompt": r["prompt"], "completion": r["chosen"]} for r in rows]
    )
    as_lm = evaluate(str(result.output_dir), data=str(instructions), task="causal-lm")
    assert {"loss", "perplexity", "exact_match"} <= set(as_lm)
    done = predict(str(result.output_dir), data=str(write_jsonl(tmp_path / "p.jsonl", rows)), max_new_tokens=3)
    assert [d["prompt"] for d in done] == [r["prompt"] for r in rows] and all(
        isinstance(d["completion"], str) for d in done
    )


def test_the_bench_table_shows_the_references_cost():
    from leantrain.commands.bench import BenchRow, table_rows

    def row(name, reference_bytes, seconds):
        metrics = {"steady_samples_per_second": 10.0, "reference_bytes": reference_bytes, "reference_seconds": seconds}
        return BenchRow(name, {}, metrics)

    records = table_rows([row("baseline", 2**21, 0.1), row("precompute_reference", 0, 4.0)])
    assert records[0]["reference MB"] == 2.0 and records[1]["reference MB"] == 0.0
    assert records[1]["reference s"] == 4.0 and records[1]["reference s vs baseline"] == pytest.approx(40.0)


def test_another_reference_model_is_compared_with_live_or_precomputed(run, llama_dir, tmp_path):
    """--reference-model: another model (here the tiny Llama with other weights) is the reference, held as a frozen
    copy or precomputed: the policy is not its reference at the start (the first loss is not log 2), and both forms
    train the same weights."""
    from transformers import AutoModelForCausalLM

    other = tmp_path / "other"
    torch.manual_seed(1)
    model = AutoModelForCausalLM.from_pretrained(llama_dir)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    model.save_pretrained(other)
    live, w_live = run(batch_size=16, max_steps=2, reference_model=str(other))
    pre, w_pre = run(batch_size=16, max_steps=2, reference_model=str(other), precompute_reference=True)
    assert abs(losses_of(live)[0] - math.log(2)) > 1e-3
    assert losses_of(pre) == pytest.approx(losses_of(live), abs=1e-6)
    assert max((w_live[k] - w_pre[k]).abs().max().item() for k in w_live) < 1e-5
    assert live.metrics["reference"] == "frozen-copy" and pre.metrics["reference"] == "precomputed"


@pytest.mark.parametrize("packing", [True, False], ids=["packed", "padded"])
def test_static_shapes_pad_pairs_to_a_few_widths_and_change_nothing(run, packing):
    """--static-shapes pads each batch's rows up to a bucket (16, 24, 32, 48, ...): more padding, counted nowhere,
    the same losses and weights."""
    from leantrain.data.batching import length_buckets
    from leantrain.data.preferences import SequencesCollator, sequence_batch

    off, w_off = run(batch_size=8, max_steps=3, packing=packing, static_shapes="off")
    on, w_on = run(batch_size=8, max_steps=3, packing=packing, static_shapes="on")
    assert on.metrics["padding_fraction"] > off.metrics["padding_fraction"]
    assert losses_of(on) == pytest.approx(losses_of(off), abs=1e-6)
    for key in ("rewards/margins", "logps/chosen"):
        assert [r[key] for r in log_rows(on)] == pytest.approx([r[key] for r in log_rows(off)], abs=1e-5)
    for name, value in w_off.items():
        assert torch.allclose(w_on[name], value, atol=1e-6), name

    sequences = [(np.arange(1, 6), np.arange(6, 6 + n)) for n in (3, 9, 14)]  # rows of 8, 14 and 19 tokens
    buckets = length_buckets(64)
    assert sequence_batch(sequences, 0, None, buckets)["input_ids"].shape == (3, 24)
    assert sequence_batch(sequences, 0, None)["input_ids"].shape == (3, 19)
    assert SequencesCollator(0, packing=packing, buckets=buckets).buckets == tuple(buckets)


@pytest.mark.slow  # compiles the tiny Llama's graphs: about a minute here
@pytest.mark.no_cover  # coverage's tracer slows dynamo ~1.6x (tests/training/test_compile.py)
def test_a_compiled_dpo_run_meets_a_few_widths_and_recompiles_at_most_for_the_short_batch(run):
    """With --compile, pairs of every length train on a few bucketed widths, compiled dynamic at once: no new graph
    for a new length after the warm-up (the epoch's short last batch, whose rows are not filled, may add one)."""
    torch._dynamo.reset()
    result, _ = run(batch_size=20, max_steps=6, compile=True, log_every=1)  # 96 pairs: 4 steps of 20 and one of 16
    rows = log_rows(result)
    graphs = [r["compiled_graphs"] for r in rows if "compiled_graphs" in r]
    assert len(graphs) == 6 and result.metrics["recompiles"] <= 1, (graphs, result.metrics["recompiles"])
    assert graphs[-1] <= 4, graphs


@pytest.mark.parametrize(
    "flags, says",
    [
        (["--label-smoothing", "0.1"], "--label-smoothing: --preference-loss sigmoid does not read it;"),
        (["--preference-loss", "ipo", "--label-smoothing", "0.1"], "--preference-loss ipo does not read it;"),
        (["--simpo-gamma", "1"], "--simpo-gamma: only --preference-loss simpo reads it, not sigmoid"),
    ],
)
def test_a_setting_the_chosen_loss_does_not_read_is_refused_in_one_line(capsys, llama_dir, tmp_path, flags, says):
    code, err = _cli(capsys, llama_dir, write_jsonl(tmp_path / "p.jsonl", pair_rows(6)), tmp_path, *flags)
    _one_line(code, err, says)
