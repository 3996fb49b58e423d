"""Online RL (`--task grpo`) on a tiny Llama in fp32: advantages against their formulas, the loss and its gradient
against a computation by hand, the first steps' losses against TRL's GRPOTrainer, accumulation and two processes
against one big batch, a killed run resumed bitwise (completions included), prompt tokens never counted, and bad
input refused in one line."""

from __future__ import annotations

import itertools
import json
import math
import random
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from leantrain import TrainConfig, train
from leantrain.commands.cli import main
from leantrain.model import generation
from leantrain.tasks import grpo
from leantrain.tasks.causal_lm import IGNORE
from leantrain.training.hooks import Hooks
from tests.casts_helper import casts_in
from tests.conftest import EXACT_JOB, assert_trained_alike
from tests.tasks.test_causal_lm import WORDS, tiny_llama, write_tiny_llama

REWARDS = Path(__file__).with_name("grpo_rewards.py")


@pytest.fixture(scope="module")
def setup(tmp_path_factory) -> Path:
    """A tiny Llama with weights (TRL loads it from its folder too) and 24 prompts of 1 to 8 words with answers."""
    from transformers import AutoTokenizer

    root = tmp_path_factory.mktemp("grpo")
    config = write_tiny_llama(root / "config")
    tiny_llama(config).save_pretrained(root / "model")
    AutoTokenizer.from_pretrained(config).save_pretrained(root / "model")
    rng = random.Random(7)
    rows = [
        {"prompt": " ".join(rng.choices(WORDS, k=rng.randint(1, 8))), "answer": rng.choice(WORDS)} for _ in range(24)
    ]
    write_jsonl(root / "prompts.jsonl", rows)
    return root


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def job(setup: Path, tmp_path: Path, **changes) -> dict:
    return {
        **dict(
            task="grpo",
            model=str(setup / "model"),
            data=str(setup / "prompts.jsonl"),
            cache_dir=str(tmp_path / "cache"),
            reward="tests.tasks.grpo_rewards:letters",
            num_generations=4,
            max_completion_length=6,
            max_length=32,
            report=False,
            **{**EXACT_JOB, "lr": 0.05},
        ),
        **changes,
    }


@pytest.fixture()
def run(setup, tmp_path):
    count = iter(range(100))

    def go(hooks=None, **changes):
        result = train(
            TrainConfig(**job(setup, tmp_path, output_dir=str(tmp_path / f"run{next(count)}"), **changes)), hooks=hooks
        )
        return result, load_file(result.model_dir / "model.safetensors")

    return go


def log_rows(result) -> list[dict]:
    rows = [json.loads(x) for x in (result.output_dir / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if "loss" in r]


class Recorder(Hooks):
    """Every training micro-batch, as the trainer hands it to the model."""

    def __init__(self):
        self.batches: list[dict] = []

    def on_micro_batch(self, model, batch):
        self.batches.append({k: v.clone() if torch.is_tensor(v) else v for k, v in batch.items()})


# -- advantages --------------------------------------------------------------------------------------------------------
def test_advantages_are_their_formulas_and_equal_rewards_give_zero():
    rewards = torch.tensor([[1.0, 0.0, 0.5, 2.0], [3.0, 3.0, 3.0, 3.0], [0.0, 1.0, 0.0, 0.0]])
    got = grpo.advantages(rewards, "grpo")
    for g, row in enumerate(rewards.tolist()):
        mean = sum(row) / 4
        std = math.sqrt(sum((x - mean) ** 2 for x in row) / 3)  # Bessel's, as TRL
        assert got[g].tolist() == pytest.approx([(x - mean) / (std + 1e-4) for x in row], rel=1e-6, abs=1e-7)
        loo = [x - (sum(row) - x) / 3 for x in row]
        assert grpo.advantages(rewards, "rloo")[g].tolist() == pytest.approx(loo, rel=1e-6, abs=1e-7)
    assert (got[1] == 0).all() and (grpo.advantages(rewards, "rloo")[1] == 0).all()


# -- the loss and its gradient by hand -------------------------------------------------------------------------------
def fixed_completions(vocab: int, eos: int) -> list[tuple[list[int], list[int]]]:
    rng = np.random.default_rng(3)
    out = []
    for p, c in [(3, 1), (9, 4), (5, 6), (4, 2), (7, 3), (2, 5)]:
        completion = rng.integers(3, vocab, size=c).tolist()
        if c % 2:
            completion[-1] = eos
        out.append((rng.integers(3, vocab, size=p).tolist(), completion))
    return out


def task_for(setup: Path, tmp_path: Path, model, **changes):
    cfg = TrainConfig(**job(setup, tmp_path, **changes)).resolved()
    task = grpo.GRPO.for_config(cfg)
    data = task.prepare_data(cfg.model, None)
    context = SimpleNamespace(accelerator=None, precision="fp32", say=lambda line: None, autocast=None)
    task.before_training(model, data, context)
    return task


def by_hand(model, sequences, advantage, old, reference, temperature, beta, eps=(0.2, 0.28)):
    """Each sequence alone through the model, every position's logits / temperature; PPO's clipped objective written
    per sign of the advantage; the KL's k3 estimator weighted by the ratio (TRL's bias-corrected KL)."""
    total = torch.zeros((), dtype=torch.float64)
    for i, (prompt, completion) in enumerate(sequences):
        ids = torch.tensor(prompt + completion)[None]
        logps = torch.log_softmax(model(input_ids=ids).logits[0].double() / temperature, -1)
        for k, token in enumerate(completion):
            lp = logps[len(prompt) - 1 + k, token]
            ratio = torch.exp(lp - (lp.detach() if old is None else old[i][k]))
            a = advantage[i]
            loss = -a * (torch.clamp(ratio, max=1 + eps[1]) if a > 0 else torch.clamp(ratio, min=1 - eps[0]))
            if beta:
                d = reference[i][k] - lp
                loss = loss + beta * ratio * (torch.exp(d) - d - 1)
            total = total + loss
    return total


@pytest.mark.parametrize("packing", [True, False], ids=["packed", "padded"])
@pytest.mark.parametrize("reused", [False, True], ids=["fresh", "reused-generation"])
def test_the_loss_and_its_gradient_are_a_computation_by_hand(setup, tmp_path, packing, reused):
    """Six fixed completions of very different lengths (EOS-ended and not), advantages of both signs; reused: their
    log-probabilities at generation shifted so that ratios fall on both sides of the clip range (asymmetric), with a
    KL to a reference at temperature 0.7."""
    model = tiny_llama(setup / "config").train()
    changes = dict(packing=packing, temperature=0.7, kl_beta=0.1 if reused else 0.0, clip_epsilon_high=0.28)
    if reused:
        changes["iterations_per_generation"] = 2
    task = task_for(setup, tmp_path, model, **changes)
    sequences = fixed_completions(model.config.vocab_size, task.tokenizer.eos_token_id)
    advantage = torch.tensor([1.5, -0.7, 0.3, -2.0, 0.9, -0.1])
    rng = np.random.default_rng(0)
    old = ref = None
    if reused:
        with torch.no_grad():
            exact = [
                torch.log_softmax(model(input_ids=torch.tensor(p + c)[None]).logits[0] / 0.7, -1)[
                    torch.arange(len(p) - 1, len(p) + len(c) - 1), torch.tensor(c)
                ].double()
                for p, c in sequences
            ]
        old = [e + torch.from_numpy(rng.choice([-0.5, -0.1, 0.05, 0.4], size=len(e))) for e in exact]
        ref = [e + torch.from_numpy(rng.normal(0, 0.3, size=len(e))) for e in exact]
    batch = task._sequences(sequences, "cpu")
    batch["advantages"] = advantage
    if reused:
        batch["old_logps"] = torch.cat(old).float()
        batch["ref_logps"] = torch.cat(ref).float()
    ours = task.loss_sum(task.forward(model, batch), batch)
    ours_grads = torch.autograd.grad(ours, list(model.parameters()), allow_unused=True)
    hand = by_hand(model, sequences, advantage, old, ref, 0.7, 0.1 if reused else 0.0)
    hand_grads = torch.autograd.grad(hand, list(model.parameters()), allow_unused=True)
    assert float(ours.detach()) == pytest.approx(float(hand.detach()), rel=1e-5, abs=1e-6)
    if reused:
        outputs = task.forward(model, batch)
        clipped = task._per_token(outputs.per_token.detach(), outputs.sequence, batch)[1]["clip_region"].sum()
        assert 0 < float(clipped) < sum(len(c) for _, c in sequences)  # the clip range bites, not everywhere
    for (name, p), a, b in zip(model.named_parameters(), ours_grads, hand_grads):
        a = torch.zeros_like(p) if a is None else a
        b = torch.zeros_like(p) if b is None else b.float()
        assert torch.allclose(a, b, atol=1e-6, rtol=1e-4), name


def test_prompt_tokens_never_count(setup, tmp_path):
    """In the sequences a step trains on, the labels are the completions' tokens only; each micro-batch's units are
    its completion tokens and the step's their sum."""
    recorder = Recorder()
    train(
        TrainConfig(**job(setup, tmp_path, max_steps=2, batch_size=2, grad_accum=2, output_dir=str(tmp_path / "r"))),
        hooks=recorder,
    )
    assert len(recorder.batches) == 4
    for step in (recorder.batches[:2], recorder.batches[2:]):
        for b in step:
            counted = b["labels"] != IGNORE
            assert float(b["units"]) == int(counted.sum())
            for s in range(int(b["sequence_ids"].max()) + 1):
                row, positions = (x.unique() for x in (b["sequence_ids"] == s).nonzero(as_tuple=True))
                assert len(row) == 1  # a sequence lies in one row
                labelled = positions[counted[row[0], positions]]
                # the sequence's first tokens (its prompt, at least one) carry no label; from there on every one does
                assert labelled.min() > positions.min() and len(labelled) == positions.max() - labelled.min() + 1
        assert float(step[0]["step_units"]) == float(step[1]["step_units"]) == sum(float(b["units"]) for b in step)


# -- against TRL's GRPOTrainer ---------------------------------------------------------------------------------------
def given_completions(tokenizer, prompts: list[str], group: int, vocab: int) -> dict[tuple[int, ...], list[list[int]]]:
    """For each prompt's tokens, `group` fixed completions of 1 to 6 tokens, some ended by EOS."""
    from leantrain.tasks.grpo import encode_prompts

    rng = np.random.default_rng(11)
    out = {}
    for ids in encode_prompts(tokenizer, prompts):
        completions = []
        for k in range(group):
            c = rng.integers(3, vocab, size=int(rng.integers(1, 7))).tolist()
            if k % 2 and len(c) < 6:
                c.append(tokenizer.eos_token_id)
            completions.append(c)
        out[tuple(ids)] = completions
    return out


def trl_losses(setup: Path, tmp_path: Path, prompts: list[str], given, settings: dict) -> tuple[list[float], dict]:
    """TRL's GRPOTrainer on the same model and prompts, its generation replaced by the given completions: the loss
    `_compute_loss` returns at each step, and the trained weights."""
    from datasets import Dataset
    from transformers import AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    from tests.tasks.grpo_rewards import letters

    args = GRPOConfig(
        output_dir=str(tmp_path / "trl"), per_device_train_batch_size=len(prompts) * settings["num_generations"],
        num_generations=settings["num_generations"], max_completion_length=settings["max_completion_length"],
        max_steps=settings["max_steps"], learning_rate=settings["lr"], optim="sgd", lr_scheduler_type="constant",
        warmup_steps=0, weight_decay=0.0, max_grad_norm=0.0, beta=settings["kl_beta"], epsilon=settings["clip_epsilon"],
        num_iterations=settings["iterations_per_generation"], temperature=settings["temperature"], loss_type="dapo",
        logging_steps=1, report_to="none", use_cpu=True, save_strategy="no", seed=0, bf16=False,
    )  # fmt: skip
    dataset = Dataset.from_list([{"prompt": p, "answer": "cat"} for p in prompts])
    tokenizer = AutoTokenizer.from_pretrained(setup / "model")
    trainer = GRPOTrainer(
        model=str(setup / "model"), reward_funcs=[letters], args=args, train_dataset=dataset, processing_class=tokenizer
    )
    losses: list[float] = []
    compute = trainer._compute_loss

    def recorded(model, inputs):
        loss = compute(model, inputs)
        losses.append(float(loss.detach()))
        return loss

    def generated(prompt_ids, *args, **kwargs):  # each prompt comes num_generations times in a row
        seen: dict[tuple[int, ...], int] = {}
        out = []
        for ids in prompt_ids:
            k = seen.setdefault(tuple(ids), 0)
            seen[tuple(ids)] = k + 1
            out.append(given[tuple(ids)][k])
        return out, None

    trainer._compute_loss = recorded
    trainer._generate_single_turn = generated
    trainer.train()
    return losses, {k: v.detach().clone() for k, v in trainer.model.state_dict().items()}


def test_the_first_steps_losses_are_trls_grpo_trainers(setup, tmp_path, monkeypatch):
    """The same model, prompts, given completions, reward and settings (G=4, temperature 0.7, KL beta 0.04, two
    optimizer steps per generation: the second step's ratios move off 1 and are clipped): leantrain's logged loss
    of each step equals what TRL's `_compute_loss` returned, to 1e-5, and so do the weights after the two steps."""
    pytest.importorskip("trl")
    from transformers import AutoTokenizer

    prompts = ["the cat sat on the mat", "a dog", "big red ball and the small blue moon"]
    data = write_jsonl(tmp_path / "three.jsonl", [{"prompt": p, "answer": "cat"} for p in prompts])
    settings = dict(
        num_generations=4, max_completion_length=6, max_steps=2, lr=0.1, kl_beta=0.04, clip_epsilon=0.2,
        iterations_per_generation=2, temperature=0.7,
    )  # fmt: skip
    tokenizer = AutoTokenizer.from_pretrained(setup / "model")
    given = given_completions(tokenizer, prompts, 4, len(tokenizer))
    theirs, trl_weights = trl_losses(setup, tmp_path, prompts, given, settings)

    real = generation.sample

    def sample(model, prompt_ids, per_prompt, sampling, seeds=None):
        if per_prompt != 4:  # evaluation's greedy completions
            return real(model, prompt_ids, per_prompt, sampling, seeds)
        return [c for ids in prompt_ids for c in given[tuple(ids)]]

    monkeypatch.setattr(generation, "sample", sample)
    ours, weights = run_with(setup, tmp_path, data, settings)
    assert len(theirs) == 2 and theirs[1] != pytest.approx(theirs[0], abs=1e-3)  # the second step is no repeat
    assert [r["loss"] for r in log_rows(ours)] == pytest.approx(theirs, abs=1e-5)
    start = load_file(setup / "model" / "model.safetensors")
    assert_trained_alike(weights, {k: trl_weights[k] for k in weights}, start, rel=1e-4)


def run_with(setup: Path, tmp_path: Path, data: Path, settings: dict):
    cfg = job(
        setup, tmp_path, data=str(data), eval_data=str(data), batch_size=3, scheduler="constant",
        output_dir=str(tmp_path / "ours"), **settings,
    )  # fmt: skip
    result = train(TrainConfig(**cfg))
    return result, load_file(result.model_dir / "model.safetensors")


# -- one big batch, however it is split; resume ------------------------------------------------------------------------
def completions_of(recorder: Recorder) -> list[list[tuple[int, ...]]]:
    """Each micro-batch's sequences (prompt + completion tokens), in order."""
    out = []
    for b in recorder.batches:
        ids, owner = b["input_ids"], b["sequence_ids"]
        out.append([tuple(ids[owner == s].tolist()) for s in range(int(owner.max()) + 1)])
    return out


def test_accumulated_micro_batches_equal_one_big_batch(run):
    """Four prompts a step in one micro-batch, or two micro-batches of two: the same completions (each prompt's from
    its own seed), the same loss per step and the same weights. Completions end at EOS or at 6 tokens, so
    micro-batches hold different numbers of completion tokens."""
    big_log, small_log = Recorder(), Recorder()
    big, w_big = run(batch_size=4, grad_accum=1, max_steps=3, hooks=big_log)
    small, w_small = run(batch_size=2, grad_accum=2, max_steps=3, hooks=small_log)
    _, start = run(batch_size=4, max_steps=3, lr=1e-30)
    assert small.metrics["micro_steps"] == 2 * big.metrics["micro_steps"] == 6
    split = completions_of(small_log)
    assert [sorted(a + b) for a, b in zip(split[::2], split[1::2])] == [sorted(x) for x in completions_of(big_log)]
    assert_trained_alike(w_big, w_small, start, rel=1e-5)
    assert [r["loss"] for r in log_rows(small)] == pytest.approx([r["loss"] for r in log_rows(big)], abs=1e-6)
    assert [r["reward"] for r in log_rows(small)] == pytest.approx([r["reward"] for r in log_rows(big)], abs=1e-6)


@pytest.mark.parametrize("reuse", [1, 2], ids=["one-step-a-generation", "two-steps-a-generation"])
def test_a_resumed_run_equals_the_uninterrupted_one_bitwise(run, reuse):
    """Checkpointed at step 3 and resumed: the same completions afterwards (sampled again from the same seeds, or,
    two steps to a generation, the second step of generation 2 reusing what the checkpoint kept of it), the same
    losses and bitwise the same weights."""
    settings = dict(
        optimizer="adamw", lr=3e-3, max_steps=6, save_every=3, batch_size=2, iterations_per_generation=reuse
    )
    whole_log, resumed_log = Recorder(), Recorder()
    whole, w_whole = run(hooks=whole_log, **settings)
    ckpt = whole.output_dir / "checkpoints" / "step-000003"
    resumed, w_resumed = run(hooks=resumed_log, resume=str(ckpt), **settings)
    assert resumed.metrics["resumed_from"] == str(ckpt) and resumed.metrics["optimizer_steps"] == 6
    assert completions_of(resumed_log) == completions_of(whole_log)[3:]
    different = [k for k in w_whole if not torch.equal(w_whole[k], w_resumed[k])]
    assert not different, f"{len(different)} tensors differ, e.g. {different[0]}"
    assert [r["loss"] for r in log_rows(resumed)] == [r["loss"] for r in log_rows(whole)]
    if reuse == 2:
        saved = torch.load(ckpt / "rank-0.pt", weights_only=True)
        assert saved["task"]["generation"] == 1  # steps 3 and 4 are generation 1's: its completions are kept


@pytest.mark.slow
def test_two_processes_equal_one(setup, tmp_path, run):
    """Two processes (gloo), two prompts each, against one process with four: the same weights and logged metrics.
    The reward is a module given by its file, as a user's would be. (about 60 s at load 2)"""
    from tests.parallel.test_data_parallel import flags, run_job, weights

    reward = f"{REWARDS}:letters"
    one, w_one = run(batch_size=4, max_steps=3, reward=reward)
    out = tmp_path / "two"
    settings = job(setup, tmp_path, batch_size=2, max_steps=3, reward=reward, num_processes=2, output_dir=out)
    rc, _, err = run_job(["-m", "leantrain", "train", *flags(**settings)])
    assert rc == 0, err[-3000:]
    two = json.loads((out / "metrics.json").read_text())
    assert two["num_processes"] == 2 and two["global_batch"] == 4
    _, start = run(batch_size=4, max_steps=3, lr=1e-30, reward=reward)
    assert_trained_alike(w_one, weights(out), start, rel=1e-5)
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines() if '"loss"' in x]
    for key in ("loss", "reward", "reward_std", "completions/mean_length", "frac_reward_zero_std"):
        assert [r[key] for r in rows] == pytest.approx([r[key] for r in log_rows(one)], abs=1e-6), key
    assert two["eval_reward"] == pytest.approx(one.metrics["eval_reward"], abs=1e-6)


# -- what each row logs ------------------------------------------------------------------------------------------------
def test_each_log_row_has_trls_metrics_and_the_report_plots_reward(run, tmp_path):
    from leantrain.run.report import load_run, plot_reward

    result, _ = run(max_steps=2, batch_size=2, kl_beta=0.1, reward="tests.tasks.grpo_rewards:letters,exact-match=0.5")
    row = log_rows(result)[-1]
    for key in (
        "reward", "reward_std", "frac_reward_zero_std", "rewards/letters/mean", "rewards/letters/std",
        "rewards/exact_match/mean", "completions/mean_length", "completions/clipped_ratio", "kl",
        "clip_ratio/low_mean", "clip_ratio/high_mean", "clip_ratio/region_mean", "time_generate_seconds",
    ):  # fmt: skip
        assert key in row, key
    # the reward is the weighted sum of the functions' rewards (their means, weighted, the mean of the sums)
    assert row["reward"] == pytest.approx(row["rewards/letters/mean"] + 0.5 * row["rewards/exact_match/mean"])
    assert row["time_generate_seconds"] > 0 and result.metrics["time_generate_seconds"] > 0
    assert set(result.metrics) >= {"eval_reward", "eval_rewards/letters/mean", "eval_completions/mean_length"}
    assert plot_reward(load_run(result.output_dir)) is not None


# -- bad input: one line, exit 2 ---------------------------------------------------------------------------------------
def cli(capsys, setup: Path, tmp_path: Path, **changes) -> tuple[int, str, str]:
    from tests.parallel.test_data_parallel import flags

    settings = job(setup, tmp_path, max_steps=1, batch_size=2, output_dir=str(tmp_path / "cli"), overwrite=True)
    settings.update(changes)
    code = main(["train", *flags(**settings)])
    out, err = capsys.readouterr()
    return code, out, err.strip()


def one_line(err: str) -> str:
    lines = [line for line in err.splitlines() if line.startswith("leantrain train: error:")]
    assert len(lines) == 1 and "Traceback" not in err, err[-2000:]
    return lines[0]


@pytest.mark.parametrize(("given", "meant"), [("regexp", "regex"), ("exact", "exact-match"), ("numbers", "number")])
def test_a_misspelt_built_in_reward_is_refused_naming_the_spelling_meant(given, meant):
    from leantrain.errors import ConfigError
    from leantrain.tasks.rewards import parse

    # a built-in's name as its scores are logged (exact_match), in any case, is that built-in
    assert parse("exact_match, Number=0.5,REGEX") == [("exact-match", 1.0), ("number", 0.5), ("regex", 1.0)]
    with pytest.raises(ConfigError, match=rf"--reward '{given}': .*; did you mean {meant}\?$"):
        parse(f"{given},number=0.5")
    with pytest.raises(ConfigError) as far:
        parse("brevity")
    assert "did you mean" not in str(far.value)


def test_a_reward_module_that_does_not_import_is_one_line(capsys, setup, tmp_path):
    broken = tmp_path / "broken_rewards.py"
    broken.write_text(
        "import a_module_nobody_has\n\ndef score(completions, **kw):\n    return [0.0] * len(completions)\n"
    )
    code, _, err = cli(capsys, setup, tmp_path, reward=f"{broken}:score")
    assert code == 2
    assert "does not import (ModuleNotFoundError: No module named 'a_module_nobody_has')" in one_line(err)
    code, _, err = cli(capsys, setup, tmp_path, reward="tests.tasks.no_such_rewards:score")
    assert code == 2 and "'tests.tasks.no_such_rewards' does not import" in one_line(err)
    code, _, err = cli(capsys, setup, tmp_path, reward="tests.tasks.grpo_rewards:no_such_function")
    assert code == 2 and "has no function 'no_such_function'" in one_line(err)


def test_a_reward_with_the_wrong_number_of_values_or_a_non_finite_one_names_the_prompt(capsys, setup, tmp_path):
    code, _, err = cli(capsys, setup, tmp_path, reward="tests.tasks.grpo_rewards:one_short")
    assert code == 2
    line = one_line(err)
    assert "returned 7 values for 8 completions (of prompts from '" in line and "return one number per" in line
    code, _, err = cli(capsys, setup, tmp_path, reward="tests.tasks.grpo_rewards:not_a_number")
    assert code == 2
    line = one_line(err)
    assert "returned nan for the completion " in line and " of the prompt '" in line
    prompts = [json.loads(x)["prompt"] for x in (setup / "prompts.jsonl").read_text().splitlines()]
    assert any(f"of the prompt {p!r}" in line for p in prompts), line


def test_a_reward_function_that_raises_is_one_line_saying_where(capsys, setup, tmp_path):
    code, _, err = cli(capsys, setup, tmp_path, reward="tests.tasks.grpo_rewards:raises")
    line = one_line(err)
    assert code == 2 and "--reward tests.tasks.grpo_rewards:raises: raised KeyError: " in line
    assert "(grpo_rewards.py line " in line and ", in raises); fix the function" in line


def test_a_mixture_of_prompt_files_is_one_line(capsys, setup, tmp_path):
    prompts = str(setup / "prompts.jsonl")
    other = write_jsonl(tmp_path / "other.jsonl", [{"prompt": "a cat", "answer": "cat"}] * 4)
    code, _, err = cli(capsys, setup, tmp_path, data=[prompts, str(other)])
    assert code == 2 and "--task grpo reads one source, not a mixture of 2" in one_line(err)


def test_a_text_column_that_is_not_there_is_named(capsys, setup, tmp_path):
    code, _, err = cli(capsys, setup, tmp_path, text_column="question")
    line = one_line(err)
    assert code == 2 and "no column 'question' (given by --text-column)" in line and "'prompt', 'answer'" in line


def test_one_generation_a_prompt_is_refused(capsys, setup, tmp_path):
    code, _, err = cli(capsys, setup, tmp_path, num_generations=1)
    assert code == 2 and "--num-generations 1: GRPO's advantages compare each completion" in one_line(err)
    code, _, err = cli(capsys, setup, tmp_path, num_generations=1, advantage="rloo")
    assert code == 2 and "--num-generations 1" in one_line(err)


def test_prompts_longer_than_the_room_left_for_a_completion_are_counted_and_skipped(capsys, setup, tmp_path):
    """With --max-length 12 and completions of up to 6 tokens, prompts of more than 6 tokens are skipped (and
    counted); when no prompt is left, one line."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(setup / "model")
    rows = [json.loads(x) for x in (setup / "prompts.jsonl").read_text().splitlines()]
    lengths = [len(tokenizer(r["prompt"])["input_ids"]) for r in rows]
    data = str(setup / "prompts.jsonl")
    code, out, err = cli(capsys, setup, tmp_path, max_length=12, data=data, eval_data=data)
    assert code == 0, err[-2000:]
    too_long = sum(n > 6 for n in lengths)
    assert 0 < too_long < len(rows)
    said = f"skipped {too_long:,} training prompts longer than --max-length 12 minus --max-completion-length 6"
    assert said in out + err
    long = write_jsonl(tmp_path / "long.jsonl", [r for r, n in zip(rows, lengths) if n > 6])
    code, _, err = cli(capsys, setup, tmp_path, max_length=12, data=str(long), eval_data=data)
    assert code == 2 and "no training prompt fits in --max-length 12 minus --max-completion-length 6" in one_line(err)


# -- the sampler of reused generations ----------------------------------------------------------------------------
@pytest.mark.parametrize("processes,accumulation", [(1, 1), (2, 2)])
def test_each_global_batch_comes_as_often_as_its_generation_is_reused_and_a_seek_lands_inside(processes, accumulation):
    def sampler(times):
        return grpo.RepeatedSampler(np.arange(23) % 5, 2, accumulation, processes, seed=1, times=times)

    once, thrice = list(sampler(1)), list(sampler(3))
    per_step = accumulation * processes
    steps = [once[i : i + per_step] for i in range(0, len(once), per_step)]
    assert thrice == [micro for step in steps for micro in step * 3]
    assert sampler(3).steps_per_epoch() == 3 * sampler(1).steps_per_epoch() == 3 * len(steps)
    assert len(sampler(3)) == len(thrice)
    seeked = sampler(3)
    seeked.start_at(0, 4)  # the second repeat of global batch 1
    rest = list(seeked)
    assert rest == thrice[4 * per_step :] and len(seeked) == len(rest)


# -- chats, LoRA, evaluation ---------------------------------------------------------------------------------------
def test_chat_prompts_render_as_the_policy_renders_them_and_rewards_see_messages(setup, tmp_path, run):
    from transformers import AutoTokenizer

    from leantrain.data.lm import CHAT_TEMPLATE
    from leantrain.tasks import policy

    rows = [json.loads(x) for x in (setup / "prompts.jsonl").read_text().splitlines()]
    chats = [[{"role": "user", "content": r["prompt"]}] for r in rows]
    data = write_jsonl(tmp_path / "chats.jsonl", [{"prompt": c, "answer": r["answer"]} for c, r in zip(chats, rows)])
    tokenizer = AutoTokenizer.from_pretrained(setup / "model")
    tokenizer.chat_template = CHAT_TEMPLATE
    texts = [r["prompt"] for r in rows]
    assert grpo.encode_prompts(tokenizer, chats) == [policy.encode_prompt(tokenizer, c) for c in chats]
    assert grpo.encode_prompts(tokenizer, texts) == [policy.encode_prompt(tokenizer, t) for t in texts]
    result, _ = run(
        data=str(data), chat_template=CHAT_TEMPLATE, reward="tests.tasks.grpo_rewards:chat_letters", max_steps=2
    )
    assert log_rows(result)[-1]["rewards/chat_letters/mean"] > 0


def test_lora_trains_the_adapters_with_the_base_as_reference(run, capfd):
    result, _ = run(lora=True, kl_beta=0.5, max_steps=3, batch_size=2, lr=0.05, optimizer="adamw")
    assert "the reference is the model with its LoRA adapters disabled" in capfd.readouterr().err
    rows = log_rows(result)
    assert rows[0]["kl"] == pytest.approx(0.0, abs=1e-7) and rows[-1]["kl"] > 0  # the adapters move the policy


def test_evaluation_scores_each_prompts_greedy_completion(setup, tmp_path, run, capsys):
    """Half the evaluation answers are the model's own greedy completions (by transformers' generate): the
    evaluation's exact-match reward is 0.5, and `leantrain evaluate` gives the run's model the same score."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from leantrain import evaluate
    from leantrain.errors import ConfigError

    tokenizer = AutoTokenizer.from_pretrained(setup / "model")
    model = AutoModelForCausalLM.from_pretrained(setup / "model").eval()
    rows = [json.loads(x) for x in (setup / "prompts.jsonl").read_text().splitlines()][:10]
    for i, r in enumerate(rows):
        ids = tokenizer(r["prompt"], return_tensors="pt")["input_ids"]
        with torch.no_grad():
            out = model.generate(ids, max_new_tokens=6, do_sample=False, pad_token_id=tokenizer.pad_token_id)
        greedy = tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True)
        r["answer"] = greedy if i % 2 == 0 else greedy + " and more"
    held = write_jsonl(tmp_path / "held.jsonl", rows)
    result, _ = run(eval_data=str(held), reward="exact-match", reward_column="answer", max_steps=1, lr=1e-30)
    assert result.metrics["eval_reward"] == 0.5 == result.metrics["eval_rewards/exact_match/mean"]
    again = evaluate(str(result.output_dir), data=str(held))
    assert again["reward"] == 0.5 and again["prompts"] == 10
    # another file's answers in another column: guessed among the usual names (not the run's column), else named
    # with --reward-column
    solutions = write_jsonl(tmp_path / "s.jsonl", [{"prompt": r["prompt"], "solution": r["answer"]} for r in rows])
    assert evaluate(str(result.output_dir), data=str(solutions))["reward"] == 0.5
    gold = write_jsonl(tmp_path / "g.jsonl", [{"prompt": r["prompt"], "gold": r["answer"]} for r in rows])
    with pytest.raises(ConfigError, match="name it with --reward-column"):
        evaluate(str(result.output_dir), data=str(gold))
    assert evaluate(str(result.output_dir), data=str(gold), reward_column="gold")["reward"] == 0.5
    capsys.readouterr()
    assert main(["evaluate", str(result.output_dir), "--data", str(gold), "--reward-column", "gold"]) == 0
    assert json.loads(capsys.readouterr().out)["reward"] == 0.5


def test_evaluate_without_data_scores_the_runs_own_held_out_prompts(run):
    """`leantrain evaluate RUN` with no --data scores the prompts the run held out, as its final evaluation did."""
    from leantrain import evaluate

    result, _ = run(max_steps=1, lr=1e-30)  # the weights stay as evaluated
    again = evaluate(str(result.output_dir))
    assert again["examples"] == 2 and again["reward"] == pytest.approx(result.metrics["eval_reward"])


def test_a_bf16_runs_generation_casts_each_weight_once(run, monkeypatch):
    """The trainer puts one autocast around a step's generation: each weight is cast to bf16 once for all of a
    rollout's tokens, not once a token (the model autocasts each forward itself)."""
    most = casts_in(monkeypatch, generation, "_sample")
    run(precision="bf16", max_steps=2)
    assert len(most) >= 2 and set(most) == {1}  # rollouts of up to 6 new tokens


def test_rollouts_sample_with_the_evaluations_kernel(run, monkeypatch):
    """Where auto trains eager (a CPU with native bf16, made so here), rollouts sample with SDPA, the evaluations'
    kernel (no backward pass), and training runs eager."""
    from transformers.models.llama import modeling_llama

    from leantrain.model import attention

    monkeypatch.setattr(attention, "_cpu_has_native_bf16", lambda: True)
    eager = {"sampling": 0, "training": 0}
    sampling = [False]
    original_attention, original_sample = modeling_llama.eager_attention_forward, generation._sample

    def spy(module, *args, **kwargs):
        if sampling[0] or module.training:
            eager["sampling" if sampling[0] else "training"] += 1
        return original_attention(module, *args, **kwargs)

    def flagged(*args):
        sampling[0] = True
        try:
            return original_sample(*args)
        finally:
            sampling[0] = False

    monkeypatch.setattr(modeling_llama, "eager_attention_forward", spy)
    monkeypatch.setattr(generation, "_sample", flagged)
    result, _ = run(precision="bf16", max_steps=2)
    assert result.metrics["attention"] == "eager" and result.metrics["eval_attention"] == "sdpa"
    assert eager == {"sampling": 0, "training": eager["training"]} and eager["training"] > 0


@pytest.mark.parametrize("reuse", [1, 2])
def test_each_generation_samples_anew_and_its_reusing_steps_train_on_it_again(run, reuse):
    """Four prompts, all in every step, weights that cannot move: each generation's completions differ from the
    last's (the generation is in the seed), and with two steps a generation, steps 1 and 2 train on the same."""
    recorder = Recorder()
    run(hooks=recorder, max_steps=4, batch_size=4, limit=4, lr=1e-30, iterations_per_generation=reuse)
    steps = [sorted(c) for c in completions_of(recorder)]
    assert len(steps) == 4
    if reuse == 1:
        assert all(a != b for a, b in itertools.pairwise(steps))
    else:
        assert steps[0] == steps[1] and steps[2] == steps[3] and steps[1] != steps[2]
