"""--streaming: the same examples in each optimizer step however the batch is split, a seek that equals
iterating, training that equals the big batch, and one-line refusals."""

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from leantrain import TrainConfig, train
from leantrain.commands.cli import main
from leantrain.data.prepare import Examples
from leantrain.data.sources import ReadOptions
from leantrain.data.streaming import StreamingBatchSampler, prepare_stream
from tests.conftest import EXACT_JOB, assert_trained_alike, make_sentiment_rows, write_csv


@pytest.fixture(scope="module")
def stream_csv(tmp_path_factory):
    return write_csv(tmp_path_factory.mktemp("stream") / "stream.csv", make_sentiment_rows(300, seed=5))


@pytest.fixture(scope="module")
def stream(tiny_model_dir, stream_csv):
    from transformers import AutoTokenizer

    cfg = TrainConfig(data=str(stream_csv), streaming=True, max_steps=1, streaming_eval_rows=20, seed=4)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    train_stream, held_out, labels, _, _ = prepare_stream(cfg, tokenizer, str(stream_csv), ReadOptions(), seed=cfg.seed)
    return train_stream, Examples(*held_out), labels


def step_sets(sampler, epoch=0) -> list[list[tuple]]:
    """Each optimizer step's examples, sorted (order within a step does not change the sum)."""
    sampler.set_epoch(epoch)
    n = sampler.num_processes
    out: list[list[tuple]] = []
    current: list[tuple] = []
    ended = 0
    for micro in sampler:
        current += [(*s.example["input_ids"].tolist(), s.example["label"]) for s in micro]
        ended += micro[-1].step_end
        if ended == n:  # every process has closed the step
            out.append(sorted(current))
            current, ended = [], 0
    return out


def test_the_eval_rows_are_held_out_of_the_training_stream(stream):
    train_stream, evaluation, labels = stream
    assert labels == ["neg", "pos"] and len(evaluation) == 20
    trained = list(train_stream.rows(0))
    assert len(trained) == 280
    held = {tuple(evaluation.features.row(i)["input_ids"].tolist()) for i in range(len(evaluation))}
    seen = {tuple(x["input_ids"].tolist()) for x in train_stream.tokenized(trained)}
    assert not held & seen


@pytest.mark.parametrize("micro,accum,procs", [(4, 2, 1), (2, 2, 2), (8, 1, 1)])
def test_steps_hold_the_same_examples_however_the_batch_is_split(stream, micro, accum, procs):
    train_stream = stream[0]
    # windows of 3 global batches: the stream crosses several windows and ends in a short step
    reference = step_sets(StreamingBatchSampler(train_stream, 8, seed=1, window_batches=3))
    split = step_sets(StreamingBatchSampler(train_stream, micro, accum, procs, seed=1, window_batches=3))
    assert split == reference
    assert len(reference) == 35 and sum(len(s) for s in reference) == 280
    assert step_sets(StreamingBatchSampler(train_stream, 8, seed=1, window_batches=3), epoch=1) != reference


def test_a_seek_equals_iterating_past_the_skipped_steps(stream):
    full = step_sets(StreamingBatchSampler(stream[0], 4, 2, seed=1, window_batches=3))
    for skip in (2, 3, 7):
        seek = StreamingBatchSampler(stream[0], 4, 2, seed=1, window_batches=3)
        seek.start_at(0, skip)
        assert step_sets(seek) == full[skip:]


def test_steps_group_similar_lengths_within_a_window(stream):
    def padding(sampler):
        real = padded = 0
        for micro in sampler:
            lengths = [len(s.example["input_ids"]) for s in micro]
            real, padded = real + sum(lengths), padded + max(lengths) * len(lengths)
        return 1 - real / padded

    grouped = padding(StreamingBatchSampler(stream[0], 4, seed=1, window_batches=10))
    one_batch_windows = padding(StreamingBatchSampler(stream[0], 4, seed=1, window_batches=1))
    assert grouped < one_batch_windows


@pytest.fixture()
def run(tiny_model_dir, stream_csv, cache_dir, tmp_path):
    count = iter(range(100))

    def go(name=None, hooks=None, **changes):
        base = dict(
            model=str(tiny_model_dir),
            data=str(stream_csv),
            cache_dir=str(cache_dir),
            output_dir=str(tmp_path / (name or f"run{next(count)}")),
            report=False,
            streaming=True,
            streaming_eval_rows=20,
            **EXACT_JOB,
        )
        result = train(TrainConfig(**{**base, **changes}), hooks=hooks)
        return result, load_file(result.model_dir / "model.safetensors")

    return go


def test_streamed_accumulation_equals_the_big_batch(run):
    big, w_big = run(batch_size=16, max_steps=5)
    small, w_small = run(batch_size=4, grad_accum=4, max_steps=5)
    _, start = run(batch_size=16, max_steps=5, lr=1e-30)
    assert small.metrics["micro_steps"] == 4 * big.metrics["micro_steps"] == 20
    assert_trained_alike(w_big, w_small, start)
    assert big.metrics["eval_accuracy"] is not None


@pytest.mark.parametrize(
    "extra,needles",
    [
        ([], ["--streaming needs --max-steps"]),
        (["--max-steps", "2", "--auto"], ["--auto", "--streaming"]),
        (["--max-steps", "2", "--streaming-eval-rows", "0"], ["--streaming-eval-rows", "positive"]),
        # every row held out: it hung, each epoch of nothing starting the next (the default holds out 1,000)
        (["--max-steps", "2"], ["all 300 rows of the stream would be held out", "lower --streaming-eval-rows"]),
        # none usable beyond the held-out rows (no labels): the same hang
        (["--max-steps", "2", "--streaming-eval-rows", "20"], ["unlabelled.csv", "no usable training rows"]),
    ],
)
def test_bad_streaming_input_is_one_line(capsys, tiny_model_dir, stream_csv, tmp_path, extra, needles):
    data = stream_csv
    if "unlabelled.csv" in needles:
        rows = make_sentiment_rows(20, seed=6) + [(text, "") for text, _ in make_sentiment_rows(30, seed=7)]
        data = write_csv(tmp_path / "unlabelled.csv", rows)
    argv = ["train", "--model", str(tiny_model_dir), "--data", str(data), "--streaming"]
    code = main([*argv, "--output-dir", str(tmp_path / "run"), "--no-progress", *extra])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    assert all(n in err[0] for n in needles), err[0]


def test_a_label_missing_from_the_head_is_named(tiny_model_dir, tmp_path, monkeypatch):
    from transformers import AutoTokenizer

    import leantrain.data.streaming as streaming
    from leantrain.errors import DataError

    monkeypatch.setattr(streaming, "HEAD_ROWS", 10)
    rows = [*make_sentiment_rows(30), ("a late and odd text", "meh")]
    path = write_csv(tmp_path / "late.csv", rows)
    cfg = TrainConfig(data=str(path), streaming=True, max_steps=1, streaming_eval_rows=5)
    s, _, _, _, _ = prepare_stream(
        cfg, AutoTokenizer.from_pretrained(tiny_model_dir), str(path), ReadOptions(), seed=cfg.seed
    )
    with pytest.raises(
        DataError, match=r"label 'meh' \(column 'label'\) is not among the classes of its first 10 rows"
    ):
        list(s.rows(0))


def test_the_class_ids_of_a_datasets_folder_are_kept(tiny_model_dir, tmp_path):
    import datasets
    from transformers import AutoTokenizer

    rows = make_sentiment_rows(40)
    features = datasets.Features({"text": datasets.Value("string"), "label": datasets.ClassLabel(names=["neg", "pos"])})
    ds = datasets.Dataset.from_dict({"text": [r[0] for r in rows], "label": [r[1] for r in rows]}, features=features)
    ds.save_to_disk(str(tmp_path / "saved"))
    cfg = TrainConfig(data=str(tmp_path / "saved"), streaming=True, max_steps=1, streaming_eval_rows=5)
    s, (_, eval_labels), labels, _, _ = prepare_stream(
        cfg, AutoTokenizer.from_pretrained(tiny_model_dir), str(tmp_path / "saved"), ReadOptions(), seed=cfg.seed
    )
    assert labels == ["neg", "pos"]
    assert [r[2] for r in s.rows(0)].count(1) == sum(r[1] == "pos" for r in rows[5:])
    assert np.array_equal(eval_labels, [int(r[1] == "pos") for r in rows[:5]])
    # read whole, the same folder names its classes alike (it trained on the ids' digits '0', '1')
    from leantrain.data.prepare import load_source

    whole = load_source(str(tmp_path / "saved"), AutoTokenizer.from_pretrained(tiny_model_dir), 32,
                        tmp_path / "cache", "train")  # fmt: skip
    assert whole.labels == [r[1] for r in rows]


def test_a_resumed_streamed_run_equals_the_uninterrupted_one(run):
    """The seek past the checkpoint's steps lands mid-window (windows of 50 global batches of 8 rows hold
    the whole stream here), and on the next epoch's reshuffled stream for the later steps."""
    from leantrain.run import checkpoint

    whole, w_whole = run(batch_size=8, max_steps=40, save_every=30)
    ckpt = whole.output_dir / "checkpoints" / "step-000030"
    assert checkpoint.verify(ckpt).step == 30
    resumed, w_resumed = run(batch_size=8, max_steps=40, save_every=30, resume=str(ckpt))
    assert resumed.metrics["resumed_from"] == str(ckpt) and resumed.metrics["epochs"] is None  # 280 rows: 35 steps
    assert all(bool((w_whole[k] == w_resumed[k]).all()) for k in w_whole)


# -- several streams mixed (docs/mixtures.md) ----------------------------------------------------------------------
@pytest.fixture(scope="module")
def streams(tiny_model_dir, stream_csv, tmp_path_factory):
    """The 300-row stream at 0.75 beside a 60-row one (50 rows after 10 held out) that a long run uses up."""
    from leantrain.model import loading
    from leantrain.tasks.text_classification import TextClassification

    small = write_csv(tmp_path_factory.mktemp("small-stream") / "small.csv", make_sentiment_rows(60, seed=6))
    cfg = TrainConfig(
        model=str(tiny_model_dir),
        data=[f"{stream_csv}@0.75", f"{small}@0.25"],
        streaming=True,
        max_steps=1,
        streaming_eval_rows=10,
        seed=4,
        cache_dir=str(tmp_path_factory.mktemp("cache")),
    )
    return TextClassification(cfg).prepare_data(str(tiny_model_dir), loading.load_config(str(tiny_model_dir)))


def first_steps(sampler, count: int) -> list[list[tuple]]:
    """The first `count` optimizer steps' examples (source, tokens, label), sorted: a mixture of streams never ends."""
    n, out, current, ended = sampler.num_processes, [], [], 0
    for micro in sampler:
        current += [(s.source, *s.example["input_ids"].tolist(), s.example["label"]) for s in micro]
        ended += micro[-1].step_end
        if ended == n:
            out.append(sorted(current))
            current, ended = [], 0
            if len(out) == count:
                return out
    return out


@pytest.mark.parametrize("micro,accum,procs", [(4, 2, 1), (2, 2, 2), (1, 4, 2)])
def test_mixed_streams_give_each_step_the_same_examples_however_split_and_seek(streams, micro, accum, procs):
    from leantrain.data.stream_mixture import StreamingMixtureSampler

    mixture = streams.train
    reference = first_steps(StreamingMixtureSampler(mixture, 8, seed=1, window_batches=3), 40)
    assert first_steps(StreamingMixtureSampler(mixture, micro, accum, procs, seed=1, window_batches=3), 40) == reference
    seek = StreamingMixtureSampler(mixture, micro, accum, procs, seed=1, window_batches=3)
    seek.start_at(0, 13)
    assert first_steps(seek, 27) == reference[13:]
    # each window of 24 rows holds 18 of the large stream's and 6 of the small one's; the small one (50 rows) is
    # used up in its ninth window and starts a reshuffled pass
    sources = [source for step in reference for source, *_ in step]
    assert sources.count(1) == 40 * 8 // 4 and sources.count(0) == 40 * 8 * 3 // 4
    small = [tuple(x[1:-1]) for step in reference for x in step if x[0] == 1]
    stream = mixture.sources[1].stream
    rows = {tuple(x["input_ids"].tolist()) for x in stream.tokenized(list(stream.rows(0)))}
    assert len(small) == 80 and set(small) == rows  # every row of the first pass, then some of them again


def test_mixed_streams_train_equal_to_their_big_batch_and_log_each_source(run, stream_csv, tmp_path):
    small = write_csv(tmp_path / "small.csv", make_sentiment_rows(60, seed=6))
    job = dict(data=[f"{stream_csv}@0.75", f"{small}@0.25"], streaming_eval_rows=10, max_steps=6)
    big, w_big = run(batch_size=16, **job)
    accumulated, w_small = run(batch_size=4, grad_accum=4, **job)
    _, start = run(batch_size=16, lr=1e-30, **job)
    assert accumulated.metrics["micro_steps"] == 4 * big.metrics["micro_steps"]
    assert_trained_alike(w_big, w_small, start)
    drawn = big.metrics["sources"]
    # a window of 50 steps holds 600 and 200 rows of each; its first 6 steps hold them near those shares
    assert drawn["stream"]["examples"] + drawn["small"]["examples"] == 96
    assert drawn["stream"]["share_examples"] == pytest.approx(0.75, abs=0.05)
    assert drawn["small"]["eval_rows"] == 10 and drawn["small"]["eval_loss"] is not None


def test_longest_first_runs_each_window_from_its_longest_batch(stream):
    """--batch-order longest-first reaches a stream's windows: within each, batches get no wider (windows of 8
    global batches make chunks of 2, a quarter of the window); shuffled's do somewhere."""

    def widths(sampler):
        return [max(len(s.example["input_ids"]) for s in micro) for micro in sampler]

    ordered = widths(StreamingBatchSampler(stream[0], 4, seed=1, window_batches=8, longest_first=True))
    chunks = [ordered[i : i + 2] for i in range(0, 64, 2)]  # the first four windows' chunks
    assert all(a >= b for a, b in chunks)
    assert widths(StreamingBatchSampler(stream[0], 4, seed=1, window_batches=8)) != ordered


def test_a_killed_mixture_of_streams_resumes_as_the_run_left_alone(run, stream_csv, tmp_path, monkeypatch):
    """0.75/0.25 of a 280-row and a 20-row stream in windows of 5 steps of 8 rows (10 of the small one's: it restarts
    every other window): killed before step 13, resumed from step 11, the run reads the first two windows without
    tokenizing them, seeks into the third and crosses the small stream's restart, logging each step's loss, each
    source's figures and the evaluations as the run left alone."""
    from leantrain.data import stream_mixture
    from leantrain.run import checkpoint
    from tests.hooks import DieAt, Killed
    from tests.test_checkpoint import logged_rows

    class Windows(stream_mixture.StreamingMixtureSampler):  # small windows, so that a short run crosses several
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **{**kwargs, "window_batches": 5})

    monkeypatch.setattr(stream_mixture, "StreamingMixtureSampler", Windows)
    small = write_csv(tmp_path / "small.csv", make_sentiment_rows(30, seed=6))
    job = dict(data=[f"{stream_csv}@0.75", f"{small}@0.25"], streaming_eval_rows=10, max_steps=16, batch_size=8,
               save_every=11, eval_every=7)  # fmt: skip
    whole, w_whole = run(**job)
    with pytest.raises(Killed):
        run("killed", hooks=DieAt(13), **job)
    assert checkpoint.CheckpointDir(tmp_path / "killed" / "checkpoints").latest().step == 11
    resumed, w_resumed = run("killed", resume="auto", **job)
    assert resumed.metrics["resumed_from"].endswith("step-000011")
    assert all(torch.equal(w_whole[k], w_resumed[k]) for k in w_whole)
    rows = logged_rows(whole.output_dir)
    assert logged_rows(resumed.output_dir) == rows
    assert [r["step"] for r in rows if "eval_loss" in r] == [7, 14, 16]
    assert resumed.metrics["sources"] == whole.metrics["sources"]
    assert whole.metrics["sources"]["small"]["examples"] > 20  # its second pass begins at step 11
