"""The shared policy pieces (tasks/policy.py) on a tiny Llama in fp32: completion log-probabilities against a
by-hand computation from the model's own logits (packed and padded alike, prompt tokens never counted), the fused
head's values and gradients against autograd's, and the reference model's three forms against each other."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from leantrain.model import losses
from leantrain.tasks import policy
from leantrain.tasks.causal_lm import IGNORE
from tests.tasks.test_causal_lm import tiny_llama, write_tiny_llama


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory) -> Path:
    return write_tiny_llama(tmp_path_factory.mktemp("tiny-llama-policy"))


def sequences(vocab: int, seed: int = 0) -> list[tuple[np.ndarray, np.ndarray]]:
    """Prompts of 3 to 9 tokens and completions of 1 to 6, of different lengths (so padding and packing differ)."""
    rng = np.random.default_rng(seed)
    return [
        (rng.integers(2, vocab, size=int(p)), rng.integers(2, vocab, size=int(c)))
        for p, c in [(3, 1), (9, 4), (5, 6), (4, 2), (7, 3)]
    ]


def by_hand(model, seqs) -> torch.Tensor:
    """Each sequence alone through the model, every position's logits: the log-probability of its completion's
    tokens given what precedes them, summed."""
    out = []
    with torch.no_grad():
        for prompt, completion in seqs:
            ids = torch.tensor(np.concatenate([prompt, completion]), dtype=torch.long)[None]
            log_probs = torch.log_softmax(model(input_ids=ids).logits[0].float(), -1)
            at = len(prompt)
            out.append(sum(log_probs[at - 1 + k, int(t)] for k, t in enumerate(completion)))
    return torch.stack(out)


@pytest.mark.parametrize("rows", [None, [[0, 1], [2], [3, 4]]], ids=["padded", "packed"])
@pytest.mark.parametrize("mode", ["fused", "rows", "full"])
def test_completion_logps_are_the_models_own_over_completion_tokens_only(llama_dir, rows, mode):
    model = tiny_llama(llama_dir)
    seqs = sequences(model.config.vocab_size)
    batch = policy.sequence_batch(seqs, pad_token_id=0, rows=rows)
    computer = policy.CompletionLogps(model)
    assert computer.mode == "fused"  # a plain Llama takes the fused head
    computer.mode = mode
    with torch.no_grad():
        got = computer(model.eval(), batch)
    expected = by_hand(model, seqs)
    assert torch.allclose(got.total, expected, atol=1e-5), (got.total, expected)
    assert got.tokens.tolist() == [len(c) for _, c in seqs]
    # the prompt's tokens carry no label: counting them changes the sums (so the comparison above would see it)
    for i, (_, completion) in enumerate(seqs):
        assert int((batch["labels"][batch["sequence_ids"] == i] != IGNORE).sum()) == len(completion)
    counted_prompts = dict(batch, labels=torch.where(batch["sequence_ids"] >= 0, batch["input_ids"], IGNORE))
    with torch.no_grad():
        assert not torch.allclose(computer(model, counted_prompts).total, expected, atol=1e-3)


def test_packed_rows_keep_sequences_apart_and_restart_positions(llama_dir):
    model = tiny_llama(llama_dir)
    seqs = sequences(model.config.vocab_size, seed=1)
    batch = policy.sequence_batch(seqs, pad_token_id=0, rows=[[0, 1, 2], [3, 4]])
    assert "attention_mask" not in batch
    first = len(seqs[0][0]) + len(seqs[0][1])
    assert batch["position_ids"][0, first] == 0 and batch["sequence_ids"][0, first] == 1
    assert (batch["sequence_ids"][1, sum(len(p) + len(c) for p, c in seqs[3:]) :] == -1).all()


@pytest.mark.parametrize("chunk", [4096, 3], ids=["one-chunk", "chunked"])
def test_the_fused_head_gives_autograds_values_and_gradients(monkeypatch, chunk):
    """Values and every gradient (hidden states, weight, bias) under per-row upstream gradients, in one chunk (the
    softmax kept) and in chunks of 3 rows (recomputed in backward)."""
    monkeypatch.setattr(losses, "HEAD_CHUNK_ROWS", chunk)
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(10, 16, generator=g, dtype=torch.float64).float().requires_grad_()
    weight = torch.randn(50, 16, generator=g).requires_grad_()
    bias = torch.randn(50, generator=g).requires_grad_()
    targets = torch.randint(0, 50, (10,), generator=g)
    upstream = torch.randn(10, generator=g)
    fused = losses.head_token_logps(hidden, weight, bias, targets)
    fused_grads = torch.autograd.grad((fused * upstream).sum(), (hidden, weight, bias))
    plain = torch.log_softmax(hidden @ weight.t() + bias, -1).gather(1, targets[:, None]).squeeze(1)
    plain_grads = torch.autograd.grad((plain * upstream).sum(), (hidden, weight, bias))
    assert torch.allclose(fused, plain, atol=1e-5)
    for a, b in zip(fused_grads, plain_grads):
        assert torch.allclose(a, b, atol=1e-5)


def test_the_fused_head_under_bf16_autocast_stays_close():
    g = torch.Generator().manual_seed(1)
    hidden = torch.randn(6, 32, generator=g, requires_grad=True)
    weight = torch.randn(40, 32, generator=g, requires_grad=True)
    targets = torch.randint(0, 40, (6,), generator=g)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        fused = losses.head_token_logps(hidden, weight, None, targets)
    assert fused.dtype == torch.float32
    plain = torch.log_softmax(hidden @ weight.t(), -1).gather(1, targets[:, None]).squeeze(1)
    assert torch.allclose(fused, plain, rtol=0.05, atol=0.5)
    fused.sum().backward()
    assert hidden.grad is not None and weight.grad is not None and weight.grad.dtype == torch.float32


def test_the_trained_policys_gradients_through_the_fused_head_are_the_full_logits(llama_dir):
    """The same weighted sum of completion log-probabilities, its gradient through the fused head and through every
    position's logits: every parameter's gradient alike."""
    seqs = sequences(300, seed=2)
    batch = policy.sequence_batch(seqs, pad_token_id=0)
    weights = torch.linspace(-1.0, 2.0, len(seqs))
    grads = []
    for mode in ("fused", "full"):
        model = tiny_llama(llama_dir).train()
        computer = policy.CompletionLogps(model)
        computer.mode = mode
        (computer(model, batch).total * weights).sum().backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
    for name in grads[0]:
        assert torch.allclose(grads[0][name], grads[1][name], atol=1e-5), name


def _lora(model):
    from peft import LoraConfig, get_peft_model

    peft_model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules="all-linear"))
    with torch.no_grad():  # adapters that change the model (peft starts B at zero)
        for name, p in peft_model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5, generator=torch.Generator().manual_seed(len(name)))
    return peft_model


def test_the_lora_reference_with_adapters_off_is_a_frozen_copy_of_the_base(llama_dir):
    base = tiny_llama(llama_dir)
    frozen = policy.FrozenCopy(base, torch.float32)
    peft_model = _lora(base).train()
    batch = policy.sequence_batch(sequences(300, seed=3), pad_token_id=0, rows=[[0, 1], [2, 3, 4]])
    computer = policy.CompletionLogps(peft_model)
    adapters_off = policy.AdaptersOff(computer).logps(peft_model, batch)
    assert peft_model.training  # restored
    assert torch.allclose(adapters_off, frozen.logps(peft_model, batch), atol=1e-6)
    with torch.no_grad():
        policy_logps = computer(peft_model, batch).total
    assert not torch.allclose(policy_logps, adapters_off, atol=1e-3)  # the adapters matter: the test can fail


def test_precomputed_reference_logps_are_the_live_references(llama_dir):
    model = tiny_llama(llama_dir).train()
    seqs = sequences(300, seed=4)
    computer = policy.CompletionLogps(model)
    batches = []
    for part in ([0, 1, 2], [3, 4]):
        batch = policy.sequence_batch([seqs[i] for i in part], pad_token_id=0)
        batches.append({**batch, "sequence_index": torch.tensor(part)})
    stored = policy.precompute(policy.Unchanged(computer), model, batches)
    live = policy.FrozenCopy(model, torch.float32).logps(model, policy.sequence_batch(seqs, pad_token_id=0))
    assert sorted(stored) == [0, 1, 2, 3, 4]
    assert np.allclose([stored[i] for i in range(5)], live.numpy(), atol=1e-6)
    batch = {**policy.sequence_batch(seqs, 0), "reference_logps": torch.tensor([stored[i] for i in range(5)])}
    assert torch.allclose(policy.Precomputed().logps(model, batch), live, atol=1e-6)


@pytest.fixture(scope="module")
def chat_tokenizer():
    from leantrain.data.lm import CHAT_TEMPLATE, train_bpe_tokenizer

    tokenizer = train_bpe_tokenizer(["the cat sat on the mat", "user: hello", "assistant: yes no maybe"], 300)
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def test_a_completion_follows_its_prompts_tokens_as_generation_continues_them(chat_tokenizer):
    tok = chat_tokenizer
    prompt, completion = policy.encode_completion(tok, "the cat", " sat on the mat")
    assert prompt == policy.encode_prompt(tok, "the cat")
    assert completion[-1] == tok.eos_token_id and tok.decode(completion[:-1]) == " sat on the mat"
    chat = [{"role": "user", "content": "hello"}]
    answer = [{"role": "assistant", "content": "yes"}]
    prompt, completion = policy.encode_completion(tok, chat, answer)
    assert prompt == policy.encode_prompt(tok, chat)
    assert tok.decode(prompt) == "user: hello\nassistant:\n"
    assert tok.decode(completion) == f"yes{tok.eos_token}"  # the template's own EOS ends it, not a second one
    assert tok.decode(prompt + completion) == tok.apply_chat_template(chat + answer, tokenize=False)


def test_the_shared_prompt_of_two_conversations_is_their_common_start():
    user = {"role": "user", "content": "hi"}
    chosen = [user, {"role": "assistant", "content": "hello"}]
    rejected = [user, {"role": "assistant", "content": "go away"}]
    assert policy.shared_prompt(chosen, rejected) == 1
    assert policy.shared_prompt(chosen, chosen) == 1  # never the final answer itself
    assert policy.shared_prompt([{"role": "user", "content": "a"}, *chosen[1:]], rejected) == 0
