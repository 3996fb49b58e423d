"""Token classification (tasks/token_classification.py): alignment and windows, the loss per counted token across
micro-batches, processes and a resume, scores as seqeval's, predictions as the pipeline's, every input format, and
bad input in one line."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file

from leantrain import TrainConfig, evaluate, predict, train
from leantrain.data import tags as T
from leantrain.data.alignment import IGNORE, align_words, make_windows, special_tokens
from leantrain.errors import ConfigError, DataError
from leantrain.tasks.base import TaskData
from leantrain.tasks.token_classification import TokenClassification
from tests.conftest import EXACT_JOB, assert_trained_alike

PEOPLE = [["Kaczmarek"], ["Anna", "Smith"], ["John"], ["Maria", "Wolfeschlegel", "Jones"]]
PLACES = [["Paris"], ["Berlin"], ["New", "York"], ["Oslo"]]
FILL = ["the", "met", "in", "today", "and", "visited", "with", "a", "friend", "from", "went", "to", "where", "it"]


def make_sentences(n: int, seed: int, longest: int = 40) -> list[tuple[list[str], list[str]]]:
    """Sentences of 1 to `longest` words with people and places in IOB2: very uneven token counts per sentence."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        words: list[str] = []
        tags: list[str] = []
        for _ in range(rng.randint(1, longest)):
            draw = rng.random()
            if draw < 0.12:
                words += (name := rng.choice(PEOPLE))
                tags += ["B-PER"] + ["I-PER"] * (len(name) - 1)
            elif draw < 0.22:
                words += (place := rng.choice(PLACES))
                tags += ["B-LOC"] + ["I-LOC"] * (len(place) - 1)
            else:
                words.append(rng.choice(FILL))
                tags.append("O")
        out.append((words, tags))
    return out


def write_conll(path: Path, sentences, columns=None) -> Path:
    lines = []
    for words, tags in sentences:
        lines += [f"{w}\t{t}" if columns is None else columns(w, t) for w, t in zip(words, tags)] + [""]
    path.write_text("\n".join(lines), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("ner")
    return (
        write_conll(root / "train.conll", make_sentences(96, seed=1)),
        write_conll(root / "eval.conll", make_sentences(24, seed=2)),
    )


@pytest.fixture()
def run(tiny_model_dir, corpus, tmp_path):
    count = iter(range(100))

    def go(model=None, **changes):
        base = dict(
            task="ner",
            model=str(model or tiny_model_dir),
            data=str(corpus[0]),
            eval_data=str(corpus[1]),
            cache_dir=str(tmp_path / "cache"),
            output_dir=str(tmp_path / f"run{next(count)}"),
            report=False,
            max_length=64,
            **EXACT_JOB,
        )
        result = train(TrainConfig(**{**base, **changes}))
        return result, load_file(result.model_dir / "model.safetensors")

    return go


def loss_log(result) -> list[float]:
    rows = [json.loads(x) for x in (result.output_dir / "metrics.jsonl").read_text().splitlines()]
    return [r["loss"] for r in rows if "loss" in r]


@pytest.fixture(scope="module")
def tokenizer(minilm_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(minilm_dir)


# -- alignment -------------------------------------------------------------------------------------------------------

NAMES = ["O", "B-LOC", "I-LOC", "B-PER", "I-PER"]


def windows_of(tokenizer, sentences, tags, max_length=64, stride=0, all_tokens=False):
    aligned = align_words(tokenizer, sentences)
    ids = [np.array([NAMES.index(t) for t in seq]) for seq in tags]
    continuation = np.array([0, 2, 2, 4, 4]) if all_tokens else None
    return aligned, make_windows(aligned, ids, max_length, stride, special_tokens(tokenizer), continuation)


@pytest.mark.parametrize("all_tokens", [False, True], ids=["first-sub-word", "every-sub-word"])
def test_a_word_of_four_pieces_is_labelled_on_its_first_or_on_every_one(tokenizer, all_tokens):
    words = ["Kaczmarek", "lives", "in", "Paris"]  # ka ##cz ##mare ##k: four pieces
    assert tokenizer.tokenize("Kaczmarek") == ["ka", "##cz", "##mare", "##k"]
    _, w = windows_of(tokenizer, [words], [["B-PER", "O", "O", "B-LOC"]], all_tokens=all_tokens)
    row = w.row(0)
    inner = [4, 4, 4] if all_tokens else [IGNORE] * 3  # I-PER after the B-PER of the first piece
    # [CLS] ka ##cz ##mare ##k lives in paris [SEP]
    assert row["token_labels"].tolist() == [IGNORE, 3, *inner, 0, 0, 1, IGNORE]
    assert row["word_index"].tolist() == [-1, 0, -1, -1, -1, 1, 2, 3, -1]  # scored once, at the first piece
    assert row["token_index"].tolist() == [-1, 0, 1, 2, 3, 4, 5, 6, -1]


def test_label_all_tokens_trains_later_sub_words_as_inside(tiny_model_dir, tmp_path):
    path = write_conll(tmp_path / "two.conll", [(["Kaczmarek", "met", "Anna"], ["B-PER", "O", "B-PER"]),
                                                (["in", "Oslo"], ["O", "B-LOC"])])  # fmt: skip
    cfg = TrainConfig(task="ner", data=str(path), eval_data=str(path), label_all_tokens=True)
    task = TokenClassification(cfg)
    windows = task.prepare_data(str(tiny_model_dir), None).train.features
    names = task.label_names
    assert [names[i] if i >= 0 else "-" for i in windows.row(0)["token_labels"]] == [
        "-",
        "B-PER",
        "I-PER",
        "I-PER",
        "I-PER",
        "O",
        "B-PER",
        "-",
    ]


@pytest.mark.parametrize("stride", [0, 8, 13])
def test_a_sentence_beyond_the_window_is_windowed_and_each_word_scored_once(tokenizer, stride):
    sentence = make_sentences(1, seed=5, longest=90)[0]
    words, tags = sentence
    aligned, w = windows_of(tokenizer, [words], [tags], max_length=32, stride=stride)
    n = len(aligned.token_ids[0])
    assert n > 3 * 30 and len(w) > 3  # several windows
    assert w.lengths.max() <= 32
    scored = np.concatenate([w.row(i)["word_index"] for i in range(len(w))])
    assert sorted(scored[scored >= 0].tolist()) == list(range(len(words)))  # every word once
    owned = np.concatenate([w.row(i)["token_index"] for i in range(len(w))])
    assert sorted(owned[owned >= 0].tolist()) == list(range(n))  # every token owned by one window
    _, whole = windows_of(tokenizer, [words], [tags], max_length=n + 2)
    full = whole.row(0)["token_labels"][1:-1]
    for i in range(len(w)):  # each window's labels are the whole sentence's at the tokens it owns
        row = w.row(i)
        mine = row["token_index"] >= 0
        assert (row["token_labels"][mine] == full[row["token_index"][mine]]).all()
        assert (row["token_labels"][~mine] == IGNORE).all()
    for i in range(len(w) - 1):  # consecutive windows share `stride` tokens of context
        a = w.row(i)["input_ids"][1:-1]
        b = w.row(i + 1)["input_ids"][1:-1]
        if stride:
            assert (a[-stride:] == b[:stride]).all()


def test_a_stride_left_out_fits_the_window_and_is_32_where_it_did_before(tokenizer):
    """Left out: 32 tokens shared, at most half of --max-length (and never the whole window); given, kept or refused."""
    from leantrain.data.alignment import window_stride

    specials = special_tokens(tokenizer)  # [CLS] and [SEP]
    assert [window_stride(None, m, specials) for m in (512, 128, 64, 63, 32, 8, 4, 3)] == [32, 32, 32, 31, 16, 4, 1, 0]
    assert window_stride(29, 32, specials) == 29
    with pytest.raises(ConfigError, match=r"--stride 30 must be .* below --max-length 32 .* \(30\); lower it"):
        window_stride(30, 32, specials)
    with pytest.raises(ConfigError, match="--max-length 2 leaves no room beside the 2 special tokens"):
        window_stride(None, 2, specials)


def test_a_short_max_length_trains_with_a_stride_that_fits_unless_one_given_does_not(
    run, capsys, tiny_model_dir, corpus, tmp_path
):
    """--max-length 32 is a 30-token window: the stride left out shares 16 tokens (said); a --stride 32 given is
    refused in one line."""
    result, _ = run(max_length=32, max_steps=1, batch_size=8)
    assert result.metrics["optimizer_steps"] == 1
    assert "consecutive ones sharing 16 (--stride left out" in capsys.readouterr().err
    argv = ["train", "--task", "ner", "--data", corpus[0], "--model", tiny_model_dir, "--max-length", "32",
            "--output-dir", tmp_path / "given", "--cache-dir", tmp_path / "cache", "--no-progress"]  # fmt: skip
    line = one_line(capsys, *argv, "--stride", "32")
    assert "--stride 32 must be at least 0 and below --max-length 32" in line and "leave it out" in line


@pytest.mark.parametrize("tags", [["O", "B-PER"], ["O", "B-PER", "O", "O"]], ids=["shorter", "longer"])
def test_a_tag_list_shorter_or_longer_than_its_words_is_refused_naming_the_row(tmp_path, tiny_model_dir, tags):
    path = tmp_path / "rows.jsonl"
    rows = [{"tokens": ["a", "b"], "ner_tags": ["O", "O"]}, {"tokens": ["he", "met", "Anna"], "ner_tags": tags}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    task = TokenClassification(TrainConfig(task="ner", data=str(path), model=str(tiny_model_dir)))
    with pytest.raises(DataError, match=rf"rows.jsonl: row 2 has 3 words in 'tokens' but {len(tags)} tags"):
        task.prepare_data(str(tiny_model_dir), None)


# -- scores ----------------------------------------------------------------------------------------------------------

EDGE_GOLD = [
    ["B-PER", "I-PER", "O", "B-LOC"],
    ["B-PER", "B-PER", "O"],  # adjacent entities of one type
    ["B-ORG", "I-ORG", "I-ORG", "O", "B-LOC", "I-LOC"],
    ["O", "O", "O"],
    ["B-LOC", "O", "B-PER", "I-PER"],
]
EDGE_PRED = [
    ["B-PER", "I-LOC", "O", "B-LOC"],  # nested types: a type change inside an entity
    ["B-PER", "I-PER", "O"],  # adjacent entities merged
    ["I-ORG", "I-ORG", "I-ORG", "O", "B-LOC", "I-LOC"],  # I- without B-
    ["O", "B-PER", "O"],
    ["B-LOC", "O", "O", "I-PER"],  # an I- that continues nothing, after O
]


def test_entity_scores_are_seqevals_strict_iob2_scores_on_every_edge_case(tiny_model_dir):
    """Through the task's own path: evaluation rows (each window's scored words and predictions, in any order and
    split across windows) become sentences, scored by seqeval; the word no window scored is predicted O."""
    from seqeval.metrics import accuracy_score, classification_report, f1_score, precision_score, recall_score
    from seqeval.scheme import IOB2

    task = TokenClassification(TrainConfig(task="ner", data="unused.conll", model=str(tiny_model_dir)))
    task.label_names = T.iob2_label_names(["PER", "LOC", "ORG"])
    task.eval_gold = EDGE_GOLD
    predicted = [list(p) for p in EDGE_PRED]
    predicted[4][1] = "O"  # this word gets no row below: the task predicts O for it (it is O here)
    width, rows = 8, {"pred": [], "word": [], "sentence": [], "loss_sum": [], "tokens": []}
    for s, seq in reversed(list(enumerate(EDGE_PRED))):  # each sentence in two windows, in reverse order
        cut = len(seq) // 2 + 1
        for start, half in ((0, seq[:cut]), (cut, seq[cut:])):
            word = [start + i if not (s == 4 and start + i == 1) else -1 for i in range(len(half))]
            rows["word"].append(word + [-1] * (width - len(half)))
            rows["pred"].append([task.label_names.index(t) for t in half] + [0] * (width - len(half)))
            rows["sentence"].append(s)
            rows["loss_sum"].append(1.0)
            rows["tokens"].append(2)
    scores = task.metrics({k: np.array(v) for k, v in rows.items()})
    strict = dict(mode="strict", scheme=IOB2)
    assert scores["f1"] == f1_score(EDGE_GOLD, predicted, **strict)  # the same arithmetic: the same bits
    assert scores["precision"] == precision_score(EDGE_GOLD, predicted, **strict)
    assert scores["recall"] == recall_score(EDGE_GOLD, predicted, **strict)
    assert scores["accuracy"] == accuracy_score(EDGE_GOLD, predicted)
    report = classification_report(EDGE_GOLD, predicted, output_dict=True, zero_division=0, **strict)
    for kind in ("PER", "LOC", "ORG"):
        assert scores[f"f1_{kind}"] == report[kind]["f1-score"], kind
    ours = task.evaluation_report({k: np.array(v) for k, v in rows.items()}, TaskData(None, None, [], None, []))
    assert set(ours["per_type"]) == {"PER", "LOC", "ORG"}
    for kind, row in ours["per_type"].items():
        theirs = report[kind]
        assert row == {"precision": theirs["precision"], "recall": theirs["recall"], "f1": theirs["f1-score"],
                       "support": theirs["support"]}, kind  # fmt: skip
    assert scores["loss"] == pytest.approx(0.5)
    # strict mode is not the CoNLL script's (which opens entities at the I- without B-): the set tells them apart
    assert scores["f1"] != pytest.approx(f1_score(EDGE_GOLD, predicted))


# -- the loss across micro-batches, processes and a resume ------------------------------------------------------------


@pytest.mark.parametrize("weighted", [False, True], ids=["plain", "class-weighted-smoothed"])
def test_the_loss_is_transformers_own_token_classification_loss(run, tiny_model_dir, corpus, weighted):
    """One step over every training window (in four micro-batches) with weights that cannot move: the logged loss is
    the mean over counted tokens of all windows, as BertForTokenClassification computes it given the labels in one
    batch; class-weighted and label-smoothed, as `cross_entropy(weight=..., label_smoothing=...)` averages."""
    from transformers import AutoModelForTokenClassification

    from leantrain.data.batching import Slot

    # given weights: "auto" (balanced) weights sum to the token count over the whole training set, which one step is
    losses = {"class_weights": "0.5,2,3,1.5,1", "label_smoothing": 0.1} if weighted else {}
    result, _ = run(batch_size=32, grad_accum=4, max_steps=1, lr=1e-30, **losses)
    cfg = TrainConfig(task="ner", data=str(corpus[0]), eval_data=str(corpus[1]), max_length=64, **losses)
    task = TokenClassification(cfg)
    data = task.prepare_data(str(tiny_model_dir), None)
    task.loss_units(data)
    assert len(data.train) <= 128
    model = AutoModelForTokenClassification.from_pretrained(result.model_dir).eval()
    batch = task.collator(data, train=True)(
        [{**data.train.features.row(i), "label": 0, "slot": Slot(i, 1.0, True)} for i in range(len(data.train))]
    )
    with torch.no_grad():
        theirs = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], labels=batch["labels"])
    expected = float(theirs.loss)
    if weighted:
        weight = torch.tensor(task.class_weights, dtype=torch.float32)
        assert len(set(task.class_weights.round(6))) > 2  # the weights differ by class
        flat = theirs.logits.reshape(-1, theirs.logits.shape[-1])
        expected = float(F.cross_entropy(flat, batch["labels"].flatten(), weight=weight, label_smoothing=0.1))
    assert loss_log(result)[0] == pytest.approx(expected, rel=1e-5)


@pytest.mark.parametrize(
    "changes",
    [{}, {"label_all_tokens": True, "class_weights": "auto", "label_smoothing": 0.1}],
    ids=["first-sub-word", "all-sub-words-weighted-smoothed"],
)
def test_accumulated_micro_batches_equal_one_big_batch_per_token(run, changes):
    """Sentences of 1 to 40 words: micro-batches of 3 hold very different counted tokens; only dividing by the
    whole step's (weighted) tokens makes four of them equal one batch of 12."""
    big, w_big = run(batch_size=12, grad_accum=1, max_steps=5, **changes)
    small, w_small = run(batch_size=3, grad_accum=4, max_steps=5, **changes)
    _, start = run(batch_size=12, max_steps=5, lr=1e-30, **changes)
    assert small.metrics["micro_steps"] == 4 * big.metrics["micro_steps"]
    assert_trained_alike(w_big, w_small, start, rel=1e-5)
    assert loss_log(small) == pytest.approx(loss_log(big), abs=1e-5)
    assert small.metrics["eval_f1"] == pytest.approx(big.metrics["eval_f1"], abs=1e-6)


def test_static_shapes_bucket_lengths_and_fill_the_short_micro_batch_without_changing_training(run):
    """--static-shapes (on with --compile): lengths padded up to buckets, and the epoch's short last micro-batch (96
    sentences in steps of 4 x 7: the last step's 12 are 7 + 5) filled with masked rows that score no word and own no
    token; training is the same as without, step for step."""
    job = dict(batch_size=7, grad_accum=4, epochs=1)
    off, w_off = run(**job, static_shapes="off")
    on, w_on = run(**job, static_shapes="on")
    _, start = run(**job, lr=1e-30)
    assert on.metrics["padding_fraction"] > off.metrics["padding_fraction"]  # the buckets' and the filled rows'
    assert on.metrics["train_examples"] == off.metrics["train_examples"] == 96  # filled rows are not examples
    assert_trained_alike(w_off, w_on, start, rel=1e-5)
    assert loss_log(on) == pytest.approx(loss_log(off), abs=1e-5)
    assert on.metrics["eval_f1"] == pytest.approx(off.metrics["eval_f1"], abs=1e-6)


def test_a_resumed_run_equals_the_uninterrupted_one_bitwise(run, dropout_model_dir):
    job = dict(model=dropout_model_dir, optimizer="adamw", lr=3e-3, max_steps=6, save_every=2, batch_size=8)
    whole, w_whole = run(**job, eval_every=3)
    ckpt = whole.output_dir / "checkpoints" / "step-000004"
    resumed, w_resumed = run(**job, eval_every=3, resume=str(ckpt))
    assert resumed.metrics["resumed_from"] == str(ckpt) and resumed.metrics["train_examples"] == 2 * 8
    different = [k for k in w_whole if not torch.equal(w_whole[k], w_resumed[k])]
    assert not different, f"{len(different)} tensors differ, e.g. {different[0]}"
    assert loss_log(resumed) == loss_log(whole)
    assert resumed.metrics["eval_f1"] == whole.metrics["eval_f1"]


@pytest.mark.slow  # two processes launched: about 60 s at load 2
def test_two_processes_equal_one_at_the_token_level(run, tiny_model_dir, corpus, tmp_path):
    from tests.parallel.test_data_parallel import flags, run_job, weights

    one, w_one = run(batch_size=8, max_steps=4)
    job = dict(
        task="ner",
        model=tiny_model_dir,
        data=corpus[0],
        eval_data=corpus[1],
        cache_dir=tmp_path / "c2",
        max_length=64,
        report=False,
        max_steps=4,
        **EXACT_JOB,
    )
    out = tmp_path / "two"
    rc, _, err = run_job(["-m", "leantrain", "train", *flags(**job, batch_size=4, num_processes=2, output_dir=out)])
    assert rc == 0, err[-3000:]
    two = json.loads((out / "metrics.json").read_text())
    assert two["num_processes"] == 2 and two["global_batch"] == 8
    _, start = run(batch_size=8, max_steps=4, lr=1e-30)
    assert_trained_alike(w_one, weights(out), start, rel=1e-5)
    for key in ("eval_loss", "eval_f1", "eval_accuracy"):  # every sentence scored once across the processes
        assert two[key] == pytest.approx(one.metrics[key], abs=1e-6), key


def test_the_cut_is_left_out_where_it_costs_or_cannot_run(tiny_model_dir, corpus, monkeypatch):
    """On a CPU in bf16 or fp16 the cut's gathers cost more than the rows save; a compiled graph or a checkpointed
    layer would not run its hooks."""
    from leantrain import parallel
    from leantrain.model import loading

    job = dict(task="ner", data=str(corpus[0]), eval_data=str(corpus[1]), max_length=64)
    data = TokenClassification(TrainConfig(**job)).prepare_data(str(tiny_model_dir), None)
    model = loading.load_for_classification(
        str(tiny_model_dir), data.label_names, auto_model="AutoModelForTokenClassification"
    )

    def cut(device: str, **changes) -> bool:
        monkeypatch.setattr(parallel, "device_type", lambda: device)
        task = TokenClassification(TrainConfig(**job, **changes))
        task.check_model(model)
        return task.tail is not None

    assert cut("cpu", precision="fp32") and cut("cuda", precision="bf16")
    assert not cut("cpu", precision="bf16") and not cut("cpu", precision="fp16")
    assert not cut("cpu", precision="fp32", compile=True)
    assert not cut("cpu", precision="fp32", activation_checkpointing=True)


def test_training_runs_the_last_layer_and_head_where_a_token_counts_only(tiny_model_dir, corpus):
    """The cut (`forward`) gives the whole model's loss and every gradient, on fewer rows than tokens."""
    from leantrain.data.batching import Slot
    from leantrain.model import loading

    task = TokenClassification(
        TrainConfig(task="ner", data=str(corpus[0]), eval_data=str(corpus[1]), max_length=64, precision="fp32")
    )
    data = task.prepare_data(str(tiny_model_dir), None)
    model = loading.load_for_classification(str(tiny_model_dir), data.label_names, auto_model=task.auto_model)
    task.check_model(model)
    assert task.tail is not None
    items = [{**data.train.features.row(i), "label": 0, "slot": Slot(i, 1.0, True)} for i in range(16)]
    batch = task.collator(data, train=True)(items)
    model.train()

    def grads(cut: bool):
        model.zero_grad()
        outputs = task.forward(model, batch) if cut else model(**task.model_inputs(batch))
        loss = task.loss_sum(outputs, batch)
        loss.backward()
        return float(loss), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    (cut_loss, cut_grads), (whole_loss, whole_grads) = grads(True), grads(False)
    assert task.tail_rows(batch) == int((batch["labels"] != IGNORE).sum()) < int(batch["attention_mask"].sum())
    assert cut_loss == pytest.approx(whole_loss, rel=1e-5)
    assert cut_grads.keys() == whole_grads.keys()
    for name, g in whole_grads.items():
        assert torch.allclose(cut_grads[name], g, atol=1e-6, rtol=1e-4), name


# -- inference -------------------------------------------------------------------------------------------------------

TEXTS = [
    "Anna Smith met Kaczmarek in New York today",
    "John went to Paris with Maria Wolfeschlegel Jones, and it was good.",
    "Oslo",
]


def trained(run):
    """A tiny tagger trained until it finds entities (an untrained one predicts O everywhere)."""
    return run(optimizer="adamw", lr=1e-2, max_steps=40, batch_size=12, warmup_ratio=0.1)


@pytest.mark.parametrize("aggregation", ["first", "simple", "average", "max"])
def test_predictions_are_the_pipelines_entities(run, aggregation):
    """The published model/ loads with pipeline("token-classification"), id2label set; predict gives its entities:
    the same types, scores and character offsets, and the text those offsets cut."""
    from transformers import pipeline

    result, _ = trained(run)
    config = json.loads((result.model_dir / "config.json").read_text())
    assert list(config["id2label"].values()) == ["O", "B-LOC", "I-LOC", "B-PER", "I-PER"]
    tagger = pipeline("token-classification", model=str(result.model_dir), aggregation_strategy=aggregation)
    ours = predict(str(result.output_dir), texts=TEXTS, aggregation=aggregation)
    found = 0
    for text, row in zip(TEXTS, ours):
        theirs = tagger(text)
        assert [(e["entity_group"], e["start"], e["end"]) for e in row["entities"]] == [
            (e["entity_group"], e["start"], e["end"]) for e in theirs
        ]
        assert [e["score"] for e in row["entities"]] == pytest.approx([float(e["score"]) for e in theirs], abs=1e-5)
        assert all(e["word"] == text[e["start"] : e["end"]] for e in row["entities"])
        found += len(theirs)
    assert found > 0


@pytest.mark.parametrize("aggregation", ["first", "simple", "average", "max"])
def test_entities_are_grouped_as_the_pipeline_groups_them_whatever_the_tags(tiny_model_dir, tmp_path, aggregation):
    """The pipeline's own postprocessing of random logits, drawn so that adjacent B- of one type, I- after O and
    type changes inside words are common, against `pieces` and `group` on the same probabilities."""
    from transformers import pipeline

    from leantrain.data.alignment import align_texts
    from leantrain.model import loading
    from leantrain.tasks.entities import group, pieces

    loading.load_for_classification(str(tiny_model_dir), NAMES, auto_model="AutoModelForTokenClassification")\
        .save_pretrained(tmp_path / "tagger")  # fmt: skip
    tagger = pipeline("token-classification", model=str(tmp_path / "tagger"), tokenizer=str(tiny_model_dir))
    pre, _, post = tagger._sanitize_parameters(aggregation_strategy=aggregation)
    text = "Anna Smith-Jones met Kaczmarek, Wolfeschlegel and John in New York on 3rd May."
    aligned = align_texts(tagger.tokenizer, [text])
    generator = torch.Generator().manual_seed(0)
    for _ in range(20):
        inputs = next(iter(tagger.preprocess(text, **pre)))
        n = inputs["input_ids"].shape[1]
        logits = 3 * torch.randn(1, n, len(NAMES), generator=generator)
        outputs = {**inputs, "logits": logits, "word_ids": None, "word_to_chars_map": None}
        outputs["special_tokens_mask"] = inputs["special_tokens_mask"]
        outputs.pop("sentence", None)
        theirs = tagger.postprocess([{**outputs, "sentence": text, "is_last": True}], **post)
        probs = torch.softmax(logits[0, 1:-1].double(), -1).float().numpy()  # the content tokens'
        units = pieces(probs, aligned.word_ids[0], aligned.token_chars[0], NAMES, aggregation)
        ours = group(units, text)
        assert [(e["entity_group"], e["start"], e["end"]) for e in ours] == [
            (e["entity_group"], e["start"], e["end"]) for e in theirs
        ]
        assert [e["score"] for e in ours] == pytest.approx([float(e["score"]) for e in theirs], abs=1e-5)


def test_span_rows_tag_the_tokenizers_words(tokenizer):
    """A span ending where punctuation starts tags the words before it only; one that starts inside a word tags that
    word (and is counted); a span of spaces tags nothing."""
    from leantrain.data.alignment import align_texts
    from leantrain.data.tagged import TaggedRows
    from leantrain.tasks.token_classification import _span_tags

    texts = ["Anna Smith, from Paris.", "the Texas-based firm", "a  b"]
    spans = [[(0, 10, "PER"), (17, 22, "LOC")], [(5, 9, "LOC")], [(1, 2, "PER")]]
    rows = TaggedRows("spans.jsonl", ["row 1", "row 2", "row 3"], texts=texts, char_spans=spans)
    aligned = align_texts(tokenizer, texts)
    assert aligned.words[0] == ["Anna", "Smith", ",", "from", "Paris", "."]
    tags, misaligned = _span_tags(aligned, rows)
    assert tags == [["B-PER", "I-PER", "O", "O", "B-LOC", "O"], ["O", "B-LOC", "O", "O", "O"], ["O", "O"]]
    assert misaligned == 1


def test_evaluate_scores_every_input_format_alike(run, corpus, tmp_path):
    """The evaluation sentences as CoNLL (IOB2, and BIOES with three columns), a JSONL table of names, a `datasets`
    folder and a Parquet file of ClassLabel ids, and span rows: the same scores."""
    import datasets

    result, _ = trained(run)
    assert result.metrics["eval_f1"] > 0.3  # scores that a wrong mapping of tags would change
    sentences = make_sentences(24, seed=2)
    names = ["O", "B-PER", "I-PER", "B-LOC", "I-LOC"]  # another order than the model's: mapped by name
    bioes = [(w, T.convert(t, "iob2", "bioes")[0]) for w, t in sentences]
    write_conll(tmp_path / "bioes.conll", bioes, columns=lambda w, t: f"{w} NN {t}")
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps({"tokens": w, "ner_tags": t}) + "\n" for w, t in sentences))
    features = datasets.Features(
        {
            "tokens": datasets.Sequence(datasets.Value("string")),
            "ner_tags": datasets.Sequence(datasets.ClassLabel(names=names)),
        }
    )
    ds = datasets.Dataset.from_dict(
        {"tokens": [w for w, _ in sentences], "ner_tags": [[names.index(x) for x in t] for _, t in sentences]},
        features=features,
    )
    ds.save_to_disk(str(tmp_path / "saved"))
    ds.to_parquet(str(tmp_path / "rows.parquet"))
    spans = []
    for words, tags in sentences:
        starts = np.cumsum([0] + [len(w) + 1 for w in words])
        found = T.spans(tags, "iob2")[0]
        spans.append(
            {
                "text": " ".join(words),
                "entities": [
                    {"start": int(starts[s.start]), "end": int(starts[s.end] - 1), "label": s.type} for s in found
                ],
            }
        )
    (tmp_path / "spans.jsonl").write_text("".join(json.dumps(r) + "\n" for r in spans))
    run_dir = str(result.output_dir)
    reference = evaluate(run_dir, str(corpus[1]))
    assert reference["sentences"] == 24 and set(reference["per_type"]) == {"PER", "LOC"}
    own = evaluate(run_dir)  # the run's own held-out sentences: its --eval-data, prepared as the run prepared it
    assert own["f1"] == pytest.approx(result.metrics["eval_f1"], abs=1e-9) == pytest.approx(reference["f1"])
    for source, extra in [
        ("bioes.conll", {"tag_column": -1}),
        ("rows.jsonl", {}),
        ("saved", {}),
        ("rows.parquet", {}),
        ("spans.jsonl", {}),
    ]:
        scores = evaluate(run_dir, str(tmp_path / source), **extra)
        for key in ("f1", "precision", "recall", "accuracy", "loss"):
            assert scores[key] == pytest.approx(reference[key], abs=1e-6), (source, key)


def test_predict_reads_words_from_a_conll_file_and_texts_from_a_text_file(run, tmp_path):
    result, _ = run(optimizer="adamw", lr=3e-3, max_steps=4, batch_size=12)
    (tmp_path / "words.conll").write_text("Anna\nSmith\nmet\n\n-DOCSTART-\n\nOslo\n")
    rows = predict(str(result.output_dir), str(tmp_path / "words.conll"))
    assert [r["tokens"] for r in rows] == [["Anna", "Smith", "met"], ["Oslo"]]
    assert all(len(r["tags"]) == len(r["tokens"]) for r in rows)
    (tmp_path / "texts.txt").write_text("Anna Smith met Kaczmarek\n\nJohn in Paris\n")
    rows = predict(str(result.output_dir), str(tmp_path / "texts.txt"))
    assert [r["text"] for r in rows] == ["Anna Smith met Kaczmarek", "John in Paris"]
    (tmp_path / "texts.jsonl").write_text('{"text": "John in Paris"}\n{"text": "Oslo"}\n')
    table = predict(str(result.output_dir), str(tmp_path / "texts.jsonl"))
    assert [r["text"] for r in table] == ["John in Paris", "Oslo"] and table[0]["entities"] == rows[1]["entities"]


def test_a_conll_2003_file_with_docstarts_iob1_tags_and_four_columns(run, tmp_path):
    """-DOCSTART- lines are skipped, --tag-column picks the last of four columns, IOB1 is detected and converted."""
    sentences = make_sentences(40, seed=7)
    iob1 = [(w, T.convert(t, "iob2", "iob1")[0]) for w, t in sentences]
    path = write_conll(tmp_path / "train.conll", iob1, columns=lambda w, t: f"{w} NNP B-NP {t}")
    path.write_text("-DOCSTART- -X- -X- O\n\n" + path.read_text())
    result, _ = run(data=str(path), eval_data=None, tag_column=-1, max_steps=2, batch_size=8)
    task = TokenClassification(TrainConfig(task="ner", data=str(path), tag_column=-1))
    rows = task._read(str(path), "train")
    assert len(rows) == 40 and task._scheme(rows) == "iob1"
    assert json.loads((result.model_dir / "config.json").read_text())["id2label"]["1"] == "B-LOC"


def test_lora_trains_a_token_classifier_whose_merged_model_the_pipeline_loads(run):
    from transformers import pipeline

    result, _ = run(lora=True, optimizer="adamw", lr=3e-3, max_steps=3, batch_size=12)
    tagger = pipeline("token-classification", model=str(result.model_dir))
    assert isinstance(tagger("Anna met John in Paris"), list)


# -- bad input -------------------------------------------------------------------------------------------------------


def one_line(capsys, *argv) -> str:
    from leantrain.commands.cli import main

    code = main([str(a) for a in argv])
    err = capsys.readouterr().err
    lines = [line for line in err.strip().splitlines() if line]
    assert code == 2 and "Traceback" not in err, err
    assert len(lines) == 1, err
    return lines[0]


def test_bad_input_is_refused_in_one_line(capsys, run, tiny_model_dir, corpus, tmp_path):
    base = [
        "train",
        "--task",
        "ner",
        "--model",
        tiny_model_dir,
        "--output-dir",
        tmp_path / "bad",
        "--no-progress",
        "--no-report",
        "--cache-dir",
        tmp_path / "cache",
    ]
    line = one_line(capsys, *base)
    assert "--task token-classification needs --data" in line
    (tmp_path / "three.conll").write_text("Anna NNP B-PER\nmet VBD O\n")
    line = one_line(capsys, *base, "--data", tmp_path / "three.conll")
    assert "three.conll: line 1 has 3 columns" in line and "--tag-column" in line
    (tmp_path / "spans.jsonl").write_text(
        '{"text": "Anna met", "entities": [[0, 4, "PER"]]}\n{"text": "in Oslo", "entities": [[3, 9, "LOC"]]}\n'
    )
    line = one_line(capsys, *base, "--data", tmp_path / "spans.jsonl")
    assert "spans.jsonl: row 2: the span [3, 9) (LOC) lies outside its text of 7 characters" in line
    orgs = write_conll(tmp_path / "orgs.conll", [(["Acme", "hired", "Anna"], ["B-ORG", "O", "B-PER"])])
    line = one_line(capsys, *base, "--data", corpus[0], "--eval-data", orgs)
    assert "orgs.conll: tags ['B-ORG'] never occur in the training data" in line
    (tmp_path / "sentences.csv").write_text('tokens,tags\nAnna met Bo,"[""B-PER""]"\n')
    line = one_line(capsys, *base, "--data", tmp_path / "sentences.csv")
    assert "row 1 of column 'tokens' is not a list ('Anna met Bo')" in line  # the cell as it is, not what parsing gave
    line = one_line(capsys, *base, "--data", f"{corpus[0]}@0.5", "--data", f"{orgs}@0.5")
    assert "--task token-classification reads one source, not a mixture of 2" in line
    result, _ = run(max_steps=1, batch_size=8)
    capsys.readouterr()
    line = one_line(capsys, "evaluate", result.output_dir, "--data", orgs)
    assert "orgs.conll: tags ['B-ORG'] never occur in the training data" in line
    assert not (tmp_path / "bad" / "metrics.json").exists()


def test_a_reading_flag_no_source_reads_is_refused_but_a_runs_recorded_one_is_read_back(
    capsys, run, corpus, tiny_model_dir, tmp_path
):
    """--tags-column beside a CoNLL file, --tag-column beside a table and --tag-scheme beside span rows were
    ignored without a word (span rows under --tag-scheme none were told their own tags "never occur in the training
    data"); a run's config.yaml holding such a flag still evaluates."""
    base = ["train", "--task", "ner", "--model", tiny_model_dir, "--output-dir", tmp_path / "bad", "--no-progress"]
    line = one_line(capsys, *base, "--data", corpus[0], "--tags-column", "ner")
    assert "--tags-column ner is for a table's tags, and " in line, line
    assert line.endswith("train.conll is a CoNLL file (a CoNLL file's tag column is --tag-column); drop --tags-column")
    table = tmp_path / "rows.jsonl"
    table.write_text(json.dumps({"tokens": ["Anna", "met"], "ner_tags": ["B-PER", "O"]}) + "\n")
    line = one_line(capsys, *base, "--data", table, "--eval-data", corpus[1], "--tag-column", "2")
    assert "--tag-column 2 is for CoNLL files" not in line  # the evaluation file is a CoNLL file: it is read
    line = one_line(capsys, *base, "--data", table, "--tag-column", "2")
    assert "--tag-column 2 is for CoNLL files, and " in line and "rows.jsonl is a table of words and tags" in line, line
    spans = tmp_path / "spans.jsonl"
    spans.write_text('{"text": "Anna met", "entities": [[0, 4, "PER"]]}\n{"text": "Bo", "entities": []}\n')
    line = one_line(capsys, *base, "--data", spans, "--tag-scheme", "none")
    assert "--tag-scheme none is for word tags, and " in line and "spans.jsonl is texts with entity spans" in line
    assert not (tmp_path / "bad").exists()
    result, _ = run(max_steps=1, batch_size=8)
    recorded = result.output_dir / "config.yaml"
    recorded.write_text(recorded.read_text() + "tags_column: ner\n")  # as a run before this check recorded it
    assert evaluate(str(result.output_dir))["sentences"] == 24


def test_evaluate_and_predict_refuse_a_reading_flag_they_were_given_that_nothing_reads(capsys, run, corpus, tmp_path):
    """evaluate and predict ignored a token reading flag given on their own command line that their --data's format
    does not read (--tags-column beside a CoNLL file), that only another task reads (--label-column), or that nothing
    reads without --data (the run's held-out rows are read as the run read them): each is refused in one line, as
    train refuses it. A run's recorded config holding such a flag still reads back, whatever file is scored."""
    result, _ = run(max_steps=1, batch_size=8)
    run_dir = result.output_dir
    capsys.readouterr()
    line = one_line(capsys, "evaluate", run_dir, "--data", corpus[1], "--tags-column", "ner")
    assert line.endswith("eval.conll is a CoNLL file (a CoNLL file's tag column is --tag-column); drop --tags-column")
    assert "--tags-column ner is for a table's tags, and " in line, line
    table = tmp_path / "rows.jsonl"
    table.write_text(json.dumps({"tokens": ["Anna", "met"], "ner_tags": ["B-PER", "O"]}) + "\n")
    line = one_line(capsys, "evaluate", run_dir, "--data", table, "--tag-column", "2")
    assert "--tag-column 2 is for CoNLL files, and " in line and "rows.jsonl is a table of words and tags" in line, line
    spans = tmp_path / "spans.jsonl"
    spans.write_text('{"text": "Anna met", "entities": [[0, 4, "PER"]]}\n')
    line = one_line(capsys, "evaluate", run_dir, "--data", spans, "--tag-scheme", "iob2")
    assert "--tag-scheme iob2 is for word tags, and " in line and line.endswith("drop --tag-scheme"), line
    line = one_line(capsys, "predict", run_dir, "--data", corpus[1], "--tokens-column", "words")
    assert "--tokens-column words is for a table's words, and " in line and "eval.conll is a CoNLL file" in line, line
    texts = tmp_path / "texts.txt"
    texts.write_text("Anna met John\n")
    line = one_line(capsys, "predict", run_dir, "--data", texts, "--text-column", "body")
    assert "--text-column body is for the texts of span rows, and " in line and "texts.txt is a text file" in line
    line = one_line(capsys, "evaluate", run_dir, "--data", corpus[1], "--label-column", "y")
    assert line.endswith(
        "the token-classification task does not read --label-column (text-classification, "
        "image-classification, audio-classification); leave it out (or choose their task with --task)"
    )
    line = one_line(capsys, "evaluate", run_dir, "--data", corpus[1], "--max-target-length", "64")
    assert line.endswith(
        "the token-classification task does not read --max-target-length (seq2seq); leave it out "
        "(or choose their task with --task)"
    ), line
    line = one_line(capsys, "evaluate", run_dir, "--tags-column", "ner")
    assert "--tags-column ner is for reading --data, and evaluate without --data rescores the run's held-out " in line
    assert line.endswith("give --data, or leave --tags-column out"), line
    line = one_line(capsys, "predict", run_dir, "--text", "Anna met", "--tokens-column", "words")
    assert "--tokens-column words is for reading --data" in line and "leave --tokens-column out" in line, line
    recorded = run_dir / "config.yaml"
    recorded.write_text(recorded.read_text() + "tags_column: ner\ntag_column: 2\n")  # as an older run recorded them
    assert evaluate(str(run_dir), str(corpus[1]))["sentences"] == 24  # its own file: read as the run read it
    assert evaluate(str(run_dir), str(table))["sentences"] == 1
    assert predict(str(run_dir), str(corpus[1]))[0]["tokens"] == make_sentences(24, seed=2)[0][0]


# -- planner and telemetry -------------------------------------------------------------------------------------------


def tagged_batch(tiny_model_dir, corpus, attention: str = "sdpa", lora: bool = False):
    """A token classifier of the tiny BERT (with LoRA adapters: `lora`), its task checked on it, and a training
    batch of 16 windows."""
    from leantrain.data.batching import Slot
    from leantrain.model import loading
    from leantrain.model import lora as adapters

    cfg = TrainConfig(task="ner", data=str(corpus[0]), eval_data=str(corpus[1]), max_length=64, precision="fp32")
    task = TokenClassification(cfg)
    data = task.prepare_data(str(tiny_model_dir), None)
    model = loading.load_for_classification(str(tiny_model_dir), data.label_names, auto_model=task.auto_model)
    model.set_attn_implementation(attention)
    if lora:
        model = adapters.apply(model, cfg, None)
    task.check_model(model)
    items = [{**data.train.features.row(i), "label": 0, "slot": Slot(i, 1.0, True)} for i in range(16)]
    return task, model.train(), task.collator(data, train=True)(items)


@pytest.mark.parametrize("lora", [False, True])
def test_the_flops_counted_are_what_the_forward_computes_with_and_without_the_cut(tiny_model_dir, corpus, lora):
    """Against torch's FlopCounterMode (eager attention, which it counts): the closed form's head at every token
    (counted on the meta device with LoRA, whose frozen weights get no gradients), and the meter charging the cut
    batch less by what it skipped. The closed form counts biases and norms too."""
    from dataclasses import replace

    from torch.utils.flop_counter import FlopCounterMode

    from leantrain.telemetry.flops import FlopMeter, flop_model

    task, model, batch = tagged_batch(tiny_model_dir, corpus, "eager", lora)
    counts = []
    for forward in (task.forward, lambda m, b: m(**task.model_inputs(b))):
        with FlopCounterMode(display=False) as counter:
            task.loss_sum(forward(model, batch), batch).backward()
        counts.append(counter.get_total_flops())
    flops = flop_model(model)
    if not lora:
        assert flops.per_sequence == 0 and "5 labels" in flops.source  # the head acts on tokens, not on sequences
    meter = FlopMeter(replace(flops, tail_per_row=task.tail_flops(model)))
    cut = meter.add(batch["input_ids"], batch["attention_mask"], None, task.tail_rows(batch))
    whole = meter.add(batch["input_ids"], batch["attention_mask"], None, None)
    assert whole == pytest.approx(counts[1], rel=0.03)
    assert whole - cut == pytest.approx(counts[1] - counts[0], rel=0.03)
    assert counts[1] - counts[0] > 0.1 * counts[1]


def test_a_token_classifiers_activations_are_planned_as_its_task_runs_it(tiny_model_dir, corpus):
    """The planner's proxies are token classifiers: what one training step of the task saves for backward, every
    token tagged (the planner's bound), is what it plans; a sequence classifier's plan (its last layer at the first
    token only) would be a fifth lower."""
    from leantrain.planner import memory as M
    from tests.planner.test_memory import saved_bytes

    task, model, _ = tagged_batch(tiny_model_dir, corpus)
    ids = torch.randint(1000, 30000, (4, 32), generator=torch.Generator().manual_seed(0))
    full = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": torch.zeros_like(ids),
            "word_index": torch.zeros_like(ids), "token_index": torch.zeros_like(ids)}  # fmt: skip
    measured = saved_bytes(model, lambda: task.loss_sum(task.forward(model, full), full))
    facts = M.model_facts(str(tiny_model_dir), task="token-classification")
    assert facts.kind == "token-classifier"
    planned = M.activation_profile(facts.config_json, 32, "fp32", False).saved(4, facts.layers, False)
    assert planned == pytest.approx(measured, rel=0.03)
    sequence = M.model_facts(str(tiny_model_dir))
    assert M.activation_profile(sequence.config_json, 32, "fp32", False).saved(4, facts.layers, False) < 0.9 * planned


def test_eight_steps_equal_the_hf_trainers_with_run_ners_collator(run, tiny_model_dir, corpus, tmp_path):
    """The same head, data and settings through transformers' Trainer (`DataCollatorForTokenClassification`, labels on
    first sub-words, as examples/pytorch/token-classification/run_ner.py makes them): one full batch a step, so the
    order of examples cannot differ; AdamW with weight decay, warm-up and linear decay, clipping at 1. The losses of
    every step and the final weights agree: what leantrain computes is what the Trainer computes."""
    import datasets
    from benchmarks.token_classification_vs_hf import read_sentences
    from transformers import (
        AutoModelForTokenClassification,
        AutoTokenizer,
        DataCollatorForTokenClassification,
        Trainer,
        TrainingArguments,
    )

    words, tags = read_sentences(corpus[0])
    names = ["O", "B-LOC", "I-LOC", "B-PER", "I-PER"]
    label_id = {n: i for i, n in enumerate(names)}
    torch.manual_seed(0)
    init = tmp_path / "init"
    AutoModelForTokenClassification.from_pretrained(
        str(tiny_model_dir), num_labels=len(names), id2label=dict(enumerate(names)), label2id=label_id
    ).save_pretrained(init)
    tokenizer = AutoTokenizer.from_pretrained(str(tiny_model_dir))
    tokenizer.save_pretrained(init)
    settings = dict(lr=1e-3, weight_decay=0.01, max_grad_norm=1.0, steps=8)

    def encode(batch):
        enc = tokenizer(batch["tokens"], is_split_into_words=True, truncation=True, max_length=128)
        enc["labels"] = [
            [-100 if w is None or w == p else label_id[t[w]] for p, w in zip([None, *enc.word_ids(i)], enc.word_ids(i))]
            for i, t in enumerate(batch["tags"])
        ]
        return enc

    rows = datasets.Dataset.from_dict({"tokens": words, "tags": tags})
    rows = rows.map(encode, batched=True, remove_columns=["tokens", "tags"])
    args = TrainingArguments(
        output_dir=str(tmp_path / "hf"), per_device_train_batch_size=len(words), max_steps=settings["steps"],
        learning_rate=settings["lr"], weight_decay=settings["weight_decay"], warmup_steps=0.25,
        lr_scheduler_type="linear", max_grad_norm=settings["max_grad_norm"], use_cpu=True, report_to=[],
        save_strategy="no", logging_steps=1, disable_tqdm=True, seed=1,
    )  # fmt: skip
    model = AutoModelForTokenClassification.from_pretrained(init)
    trainer = Trainer(
        model=model, args=args, train_dataset=rows, data_collator=DataCollatorForTokenClassification(tokenizer)
    )
    trainer.train()
    theirs = [h["loss"] for h in trainer.state.log_history if "loss" in h]

    result, ours = run(model=init, optimizer="adamw", lr=settings["lr"], weight_decay=settings["weight_decay"],
                       max_grad_norm=settings["max_grad_norm"], warmup_ratio=0.25, scheduler="linear",
                       batch_size=len(words), max_steps=settings["steps"], max_length=128)  # fmt: skip
    assert loss_log(result) == pytest.approx(theirs, rel=1e-5)
    for name, value in model.state_dict().items():
        assert torch.allclose(ours[name], value, atol=1e-5), name


def test_scoring_entities_imports_neither_scikit_learn_nor_scipy():
    """seqeval's metrics module imports both (half a second of every run) for arithmetic the scores do themselves."""
    from tests.imports_helper import imported

    code = (
        "from leantrain.tasks.entities import entity_scores, entity_report; "
        "g = [['B-PER', 'I-PER', 'O']]; entity_scores(g, g, 'iob2'); entity_report(g, g)"
    )
    assert imported(code, "sklearn", "scipy", "seqeval") == ["seqeval"]


@pytest.mark.parametrize("labels", [["O", "B-PER"], ["O", "B-PER", "I-PER"]])
def test_a_sentence_classifier_taken_for_tokens_gets_a_new_head_and_keeps_its_body(tiny_model_dir, tmp_path, labels):
    """A sentence classifier's `classifier` has the token head's name: with as many labels it was loaded as the token
    head without a word (trained on the pooled [CLS], not on tokens); with another count the load was refused."""
    from transformers import BertConfig, BertForSequenceClassification

    from leantrain.model import loading

    config = BertConfig.from_pretrained(tiny_model_dir, id2label={0: "neg", 1: "pos"})
    torch.manual_seed(7)
    sentences = BertForSequenceClassification(config)
    sentences.save_pretrained(tmp_path / "sentiment")
    notes: list[str] = []
    tokens = loading.load_for_classification(
        str(tmp_path / "sentiment"), labels, auto_model="AutoModelForTokenClassification", notes=notes
    )
    assert notes == [
        "the model's head (trained as BertForSequenceClassification) is another task's: a new TokenClassification "
        "head is started"
    ]
    assert tokens.classifier.weight.shape == (len(labels), 64)
    assert not torch.equal(tokens.classifier.weight[:2], sentences.classifier.weight)
    # drawn as a new head is
    assert float(tokens.classifier.weight.std()) == pytest.approx(config.initializer_range, rel=0.3)
    for name, value in sentences.bert.state_dict().items():
        if not name.startswith("pooler."):  # the token model has no pooler
            assert torch.equal(tokens.bert.state_dict()[name], value), name


def test_a_run_trained_without_a_tag_scheme_is_scored_so_by_evaluate_on_any_file(run, corpus, tmp_path):
    """--tag-scheme none trains B-PER and I-PER as plain tags and scores them per tag: evaluate on a copy of the
    evaluation file scored entities instead (its model's label names have prefixes), so the two F1s differed."""
    result, _ = run(tag_scheme="none", max_steps=4)
    run_dir = str(result.output_dir)
    copy = tmp_path / "copy.conll"
    copy.write_bytes(corpus[1].read_bytes())
    own, again = evaluate(run_dir), evaluate(run_dir, str(copy))
    assert again["tag_scheme"] == "none" and "per_type" not in again
    for key in ("f1", "accuracy", "loss"):
        assert again[key] == pytest.approx(own[key], abs=1e-9) == pytest.approx(result.metrics[f"eval_{key}"]), key
