"""Online RL (`--task grpo`) on a tiny Llama in fp32: advantages against their formulas, the loss and its gradient
against a computation by hand, the first steps' losses against TRL's GRPOTrainer, accumulation and two processes
against one big batch, a killed run resumed bitwise (completions included), prompt tokens never counted, and bad
input refused in one line."""

from __future__ import annotations

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
from leantrain.errors import ConfigError, DataError
from leantrain.model import generation
from leantrain.tasks import grpo
from leantrain.tasks.causal_lm import IGNORE
from leantrain.training.hooks import Hooks
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
    rows = [{"prompt": " ".join(rng.choices(WORDS, k=rng.randint(1, 8))), "answer": rng.choice(WORDS)} for _ in range(24)]
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
        result = train(TrainConfig(**job(setup, tmp_path, output_dir=str(tmp_path / f"run{next(count)}"), **changes)), hooks=hooks)
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


# -- advantages ---------------------------------------------------------------------------------------------------------
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
    train(TrainConfig(**job(setup, tmp_path, max_steps=2, batch_size=2, grad_accum=2, output_dir=str(tmp_path / "r"))), hooks=recorder)
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
