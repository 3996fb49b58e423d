"""End to end on a tiny random BERT: the outputs a user relies on, caching, and never losing a run."""

import json
import os

import numpy as np
import pytest
import yaml

from leantrain import TrainConfig, evaluate, train
from leantrain.errors import ConfigError, DataError, ModelError


@pytest.fixture()
def job(tiny_model_dir, sentiment_csv, cache_dir, tmp_path):
    def make(**changes):
        base = dict(
            model=str(tiny_model_dir),
            data=str(sentiment_csv),
            output_dir=str(tmp_path / "run"),
            cache_dir=str(cache_dir),
            batch_size=16,
            epochs=1,
            lr=1e-3,
            progress=False,
            log_every=2,
            precision="fp32",
            report=False,
        )
        return TrainConfig(**{**base, **changes})

    return make


def test_train_writes_a_shippable_run(job, capsys):
    result = train(job(epochs=4, lr=3e-3, warmup_ratio=0.0, report=True))
    out = result.output_dir
    for name in (
        "model/config.json",
        "model/model.safetensors",
        "model/tokenizer.json",
        "metrics.json",
        "metrics.jsonl",
        "config.yaml",
        "report.html",
    ):
        assert (out / name).is_file(), name
    assert not (out / ".incomplete").exists()
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics == pytest.approx(result.metrics)
    assert metrics["eval_accuracy"] > 0.8  # the label is one word: even a tiny model learns it
    assert 0 <= metrics["padding_fraction"] < 0.2
    assert metrics["train_samples_per_second"] > 0 and metrics["train_tokens_per_second"] > 0
    assert metrics["steady_mfu"] > 0 and metrics["mfu"] > 0  # the run's FLOPs over the probed peak
    # every file of model/ readable as the others are (model.safetensors was written 0600)
    mask = os.umask(0)
    os.umask(mask)
    assert {p.name: p.stat().st_mode & 0o777 for p in (out / "model").iterdir()} == {
        p.name: 0o666 & ~mask for p in (out / "model").iterdir()
    }
    # label map travels with the model
    config = json.loads((out / "model/config.json").read_text())
    assert config["id2label"] == {"0": "neg", "1": "pos"}
    # the resolved config records what ran
    assert yaml.safe_load((out / "config.yaml").read_text())["batch_size"] == 16
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    train_rows = [r for r in rows if "loss" in r]
    assert [r["step"] for r in train_rows] == list(range(2, metrics["optimizer_steps"] + 1, 2))
    assert train_rows[-1]["loss"] < train_rows[0]["loss"]
    assert "eval_accuracy" in rows[-1]
    # a Hub model card: front matter, then what the model is and how well it did
    card = (out / "model" / "README.md").read_text()
    assert card.startswith("---\n") and "library_name: transformers" in card
    assert f"{metrics['eval_accuracy']:.4f}" in card

    # the saved model (not only the one in memory) loads in a transformers pipeline, offline, and has learned
    from transformers import pipeline

    clf = pipeline("text-classification", model=str(result.model_dir))
    assert [r["label"] for r in clf(["the film was wonderful and superb", "an awful and boring plot"])] == [
        "pos",
        "neg",
    ]


def test_a_checkpoint_stored_in_bf16_trains_in_fp32_as_its_weights_upcast(job, tiny_model_dir, tmp_path):
    """Most causal LMs on the Hub are stored in bf16, and transformers 5 loads a checkpoint in the dtype it was saved
    in. Its weights train in fp32 (the optimizer's master weights; --precision sets the compute): a bf16 checkpoint
    trains exactly as the same weights stored in fp32, and publishes fp32."""
    import torch
    from safetensors.torch import load_file
    from transformers import AutoModel, AutoTokenizer

    model = AutoModel.from_pretrained(tiny_model_dir).to(torch.bfloat16)
    published = {}
    for dtype in (torch.bfloat16, torch.float32):
        folder = tmp_path / str(dtype)
        model.to(dtype).save_pretrained(folder)  # bf16 to fp32 is exact: the same weights, stored two ways
        AutoTokenizer.from_pretrained(tiny_model_dir).save_pretrained(folder)
        run = job(model=str(folder), output_dir=str(tmp_path / f"run-{dtype}"), optimizer="adamw", max_steps=3)
        published[dtype] = load_file(train(run).output_dir / "model" / "model.safetensors")
    assert {t.dtype for t in published[torch.bfloat16].values()} == {torch.float32}
    assert all(torch.equal(published[torch.bfloat16][k], v) for k, v in published[torch.float32].items())


def test_a_run_is_repeatable_with_the_same_seed(job, tmp_path):
    a = train(job(output_dir=str(tmp_path / "a"))).metrics
    b = train(job(output_dir=str(tmp_path / "b"))).metrics
    assert a["train_loss"] == b["train_loss"] and a["eval_loss"] == b["eval_loss"]


def test_second_run_reuses_the_tokenization_cache(job, tmp_path, capsys):
    train(job(output_dir=str(tmp_path / "a"), max_steps=1))
    first = capsys.readouterr().err
    train(job(output_dir=str(tmp_path / "b"), max_steps=1))
    second = capsys.readouterr().err
    assert "tokenized and cached" in first
    assert "tokenized data loaded from cache" in second


def test_a_finished_run_is_not_overwritten(job):
    train(job(max_steps=1))
    with pytest.raises(ConfigError, match="holds a finished run; pass --overwrite"):
        train(job(max_steps=1))


def test_a_finished_run_is_trained_further_with_resume_and_overwrite(job, tmp_path):
    """A longer --max-steps on a finished run: --resume alone is told to add --overwrite (not to "replace" the
    run), and with both the run goes on from its last checkpoint."""
    train(job(max_steps=2, save_every=1))
    with pytest.raises(ConfigError, match="to train it further from its checkpoint add --overwrite to --resume"):
        train(job(max_steps=3, save_every=1, resume="auto"))
    before = {p.name: p.read_bytes() for p in (tmp_path / "run").rglob("*") if p.is_file()}
    # a resume refused (a setting that would change the result) leaves the finished run as it was, to the byte
    from leantrain.run.checkpoint import CheckpointError

    with pytest.raises(CheckpointError, match="cannot resume"):
        train(job(max_steps=3, save_every=1, resume="auto", overwrite=True, lr=0.5))
    assert {p.name: p.read_bytes() for p in (tmp_path / "run").rglob("*") if p.is_file()} == before
    longer = train(job(max_steps=3, save_every=1, resume="auto", overwrite=True))
    assert longer.metrics["resumed_from"].endswith("step-000002") and longer.metrics["optimizer_steps"] == 3


def test_a_failed_overwrite_keeps_the_finished_run(job, monkeypatch):
    first = train(job(max_steps=2))
    weights = (first.model_dir / "model.safetensors").read_bytes()
    metrics = (first.output_dir / "metrics.json").read_text()

    from leantrain.training.evaluator import Evaluator

    def boom(*args, **kwargs):
        raise RuntimeError("simulated crash during the final evaluation")

    monkeypatch.setattr(Evaluator, "evaluate", boom)
    with pytest.raises(RuntimeError, match="simulated crash"):
        train(job(max_steps=3, overwrite=True))
    assert (first.model_dir / "model.safetensors").read_bytes() == weights
    assert (first.output_dir / "metrics.json").read_text() == metrics


def test_overwrite_replaces_a_finished_run_once_the_new_one_succeeds(job):
    train(job(max_steps=1))
    second = train(job(max_steps=3, overwrite=True))
    assert json.loads((second.output_dir / "metrics.json").read_text())["optimizer_steps"] == 3


def test_separate_eval_data_and_unseen_labels(job, tmp_path):
    from tests.conftest import make_sentiment_rows, write_csv

    # 20 pos and 5 neg: unlike the balanced rows held out of the training file, so even a barely trained model
    # scores a different loss on them
    rows = make_sentiment_rows(40, seed=5)
    rows = [r for r in rows if r[1] == "pos"] + [r for r in rows if r[1] == "neg"][:5]
    eval_csv = write_csv(tmp_path / "eval.csv", rows)
    result = train(job(eval_data=str(eval_csv), max_steps=2))
    # the final evaluation ran on the eval file (not on rows held out of the training file)
    again = evaluate(str(result.output_dir), str(eval_csv), cache_dir=str(tmp_path / "c"))
    assert again["examples"] == 25
    assert result.metrics["eval_loss"] == pytest.approx(again["loss"], rel=1e-4)
    bad = write_csv(tmp_path / "bad_eval.csv", [("good film", "pos"), ("meh", "neutral")])
    with pytest.raises(DataError, match=r"bad_eval.csv: labels \['neutral'\].*never occur in the training data"):
        train(job(eval_data=str(bad), output_dir=str(tmp_path / "other")))


def test_evaluate_without_data_rescores_the_runs_own_held_out_rows_in_its_precision(job, tmp_path, monkeypatch):
    """`leantrain evaluate RUN`: the run's config rebuilt from config.yaml (its seed, split, --max-length and
    precision), its held-out rows prepared as it prepared them: the run's own final evaluation, again. The check of
    the first-token shortcut runs in fp32 in both (not under the bf16 autocast `prepare` wraps the forward in, which
    failed it on an AVX2 CPU: evaluate then ran the whole last layer, 8e-6 off in the loss)."""
    import torch

    from leantrain.tasks import classification

    checked = []

    def first_token_tail(model):
        checked.append(torch.is_autocast_enabled("cpu") or hasattr(model, "_original_forward"))  # Accelerate's wrap
        return shortcut(model)

    shortcut = classification.first_token_tail
    monkeypatch.setattr(classification, "first_token_tail", first_token_tail)
    result = train(job(max_steps=3, max_length=24, precision="bf16"))
    again = evaluate(str(result.output_dir), cache_dir=str(tmp_path / "c"))
    assert checked == [False, False]  # the run's check and evaluate's, neither on an autocast-wrapped forward
    assert again["examples"] == 24  # 10% of the 240 rows, as the run held them out
    for name in ("loss", "accuracy", "macro_f1"):
        assert again[name] == pytest.approx(result.metrics[f"eval_{name}"], abs=1e-6), name
    # in fp32 the bf16 run's loss is another number: the run's precision is what evaluate used above
    fp32 = evaluate(str(result.output_dir), cache_dir=str(tmp_path / "c"), precision="fp32")
    assert fp32["loss"] != again["loss"]
    with pytest.raises(DataError, match="not a leantrain run, so it has no held-out rows of its own; give --data"):
        evaluate(job().model, cache_dir=str(tmp_path))


def test_the_runs_own_headerless_file_is_read_again_as_the_run_read_it(job, sentiment_csv, tmp_path):
    """A file trained with --format tsv --column-names is evaluated and predicted on without the flags; another file
    is still read on its own terms."""
    import pandas as pd

    from leantrain import predict
    from leantrain.data.sources import ReadOptions

    rows = pd.read_csv(sentiment_csv)[["label", "text"]]
    sms = tmp_path / "SMSCollection"
    rows.to_csv(sms, sep="\t", header=False, index=False)
    result = train(job(data=str(sms), format="tsv", column_names="label,text", max_steps=2))
    scored = evaluate(str(result.output_dir), str(sms), cache_dir=str(tmp_path / "c"))
    assert scored["examples"] == len(rows)
    predicted = predict(str(result.output_dir), str(sms))
    assert [r["text"] for r in predicted[:3]] == rows["text"][:3].tolist()
    copy = tmp_path / "copy"
    copy.write_bytes(sms.read_bytes())
    with pytest.raises(DataError, match=r"copy: unknown format '\(no suffix\)'"):
        evaluate(str(result.output_dir), str(copy), cache_dir=str(tmp_path / "c"))
    # any reading setting given: read on those terms alone (the first row as a header: one row fewer)
    as_header = evaluate(
        str(result.output_dir), str(sms), cache_dir=str(tmp_path / "c"), read=ReadOptions(format="tsv"),
        text_column=rows["text"][0], label_column=rows["label"][0],
    )  # fmt: skip
    assert as_header["examples"] == len(rows) - 1


def test_a_tiny_evaluation_is_said_to_say_little(job, capsys):
    result = train(job(max_steps=1, eval_fraction=0.05))  # 12 of the 240 rows held out
    assert "warning: the evaluation holds 12 examples: one is 8% of its scores, which say little" in (
        capsys.readouterr().err
    )
    train(job(max_steps=1, eval_fraction=0.2, output_dir=str(result.output_dir.parent / "more")))  # 48
    assert "warning: the evaluation holds" not in capsys.readouterr().err


def test_a_tiny_given_eval_data_is_told_to_be_larger_not_to_be_given(job, tmp_path, capsys):
    from tests.conftest import make_sentiment_rows, write_csv

    dev = write_csv(tmp_path / "dev.csv", make_sentiment_rows(10, seed=5))
    train(job(max_steps=1, eval_data=str(dev)))
    err = capsys.readouterr().err
    assert (
        "warning: the evaluation holds 10 examples: one is 10% of its scores, which say little; give a larger "
        "--eval-data" in err
    )
    assert "give --eval-data, or more data" not in err


def test_a_rate_above_one_is_said_to_be_implausible(job, capsys):
    result = train(job(max_steps=1, lr=2e5, on_nan="skip"))
    said = capsys.readouterr().err
    assert "warning: --lr 200000 is far above any rate that trains a transformer" in said
    assert "if a minus sign was lost: --lr 2e-5" in said
    train(job(max_steps=1, lr=0.5, optimizer="sgd", output_dir=str(result.output_dir.parent / "sgd")))
    assert "far above any rate" not in capsys.readouterr().err


def test_limit_takes_a_stratified_sample(job):
    result = train(job(limit=40, max_steps=1))
    assert result.metrics["optimizer_steps"] == 1
    result = train(job(limit=40, overwrite=True))
    assert result.metrics["train_examples"] == 40


def test_max_length_beyond_the_model_is_refused(job):
    with pytest.raises(ConfigError, match=r"--max-length 4096 is beyond .* supports \(128\)"):
        train(job(max_length=4096))


def test_model_folder_without_a_model_is_refused(job, tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelError, match="holds no model"):
        train(job(model=str(tmp_path / "empty")))


def test_unknown_hub_model_offline_is_refused(job):
    with pytest.raises(ModelError, match="Hub"):
        train(job(model="someone/not-a-model-xyz"))


def test_sentence_pairs_train_on_both_sentences(tiny_model_dir, cache_dir, tmp_path):
    """The label is carried by the second sentence only: a run that ignored `sentence2` would stay at chance."""
    import pandas as pd

    from tests.conftest import FILLER, make_sentiment_rows

    rng = np.random.default_rng(0)
    rows = [
        {"sentence1": " ".join(rng.choice(FILLER, 6)), "sentence2": text, "label": label}
        for text, label in make_sentiment_rows(240, seed=1)
    ]
    path = tmp_path / "pairs.jsonl"
    pd.DataFrame(rows).to_json(path, orient="records", lines=True)
    result = train(
        TrainConfig(
            model=str(tiny_model_dir),
            data=str(path),
            output_dir=str(tmp_path / "run"),
            cache_dir=str(cache_dir),
            batch_size=16,
            epochs=4,
            lr=3e-3,
            warmup_ratio=0.0,
            progress=False,
            report=False,
            precision="fp32",
        )
    )
    assert result.metrics["num_labels"] == 2
    assert result.metrics["eval_accuracy"] > 0.8


def test_a_pair_model_refuses_single_texts_and_a_single_text_model_pairs(tiny_model_dir, cache_dir, tmp_path):
    """Scores of a pair classifier on one sentence (or the reverse) would mean nothing: refused in one line."""
    import pandas as pd

    from leantrain import predict
    from tests.conftest import make_sentiment_rows, write_csv

    rows = make_sentiment_rows(40, seed=2)
    pairs = tmp_path / "pairs.csv"
    pd.DataFrame([{"sentence1": "a", "sentence2": t, "label": y} for t, y in rows]).to_csv(pairs, index=False)
    single = write_csv(tmp_path / "single.csv", rows)
    common = dict(model=str(tiny_model_dir), cache_dir=str(cache_dir), max_steps=1, progress=False, report=False)
    pair_run = str(train(TrainConfig(data=str(pairs), output_dir=str(tmp_path / "p"), **common)).output_dir)
    text_run = str(train(TrainConfig(data=str(single), output_dir=str(tmp_path / "s"), **common)).output_dir)
    with pytest.raises(DataError, match=r"--text: .* was trained on sentence pairs, this gives single texts"):
        predict(pair_run, texts=["great"])
    with pytest.raises(DataError, match=r"single\.csv: .* was trained on sentence pairs"):
        evaluate(pair_run, str(single))
    with pytest.raises(DataError, match=r"pairs\.csv: .* was trained on single texts, this gives sentence pairs"):
        predict(text_run, data=str(pairs))
    assert len(predict(pair_run, data=str(pairs))) == 40 and len(predict(text_run, texts=["great"])) == 1


def test_a_batch_larger_than_the_data_says_what_it_used(job, capsys):
    result = train(job(batch_size=1_000_000, epochs=2))
    err = capsys.readouterr().err
    n = result.metrics["train_examples"] // 2  # two epochs of all the training rows
    assert (
        f"warning: the global batch (1,000,000) is larger than the {n:,} training examples: each optimizer step "
        f"trains on all {n:,}, one step per epoch, in micro-batches of up to {n:,}; --batch-size {n - 1:,} or less "
        "gives several steps an epoch" in err  # a batch of all n is one step still
    )
    assert result.metrics["optimizer_steps"] == 2
    train(job(batch_size=1, grad_accum=n + 1, output_dir=str(result.output_dir.parent / "accumulated"), max_steps=1))
    assert (
        f"up to 1; a step takes at least {n + 1} ({n + 1} accumulation x 1 processes), so no --batch-size gives a "
        "second step: give more data, or a lower --grad-accum" in capsys.readouterr().err
    )
    train(job(batch_size=16, output_dir=str(result.output_dir.parent / "small"), epochs=1))
    assert "is larger than the" not in capsys.readouterr().err


def model_copy(tiny_model_dir, tmp_path, keep) -> str:
    import shutil

    folder = tmp_path / "model-copy"
    folder.mkdir()
    for f in tiny_model_dir.iterdir():
        if keep(f.name):
            shutil.copy(f, folder / f.name)
    return str(folder)


def test_a_model_folder_without_tokenizer_files_is_refused_before_training(job, tiny_model_dir, tmp_path):
    folder = model_copy(tiny_model_dir, tmp_path, lambda name: name in ("config.json", "model.safetensors"))
    with pytest.raises(ModelError, match=rf"{folder}: no tokenizer in this model folder \(looked for tokenizer.json"):
        train(job(model=folder))
    assert not (tmp_path / "run" / "metrics.json").exists()


def test_a_tokenizer_far_smaller_than_the_embedding_table_is_refused(job, tiny_model_dir, tmp_path):
    from transformers import BertTokenizerFast

    folder = model_copy(tiny_model_dir, tmp_path, lambda name: name in ("config.json", "model.safetensors"))
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "good", "bad"]) + "\n")
    BertTokenizerFast(vocab_file=str(vocab)).save_pretrained(folder)
    with pytest.raises(
        ModelError, match=r"its tokenizer knows \d tokens but the model's embedding table has 30,522 rows"
    ):
        train(job(model=folder))


def test_data_the_tokenizer_reads_mostly_as_unknown_tokens_is_refused(job, tmp_path):
    from tests.conftest import write_csv

    words = ["ሰላም", "ለዓለም", "እንዴት", "ነህ", "🦜🦩", "ᏣᎳᎩ"]
    rows = [(" ".join(words[(i + k) % 6] for k in range(4)) + " ok", "pos" if i % 2 else "neg") for i in range(60)]
    data = write_csv(tmp_path / "unreadable.csv", rows)
    with pytest.raises(DataError, match=r"unreadable.csv: the tokenizer maps 80% of the tokens .* to its unknown"):
        train(job(data=str(data)))


def test_batch_order_longest_first_runs_each_chunk_from_its_longest_batch(job):
    """--batch-order reaches the loader: longest-first's micro-batches get no wider within a chunk (12 steps stay in
    the first: 13 of the epoch's 54 batches); shuffled's do."""
    from leantrain.training import Hooks

    class Widths(Hooks):
        def __init__(self):
            self.widths = []

        def on_micro_batch(self, model, batch):
            self.widths.append(int(batch["attention_mask"].sum(-1).max()))

    orders = {}
    for order in ("longest-first", "shuffled"):
        seen = Widths()
        train(job(batch_order=order, batch_size=4, max_steps=12, output_dir=job().output_dir + order), hooks=seen)
        orders[order] = seen.widths
    assert orders["longest-first"] == sorted(orders["longest-first"], reverse=True)
    assert orders["shuffled"] != sorted(orders["shuffled"], reverse=True)


def test_a_folder_of_model_folders_names_them(tmp_path):
    """A run's checkpoints/ given as the model: the step folders in it are named, the newest as the example."""
    from leantrain.model.loading import resolve_model

    for step in ("step-000002", "step-000004"):
        (tmp_path / "checkpoints" / step).mkdir(parents=True)
        (tmp_path / "checkpoints" / step / "config.json").write_text("{}")
    with pytest.raises(
        ModelError, match=r"its folders step-000002, step-000004 do: give one of them, e\.g\. .*step-000004$"
    ):
        resolve_model(str(tmp_path / "checkpoints"))


def test_tweets_are_normalized_by_the_tokenizer_the_published_model_keeps(job, tmp_path, capsys):
    from transformers import AutoTokenizer, pipeline

    from leantrain import predict

    rows = [("@united lost my bag http://t.co/AbC123xyz &amp; awful", "neg"), ("@jo so happy today", "pos")] * 20
    data = tmp_path / "tweets.csv"
    data.write_text("text,label\n" + "".join(f'"{t}",{y}\n' for t, y in rows))
    result = train(job(data=str(data), normalize_tweets=True, max_steps=2, eval_fraction=0.2))
    tokenizer = AutoTokenizer.from_pretrained(result.model_dir)  # as a user loads it, by its saved class
    raw = "RT @someone: mail me@x.com http://t.co/XyZ789 &lt;3"
    assert tokenizer.tokenize(raw) == ["rt", "@", "user", ":", "mail", "me", "@", "x", ".", "com", "http", "<", "3"]
    assert tokenizer.tokenize(tokenizer.backend_tokenizer.normalizer.normalize_str(raw)) == tokenizer.tokenize(raw)
    plain = AutoTokenizer.from_pretrained(job().model)
    pair = ("a plain sentence, no tweet in it", "and a second one")
    assert tokenizer(*pair) == plain(*pair)  # ids, segments and mask: the model's own tokenizer's, rules aside
    # leantrain's predict and a transformers pipeline read the raw tweet as the run trained on it
    clf = pipeline("text-classification", model=str(result.model_dir))
    ours = predict(str(result.model_dir.parent), texts=[raw])[0]
    assert clf(raw)[0]["score"] == pytest.approx(ours["score"], abs=1e-5)
    assert clf(raw)[0]["score"] == pytest.approx(clf("RT @user: mail me@x.com http <3")[0]["score"], abs=1e-6)
    assert "read as tweets" in (result.model_dir / "README.md").read_text()  # the card says what the tokenizer does


def test_tweets_need_a_fast_tokenizer_to_carry_the_rules():
    from leantrain.model.loading import tweet_tokenizer

    class PythonTokenizer:  # no backend_tokenizer: nothing to add the rules to, nothing tokenizer.json could keep
        pass

    with pytest.raises(ModelError, match=r"--normalize-tweets: m's tokenizer is a Python one .*--no-normalize-tweets"):
        tweet_tokenizer(PythonTokenizer(), "m")


def test_tweets_are_left_as_they_are_unless_asked_and_the_default_job_asks():
    assert not TrainConfig(data="mine.csv").resolved().normalize_tweets
    assert TrainConfig(limit=9).resolved().normalize_tweets is True  # the default job's corpus is tweets
    assert TrainConfig(limit=9, normalize_tweets=False).resolved().normalize_tweets is False
    assert TrainConfig(limit=9, task="text-classification", model="m").resolved().normalize_tweets is True
    # another model or task on the tweets: left unset, which no task refuses (a language model reads no such flag)
    assert TrainConfig(limit=9, model="gpt2").resolved().normalize_tweets is None
    assert TrainConfig(limit=9, task="causal-lm").resolved().normalize_tweets is None
