"""The sequence-to-sequence task on tiny random encoder-decoders built from configs (a T5 and a bert2bert
EncoderDecoderModel, both with MiniLM's real tokenizer, fp32): the loss per target token is exact under
accumulation, processes and resume with very uneven targets; target padding never counts; generated text is scored
as rouge-score and sacrebleu score it; bad input is one line."""

from __future__ import annotations

import csv
import json
import random
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from leantrain import TrainConfig, train
from leantrain.commands.cli import main
from leantrain.data.batching import Slot
from leantrain.data.seq2seq import IGNORE, PairCollator, resolve_pair_columns
from leantrain.training import Hooks
from tests.casts_helper import casts_in
from tests.conftest import EXACT_JOB, assert_trained_alike

WORDS = [
    "the",
    "cat",
    "dog",
    "sat",
    "ran",
    "on",
    "a",
    "mat",
    "log",
    "big",
    "small",
    "red",
    "blue",
    "house",
    "tree",
    "river",
]


def write_pairs(path: Path, n: int, seed: int, header=("source", "target")) -> Path:
    """Sources of 2-10 words; targets of 1, 2 or 30 words (the source reversed, cycled), whatever the source's
    length: batches grouped by source length hold very different numbers of target tokens."""
    rng = random.Random(seed)
    with path.open("w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(header)
        for _ in range(n):
            src = rng.choices(WORDS, k=rng.randint(2, 10))
            backwards = src[::-1]
            w.writerow([" ".join(src), " ".join(backwards[i % len(src)] for i in range(rng.choice((1, 2, 30))))])
    return path


@pytest.fixture(scope="module")
def models(minilm_dir, tmp_path_factory) -> dict[str, Path]:
    """A 2-layer, 32-wide T5 and bert2bert, random weights, no dropout; and the T5 with dropout 0.1."""
    from transformers import (
        AutoTokenizer,
        BertConfig,
        BertLMHeadModel,
        BertModel,
        EncoderDecoderModel,
        T5Config,
        T5ForConditionalGeneration,
    )

    root = tmp_path_factory.mktemp("seq2seq-models")
    tokenizer = AutoTokenizer.from_pretrained(minilm_dir)
    t5 = dict(vocab_size=30522, d_model=32, d_ff=64, num_layers=2, num_heads=2, d_kv=16)
    t5 |= dict(pad_token_id=0, eos_token_id=102, decoder_start_token_id=0)  # BERT's [PAD] and [SEP]
    bert = dict(vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64)
    bert |= dict(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, max_position_embeddings=128)
    torch.manual_seed(0)
    built = {
        "t5": T5ForConditionalGeneration(T5Config(**t5, dropout_rate=0.0)),
        "t5-dropout": T5ForConditionalGeneration(T5Config(**t5, dropout_rate=0.1)),
        # no pooler: a bert2bert never uses it (a warm-started one has it, untrained)
        "bert2bert": EncoderDecoderModel(
            encoder=BertModel(BertConfig(**bert), add_pooling_layer=False),
            decoder=BertLMHeadModel(BertConfig(**bert, is_decoder=True, add_cross_attention=True)),
        ),
    }
    out = {}
    for name, model in built.items():
        model.save_pretrained(root / name)
        tokenizer.save_pretrained(root / name)
        out[name] = root / name
    return out


@pytest.fixture(scope="module")
def pairs(tmp_path_factory) -> tuple[Path, Path]:
    """109 training pairs (six steps of 16, then 13), 27 held out."""
    root = tmp_path_factory.mktemp("pairs")
    return write_pairs(root / "train.csv", 109, seed=1), write_pairs(root / "eval.csv", 27, seed=2)


def job(models, pairs, tmp_path, name: str, model: str = "t5", **changes) -> TrainConfig:
    base = dict(
        model=str(models[model]),
        data=str(pairs[0]),
        eval_data=str(pairs[1]),
        cache_dir=str(tmp_path / "cache"),
        output_dir=str(tmp_path / name),
        report=False,
        generation_max_new_tokens=8,
        **EXACT_JOB,
    )
    return TrainConfig(**{**base, **changes})


def loss_log(run_dir: Path) -> list[float]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r["loss"] for r in rows if "loss" in r]


class Units(Hooks):
    """Each training micro-batch's target tokens."""

    def __init__(self):
        self.units: list[float] = []

    def on_micro_batch(self, model, batch) -> None:
        self.units.append(float(batch["units"]))


# -- the loss per target token is exact ----------------------------------------------------------------------------


@pytest.mark.slow  # three runs that generate at their end: 104 s (t5) and 121 s (bert2bert) at load 12
@pytest.mark.parametrize("model", ["t5", "bert2bert"])
def test_accumulation_equals_the_big_batch_with_very_uneven_targets(models, pairs, tmp_path, model):
    """Four micro-batches of 4 equal one batch of 16 (<= 1e-5), though the micro-batches' target tokens differ
    fivefold and more: the loss is divided by the whole step's target tokens, not averaged per micro-batch."""
    units = Units()
    big = train(job(models, pairs, tmp_path, "big", model, batch_size=16, max_steps=6))
    small = train(job(models, pairs, tmp_path, "small", model, batch_size=4, grad_accum=4, max_steps=6), hooks=units)
    start = train(job(models, pairs, tmp_path, "start", model, batch_size=16, max_steps=6, lr=1e-30))
    assert max(units.units) >= 5 * min(units.units)  # very uneven target tokens per micro-batch
    # a bert2bert's encoder has a pooler that nothing reads (transformers builds one whatever was saved): no gradient
    weights = [
        {k: v for k, v in load_file(r.model_dir / "model.safetensors").items() if ".pooler." not in k}
        for r in (big, small, start)
    ]
    assert_trained_alike(weights[0], weights[1], weights[2])
    assert loss_log(small.output_dir) == pytest.approx(loss_log(big.output_dir), abs=1e-5)
    for key in ("eval_loss", "eval_rouge1", "eval_rougeL"):  # the same model scores the same
        assert small.metrics[key] == pytest.approx(big.metrics[key], abs=1e-4), key


def test_static_shapes_bucket_sources_and_targets_apart_and_change_nothing(models, pairs, tmp_path):
    """--static-shapes (on with --compile): sources and targets padded up to their own length buckets, and the
    epoch's short last micro-batch (109 pairs in micro-batches of 8: the last holds 5) filled with rows whose targets
    are masked; the training and its evaluation are the run's without them. The weights both start from are the
    model folder's (the file a run at lr 1e-30 would write: not trained a third time)."""
    common = dict(batch_size=8, grad_accum=2, epochs=1, generation_max_new_tokens=4)
    off = train(job(models, pairs, tmp_path, "off", static_shapes="off", **common))
    on = train(job(models, pairs, tmp_path, "on", static_shapes="on", **common))
    assert on.metrics["padding_fraction"] > off.metrics["padding_fraction"]
    assert on.metrics["train_examples"] == off.metrics["train_examples"] == 109
    weights = [load_file(r.model_dir / "model.safetensors") for r in (off, on)]
    start = load_file(models["t5"] / "model.safetensors")
    assert_trained_alike(weights[0], weights[1], {k: start[k] for k in weights[0]})
    assert loss_log(on.output_dir) == pytest.approx(loss_log(off.output_dir), abs=1e-5)
    assert on.metrics["eval_loss"] == pytest.approx(off.metrics["eval_loss"], abs=1e-5)


@pytest.mark.slow  # launches a 2-process job: 122 s at load 12
def test_two_processes_equal_one_process_with_twice_the_batch(models, pairs, tmp_path):
    from tests.parallel.test_data_parallel import flags, run_job

    config = job(models, pairs, tmp_path, "one", "t5", batch_size=16, epochs=1)
    one = train(config)
    two = tmp_path / "two"
    given = {
        k: v
        for k, v in config.to_dict().items()
        if v is not None and k not in ("output_dir", "batch_size", "progress", "eval_fraction")  # --eval-data given
    }
    rc, _, err = run_job(
        ["-m", "leantrain", "train", *flags(**given, batch_size=8, num_processes=2, output_dir=two, progress=False)]
    )
    assert rc == 0, err[-3000:]
    metrics = json.loads((two / "metrics.json").read_text())
    assert metrics["num_processes"] == 2 and metrics["optimizer_steps"] == one.metrics["optimizer_steps"] == 7
    ours, theirs = load_file(two / "model" / "model.safetensors"), load_file(one.model_dir / "model.safetensors")
    assert max((ours[k] - theirs[k]).abs().max().item() for k in ours) <= 1e-5
    # evaluation generates on each process and gathers every example once: the same scores
    for key in ("eval_loss", "eval_rouge1", "eval_rouge2", "eval_rougeL", "eval_rougeLsum"):
        assert metrics[key] == pytest.approx(one.metrics[key], abs=1e-5), key


def test_resuming_a_checkpoint_gives_bitwise_the_same_run(models, pairs, tmp_path):
    """With dropout and AdamW, resumed at step 4 of 8: the same weights and losses, bit for bit."""
    from tests.test_checkpoint import assert_same_weights, step_dir

    common = dict(model="t5-dropout", optimizer="adamw", lr=3e-3, batch_size=12, max_steps=8, save_every=2)
    whole = train(job(models, pairs, tmp_path, "whole", **common, eval_every=3))
    ckpt = step_dir(whole.output_dir, 4)
    resumed = train(job(models, pairs, tmp_path, "resumed", **common, eval_every=3, resume=str(ckpt)))
    assert resumed.metrics["resumed_from"] == str(ckpt) and resumed.metrics["train_examples"] == 4 * 12
    assert_same_weights(whole.output_dir, resumed.output_dir)
    assert loss_log(resumed.output_dir) == loss_log(whole.output_dir)
    assert resumed.metrics["eval_rougeL"] == whole.metrics["eval_rougeL"]


def test_a_bf16_generating_evaluation_casts_each_weight_once(models, pairs, tmp_path, monkeypatch):
    """An evaluation runs under one autocast: each weight is cast to bf16 once for the loss pass and every
    generated token of every batch, not once a forward (the prepared model autocasts each forward itself)."""
    from accelerate.utils import operations

    from leantrain.training import evaluator

    # Accelerate's fp32 copies of a forward's outputs in the evaluation: its loss passes', not each generated token's
    inside, conversions = [False], []
    convert, gather = operations.convert_to_fp32, evaluator.gather_rows
    monkeypatch.setattr(operations, "convert_to_fp32", lambda x: conversions.append(inside[0]) or convert(x))

    def gathering(*args, **kwargs):
        inside[0] = True
        try:
            return gather(*args, **kwargs)
        finally:
            inside[0] = False

    monkeypatch.setattr(evaluator, "gather_rows", gathering)
    most = casts_in(monkeypatch, evaluator, "gather_rows")
    train(job(models, pairs, tmp_path, "bf16", "bert2bert", precision="bf16", max_steps=1))
    assert most == [1]  # 27 examples in two batches, each a loss pass and 8 tokens generated
    assert conversions.count(True) == 1  # the loss pass's (and one a generated token, 9 in all, before)


def test_predict_generates_in_the_runs_bf16_casting_each_weight_once(models, pairs, tmp_path, monkeypatch):
    """`predict` on a bf16 run generates in bf16, as the run's evaluations did, under one autocast: each weight is
    cast once for all the sources and tokens."""
    from leantrain.inference import predict
    from leantrain.tasks.seq2seq import Seq2Seq

    result = train(job(models, pairs, tmp_path, "bf16", "bert2bert", precision="bf16", max_steps=1))
    most = casts_in(monkeypatch, Seq2Seq, "predict", model_at=1)
    rows = predict(str(result.output_dir), texts=["the red cat sat", "a dog ran far away", "big"])
    assert len(rows) == 3 and most == [1]


@pytest.mark.parametrize("model", ["t5", "bert2bert"])
def test_padding_known_on_the_host_trains_as_the_models_own_reads(models, pairs, tmp_path, monkeypatch, model):
    """The encoder-decoder's mask checks answered from the host's facts (`model.masks._known_padding`) give, bitwise,
    the run in which transformers reads each mask (padded sources: batches of 16 uneven pairs)."""
    from tests.test_masks import _same

    cfg = job(models, pairs, tmp_path, "masks", model=model, optimizer="adamw", batch_size=16, max_steps=3)
    made = _same(cfg.replace(log_every=1), monkeypatch)
    assert made.encoder_decoder


def batch_of(task, rows: list[tuple[list[int], list[int]]]) -> dict:
    """A collated batch of (source ids, target ids) pairs."""
    assert task.ids is not None
    items = [
        {"input_ids": np.array(s), "target_ids": np.array(t), "slot": Slot(i, 1.0, True)}
        for i, (s, t) in enumerate(rows)
    ]
    return PairCollator(task.ids.pad, task.ids.start)(items)


def prepared_task(models, pairs, tmp_path, model: str):
    from leantrain.model.loading import load_config
    from leantrain.tasks.seq2seq import Seq2Seq

    cfg = job(models, pairs, tmp_path, "unused", model).resolved()
    task = Seq2Seq(cfg)
    data = task.prepare_data(cfg.model, load_config(cfg.model))
    built = task.build_model(cfg.model, data).train()
    task.check_model(built)
    return task, built, data


@pytest.mark.parametrize("model", ["t5", "bert2bert"])
def test_target_padding_is_never_in_the_loss(models, pairs, tmp_path, model):
    """Labels (and decoder inputs) at padded target positions set to real token ids change neither the loss nor any
    gradient: what counts is each target's own tokens. And the loss over those tokens is transformers' own."""
    task, built, _ = prepared_task(models, pairs, tmp_path, model)
    assert task.fuses_head_loss  # the fused head and loss is what training runs
    batch = batch_of(
        task, [([101, 7, 8, 9, 102], [11, 12, 13, 102]), ([101, 5, 102], [14, 102]), ([101, 6, 102], [102])]
    )
    assert int(batch["target_mask"].sum()) == 7 and batch["labels"].shape == (3, 4)

    def loss_and_grads(b):
        built.zero_grad()
        loss = task.loss_sum(task.forward(built, b), b)
        loss.backward()
        return loss.detach(), {n: p.grad.clone() for n, p in built.named_parameters() if p.grad is not None}

    loss, grads = loss_and_grads(batch)
    changed = {**batch, "labels": batch["labels"].clone(), "decoder_input_ids": batch["decoder_input_ids"].clone()}
    pad = ~batch["target_mask"]
    changed["labels"][pad] = torch.tensor([2000, 2001, 2002, 2003, 2004])
    changed["decoder_input_ids"][pad] = torch.tensor([3000, 3001, 3002, 3003, 3004])
    loss2, grads2 = loss_and_grads(changed)
    assert torch.equal(loss, loss2)
    assert grads.keys() == grads2.keys() and all(torch.allclose(grads[k], grads2[k], atol=1e-7) for k in grads)
    with torch.no_grad():  # transformers' own loss: the mean cross-entropy of the labels that are not -100
        theirs = built(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], labels=batch["labels"])
    assert float(loss) / 7 == pytest.approx(float(theirs.loss), rel=1e-5)


def test_the_decoder_input_is_the_target_shifted_behind_the_start_token(models, pairs, tmp_path):
    task, _, data = prepared_task(models, pairs, tmp_path, "bert2bert")
    assert task.ids.start == 101  # a bert2bert decoder starts from [CLS] ...
    targets = data.train.features.target
    firsts = targets.input_ids[targets.offsets[:-1]]
    assert 101 not in firsts and (targets.input_ids[targets.offsets[1:] - 1] == 102).all()  # ... so it is no target
    batch = batch_of(task, [([101, 7, 102], [11, 12, 102]), ([101, 5, 102], [14, 102])])
    assert batch["decoder_input_ids"].tolist() == [[101, 11, 12], [101, 14, 0]]
    assert batch["labels"].tolist() == [[11, 12, 102], [14, 102, IGNORE]]


# -- evaluation generates -------------------------------------------------------------------------------------------


def test_rouge_of_a_known_prediction_set_is_rouge_scores(models, pairs, tmp_path):
    """The task's ROUGE of generated ids (decoded, special tokens left out, gathered in any order) is rouge-score's
    mean F-measure x 100 of the texts against the references of the same examples; BLEU and chrF are sacrebleu's."""
    import sacrebleu
    from rouge_score import rouge_scorer

    from leantrain.tasks.seq2seq import Seq2Seq

    task, _, _ = prepared_task(models, pairs, tmp_path, "t5")
    predictions = ["the cat sat", "a red house\nby the river", "dogs running", "", "blue blue blue"]
    task.references = ["the cat sat on the mat", "a red house\nnear a river", "the dog ran", "nothing", "blue"]
    width = 12
    ids = np.full((5, width), task.ids.pad)
    for i, text in enumerate(predictions):
        tokens = task.tokenizer(text, add_special_tokens=False)["input_ids"] + [task.ids.eos]
        ids[i, : len(tokens)] = tokens
    order = np.array([3, 0, 4, 2, 1])  # as gathered from processes: rows in any order, with their example ids
    rows = {"preds": ids[order], "index": order, "loss_sum": np.ones(5), "tokens": np.ones(5)}
    scores = task.metrics(rows)
    scorer = rouge_scorer.RougeScorer(["rouge1", "rouge2", "rougeL", "rougeLsum"], use_stemmer=True)
    expected = [scorer.score(ref, pred) for pred, ref in zip(predictions, task.references)]
    for kind in ("rouge1", "rouge2", "rougeL", "rougeLsum"):
        assert scores[kind] == pytest.approx(100 * np.mean([e[kind].fmeasure for e in expected]), abs=1e-9), kind
    assert expected[0]["rouge1"].fmeasure == pytest.approx(2 / 3)  # P 1, R 1/2 (a hand check of the oracle)
    assert scores["mean_generated_tokens"] == pytest.approx(np.mean([(r != task.ids.pad).sum() for r in ids]))
    translation = Seq2Seq(job(models, pairs, tmp_path, "bleu", metrics="bleu,chrf"))
    translation.tokenizer, translation.ids, translation.references = task.tokenizer, task.ids, task.references
    scores = translation.metrics(rows)
    references = [task.references]
    assert scores["bleu"] == pytest.approx(sacrebleu.corpus_bleu(predictions, references).score, abs=1e-9)
    assert scores["chrf"] == pytest.approx(sacrebleu.corpus_chrf(predictions, references).score, abs=1e-9)


def test_metrics_loss_alone_evaluates_without_generating(models, pairs, tmp_path):
    """`--metrics loss` (documented for fast mid-run checks): evaluations report the loss and generate nothing."""
    from leantrain.errors import ConfigError
    from leantrain.tasks.seq2seq import Seq2Seq

    task = Seq2Seq(job(models, pairs, tmp_path, "loss", metrics="loss"))
    assert task.metric_names == ("loss",) and task.scored == () and task.best_default == "loss"
    with pytest.raises(ConfigError, match="do not score generated text"):
        Seq2Seq(job(models, pairs, tmp_path, "acc", metrics="loss,accuracy"))


@pytest.mark.parametrize("model", ["t5", "bert2bert"])
def test_batched_generation_equals_generating_each_source_alone(models, pairs, tmp_path, model):
    """Padding a source to its batch's longest (the attention mask hides it) changes no generated token."""
    from leantrain.tasks.seq2seq import generate_ids, pad_sources

    task, built, data = prepared_task(models, pairs, tmp_path, model)
    built.eval()
    sources = [data.eval.features.source.row(i)["input_ids"] for i in range(6)]
    assert len({len(s) for s in sources}) > 2
    ids, mask = pad_sources(sources, task.ids.pad)
    together = generate_ids(built, ids, mask, task.ids, max_new_tokens=6)
    for i, s in enumerate(sources):
        alone = generate_ids(built, *pad_sources([s], task.ids.pad), task.ids, max_new_tokens=6)
        assert torch.equal(together[i], alone[0]), i


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("model", ["t5", "bert2bert"])
def test_greedy_generation_is_transformers_own_with_ended_rows_out_of_the_batch(
    models, pairs, tmp_path, monkeypatch, model, precision
):
    """`generate_ids`' greedy loop (rows that end leave the batch) gives the ids of transformers' `generate` (which
    runs every row to the last), with rows ending at different steps; where a logits processor applies (here a
    repetition penalty) the generation is transformers' own."""
    import copy

    from leantrain.model import generation
    from leantrain.tasks.seq2seq import DecoderIds, generate_ids, pad_sources

    task, built, data = prepared_task(models, pairs, tmp_path, model)
    built.eval()
    with torch.no_grad():  # larger random weights: rows that differ, and tokens that do not repeat at once
        for p in built.parameters():
            if p.dim() > 1:
                p.normal_(0, 0.3, generator=torch.Generator().manual_seed(p.numel()))
    ids, mask = pad_sources([data.eval.features.source.row(i)["input_ids"] for i in range(12)], task.ids.pad)
    widths = []
    original = built.forward
    monkeypatch.setattr(
        built, "forward", lambda **kw: widths.append(kw["decoder_input_ids"].shape[0]) or original(**kw)
    )

    def theirs(eos: int, **changes) -> torch.Tensor:
        config = copy.deepcopy(built.generation_config)
        config.update(max_new_tokens=8, num_beams=1, do_sample=False, decoder_start_token_id=task.ids.start,
                      pad_token_id=task.ids.pad, eos_token_id=eos, **changes)  # fmt: skip
        with torch.no_grad():
            out = built.generate(input_ids=ids, attention_mask=mask, generation_config=config)[:, 1:]
        return torch.nn.functional.pad(out, (0, 8 - out.shape[1]), value=task.ids.pad)

    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16"):
        free = theirs(eos=-1)  # no token ends a row; the EOS below is one that some rows write early, some late
        firsts: dict[int, set[int]] = {}
        for row in free.tolist():
            for token in row:
                firsts.setdefault(token, set()).add(row.index(token))
        eos = max(firsts, key=lambda token: len(firsts[token]))
        assert len(firsts[eos]) > 1
        widths.clear()
        ours = generate_ids(built, ids, mask, DecoderIds(task.ids.start, task.ids.pad, eos), max_new_tokens=8)
        assert widths[0] == 12 and widths[-1] < 12  # rows left as they ended
        assert torch.equal(ours, theirs(eos))
        built.generation_config.repetition_penalty = 1.5
        called = []
        monkeypatch.setattr(generation, "greedy_pairs", lambda *a, **k: called.append(1))
        penalized = generate_ids(built, ids, mask, DecoderIds(task.ids.start, task.ids.pad, eos), max_new_tokens=8)
        assert called == [] and torch.equal(penalized, theirs(eos, repetition_penalty=1.5))


def write_animals(path: Path, n: int, seed: int) -> Path:
    """The target names the first animal the source mentions (cat, dog), else says none: a task a tiny model learns
    in a hundred steps, and only if the decoder learns to write what comes after its start token."""
    rng = random.Random(seed)
    with path.open("w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(["document", "summary"])
        for _ in range(n):
            src = rng.choices(WORDS, k=rng.randint(2, 10))
            w.writerow([" ".join(src), next((x for x in src if x in ("cat", "dog")), "none")])
    return path


@pytest.mark.slow  # 120 optimizer steps, evaluate and predict: 200 s at load 12
def test_a_run_learns_and_its_model_serves_evaluate_predict_and_automodel(models, tmp_path):
    """A tiny T5 learns which animal a text names (chance scores about 40): its final ROUGE is what `evaluate`
    gives on the same held-out rows (the --eval-limit sample), its `predict` is what the published model/ generates
    through transformers alone, and its card says how to load it."""
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    from leantrain.inference import evaluate, predict

    data = (write_animals(tmp_path / "train.csv", 240, seed=3), write_animals(tmp_path / "eval.csv", 40, seed=4))
    result = train(
        job(models, data, tmp_path, "learn", optimizer="adamw", lr=1e-2, batch_size=8, epochs=4, eval_limit=30)
    )
    m = result.metrics
    assert m["eval_rouge1"] > 90 and m["eval_loss"] < 0.5, m  # the random start: ROUGE 0, loss 10.3
    again = evaluate(str(result.output_dir))  # the run's own held-out rows: the same 30 of the 40
    assert again["examples"] == 30 and again["rouge1"] == pytest.approx(m["eval_rouge1"], abs=1e-9)
    assert len(again["examples_shown"]) == 3 and set(again["examples_shown"][0]) == {"source", "reference", "generated"}
    texts = ["the red cat sat on a mat", "big house", "a dog ran"]
    ours = [r["generated_text"] for r in predict(str(result.output_dir), texts=texts)]
    tokenizer = AutoTokenizer.from_pretrained(result.model_dir)
    model = AutoModelForSeq2SeqLM.from_pretrained(result.model_dir).eval()
    for text, generated in zip(texts, ours):
        enc = tokenizer([text], return_tensors="pt", return_token_type_ids=False)
        out = model.generate(**enc, max_new_tokens=8, do_sample=False)
        assert tokenizer.decode(out[0], skip_special_tokens=True).strip() == generated
    card = (result.model_dir / "README.md").read_text()
    assert "AutoModelForSeq2SeqLM" in card and "pipeline_tag: text2text-generation" in card


def test_translation_pairs_and_the_task_aliases(models, tmp_path):
    """A `translation` column of {language: text} read with --source-column/--target-column naming languages;
    --task translation scores BLEU and chrF, summarization ROUGE."""
    import pandas as pd

    from leantrain.model.loading import load_config
    from leantrain.tasks import resolve

    df = pd.DataFrame({"translation": [{"en": "the cat", "fr": "le chat"}, {"en": "a dog", "fr": "un chien"}]})
    cols = resolve_pair_columns(df, "wmt", "en", "fr")
    assert (cols.source, cols.target, cols.translation) == ("en", "fr", "translation")
    # both ways: the first in the alphabet was the one suggested, the reverse of a French-to-English run's
    both = r"say which way with --source-column en --target-column fr, or --source-column fr --target-column en$"
    with pytest.raises(Exception, match=both):
        resolve_pair_columns(df, "wmt", None, None)
    with pytest.raises(Exception, match=r"say which way with --source-column fr --target-column en$"):
        resolve_pair_columns(df, "wmt", "fr", None)
    assert resolve_pair_columns(pd.DataFrame({"document": [], "summary": []}), "x", None, None).target == "summary"
    config = load_config(str(models["t5"]))
    for spelling, names in (("translation", ("bleu", "chrf", "loss")), ("summarization", None)):
        task = resolve(TrainConfig(model=str(models["t5"]), task=spelling), config)
        assert task.name == "seq2seq"
        assert task.metric_names == (names or ("rouge1", "rouge2", "rougeL", "rougeLsum", "loss"))
    assert TrainConfig(task="translation").metrics == "bleu,chrf"
    assert TrainConfig(task="translation", metrics="rougeL").metrics == "rougeL"  # what the user said stands


# -- bad input: one line, exit 2 ------------------------------------------------------------------------------------


def _one_line_error(capsys, argv, *needles) -> None:
    code = main(argv)
    err = capsys.readouterr().err
    lines = [line for line in err.strip().splitlines() if line]
    assert code == 2 and len(lines) == 1 and "Traceback" not in err, err
    for needle in needles:
        assert needle in lines[0], lines[0]


def test_bad_input_is_one_line_naming_the_fix(models, pairs, tmp_path, capsys):
    base = ["train", "--output-dir", str(tmp_path / "run"), "--cache-dir", str(tmp_path / "cache"), "--no-progress"]
    t5 = ["--model", str(models["t5"])]
    only_sources = tmp_path / "sources.csv"
    only_sources.write_text("source\nthe cat\na dog\n")
    _one_line_error(capsys, [*base, *t5, "--data", str(only_sources)], "sources.csv", "--target-column")
    _one_line_error(capsys, [*base, *t5, "--data", str(pairs[0]), "--target-column", "summary"], "no column 'summary'")
    decoder_only = ["--model", "preset:tiny-llama", "--task", "seq2seq", "--data", str(pairs[0])]
    _one_line_error(capsys, [*base, *decoder_only], "decoder-only", "--task causal-lm")
    _one_line_error(capsys, [*base, *t5, "--data", str(pairs[0]), "--packing"], "--packing", "drop --packing")
    mixture = ["--data", f"{pairs[0]}@0.5", "--data", f"{only_sources}@0.5"]
    _one_line_error(capsys, [*base, *t5, *mixture], "--task seq2seq reads one source", "join the files into one")
    _one_line_error(capsys, [*base, *t5, "--data", str(pairs[0]), "--metrics", "accuracy"], "--metrics", "rouge1")
    # --max-length is the sources' length only where --max-source-length is left out: given both, one was ignored
    two = ["--max-length", "64", "--max-source-length", "32"]
    _one_line_error(capsys, [*base, *t5, "--data", str(pairs[0]), *two], "--max-length 64", "--max-source-length alone")
    # the planner models a T5 (tests/planner/test_seq2seq_plan.py), not a warm-started bert2bert: `plan` and `--auto`
    # say so
    b2b = ["--model", str(models["bert2bert"]), "--max-target-length", "32"]  # (its positions: 128)
    _one_line_error(capsys, ["plan", *b2b, "--data", str(pairs[0])], "planner", "'encoder-decoder' model", "by hand")
    _one_line_error(capsys, [*base, *b2b, "--data", str(pairs[0]), "--auto"], "planner", "by hand")


def test_predict_reads_a_text_file_one_source_a_line_and_evaluate_asks_for_a_target_to_score(
    models, pairs, tmp_path, capsys
):
    result = train(job(models, pairs, tmp_path, "run", max_steps=1))
    texts = tmp_path / "texts.txt"
    texts.write_text("the red cat sat\n\na dog ran\n")
    out = tmp_path / "predicted.jsonl"
    assert main(["predict", str(result.output_dir), "--data", str(texts), "--output", str(out)]) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["text"] for r in rows] == ["the red cat sat", "a dog ran"] and all("generated_text" in r for r in rows)
    capsys.readouterr()
    missing = ["predict", str(result.output_dir), "--data", str(tmp_path / "missing.txt")]
    _one_line_error(capsys, missing, "missing.txt", "cannot read", "--data")
    only_sources = tmp_path / "sources.csv"
    only_sources.write_text("source\nthe cat\na dog\n")
    scored = ["evaluate", str(result.output_dir), "--data", str(only_sources)]
    _one_line_error(capsys, scored, "no target column to score against", "--target-column")


def test_evaluate_and_predict_say_how_many_rows_they_leave_out(models, pairs, tmp_path, capsys, caplog):
    """A row without a source (or, to score, a target) is left out of evaluate and predict as of training, and now
    said with how many (evaluate scored 2 of 4 rows, predict wrote 3 of 4, without a word)."""
    from leantrain import evaluate, predict

    result = train(job(models, pairs, tmp_path, "run", max_steps=1))
    gappy = tmp_path / "gappy.csv"
    gappy.write_text("source,target\nthe cat,cat the\n,a dog\nred mat,\nsat on,on sat\n")
    with caplog.at_level("WARNING", logger="leantrain"):
        scores = evaluate(str(result.output_dir), str(gappy))
    assert scores["examples"] == 2 and scores["skipped"] == 2
    said = "gappy.csv: 4 rows, 2 dropped (1 without a source text, 1 without a target text)"
    assert said in caplog.text, caplog.text
    caplog.clear()
    with caplog.at_level("WARNING", logger="leantrain"):
        rows = predict(str(result.output_dir), str(gappy))
    assert [r["text"] for r in rows] == ["the cat", "red mat", "sat on"]
    assert "gappy.csv: 4 rows, 1 dropped (1 without a source text)" in caplog.text, caplog.text


def test_evaluate_says_how_many_references_max_target_length_cuts_and_scores_the_whole_texts(
    models, pairs, tmp_path, capsys, caplog
):
    """A reference longer than --max-target-length has its loss counted on its first tokens only: evaluate scored
    so without a word. It now says how many were cut, to what length and the flag that counts them whole, in one
    line and in `references_cut`; the scores compare the whole reference texts, whatever the cut."""
    from transformers import AutoTokenizer

    from leantrain import evaluate

    result = train(job(models, pairs, tmp_path, "run", max_steps=1, max_target_length=16))
    with pairs[1].open(newline="", encoding="utf-8") as f:
        references = [row["target"] for row in csv.DictReader(f)]
    whole = [len(ids) for ids in AutoTokenizer.from_pretrained(models["t5"])(text_target=references)["input_ids"]]
    longer, longest = sum(n > 16 for n in whole), max(whole)
    assert 0 < longer < len(references)
    said = (
        f"{pairs[1]}: {longer} of {len(references)} references are longer than --max-target-length 16 tokens (the "
        f"longest: {longest}): the loss counts only their first 16 and the model writes at most 8 (the scores "
        f"compare the whole texts); --max-target-length {longest} counts them whole, --generation-max-new-tokens "
        f"{longest} lets the model write them"
    )
    for data in (str(pairs[1]), None):  # a file, and the run's own held-out pairs
        caplog.clear()
        with caplog.at_level("WARNING", logger="leantrain"):
            cut = evaluate(str(result.output_dir), data)
        assert cut["references_cut"] == longer and cut["max_target_length"] == 16, cut
        assert [r.getMessage() for r in caplog.records if "references" in r.getMessage()] == [said], caplog.text
    caplog.clear()
    with caplog.at_level("WARNING", logger="leantrain"):
        counted = evaluate(str(result.output_dir), str(pairs[1]), max_target_length=longest)
    assert counted["references_cut"] == 0, counted
    # nothing cut, but the run's --generation-max-new-tokens 8 keeps the model from writing the long ones whole
    capped = (
        f"{pairs[1]}: {sum(n > 8 for n in whole)} of {len(references)} references are longer than the 8 tokens the "
        f"model writes at most (the longest: {longest}), so no output matches them whole; "
        f"--generation-max-new-tokens {longest} lets the model write them"
    )
    assert [r.getMessage() for r in caplog.records if "references" in r.getMessage()] == [capped], caplog.text
    assert counted["target_tokens"] > cut["target_tokens"] and counted["loss"] != cut["loss"]
    assert counted["rougeL"] == cut["rougeL"]  # the same generated texts against the same whole references
    capsys.readouterr()
    args = ["evaluate", str(result.output_dir), "--data", str(pairs[1]), "--max-target-length", str(longest)]
    assert main([*args, "--metrics", "loss"]) == 0  # (the loss alone: nothing generated)
    assert json.loads(capsys.readouterr().out)["references_cut"] == 0


def test_evaluate_and_predict_max_length_cuts_sources_in_place_of_the_runs_max_source_length(models, pairs, tmp_path):
    """`--max-length` is --max-source-length's default in training; at evaluate and predict the length the run
    recorded won over it without a word. Now --max-length cuts the sources there too."""
    from leantrain import evaluate
    from leantrain.job import for_inference

    result = train(job(models, pairs, tmp_path, "run", max_steps=1, max_source_length=4, metrics="loss"))
    run = str(result.output_dir)
    assert for_inference(run, {}).task._settings().max_source_length == 4  # the run's own
    assert for_inference(run, {"max_length": 16}).task._settings().max_source_length == 16  # (predict's job too)
    cut, whole = evaluate(run, str(pairs[1])), evaluate(run, str(pairs[1]), max_length=16)
    assert cut["examples"] == whole["examples"] and cut["loss"] != whole["loss"], (cut, whole)


def test_evaluate_takes_generation_max_new_tokens_and_tasks_that_do_not_generate_refuse_it(
    models, pairs, tmp_path, capsys, caplog, minilm_dir, sentiment_csv
):
    """A run's --generation-max-new-tokens capped evaluate's generation with no flag to raise it, while its line on
    cut references said "the model writes at most N". evaluate takes --generation-max-new-tokens (a classifier or
    a language model, whose evaluation generates nothing, refuses it in one line)."""
    from leantrain import evaluate

    result = train(job(models, pairs, tmp_path, "run", max_steps=1, max_target_length=16, eval_limit=4))
    run, data = str(result.output_dir), str(pairs[1])
    own = evaluate(run, data)  # the run's 8
    caplog.clear()
    with caplog.at_level("WARNING", logger="leantrain"):
        fewer = evaluate(run, data, generation_max_new_tokens=3, max_target_length=64)
    assert fewer["mean_generated_tokens"] <= 3 < own["mean_generated_tokens"], (fewer, own)
    assert "longer than the 3 tokens the model writes at most" in caplog.text, caplog.text  # (none cut at 64)
    capsys.readouterr()
    caplog.clear()
    with caplog.at_level("WARNING", logger="leantrain"):
        assert main(["evaluate", run, "--data", data, "--generation-max-new-tokens", "12"]) == 0
    more = json.loads(capsys.readouterr().out)
    assert own["mean_generated_tokens"] < more["mean_generated_tokens"] <= 12, (own, more)
    assert more["references_cut"] > 0 and "the model writes at most 12 (" in caplog.text, caplog.text
    flag = ["--generation-max-new-tokens", "8"]
    for model in (str(minilm_dir), "preset:tiny-llama"):
        argv = ["evaluate", model, "--data", str(sentiment_csv), *flag]
        _one_line_error(capsys, argv, "does not read --generation-max-new-tokens (seq2seq)", "leave it out")
    _one_line_error(capsys, ["evaluate", run, *flag[:1], "0"], "--generation-max-new-tokens must be a positive")


def test_a_source_prefix_is_noted_on_a_model_not_pretrained_with_one_and_its_absence_on_t5(models, pairs, tmp_path):
    """`--source-prefix 'summarize: '` on a BART was put before every source without a word: BART was not
    pretrained with task prefixes, so the run notes it (it is legal). A T5 checkpoint given none is noted as HF's
    run_summarization warns."""
    from transformers import AutoTokenizer, BartConfig, T5Config

    from leantrain.job import assemble

    tokenizer = AutoTokenizer.from_pretrained(models["t5"])
    bart = BartConfig(
        vocab_size=30522, d_model=32, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2,
        decoder_attention_heads=2, encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=256,
        pad_token_id=0, bos_token_id=101, eos_token_id=102, decoder_start_token_id=102,
    )  # fmt: skip
    t5 = T5Config.from_pretrained(models["t5"])
    for name, config in (("bart", bart), ("t5-small", t5)):  # configs alone: random weights, as from scratch
        config.save_pretrained(tmp_path / name)
        tokenizer.save_pretrained(tmp_path / name)

    def noted(model: Path, prefix: str | None) -> list[str]:
        cfg = TrainConfig(
            model=str(model), task="seq2seq", data=str(pairs[0]), eval_data=str(pairs[1]), source_prefix=prefix,
            cache_dir=str(tmp_path / "cache"), output_dir=str(tmp_path / "out"),
        )  # fmt: skip
        made = assemble(cfg)
        return [n for n in made.task.prepare_data(made.model_path, made.model_config).notes if "prefix" in n]

    cost = len(tokenizer("summarize: ", add_special_tokens=False)["input_ids"])
    assert noted(tmp_path / "bart", "summarize: ") == [
        "--source-prefix 'summarize: ': a 'bart' model was not pretrained with task prefixes (T5 was), so the same "
        f"text before every source tells it nothing and takes {cost} of its 128 tokens (--max-source-length); leave "
        "--source-prefix out unless you mean it"
    ]
    assert noted(tmp_path / "t5-small", None) == [
        f"{tmp_path / 't5-small'} was pretrained with a task prefix before every input, and no --source-prefix is "
        "given: give one, e.g. --source-prefix 'summarize: ' or 'translate English to German: '"
    ]
    for model, prefix in ((tmp_path / "bart", None), (tmp_path / "t5-small", "summarize: "), (models["t5"], "x: ")):
        assert noted(model, prefix) == [], (model, prefix)


def test_predicts_generation_settings_are_checked_and_zero_new_tokens_is_refused():
    """`--max-new-tokens 0` generated the run's own number of tokens without a word: refused, as a causal LM's is."""
    from leantrain.errors import LeantrainError
    from leantrain.tasks.seq2seq import sampling_settings

    assert sampling_settings({}, 16) == {"max_new_tokens": 16}
    assert sampling_settings({"max_new_tokens": 4}, 16) == {"max_new_tokens": 4}
    for tokens in (0, -3):
        with pytest.raises(LeantrainError, match=f"--max-new-tokens must be a positive integer, got {tokens}"):
            sampling_settings({"max_new_tokens": tokens}, 16)


# -- telemetry and LoRA ---------------------------------------------------------------------------------------------


def test_padded_to_fixed_lengths_the_unfused_head_makes_a_full_batchs_logits(models, pairs, tmp_path):
    """--pad-to-max-length: the head's logits are a full batch's (one shape, the peak `plan --probe` measures) where
    they are made at all (label smoothing takes them), with the same loss; the fused head and loss stays fused."""
    from leantrain.tasks.seq2seq import Seq2Seq

    task, built, _ = prepared_task(models, pairs, tmp_path, "t5")
    batch = batch_of(task, [([101, 7, 8, 9, 102], [11, 12, 13, 102]), ([101, 5, 102], [14, 102])])

    def checked(**changes) -> Seq2Seq:
        made = Seq2Seq(task.cfg.replace(**changes))
        made.ids = task.ids
        made.check_model(built)
        return made

    cut, padded = checked(label_smoothing=0.1), checked(label_smoothing=0.1, pad_to_max_length=True)
    assert cut.selects_logits and not padded.selects_logits and not padded.fuses_head_loss
    outputs = padded.forward(built, batch)
    assert outputs.logits.shape == (*batch["labels"].shape, built.config.vocab_size)
    assert padded.tail_rows(batch) is None
    with torch.random.fork_rng(devices=[]):
        expected = float(cut.loss_sum(cut.forward(built, batch), batch))
    assert float(padded.loss_sum(outputs, batch)) == pytest.approx(expected, rel=1e-6)
    fused = checked(pad_to_max_length=True)
    assert fused.selects_logits and fused.fuses_head_loss


@pytest.mark.parametrize("model", ["t5", "bert2bert"])
def test_flops_of_a_training_micro_batch_are_what_it_computes(models, pairs, tmp_path, model):
    """The FLOP meter's count of an encoder-decoder's micro-batch (the head at target tokens only, fused with the
    loss) equals torch's FlopCounterMode count of that forward and backward."""
    from dataclasses import replace

    from torch.utils.flop_counter import FlopCounterMode

    from leantrain.model.attention import set_up
    from leantrain.telemetry.flops import FlopMeter, flop_model

    task, built, _ = prepared_task(models, pairs, tmp_path, model)
    set_up(built, "eager", "cpu", "fp32")  # FlopCounterMode does not count CPU SDPA kernels
    task.check_model(built)
    batch = batch_of(task, [([101, 7, 8, 9, 102], [11, 12, 13, 102]), ([101, 5, 102], [14, 102])])
    in_place = {torch.ops.aten.addmm_: lambda _c, a, b, out_shape=None: 2 * a[0] * a[1] * b[1]}
    with FlopCounterMode(display=False, custom_mapping=in_place) as counter:
        task.loss_sum(task.forward(built, batch), batch).backward()
    meter = FlopMeter(replace(flop_model(built), tail_per_row=task.tail_flops(built)))
    counted = meter.add(batch["input_ids"], None, None, task.tail_rows(batch), batch["target_mask"])
    assert counted == pytest.approx(counter.get_total_flops(), rel=1e-6)


def test_lora_trains_adapters_only_and_publishes_a_plain_model(models, pairs, tmp_path):
    from transformers import AutoModelForSeq2SeqLM

    result = train(job(models, pairs, tmp_path, "lora", "bert2bert", lora=True, lora_r=4, max_steps=3, batch_size=8))
    m = result.metrics
    assert 0 < m["gradients_bytes"] < 0.2 * m["weights_bytes"]  # adapters only: no encoder, decoder or embedding "head"
    model = AutoModelForSeq2SeqLM.from_pretrained(result.model_dir)
    assert type(model).__name__ == "EncoderDecoderModel" and not any("lora" in n for n, _ in model.named_parameters())
