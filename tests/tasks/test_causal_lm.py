"""The causal-LM task on a tiny Llama built from a config (fp32, no dropout): packing keeps documents apart,
accumulation is exact at the token level, resume is bitwise, and the trained model loads in a pipeline."""

from __future__ import annotations

import json
import math
import random
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from leantrain import TrainConfig, train
from leantrain.data.lm import LMCollator, pack, train_bpe_tokenizer
from leantrain.data.tokenize import TokenizedText
from leantrain.errors import ConfigError, DataError
from leantrain.tasks.causal_lm import CausalLM, check_packing_separates, token_losses
from tests.conftest import EXACT_JOB, assert_trained_alike

WORDS = [
    "the",
    "a",
    "cat",
    "dog",
    "sat",
    "ran",
    "on",
    "under",
    "mat",
    "park",
    "big",
    "small",
    "red",
    "blue",
    "ball",
    "sun",
    "moon",
    "was",
    "is",
    "and",
]


def documents(n: int, seed: int) -> list[str]:
    """Documents of very different lengths (2 to 60 words), so rows count very different numbers of tokens."""
    rng = random.Random(seed)
    return [" ".join(rng.choices(WORDS, k=rng.choice([2, 3, 5, 40, 60]))) for _ in range(n)]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("lm") / "corpus.txt"
    path.write_text("\n\n".join(documents(120, seed=0)) + "\n")
    return path


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory) -> Path:
    return write_tiny_llama(tmp_path_factory.mktemp("tiny-llama"))


def write_tiny_llama(folder: Path) -> Path:
    """A 2-layer Llama (hidden 32) config with no weights (trained from scratch) and a BPE tokenizer."""
    from transformers import LlamaConfig

    tokenizer = train_bpe_tokenizer(documents(200, seed=1), vocab_size=300)
    tokenizer.save_pretrained(folder)
    LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        attention_dropout=0.0,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        architectures=["LlamaForCausalLM"],
    ).save_pretrained(folder)
    return folder


def tiny_llama_job(folder: Path) -> tuple[Path, Path]:
    """A tiny Llama with seeded random weights saved (every run starts from the same ones) and a corpus of 120
    documents beside it: (the model's folder, the corpus)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    model = write_tiny_llama(folder / "llama")
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(model)).save_pretrained(model)
    corpus = folder / "corpus.txt"
    corpus.write_text("\n\n".join(documents(120, seed=0)) + "\n")
    return model, corpus


def tiny_llama(llama_dir: Path, attn: str = "sdpa"):
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(0)
    config = AutoConfig.from_pretrained(llama_dir)
    return AutoModelForCausalLM.from_config(config, attn_implementation=attn).eval()


# -- packing keeps documents apart ---------------------------------------------------------------------------------
def docs_of(lengths: list[int], vocab: int, seed: int = 0) -> TokenizedText:
    rng = np.random.default_rng(seed)
    ids = rng.integers(2, vocab, size=sum(lengths)).astype(np.int32)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    return TokenizedText(ids, offsets)


def test_token_losses_are_transformers_own_causal_lm_loss(llama_dir):
    """The per-token loss, summed and divided by the counted tokens, is the loss transformers computes from the same
    labels (its ForCausalLMLoss shifts them): an oracle outside leantrain, with uncounted (-100) labels mid-row and at
    both ends; and the gradient it gives the logits is the same too."""
    model = tiny_llama(llama_dir)
    ids = torch.randint(2, model.config.vocab_size, (3, 17), generator=torch.Generator().manual_seed(0))
    labels = ids.clone()
    labels[0, :5], labels[1, 7:9], labels[2, -3:] = -100, -100, -100
    logits = model(input_ids=ids).logits.detach().requires_grad_()
    ours = token_losses(logits, labels)
    counted = int((labels[:, 1:] != -100).sum())
    assert ours.shape == (3, 16) and float(ours[0, :4].abs().sum()) == 0.0  # uncounted targets cost nothing
    theirs = model.loss_function(logits=logits, labels=labels, vocab_size=model.config.vocab_size)
    assert float(ours.sum() / counted) == pytest.approx(float(theirs), rel=1e-6)
    (g_ours,) = torch.autograd.grad(ours.sum() / counted, logits)
    (g_theirs,) = torch.autograd.grad(theirs, logits)
    assert torch.allclose(g_ours, g_theirs, atol=1e-7)


def uneven_counted_batch(vocab: int) -> dict[str, torch.Tensor]:
    """Three rows of 17 tokens whose uncounted (-100) labels lie at the start (a prompt), mid-row and at the end."""
    ids = torch.randint(2, vocab, (3, 17), generator=torch.Generator().manual_seed(0))
    labels = ids.clone()
    labels[0, :5], labels[1, 7:9], labels[2, -3:] = -100, -100, -100
    return {"input_ids": ids, "labels": labels}


@pytest.mark.parametrize("fused", [True, False], ids=["head-and-loss-fused", "counted-logits"])
def test_training_computes_logits_only_where_a_token_counts(llama_dir, corpus, fused, monkeypatch):
    """The output head runs on the counted positions alone, with the loss in one chunked pass (the logits never
    whole) or as logits of (counted tokens, vocabulary): the same loss and the same gradient for every weight as
    the full logits give (up to rounding); evaluation, a later call and a compiled model keep every position's."""
    import leantrain.model.losses

    monkeypatch.setattr(leantrain.model.losses, "HEAD_CHUNK_ROWS", 7)  # several chunks, the last one short
    model = tiny_llama(llama_dir).train()
    task = CausalLM(TrainConfig(model=str(llama_dir), data=str(corpus), packing=False))
    task.check_model(model)
    assert task.selects_logits and task.fuses_head_loss
    task.fuses_head_loss = fused
    batch = uneven_counted_batch(model.config.vocab_size)
    weights = [p for p in model.parameters() if p.requires_grad]
    full = task.loss_sum(model(input_ids=batch["input_ids"]), batch)
    full_grads = torch.autograd.grad(full, weights)
    out = task.forward(model, batch)
    counted = int((batch["labels"][:, 1:] != -100).sum())
    assert out.logits.shape == (() if fused else (counted, model.config.vocab_size))
    assert task.tail_rows(batch) == counted
    selected = task.loss_sum(out, batch)
    assert float(selected.detach()) == pytest.approx(float(full.detach()), rel=1e-6)
    for p, g_full, g in zip(weights, full_grads, torch.autograd.grad(selected, weights)):
        # the chunks' sums round in another order: each gradient within 1e-6 of its largest entry
        assert torch.allclose(g, g_full, rtol=1e-5, atol=1e-6 * float(g_full.abs().max())), p.shape
    assert model(input_ids=batch["input_ids"]).logits.dim() == 3  # the head is itself again
    with torch.no_grad():  # evaluation selects too, and its rows are those of every position's logits
        logits = model.eval()(input_ids=batch["input_ids"]).logits
        rows = task.eval_rows(task.forward(model, batch), batch)
    assert torch.allclose(rows["loss_sum"], token_losses(logits, batch["labels"]).sum(-1), rtol=1e-6)
    assert torch.equal(rows["tokens"], (batch["labels"][:, 1:] != -100).sum(-1))
    compiled = CausalLM(TrainConfig(model=str(llama_dir), data=str(corpus), packing=False, compile=True))
    compiled.check_model(model)
    assert not compiled.selects_logits and compiled.tail_rows(batch) is None
    assert compiled.forward(model, batch).logits.shape == (3, 17, model.config.vocab_size)


@pytest.mark.parametrize("mode", ["fused", "counted-logits", "all-logits"])
def test_row_losses_are_each_rows_part_of_the_summed_loss(llama_dir, corpus, mode):
    """A mixture's training loss per source adds each row's part: the fused head writes each counted token's loss
    as it goes, which must be the row's loss from the full logits (and add up to `loss_sum`)."""
    model = tiny_llama(llama_dir).train()
    task = CausalLM(TrainConfig(model=str(llama_dir), data=str(corpus), packing=False))
    task.check_model(model)
    task.fuses_head_loss, task.selects_logits = mode == "fused", mode != "all-logits"
    batch = {**uneven_counted_batch(model.config.vocab_size), "source": torch.tensor([0, 1, 0])}
    with torch.no_grad():
        expected = token_losses(model(input_ids=batch["input_ids"]).logits, batch["labels"]).sum(-1)
    out = task.forward(model, batch)
    rows = task.row_losses(out, batch)
    assert rows.shape == (3,) and torch.allclose(rows, expected, rtol=1e-5)
    assert float(rows.sum()) == pytest.approx(float(task.loss_sum(out, batch)), rel=1e-5)


def test_a_mixture_by_tokens_draws_its_weights_and_scores_each_source_as_evaluate_does(run, tmp_path):
    """Unpacked rows of 2 to 60 words, one source long documents, the other short: by tokens, the epoch's training
    tokens follow the weights (by examples they would not); each source's held-out loss is `evaluate`'s on it."""
    from leantrain.inference import evaluate

    sources = []
    for name, seed, lengths in (("long", 11, [40, 60]), ("short", 12, [2, 3, 5])):
        rng = random.Random(seed)
        docs = [" ".join(rng.choices(WORDS, k=rng.choice(lengths))) for _ in range(60)]
        (tmp_path / f"{name}.txt").write_text("\n\n".join(docs[:45]) + "\n")
        (tmp_path / f"{name}-dev.txt").write_text("\n\n".join(docs[45:]) + "\n")
        sources.append({"path": str(tmp_path / f"{name}.txt"), "eval_data": str(tmp_path / f"{name}-dev.txt")})
    sources[0]["weight"], sources[1]["weight"] = 0.6, 0.4
    result, _ = run(data=sources, mix_by="tokens", packing=False, batch_size=8, epochs=1, log_every=2)
    drawn = result.metrics["sources"]
    assert drawn["long"]["share_tokens"] == pytest.approx(0.6, abs=0.03)
    assert drawn["short"]["share_examples"] > 0.75  # many short rows for as many tokens
    for name in ("long", "short"):
        alone = evaluate(str(result.output_dir), sources[name == "short"]["eval_data"])
        assert drawn[name]["eval_loss"] == pytest.approx(alone["loss"], rel=1e-5)
        assert drawn[name]["eval_perplexity"] == pytest.approx(alone["perplexity"], rel=1e-5)
        assert drawn[name]["train_loss"] is not None
    assert drawn["long"]["eval_loss"] != drawn["short"]["eval_loss"]


def test_a_preset_learns_its_tokenizer_from_every_source_of_a_mixture(tmp_path):
    a, b = tmp_path / "a.txt", tmp_path / "b.txt"
    a.write_text("\n\n".join(documents(80, seed=1)) + "\n")
    b.write_text("\n\n".join(["zebra quokka narwhal " * 3] * 40) + "\n")
    cfg = TrainConfig(model="preset:tiny-llama", data=[f"{a}@0.9", f"{b}@0.1"], cache_dir=str(tmp_path), max_length=32)
    tokenizer = CausalLM(cfg).prepare_data("preset:tiny-llama", None).processor
    assert all(len(tokenizer.tokenize(f" {w}")) == 1 for w in ("quokka", "narwhal", "sun", "moon"))


class ReshapingLM(torch.nn.Module):
    """A causal LM whose forward reshapes its logits to (batch, length, vocabulary), whatever its head gave."""

    def __init__(self, inner):
        super().__init__()
        self.inner, self.config = inner, inner.config

    def get_output_embeddings(self):
        return self.inner.get_output_embeddings()

    def forward(self, input_ids, **kwargs):
        from types import SimpleNamespace

        return SimpleNamespace(logits=self.inner(input_ids=input_ids, **kwargs).logits.reshape(*input_ids.shape, -1))


def test_logits_are_selected_only_where_they_are_the_heads_rows(llama_dir, corpus):
    """A model whose logits are not its output head's rows (here reshaped after the head) keeps every position's
    logits: it trains as it computes, not with a cut it would misread."""
    from leantrain.tasks.causal_lm import head_rows_work

    model = tiny_llama(llama_dir)
    reshaping = ReshapingLM(model)
    assert head_rows_work(model) and not head_rows_work(reshaping)
    task = CausalLM(TrainConfig(model=str(llama_dir), data=str(corpus), packing=False))
    task.check_model(reshaping)
    assert not task.selects_logits
    batch = uneven_counted_batch(model.config.vocab_size)
    assert task.forward(reshaping.train(), batch).logits.shape == (3, 17, model.config.vocab_size)


class ScalingLM(ReshapingLM):
    """A causal LM that scales its head's output (as Cohere's `logit_scale` does): its rows are the head's rows, but
    its loss is not the head's loss."""

    def forward(self, input_ids, **kwargs):
        from types import SimpleNamespace

        return SimpleNamespace(logits=self.inner(input_ids=input_ids, **kwargs).logits * 2.0)


def test_the_head_and_loss_fuse_only_where_the_logits_are_the_heads_output(llama_dir, corpus):
    """A model that scales its logits after the head keeps the counted-logits cut but not the fused loss (which
    would read the scale as part of the loss), and trains with the loss of its scaled logits."""
    from leantrain.tasks.causal_lm import head_loss_works

    model = tiny_llama(llama_dir)
    scaling = ScalingLM(model)
    assert head_loss_works(model) and not head_loss_works(scaling)
    task = CausalLM(TrainConfig(model=str(llama_dir), data=str(corpus), packing=False))
    task.check_model(scaling)
    assert task.selects_logits and not task.fuses_head_loss
    batch = uneven_counted_batch(model.config.vocab_size)
    whole = task.loss_sum(scaling.train()(input_ids=batch["input_ids"]), batch).detach()
    trained = task.loss_sum(task.forward(scaling, batch), batch).detach()
    assert float(trained) == pytest.approx(float(whole), rel=1e-6)
    # padded to a fixed length: the unfused head makes a full batch's logits (one shape, the peak a probe measures);
    # the fused loss stays, its logits never whole
    padded = CausalLM(TrainConfig(model=str(llama_dir), data=str(corpus), packing=False, pad_to_max_length=True))
    padded.check_model(scaling)
    assert not padded.selects_logits and padded.tail_rows(batch) is None
    assert padded.forward(scaling, batch).logits.shape == (*batch["input_ids"].shape, model.config.vocab_size)
    assert float(padded.loss_sum(padded.forward(scaling, batch), batch).detach()) == pytest.approx(float(whole), 1e-6)
    padded.check_model(model)
    assert padded.selects_logits and padded.fuses_head_loss


@pytest.mark.parametrize("selected", [True, False], ids=["counted-logits", "all-logits"])
def test_exact_match_rows_need_every_counted_token_to_be_the_argmax(selected):
    """Row 0's counted targets are all the argmax, row 1 misses one (and is right where nothing counts, which
    does not matter); from every position's logits or only the counted ones, the rows are the same."""
    from types import SimpleNamespace

    from leantrain.tasks.causal_lm import next_token_targets

    labels = torch.tensor([[-100, -100, 2, 3, 1], [-100, 4, 0, -100, -100]])
    targets = next_token_targets(labels)
    logits = torch.zeros(2, 5, 6)
    for r, t in (targets != -100).nonzero().tolist():
        logits[r, t, targets[r, t]] = 5.0
    logits[1, 1, 3] = 9.0  # row 1's second counted token is not the argmax
    logits[1, 3, 5] = 9.0  # an uncounted position: ignored
    counted = targets != -100
    rows = CausalLM(None).eval_rows(SimpleNamespace(logits=logits[counted] if selected else logits), {"labels": labels})
    assert rows["exact"].tolist() == [1, 0] and rows["tokens"].tolist() == [3, 2]
    assert rows["loss_sum"][1] > rows["loss_sum"][0] > 0


def test_flops_of_a_forward_that_selects_logits_are_what_it_computes(llama_dir, corpus):
    """The FLOP meter's count of a training micro-batch whose head ran on its counted positions only equals what
    torch's FlopCounterMode counts for that forward and backward (an oracle outside leantrain)."""
    from dataclasses import replace

    from torch.utils.flop_counter import FlopCounterMode

    from leantrain.telemetry.flops import FlopMeter, flop_model

    model = tiny_llama(llama_dir, "eager").train()  # FlopCounterMode does not count CPU SDPA kernels
    task = CausalLM(TrainConfig(model=str(llama_dir), data=str(corpus), packing=False))
    task.check_model(model)
    batch = uneven_counted_batch(model.config.vocab_size)
    # the fused head and loss accumulates the head's weight gradient in place (addmm_, which torch's table lacks)
    in_place = {torch.ops.aten.addmm_: lambda _c, a, b, out_shape=None: 2 * a[0] * a[1] * b[1]}
    with FlopCounterMode(display=False, custom_mapping=in_place) as counter:
        task.loss_sum(task.forward(model, batch), batch).backward()
    meter = FlopMeter(replace(flop_model(model), tail_per_row=task.tail_flops(model)))
    counted = meter.add(batch["input_ids"], None, None, task.tail_rows(batch))
    assert counted == pytest.approx(counter.get_total_flops(), rel=1e-9)
    assert meter.useful_flops == pytest.approx(counted, rel=1e-12)  # no padding in these rows


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_a_packed_row_gives_each_document_its_own_per_token_losses(llama_dir, attn):
    model = tiny_llama(llama_dir, attn)
    vocab = model.config.vocab_size
    lengths = [7, 12, 1, 5, 30]  # the last crosses into a second row: its second chunk is a segment of its own
    docs = docs_of(lengths, vocab)
    rows = pack(docs, max_length=32)
    assert len(rows) == 2
    batch = LMCollator(pad_token_id=1, packing=True)([{**rows.row(i), "slot": _slot(i)} for i in range(len(rows))])
    task = CausalLM(TrainConfig(packing=True))
    with torch.no_grad():
        packed = token_losses(model(**task.model_inputs(batch)).logits, batch["labels"])
    # every segment alone, unpacked (the tail of the long document is its second chunk alone)
    starts = np.flatnonzero(batch["position_ids"].flatten().numpy() == 0)
    flat_ids, flat_labels = batch["input_ids"].flatten(), batch["labels"].flatten()
    width = batch["input_ids"].shape[1]
    checked = 0
    for a, b in zip(starts, [*starts[1:], batch["input_ids"].numel()]):
        row, col, n = a // width, a % width, b - a
        if n < 2 or (flat_labels[a + 1 : b] == -100).all():
            continue  # nothing predicted (a one-token document, or the padding segment)
        with torch.no_grad():
            alone_logits = model(input_ids=flat_ids[a:b].unsqueeze(0), use_cache=False).logits
        alone = token_losses(alone_logits, flat_labels[a:b].unsqueeze(0))[0]
        torch.testing.assert_close(packed[row, col : col + n - 1], alone, atol=1e-5, rtol=0)
        checked += 1
    assert checked == 5  # 7, 12, 5, and the two chunks of 30 (the 1-token document predicts nothing)
    # and packing mattered: without restarting position ids, later documents see the earlier ones
    with torch.no_grad():
        leaky = token_losses(model(input_ids=batch["input_ids"], use_cache=False).logits, batch["labels"])
    assert (leaky - packed).abs().max() > 1e-3


def _slot(i: int):
    from leantrain.data.batching import Slot

    return Slot(i, 1.0, True)


def test_packing_is_refused_when_attention_ignores_position_ids(llama_dir, monkeypatch):
    from transformers import masking_utils

    model = tiny_llama(llama_dir)
    check_packing_separates(model)  # the real one keeps documents apart
    monkeypatch.setattr(masking_utils, "find_packed_sequence_indices", lambda position_ids: None)
    with pytest.raises(ConfigError, match="--no-packing"):
        check_packing_separates(model)


# -- training runs -------------------------------------------------------------------------------------------------
@pytest.fixture()
def run(llama_dir, corpus, tmp_path):
    count = iter(range(100))

    def go(**changes):
        base = dict(
            model=str(llama_dir),
            data=str(corpus),
            cache_dir=str(tmp_path / "cache"),
            output_dir=str(tmp_path / f"run{next(count)}"),
            max_length=32,
            report=False,
            metric_for_best="loss",
            **EXACT_JOB,
        )
        result = train(TrainConfig(**{**base, **changes}))
        return result, load_file(result.model_dir / "model.safetensors")

    return go


def test_a_text_file_of_one_document_says_what_ends_a_document_and_reads_one_a_line_when_asked(run, tmp_path, capsys):
    """Lines without a blank line between them are one document: the error says so and how to read one a line, not
    only 'only 1'; --text-documents lines then trains on one document a line, 10% of them held out."""
    lines = tmp_path / "lines.txt"
    lines.write_text("\n".join(documents(20, seed=3)) + "\n")
    expected = (
        "only 1 document (in text files a blank line ends a document; this one has 20 lines: --text-documents lines "
        "reads one a line); need two"
    )
    with pytest.raises(DataError, match=re.escape(expected)):
        run(data=str(lines))
    result, _ = run(data=str(lines), text_documents="lines")
    assert "held out 2 documents (10%" in capsys.readouterr().err and result.metrics["train_examples"] > 0


def loss_log(result) -> list[float]:
    rows = [json.loads(x) for x in (result.output_dir / "metrics.jsonl").read_text().splitlines()]
    return [r["loss"] for r in rows if "loss" in r]


@pytest.mark.parametrize("packing", [True, False], ids=["packed", "padded"])
def test_accumulated_micro_batches_equal_one_big_batch_per_token(run, packing):
    """Padded, each row is one document of 2 to 60 words: micro-batches hold very different counted tokens, and
    only dividing by the whole step's tokens (not each micro-batch's, nor examples) makes them add up."""
    big, w_big = run(batch_size=8, grad_accum=1, max_steps=5, packing=packing)
    small, w_small = run(batch_size=2, grad_accum=4, max_steps=5, packing=packing)
    _, start = run(batch_size=8, max_steps=5, packing=packing, lr=1e-30)
    assert small.metrics["micro_steps"] == 4 * big.metrics["micro_steps"]
    assert_trained_alike(w_big, w_small, start, rel=1e-5)
    assert loss_log(small) == pytest.approx(loss_log(big), abs=1e-5)


def test_a_resumed_run_equals_the_uninterrupted_one_bitwise(run):
    whole, w_whole = run(optimizer="adamw", lr=3e-3, max_steps=6, save_every=2, batch_size=4)
    ckpt = whole.output_dir / "checkpoints" / "step-000004"
    resumed, w_resumed = run(optimizer="adamw", lr=3e-3, max_steps=6, save_every=2, batch_size=4, resume=str(ckpt))
    assert resumed.metrics["resumed_from"] == str(ckpt)
    assert resumed.metrics["optimizer_steps"] == 6 and resumed.metrics["train_examples"] == 2 * 4
    different = [k for k in w_whole if not torch.equal(w_whole[k], w_resumed[k])]
    assert not different, f"{len(different)} tensors differ, e.g. {different[0]}"
    assert loss_log(resumed) == loss_log(whole)


def test_the_trained_model_generates_through_a_pipeline_and_reports_perplexity(run):
    from transformers import pipeline

    result, _ = run(optimizer="adamw", lr=3e-3, max_steps=4, batch_size=8)
    metrics = result.metrics
    assert metrics["eval_perplexity"] == pytest.approx(np.exp(metrics["eval_loss"]))
    generate = pipeline("text-generation", model=str(result.model_dir))
    out = generate("the cat", max_new_tokens=5, do_sample=False)[0]["generated_text"]
    assert out.startswith("the cat") and len(out) > len("the cat")


def test_the_logged_loss_is_the_mean_over_counted_tokens(run, llama_dir, corpus, tmp_path):
    """One step over every training row with weights that cannot move: the logged loss must be the loss per
    counted token over all rows, computed here from the saved model (not per row, not per micro-batch)."""
    from transformers import AutoModelForCausalLM

    from leantrain.data.batching import Slot

    result, _ = run(batch_size=64, grad_accum=4, max_steps=1, lr=1e-30, packing=False)
    cfg = TrainConfig(
        model=str(llama_dir),
        data=str(corpus),
        cache_dir=str(tmp_path / "cache"),
        max_length=32,
        packing=False,
        seed=EXACT_JOB["seed"],  # the same held-out documents
    )
    task = CausalLM(cfg)
    data = task.prepare_data(str(llama_dir), None)
    rows = data.train.features
    assert 64 * 4 >= len(rows) > 64  # one step holds every row, in several micro-batches
    model = AutoModelForCausalLM.from_pretrained(result.model_dir).eval()
    collate = task.collator(data, train=True)
    total, tokens = 0.0, 0
    for i in range(len(rows)):
        batch = collate([{**rows.row(i), "slot": Slot(i, 1.0, True)}])
        with torch.no_grad():
            total += float(token_losses(model(**task.model_inputs(batch)).logits, batch["labels"]).sum())
        tokens += int((batch["labels"] != -100).sum())
    assert tokens == int(rows.counted.sum())
    assert loss_log(result)[0] == pytest.approx(total / tokens, rel=1e-5)


@pytest.mark.slow
def test_two_processes_equal_one_at_the_token_level(run, llama_dir, corpus, tmp_path):
    """Two processes (gloo), one micro-batch of 4 rows each, against one process with 8: the same weights.
    Padded rows of 2 to 60 words give the two processes very different counted tokens every step."""
    from tests.parallel.test_data_parallel import flags, run_job, weights

    job = dict(
        model=llama_dir,
        data=corpus,
        cache_dir=tmp_path / "cache",
        max_length=32,
        report=False,
        packing=False,
        metric_for_best="loss",
        max_steps=4,
        **EXACT_JOB,
    )
    one, w_one = run(packing=False, max_steps=4, batch_size=8)
    out = tmp_path / "two"
    rc, _, err = run_job(["-m", "leantrain", "train", *flags(**job, batch_size=4, num_processes=2, output_dir=out)])
    assert rc == 0, err[-3000:]
    two = json.loads((out / "metrics.json").read_text())
    assert two["num_processes"] == 2 and two["global_batch"] == 8
    _, start = run(batch_size=8, max_steps=4, packing=False, lr=1e-30)
    assert_trained_alike(w_one, weights(out), start, rel=1e-5)
    assert two["eval_loss"] == pytest.approx(one.metrics["eval_loss"], abs=1e-6)


def test_useful_flops_of_a_packed_batch_count_attention_per_document():
    """Rows of packed documents (7+9 and 12+4 tokens) are useful work of four sequences alone, not two rows of
    16: the square term is 7**2 + 9**2 + 12**2 + 4**2, while the padded (device) count keeps 2 * 16**2."""
    from leantrain.telemetry.flops import FlopMeter, FlopModel

    model = FlopModel(per_sequence=0.0, per_token=100.0, per_token_sq=1.0, source="test")
    positions = torch.tensor([[*range(7), *range(9)], [*range(12), *range(4)]])
    packed = FlopMeter(model)
    padded = packed.add(torch.zeros(2, 16), None, positions)
    assert padded == 2 * (100 * 16 + 16**2)
    alone = FlopMeter(model)
    for n in (7, 9, 12, 4):
        alone.add(torch.zeros(1, n))
    assert packed.useful_flops == alone.useful_flops == 100 * 32 + 49 + 81 + 144 + 16


@pytest.fixture(scope="module")
def sentiment_prompts(tmp_path_factory) -> Path:
    rng = random.Random(5)
    lines = []
    for _ in range(160):
        good = rng.random() < 0.5
        words = rng.choices(["great", "lovely"] if good else ["bad", "dull"], k=2) + rng.choices(WORDS, k=3)
        rng.shuffle(words)
        completion = " positive" if good else " negative"
        lines.append(json.dumps({"prompt": f"Review: {' '.join(words)}\nSentiment:", "completion": completion}))
    path = tmp_path_factory.mktemp("sft") / "sft.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_a_preset_trains_its_tokenizer_on_the_instruction_rows(sentiment_prompts, tmp_path):
    """A preset trained from scratch on prompt / completion rows learns its BPE from prompts and completions (it was
    refused: "text column ambiguous among 'prompt', 'completion'"), so the completions are words of its vocabulary
    and the rows are instruction rows, only the completions counted."""
    cfg = TrainConfig(model="preset:tiny-llama", data=str(sentiment_prompts), cache_dir=str(tmp_path), max_length=64)
    data = CausalLM(cfg).prepare_data("preset:tiny-llama", None)
    tokenizer = data.processor
    assert len(tokenizer.tokenize(" positive")) == 1 and len(tokenizer.tokenize(" negative")) == 1
    rows = data.train.features
    assert 0 < rows.counted.sum() < 0.25 * rows.lengths.sum()  # " positive" or " negative" and EOS of each prompt


def test_a_limit_beyond_the_documents_is_said(sentiment_prompts, tmp_path):
    cfg = TrainConfig(model="preset:tiny-llama", data=str(sentiment_prompts), cache_dir=str(tmp_path), limit=10**6)
    data = CausalLM(cfg).prepare_data("preset:tiny-llama", None)
    said = [n for n in data.notes if n.startswith("--limit 1,000,000 is more than the ")]
    assert said and said[0].endswith(" documents there are: all of them are used"), data.notes


def test_a_preset_tunes_on_chats_and_predict_renders_chats_as_training_did(sentiment_prompts, tmp_path):
    """A preset's own tokenizer has a chat template (a 'messages' column needed --chat-template before); the
    run's model/ keeps it, and `predict --chat` / a 'messages' column generate from the rendered chat, as
    `generate` does from `apply_chat_template(..., add_generation_prompt=True)`."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from leantrain.data.lm import CHAT_TEMPLATE
    from leantrain.inference import predict

    chats = tmp_path / "chats.jsonl"
    rows = [json.loads(x) for x in sentiment_prompts.read_text().splitlines()]
    lines = []
    for r in rows:
        chat = [{"role": "user", "content": r["prompt"]}, {"role": "assistant", "content": r["completion"].strip()}]
        lines.append(json.dumps({"messages": chat}) + "\n")
    chats.write_text("".join(lines))
    cfg = dict(model="preset:tiny-llama", data=str(chats), cache_dir=str(tmp_path / "cache"), report=False)
    result = train(TrainConfig(**cfg, output_dir=str(tmp_path / "run"), max_length=64, max_steps=3, batch_size=8))
    tokenizer = AutoTokenizer.from_pretrained(result.model_dir)
    assert tokenizer.chat_template == CHAT_TEMPLATE
    model = AutoModelForCausalLM.from_pretrained(result.model_dir).eval()
    question = [{"role": "user", "content": rows[0]["prompt"]}]
    text = tokenizer.apply_chat_template(question, tokenize=False, add_generation_prompt=True)
    assert text.endswith("assistant:\n")
    ids = tokenizer(text, return_tensors="pt", add_special_tokens=False)["input_ids"]
    out = model.generate(ids, max_new_tokens=3, do_sample=False, pad_token_id=tokenizer.pad_token_id)
    expected = {"messages": question, "completion": tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True)}
    assert predict(str(result.output_dir), texts=[rows[0]["prompt"]], chat=True, max_new_tokens=3) == [expected]
    from_data = predict(str(result.output_dir), data=str(chats), max_new_tokens=3, batch_size=64)
    assert len(from_data) == len(rows) and from_data[0] == expected  # the assistant's answer left out


def test_exact_match_is_that_of_greedy_generation(run, llama_dir, sentiment_prompts, tmp_path):
    """The evaluation's exact match (one teacher-forced pass) equals generating each held-out completion greedily
    with `generate` and comparing it with the reference, token for token (EOS included)."""
    from transformers import AutoModelForCausalLM

    result, _ = run(data=str(sentiment_prompts), optimizer="adamw", lr=1e-2, max_steps=60, batch_size=8, max_length=64)
    cfg = TrainConfig(
        model=str(llama_dir), data=str(sentiment_prompts), cache_dir=str(tmp_path / "cache"), max_length=64, seed=3
    )
    task = CausalLM(cfg)
    data = task.prepare_data(str(llama_dir), None)
    model = AutoModelForCausalLM.from_pretrained(result.model_dir).eval()
    rows, right = data.eval.features, 0
    for i in range(len(rows)):
        row = rows.row(i)
        first = int(np.flatnonzero(row["labels"] != -100)[0])
        prompt, completion = row["input_ids"][:first], row["input_ids"][first:].tolist()
        out = model.generate(
            torch.tensor(prompt, dtype=torch.long)[None],
            max_new_tokens=len(completion),
            do_sample=False,
            eos_token_id=None,  # generate all of them: a completion ending early is a mismatch
            pad_token_id=1,
        )[0, len(prompt) :].tolist()
        right += out == completion
    assert result.metrics["eval_exact_match"] == pytest.approx(right / len(rows), abs=1e-12)
    assert 0 < right < len(rows)  # some right and some wrong: the comparison means something


@pytest.mark.parametrize("instruction", [False, True], ids=["text", "instruction"])
def test_evaluate_gives_the_runs_own_held_out_loss_perplexity_and_exact_match(
    run, sentiment_prompts, tmp_path, instruction
):
    """`leantrain evaluate` on a language model scores a text as the run's evaluation scored its --eval-data:
    the same rows (packed for text, one per row for instruction data), loss per counted token, perplexity, exact
    match."""
    from leantrain.inference import evaluate

    if instruction:
        lines = sentiment_prompts.read_text().splitlines()
        train_file, held_out = tmp_path / "train.jsonl", tmp_path / "held_out.jsonl"
        train_file.write_text("\n".join(lines[:120]) + "\n")
        held_out.write_text("\n".join(lines[120:]) + "\n")
    else:
        train_file, held_out = tmp_path / "train.txt", tmp_path / "held_out.txt"
        train_file.write_text("\n\n".join(documents(60, seed=7)) + "\n")
        held_out.write_text("\n\n".join(documents(25, seed=8)) + "\n")
    job = dict(optimizer="adamw", lr=1e-2, max_steps=8, max_length=64)  # 64: every completion kept
    result, _ = run(data=str(train_file), eval_data=str(held_out), **job)
    scores = evaluate(str(result.output_dir), str(held_out), batch_size=3)  # other batches than the run's
    m = result.metrics
    assert scores["loss"] == pytest.approx(m["eval_loss"], rel=1e-5)
    assert scores["perplexity"] == pytest.approx(m["eval_perplexity"], rel=1e-5)
    assert ("exact_match" in scores) == instruction
    if instruction:
        assert scores["exact_match"] == m["eval_exact_match"]
        assert scores["documents"] == len(lines) - 120
        # a model folder with no run beside it (a pretrained model): instruction rows are scored alike
        bare = shutil.copytree(result.model_dir, tmp_path / "bare")
        assert evaluate(str(bare), str(held_out))["loss"] == pytest.approx(m["eval_loss"], rel=1e-5)
    assert scores["loss"] < math.log(300) - 0.5  # trained: well below a uniform guess over the vocabulary


def test_evaluate_scores_a_pretrained_model_in_rows_of_its_context(llama_dir, tmp_path):
    """A model folder leantrain did not train has no run's --max-length: its documents are scored in rows of the
    model's context (256 positions here, at most 1,024), not cut into chunks of 128 whose first tokens lose their
    context."""
    from leantrain.inference import evaluate

    bare = tmp_path / "pretrained"
    tiny_llama(llama_dir).save_pretrained(bare)
    shutil.copy(llama_dir / "tokenizer.json", bare)
    shutil.copy(llama_dir / "tokenizer_config.json", bare)
    text = tmp_path / "long.txt"  # documents of four 40-word pieces, some longer than 128 tokens
    text.write_text("\n\n".join(" ".join(documents(40, seed=i)[j] for j in range(40) if j % 10 == 3) for i in range(6)))
    default, whole, chunked = (evaluate(str(bare), str(text), max_length=n) for n in (None, 256, 128))
    assert default == whole
    assert default["tokens"] > chunked["tokens"] and default["loss"] != chunked["loss"]


def test_predict_generates_greedily_or_by_sampling(run):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from leantrain.errors import LeantrainError
    from leantrain.inference import predict

    result, _ = run(optimizer="adamw", lr=3e-3, max_steps=4, batch_size=8)
    prompts = ["the cat sat on a big red mat", "a"]  # different lengths: batched generation pads one
    greedy = predict(str(result.output_dir), texts=prompts, max_new_tokens=4)
    tokenizer = AutoTokenizer.from_pretrained(result.model_dir)
    model = AutoModelForCausalLM.from_pretrained(result.model_dir).eval()
    for row, prompt in zip(greedy, prompts):
        ids = tokenizer(prompt, return_tensors="pt")["input_ids"]
        out = model.generate(ids, max_new_tokens=4, do_sample=False, pad_token_id=tokenizer.pad_token_id)
        assert row == {
            "prompt": prompt,
            "completion": tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True),
        }
    lines = result.output_dir.parent / "prompts.txt"
    lines.write_text(f"{prompts[0]}\n\n{prompts[1]}\n")  # a text file: one prompt a line, as NER's predict reads
    assert predict(str(result.output_dir), data=str(lines), max_new_tokens=4) == greedy
    sampled = predict(str(result.output_dir), texts=prompts, max_new_tokens=4, temperature=1.5, top_p=0.95)
    assert sampled == predict(str(result.output_dir), texts=prompts, max_new_tokens=4, temperature=1.5, top_p=0.95)
    with pytest.raises(LeantrainError, match="--temperature"):
        predict(str(result.output_dir), texts=prompts, top_p=0.5)
    with pytest.raises(DataError, match="no chat template to render a chat with; give plain prompts"):
        predict(str(result.output_dir), texts=prompts, chat=True)


def test_an_empty_prompt_generates_from_the_bos_token_as_transformers_pipeline_does(tmp_path, capsys):
    """A language model continues nothing from its BOS token (a classifier's empty --text is still refused). A
    GPT-2-like model whose tokenizer adds no BOS itself: the empty prompt has no token until leantrain gives it one,
    batched beside a prompt that has some; transformers' text-generation pipeline is the oracle."""
    from transformers import GPT2Config, GPT2LMHeadModel, pipeline

    from leantrain.commands.cli import main
    from leantrain.inference import predict

    folder = tmp_path / "gpt2"
    tokenizer = train_bpe_tokenizer(documents(200, seed=1), vocab_size=300)
    assert tokenizer.bos_token_id is not None and tokenizer("")["input_ids"] == []
    config = GPT2Config(
        vocab_size=len(tokenizer), n_embd=32, n_layer=2, n_head=2, n_positions=64, bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, initializer_range=0.2,
    )  # fmt: skip
    # (weights this wide: the first token chosen is not the EOS, which would end the completion at once)
    torch.manual_seed(0)
    GPT2LMHeadModel(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    rows = predict(str(folder), texts=["", "the cat"], max_new_tokens=5)
    generator = pipeline("text-generation", model=str(folder))
    for row, prompt in zip(rows, ["", "the cat"]):
        [theirs] = generator(prompt, max_new_tokens=5, do_sample=False, return_full_text=False)
        assert row == {"prompt": prompt, "completion": theirs["generated_text"]} and row["completion"]
    assert main(["predict", str(folder), "--text", "", "--max-new-tokens", "5"]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out) == rows[0] and "default job" not in err  # a model folder is no default training job


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_a_bf16_lora_run_keeps_a_tied_table_stored_in_bf16_in_bf16_with_the_same_bits(
    llama_dir, run, tmp_path, monkeypatch, attention
):
    """A causal LM stored in bf16 whose output layer is its input table: the table is kept in bf16 (its values are
    bf16's), its lookups cast back to fp32, so the losses and the published model are bitwise those of an fp32
    table (eager's additive masks too, built in the lookups' dtype)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from leantrain.model import freezing

    folder = tmp_path / "tied"
    shutil.copytree(llama_dir, folder)
    config = AutoConfig.from_pretrained(folder)
    config.tie_word_embeddings = True
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).to(torch.bfloat16).save_pretrained(folder)
    job = dict(model=str(folder), lora=True, lora_r=4, lora_alpha=8, max_steps=4, batch_size=4, precision="bf16")
    low, w_low = run(**job, attention=attention, save_every=4)
    monkeypatch.setattr(freezing, "store_frozen", lambda model, dtype: None)  # every weight fp32, as before
    fp32, w_fp32 = run(**job, attention=attention, save_every=4)
    assert loss_log(low) == loss_log(fp32)
    saved = load_file(low.output_dir / "checkpoints" / "step-000004" / "model.safetensors")
    table = [v for k, v in saved.items() if k.endswith(("embed_tokens.weight", "lm_head.weight"))]  # saved once
    assert len(table) == 1 and table[0].dtype == torch.bfloat16
    assert w_low.keys() == w_fp32.keys() and all(torch.equal(w_low[k], w_fp32[k]) for k in w_low)


def test_lora_on_a_language_model_accumulates_exactly_and_publishes_a_merged_model(run):
    """LoRA (issue #15) on the causal-LM task: only the adapters train (embeddings and the output layer stay
    bitwise), 4 micro-batches of packed rows equal one big batch at the token level, and model/ is a plain
    LlamaForCausalLM that pipeline() loads and generates with."""
    from transformers import pipeline

    lora = dict(lora=True, lora_r=4, lora_alpha=8, max_steps=4)
    big, w_big = run(batch_size=8, **lora)
    small, w_small = run(batch_size=2, grad_accum=4, **lora)
    _, start = run(batch_size=8, **{**lora, "lr": 1e-30})
    assert sorted(w_big) == sorted(start) and not any("lora" in k for k in w_big)  # merged: the base's names
    frozen = [k for k in w_big if "embed_tokens" in k or "norm" in k or k == "lm_head.weight"]
    assert frozen and all(torch.equal(w_big[k], start[k]) and torch.equal(w_small[k], start[k]) for k in frozen)
    # the merged projections (base + B @ A) moved; every one of them alike in both runs
    merged = [k for k in w_big if k not in frozen]
    assert all(k.endswith("_proj.weight") for k in merged), merged
    pick = lambda w: {k: w[k] for k in merged}  # noqa: E731
    assert_trained_alike(pick(w_big), pick(w_small), pick(start), rel=1e-5)
    assert loss_log(small) == pytest.approx(loss_log(big), abs=1e-5)
    assert "frozen weights get no gradients" in big.metrics["flop_model"]
    out = pipeline("text-generation", model=str(big.model_dir))("the cat", max_new_tokens=4, do_sample=False)
    assert out[0]["generated_text"].startswith("the cat")
