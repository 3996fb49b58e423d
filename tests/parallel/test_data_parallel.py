"""Real multi-process jobs on CPU (gloo), checked against one process.

Each job is a `leantrain train` command in a subprocess (its own session, killed whole on timeout),
on the tiny dropout-free BERT in fp32 with plain SGD, one thread per rank. The single-process
baselines run in this process.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from leantrain import TrainConfig, train
from leantrain.commands.launch import free_port
from leantrain.errors import LeantrainError
from tests.conftest import EXACT_JOB, make_sentiment_rows, max_diff, write_csv
from tests.hooks import site_env

#: every test here launches torchrun/accelerate/Ray jobs
pytestmark = pytest.mark.slow

TOL = 1e-5
JOB_TIMEOUT = 240
PROBE = Path(__file__).with_name("probe.py")


def flags(**values) -> list[str]:
    out = []
    for key, value in values.items():
        flag = "--" + key.replace("_", "-")
        if isinstance(value, list):  # several --data sources
            for item in value:
                out += [flag, str(item)]
        elif isinstance(value, bool):
            out.append(flag if value else "--no-" + flag[2:])
        else:
            out += [flag, str(value)]
    return out


def clean_env(**extra) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if k
        not in (
            "RANK",
            "LOCAL_RANK",
            "WORLD_SIZE",
            "LOCAL_WORLD_SIZE",
            "MASTER_ADDR",
            "MASTER_PORT",
            "LEANTRAIN_LAUNCHED",
        )
        and not k.startswith("ACCELERATE_")
    }
    env.update(HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false", OMP_NUM_THREADS="1", **extra)
    return env


def start(args: list[str], **env) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, *args],
        env=clean_env(**env),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def finish(proc: subprocess.Popen, timeout: float = JOB_TIMEOUT) -> tuple[int, str, str]:
    """Wait for a job; on timeout kill its whole process group (launcher and ranks) and fail."""
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"job hung for {timeout} s; stderr tail:\n{err[-3000:]}")
    return proc.returncode, out, err


def run_job(args: list[str], timeout: float = JOB_TIMEOUT, **env) -> tuple[int, str, str]:
    return finish(start(args, **env), timeout)


def weights(run_dir: Path) -> dict[str, torch.Tensor]:
    return load_file(run_dir / "model" / "model.safetensors")


@pytest.fixture(scope="module")
def setup(tiny_model_dir, tmp_path_factory):
    """109 training rows: six full steps of 16, then a step of 13 that two processes split unevenly (7 and 6
    examples; with two accumulation steps of 4, micro-batches of 4, 3, 3 and 3)."""
    root = tmp_path_factory.mktemp("dp")
    train_csv = write_csv(root / "train.csv", make_sentiment_rows(109, seed=11))
    eval_csv = write_csv(root / "eval.csv", make_sentiment_rows(27, seed=12))
    base = dict(
        model=str(tiny_model_dir),
        data=str(train_csv),
        eval_data=str(eval_csv),
        cache_dir=str(root / "cache"),
        **EXACT_JOB,
    )
    return root, base


@pytest.fixture(scope="module")
def baseline(setup):
    """One process, global batch 16, one epoch (7 steps, the last of 13 examples): what every 2-process run
    with 16 examples per step must equal."""
    root, base = setup
    result = train(TrainConfig(**base, batch_size=16, epochs=1, output_dir=str(root / "one")))
    assert result.metrics["optimizer_steps"] == 7
    return result.output_dir


def assert_one_writer(run_dir: Path, single: Path, out: str, err: str) -> None:
    # the same outputs as a single process, nothing left over (no staging, no second writer's files)
    assert sorted(p.name for p in run_dir.iterdir()) == sorted(p.name for p in single.iterdir())
    assert {"config.yaml", "metrics.json", "metrics.jsonl", "model"} <= {p.name for p in run_dir.iterdir()}
    assert out.count("accuracy ") == 1, out  # the result line, once
    assert err.count("leantrain: training ") == 1, err  # the main process's messages, once
    assert err.count("eval accuracy") == 1, err  # the summary table, once


@pytest.mark.parametrize("launcher", ["accelerate", "torchrun"])
def test_two_processes_equal_one_process_with_twice_the_batch(setup, baseline, launcher):
    root, base = setup
    out_dir = root / f"two-{launcher}"
    rc, out, err = run_job(
        [
            "-m",
            "leantrain",
            "train",
            *flags(**base, batch_size=8, epochs=1, output_dir=out_dir, num_processes=2, launcher=launcher),
        ]
    )
    assert rc == 0, err[-3000:]
    metrics = json.loads((out_dir / "metrics.json").read_text())
    one = json.loads((baseline / "metrics.json").read_text())
    assert metrics["num_processes"] == 2 and metrics["global_batch"] == 16 and metrics["optimizer_steps"] == 7
    assert max_diff(weights(out_dir), weights(baseline)) <= TOL
    # evaluation gathers every example once, so the metrics are the single-process ones
    for key in ("eval_accuracy", "eval_macro_f1", "eval_loss"):
        assert metrics[key] == pytest.approx(one[key], abs=1e-6), key
    assert metrics["train_examples"] == one["train_examples"] == 109
    assert_one_writer(out_dir, baseline, out, err)


def test_two_processes_with_static_shapes_equal_one_process(setup, baseline):
    """Static shapes (on with --compile): the last step's 13 examples, split 7 and 6 across the processes, come in
    micro-batches of 4, 3, 3 and 3, filled with masked rows to 4; lengths are padded to buckets. Nothing changes."""
    root, base = setup
    out_dir = root / "two-static"
    rc, _, err = run_job(
        ["-m", "leantrain", "train",
         *flags(**base, batch_size=4, grad_accum=2, epochs=1, output_dir=out_dir, num_processes=2, static_shapes="on")]
    )  # fmt: skip
    assert rc == 0, err[-3000:]
    metrics = json.loads((out_dir / "metrics.json").read_text())
    assert metrics["optimizer_steps"] == 7 and metrics["train_examples"] == 109  # no example counted twice
    assert metrics["padding_fraction"] > json.loads((baseline / "metrics.json").read_text())["padding_fraction"]
    assert max_diff(weights(out_dir), weights(baseline)) <= TOL


def test_two_processes_whose_clocks_disagree_train_what_the_first_ones_reading_sizes(setup):
    """--max-time on two processes whose clocks read 1 and 3 s a step (LT_TEST_CLOCK): alone, the first would size
    the run at its warm-up's end to 30 of its 42 steps and the second to 15, and read again at other steps. Both
    take the first process's readings, at the same steps, and train what one process given those steps does."""
    root, base = setup
    job = dict(base, epochs=6, warmup_steps=15)
    one = train(TrainConfig(**job, batch_size=16, max_steps=30, output_dir=str(root / "timed-one"))).output_dir
    out_dir = root / "timed-two"
    rc, _, err = run_job(
        ["-m", "leantrain", "train", *flags(**job, batch_size=8, max_time="30s", output_dir=out_dir, num_processes=2)],
        **site_env(LT_TEST_CLOCK="1,3"),
    )
    assert rc == 0, err[-3000:]
    metrics = json.loads((out_dir / "metrics.json").read_text())
    assert metrics["time_budget"]["sizes"] == [[15, 30]] and metrics["optimizer_steps"] == 30, metrics["time_budget"]
    assert max_diff(weights(out_dir), weights(one)) <= TOL


def test_a_process_that_stops_answering_ends_the_job_in_the_collective_timeout(setup):
    """Process 1 hangs before its second optimizer step; process 0 waits for it at the next gradient all-reduce for
    --collective-timeout (5 s; torch's default would be 30 minutes) and fails, which ends the job."""
    import time

    root, base = setup
    started = time.monotonic()
    rc, _, err = run_job(
        ["-m", "leantrain", "train",
         *flags(**base, batch_size=8, epochs=1, output_dir=root / "hung", num_processes=2, collective_timeout="5s")],
        timeout=150, **site_env(LT_TEST_FAULT="1:2:hang"),
    )  # fmt: skip
    assert rc != 0 and "injecting a fault (hang) into process 1" in err, err[-3000:]
    assert "process 0 of 2 gave up waiting for another process at a collective (--collective-timeout" in err, err
    assert time.monotonic() - started < 120, err[-3000:]
    assert not (root / "hung" / "model").exists()


def test_two_processes_with_class_weights_equal_one_process(setup):
    """A weighted step divides by the total class weight of the whole step across both ranks (issue #17): with
    weights 1 and 3 and label smoothing, two processes of 8 equal one of 16; dividing by each rank's own weight
    (or by its example count) would not, as the ranks' shares of each class differ."""
    root, base = setup
    job = dict(base, class_weights="1,3", label_smoothing=0.1, epochs=1)
    one = train(TrainConfig(**job, batch_size=16, output_dir=str(root / "weighted-one"))).output_dir
    out_dir = root / "weighted-two"
    rc, _, err = run_job(["-m", "leantrain", "train", *flags(**job, batch_size=8, output_dir=out_dir, num_processes=2)])
    assert rc == 0, err[-3000:]
    assert max_diff(weights(out_dir), weights(one)) <= TOL
    steps = [json.loads(line) for line in (out_dir / "metrics.jsonl").read_text().splitlines()]
    alone = [json.loads(line) for line in (one / "metrics.jsonl").read_text().splitlines()]
    losses = [r["loss"] for r in steps if "loss" in r]  # each step's weighted mean, logged every step
    assert len(losses) == 7 and losses == pytest.approx([r["loss"] for r in alone if "loss" in r], abs=1e-5)


def test_a_mixture_on_two_processes_equals_one_process_and_resumes_mid_log_row_exactly(setup):
    """Two sources at 0.7/0.3, the small one used up and restarted: two processes of 8 train what one of 16 does,
    each source's logged loss and shares alike (summed across the ranks); resumed from step 4 of 9, mid log row (rows
    every 3 steps), the two-process run logs and ends as the one left alone (the checkpoint holds the row's sums of
    both ranks)."""
    root, base = setup
    small = write_csv(root / "small.csv", make_sentiment_rows(30, seed=13))
    job = {k: v for k, v in base.items() if k != "eval_data"}  # each source holds out its own rows
    job.update(data=[f"{base['data']}@0.7", f"{small}@0.3"], epochs=1, log_every=3)
    one = train(TrainConfig(**job, batch_size=16, output_dir=str(root / "mix-one"))).output_dir
    two, resumed = root / "mix-two", root / "mix-resumed"
    rc, _, err = run_job(["-m", "leantrain", "train", *flags(**job, batch_size=8, num_processes=2, save_every=4,
                                                            output_dir=two)])  # fmt: skip
    assert rc == 0, err[-3000:]
    assert max_diff(weights(two), weights(one)) <= TOL

    def logged(run_dir: Path) -> list[dict]:
        rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
        return [{"step": r["step"], "loss": r.get("loss"), **r.get("sources", {})} for r in rows]

    for a, b in zip(logged(two), logged(one), strict=True):
        assert a.keys() == b.keys()
        for key in a:
            if isinstance(a[key], dict):
                assert a[key] == pytest.approx(b[key], abs=TOL), (a["step"], key)
    passes = [r["small"]["epochs"] for r in logged(one) if r["loss"] is not None]
    assert passes[-1] > 1  # the small source restarted
    ckpt = two / "checkpoints" / "step-000004"
    rc, _, err = run_job(["-m", "leantrain", "train", *flags(**job, batch_size=8, num_processes=2, save_every=4,
                                                            output_dir=resumed, resume=ckpt)])  # fmt: skip
    assert rc == 0, err[-3000:]
    assert logged(resumed) == logged(two)
    assert all(torch.equal(a, b) for a, b in zip(weights(resumed).values(), weights(two).values()))
    # one process would split each step otherwise (docs/mixtures.md): refused, naming the count
    with pytest.raises(LeantrainError, match=r"num_processes differs \(2 in the checkpoint, 1 now\)"):
        train(
            TrainConfig(**job, batch_size=8, save_every=4, output_dir=str(root / "mix-one-process"), resume=str(ckpt))
        )


# a 2-process run and a 1-process one (subprocesses, one thread each): 13-15 s each at load 2-3
@pytest.mark.parametrize("kind", ["mixture-by-tokens", "streamed-mixture", "stream"])
def test_mixtures_and_streams_on_two_processes_compute_exactly_what_one_does_on_the_same_micro_batches(setup, kind):
    """Two processes of 8 examples a step equal, bitwise, one process accumulating the same two micro-batches of 8:
    a weighted mixture by tokens whose small source restarts, a mixture of two streams and one stream (each process
    takes its micro-batches of every window); the same weights, per-step losses and each source's figures."""
    root, base = setup
    small = write_csv(root / f"small-{kind}.csv", make_sentiment_rows(40, seed=14))
    job = {k: v for k, v in base.items() if k != "eval_data"}  # each source holds out its own rows
    # 8 full steps: the epoch's 9th holds 6 rows, one micro-batch of 6 accumulated but 3 and 3 on two processes
    job.update(data=[f"{base['data']}@0.7", f"{small}@0.3"], max_steps=8, eval_every=5)
    if kind == "stream":  # 101 rows after 8 held out: 6 full steps, then the pass's last of 5 (as above)
        job.update(data=base["data"], max_steps=6)
    if kind != "mixture-by-tokens":
        job.update(streaming=True, streaming_eval_rows=8)
    else:
        job.update(mix_by="tokens")
    runs = {}
    for name, shape in {"accumulated": dict(grad_accum=2), "two": dict(num_processes=2)}.items():
        out_dir = root / f"{kind}-{name}"
        rc, _, err = run_job(["-m", "leantrain", "train", *flags(**job, **shape, batch_size=8, output_dir=out_dir)])
        assert rc == 0, err[-3000:]
        runs[name] = out_dir
    acc, two = weights(runs["accumulated"]), weights(runs["two"])
    different = [k for k in acc if not torch.equal(acc[k], two[k])]
    assert not different, f"{len(different)} tensors differ, e.g. {different[0]}"

    def logged(run_dir: Path) -> list[dict]:
        """Each row's step, loss and each source's figures, flat ("small.loss")."""
        rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
        out = []
        for r in rows:
            flat = {f"{name}.{k}": v for name, figures in r.get("sources", {}).items() for k, v in figures.items()}
            out.append({"step": r["step"], "loss": r.get("loss"), "eval_loss": r.get("eval_loss"), **flat})
        return out

    one, split = logged(runs["accumulated"]), logged(runs["two"])
    assert [r["step"] for r in split if r["loss"] is not None] == list(range(1, job["max_steps"] + 1))
    for a, b in zip(split, one, strict=True):
        if a["loss"] is not None:  # a training row: bitwise
            assert a == b
        else:  # an evaluation: each process scores half the rows, summed in another order
            assert a == pytest.approx(b, abs=1e-6), a["step"]
    if kind == "mixture-by-tokens":
        trained = [r for r in one if r["loss"] is not None]
        assert trained[-1][f"{small.stem}.epochs"] > 1  # the small source restarted


@pytest.mark.parametrize("kind", ["ddp", "local-sgd", "fsdp"])
def test_a_two_process_run_resumed_from_its_checkpoint_equals_the_run_left_alone(setup, dropout_model_dir, kind):
    """Each rank saves and restores its own state (rank-N.pt: its RNG draws its own dropout masks; under local SGD
    its own AdamW moments, and the outer optimizer's momentum): resumed at step 3 of 7, two processes with dropout
    and AdamW end bitwise where the uninterrupted two-process run does, having trained only steps 4-7. (The
    local-SGD case: a mutation pass found the per-rank optimizer and local SGD restores untested.) Sharded
    (--shard fsdp on CPU): the whole state is gathered into the checkpoint, and each process takes its shards of
    the weights and AdamW moments back."""
    root, base = setup
    job = dict(base, model=dropout_model_dir, optimizer="adamw", lr=1e-3, batch_size=8, epochs=1, num_processes=2)
    if kind == "local-sgd":  # DiLoCo's Nesterov outer step: its momentum, saved at the sync of step 3, moves step 6's
        job.update(local_sgd_steps=3, local_sgd_outer_lr=0.7, local_sgd_outer_momentum=0.9)
    if kind == "fsdp":
        job.update(shard="fsdp")
    name = f"two-{kind}"
    whole, resumed = root / f"{name}-whole", root / f"{name}-resumed"
    rc, _, err = run_job(["-m", "leantrain", "train", *flags(**job, save_every=3, output_dir=whole)])
    assert rc == 0, err[-3000:]
    ckpt = whole / "checkpoints" / "step-000003"
    assert {p.name for p in ckpt.iterdir()} >= {"rank-0.pt", "rank-1.pt"}
    rc, _, err = run_job(["-m", "leantrain", "train", *flags(**job, save_every=3, output_dir=resumed, resume=ckpt)])
    assert rc == 0, err[-3000:]
    metrics = json.loads((resumed / "metrics.json").read_text())
    assert metrics["resumed_from"] == str(ckpt) and metrics["optimizer_steps"] == 7
    assert metrics["train_examples"] == 109 - 3 * 16  # only the steps after the checkpoint
    w_whole, w_resumed = weights(whole), weights(resumed)
    different = [k for k in w_whole if not torch.equal(w_whole[k], w_resumed[k])]
    assert not different, f"{len(different)} tensors differ, e.g. {different[0]}"


def test_two_machines_with_gradient_accumulation_equal_one_process(setup, baseline):
    """Two `leantrain` commands on 127.0.0.1 as machine ranks 0 and 1, one process each, 2 micro-batches of 4
    per step: 16 examples per optimizer step, as the baseline."""
    root, base = setup
    out_dir, port = root / "machines", free_port()
    jobs = [
        start(
            [
                "-m",
                "leantrain",
                "train",
                *flags(
                    **base,
                    batch_size=4,
                    grad_accum=2,
                    epochs=1,
                    output_dir=out_dir,
                    num_processes=1,
                    num_machines=2,
                    machine_rank=rank,
                    main_process_ip="127.0.0.1",
                    main_process_port=port,
                ),
            ]
        )
        for rank in (0, 1)
    ]
    results = [finish(job) for job in jobs]
    for rc, _, err in results:
        assert rc == 0, err[-3000:]
    metrics = json.loads((out_dir / "metrics.json").read_text())
    # six full steps of two micro-batches per process, and the short last step (13 examples) takes two as well
    assert metrics["num_processes"] == 2 and metrics["micro_steps"] == 14 and metrics["optimizer_steps"] == 7
    assert max_diff(weights(out_dir), weights(baseline)) <= TOL
    assert "accuracy " in results[0][1] and "accuracy " not in results[1][1]  # machine 0 writes, 1 does not


def test_shards_are_disjoint_and_complete_evaluation_has_no_duplicates_and_local_sgd_averages(
    setup, tiny_model_dir, tmp_path
):
    """The user's own torchrun around plain `leantrain train` (tests/parallel/probe.py records what each rank
    saw): 54 training rows, 16 per step, 2 epochs; 27 evaluation rows in batches of 16 and 11."""
    from leantrain.model import loading

    _, base = setup
    train_csv = write_csv(tmp_path / "train.csv", make_sentiment_rows(54, seed=1))
    eval_csv = write_csv(tmp_path / "eval.csv", make_sentiment_rows(27, seed=2))
    out_dir, record = tmp_path / "run", tmp_path / "record"
    k, lr = 2, 0.5
    cfg = {
        **base,
        "data": train_csv,
        "eval_data": eval_csv,
        "batch_size": 8,
        "epochs": 2,
        "local_sgd_steps": k,
        "scheduler": "constant",
        "lr": lr,
        "output_dir": out_dir,
    }
    rc, _, err = run_job(
        [
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node",
            "2",
            str(PROBE),
            str(record),
            "train",
            *flags(**cfg),
        ]
    )
    assert rc == 0, err[-3000:]
    ranks = [torch.load(f"{record}.{r}.pt", weights_only=False) for r in (0, 1)]

    # every epoch: each rank a disjoint shard, together every training example exactly once
    for epoch in (0, 1):
        seen = [[i for b in rank["batches"] if b["epoch"] == epoch for i in b["index"].tolist()] for rank in ranks]
        assert all(len(s) == len(set(s)) for s in seen)
        assert not set(seen[0]) & set(seen[1])
        assert sorted(seen[0] + seen[1]) == list(range(54))
    # evaluation: the ranks hold batches of different sizes (one padded by repeats), the gathered result
    # holds each of the 27 examples once
    for rank in ranks:
        for gathered in rank["eval_gathered"]:
            assert sorted(gathered) == list(range(27))
    assert sorted(set(ranks[0]["eval_local"][0] + ranks[1]["eval_local"][0])) == list(range(27))

    # local SGD: replay each rank's steps from the same start in this process, average every k steps
    metrics = json.loads((out_dir / "metrics.json").read_text())
    assert metrics["optimizer_steps"] == 8 and metrics["local_sgd_syncs"] == 4
    assert metrics["local_sgd_bytes_communicated"] == 4 * metrics["gradients_bytes"]
    expected = replay_local_sgd(loading.load_for_classification(str(tiny_model_dir), ["neg", "pos"]), ranks, k, lr)
    assert max_diff(weights(out_dir), expected) <= TOL
    # and it is not plain data parallelism: the averaged model differs from one that all-reduced every step
    assert (
        max_diff(
            expected,
            replay_local_sgd(loading.load_for_classification(str(tiny_model_dir), ["neg", "pos"]), ranks, 1, lr),
        )
        > 1e-4
    )


def replay_local_sgd(model, ranks: list[dict], k: int, lr: float) -> dict[str, torch.Tensor]:
    """Local SGD from its definition: each rank runs plain SGD on the mean loss of its own examples of each
    step, and parameters are averaged every k optimizer steps and at the end. (Every step here splits evenly
    across the ranks, so each rank's mean is its share of the global batch's mean.)"""
    import copy

    import torch.nn.functional as F

    model.load_state_dict(ranks[0]["init"])
    replicas = [copy.deepcopy(model) for _ in ranks]
    steps = []
    for rank in ranks:
        groups, current = [], []
        for batch in rank["batches"]:
            current.append(batch)
            if bool(batch["step_end"]):
                groups.append(current)
                current = []
        steps.append(groups)
    assert len({len(s) for s in steps}) == 1
    n = len(ranks)
    for step in range(len(steps[0])):
        for replica, groups in zip(replicas, steps):
            replica.train()
            examples = sum(len(batch["labels"]) for batch in groups[step])
            for batch in groups[step]:
                logits = replica(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
                loss = F.cross_entropy(logits, batch["labels"], reduction="sum") / examples
                loss.backward()
            with torch.no_grad():
                for p in replica.parameters():
                    if p.grad is not None:
                        p -= lr * p.grad
                        p.grad = None
        if (step + 1) % k == 0 or step + 1 == len(steps[0]):
            with torch.no_grad():
                for params in zip(*(r.parameters() for r in replicas)):
                    mean = sum(p.detach() for p in params) / n
                    for p in params:
                        p.copy_(mean)
    return {k: v.detach().clone() for k, v in replicas[0].state_dict().items()}


@pytest.mark.parametrize("mode, launcher", [("raise", "accelerate"), ("kill", "torchrun")])
def test_a_failing_process_fails_the_whole_job_quickly(setup, tmp_path, mode, launcher):
    _, base = setup
    out_dir = tmp_path / "run"
    rc, out, err = run_job(
        [
            "-m",
            "leantrain",
            "train",
            *flags(**base, batch_size=8, max_steps=6, output_dir=out_dir, num_processes=2, launcher=launcher),
        ],
        timeout=180,
        **site_env(LT_TEST_FAULT=f"1:2:{mode}"),
    )
    assert rc != 0
    fault = re.search(r"injecting a fault \((\w+)\) into process 1 at optimizer step 2 \(t=([\d.]+)\)", err)
    assert fault, err[-3000:]
    after = err[fault.end() :].strip().splitlines()
    assert len(after) <= 6 and "Traceback" not in err, err[-3000:]  # a few lines, the tracebacks in the log folder
    first = {"raise": "process 1 of 2 exited with code 1", "kill": "process 1 of 2 was killed by SIGKILL"}[mode]
    assert f"error: {first}" in err and "(the first failure)" in err, err[-3000:]
    assert "then: process 0 lost its connection to it and stopped" in err  # the survivor: a consequence
    assert "process 0 of 2 failed" not in err
    if mode == "raise":
        assert "process 1 of 2 failed: RuntimeError: injected fault" in err  # the failing rank's own error
        assert "injected fault at optimizer step 2" in (out_dir / "logs" / "process-1.log").read_text()
    assert "Connection" in (out_dir / "logs" / "process-0.log").read_text()
    assert "exitcode" in (out_dir / "logs" / "launcher.log").read_text()  # torch elastic's own report, kept
    assert not (out_dir / "metrics.json").exists()  # nothing published
    assert "accuracy " not in out


def test_ray_train_workers_equal_one_process(setup, baseline, tmp_path_factory):
    pytest.importorskip("ray.train.torch")
    import shutil
    import tempfile

    root, base = setup
    out_dir = root / "ray"
    ray_tmp = tempfile.mkdtemp(prefix="ltray", dir="/tmp")  # short: Ray's socket paths must stay < 108 bytes
    try:
        rc, out, err = run_job(
            [
                "-m",
                "leantrain",
                "train",
                *flags(**base, batch_size=8, epochs=1, output_dir=out_dir, launcher="ray", ray_workers=2),
            ],
            timeout=300,
            LEANTRAIN_RAY_TMPDIR=ray_tmp,
            RAY_USAGE_STATS_ENABLED="0",
        )
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)
    assert rc == 0, err[-3000:]
    metrics = json.loads((out_dir / "metrics.json").read_text())
    assert metrics["num_processes"] == 2 and metrics["global_batch"] == 16
    assert max_diff(weights(out_dir), weights(baseline)) <= TOL
    assert out.count("accuracy ") == 1


def test_input_that_every_process_refuses_is_one_line_and_exit_2(setup):
    """Bad input in a job of two processes (data only a task's own reader refuses, once each process reads it): the
    main process's one line, exit 2, as one process would give, and no folder left: the others' logs repeat it."""
    root, base = setup
    out_dir = root / "refused"
    rc, _, err = run_job(["-m", "leantrain", "train", *flags(**base, task="kto", output_dir=out_dir, num_processes=2)])
    lines = [line for line in err.splitlines() if line.startswith("leantrain train")]
    assert rc == 2 and len(lines) == 1 and "Traceback" not in err, err
    assert "train.csv: no 'prompt', 'completion' column" in lines[0], lines[0]
    assert not out_dir.exists()


# two 2-process launches and a 1-process run: 95 s at load 2.5
def test_fsdp_on_two_cpu_processes_equals_one_process_and_halves_what_each_holds(setup, baseline):
    """--shard fsdp on CPU (torch's FSDP2 over gloo, issue #16): two processes, each holding half of every parameter,
    gradient and optimizer state, train the same weights as one process with the whole batch (fp32, SGD, every
    tensor, the uneven last step included), with clipping that triggers (the norm is the whole model's, across
    shards), and publish the whole model. Then AdamW: each process holds about half the weights and moments."""
    root, base = setup
    clipped = dict(base, max_grad_norm=0.05, epochs=1)
    one, out_dir = sharded_equals_one_process(clipped, root / "clipped")
    steps = [json.loads(line) for line in (out_dir / "metrics.jsonl").read_text().splitlines()]
    assert max(r["grad_norm"] for r in steps if "grad_norm" in r) > 0.05  # clipping did bite
    assert max_diff(weights(out_dir), weights(baseline)) > 100 * TOL  # (clipping changed the run)
    # AdamW: each process holds half the weights and half the moments (two fp32 tensors a parameter, whole: twice
    # the weights)
    whole = json.loads((one / "metrics.json").read_text())["weights_bytes"]
    adam = dict(base, optimizer="adamw", lr=1e-3, max_steps=2)
    out_dir = root / "adam-fsdp"
    rc, _, err = run_job(
        ["-m", "leantrain", "train", *flags(**adam, batch_size=8, output_dir=out_dir, num_processes=2, shard="fsdp")]
    )
    assert rc == 0, err[-3000:]
    half = json.loads((out_dir / "metrics.json").read_text())
    assert 0.45 < half["weights_bytes"] / whole < 0.55
    assert 0.45 < half["optimizer_state_bytes"] / (2 * whole) < 0.55


def sharded_equals_one_process(job: dict, root: Path) -> tuple[Path, Path]:
    """`job` trained by one process at batch 16 and by two sharding it with FSDP2 at batch 8 each: the same weights.
    Returns the two run folders."""
    one = train(TrainConfig(**job, batch_size=16, output_dir=str(root / "one"))).output_dir
    out_dir = root / "fsdp"
    rc, _, err = run_job(
        ["-m", "leantrain", "train", *flags(**job, batch_size=8, output_dir=out_dir, num_processes=2, shard="fsdp")]
    )
    assert rc == 0, err[-3000:]
    assert "sharded with FSDP2 across 2 processes" in err
    assert max_diff(weights(out_dir), weights(one)) <= TOL
    return one, out_dir


def test_fsdp_with_frozen_embeddings_equals_one_process(setup):
    """--freeze with --shard fsdp: FSDP2 shards a model whose parameters are partly frozen; two processes train the
    same weights as one (AdamW, whose moments would move a frozen table if it got any), and the frozen table is
    published as it was loaded."""
    root, base = setup
    job = dict(base, optimizer="adamw", lr=1e-3, max_steps=3, freeze="embeddings")
    one, out_dir = sharded_equals_one_process(job, root / "frozen")
    counted = [json.loads((d / "metrics.json").read_text())["flop_model"] for d in (one, out_dir)]
    assert counted[0] == counted[1] and "frozen weights get no gradients" in counted[0]  # counted whole, frozen alike
    pretrained, trained = load_file(Path(base["model"]) / "model.safetensors"), weights(out_dir)
    table, layer = "embeddings.word_embeddings.weight", "encoder.layer.0.attention.self.query.weight"
    assert torch.equal(trained[f"bert.{table}"], pretrained[table])
    assert not torch.equal(trained[f"bert.{layer}"], pretrained[layer])


@pytest.mark.parametrize(("task", "tied"), [("dpo", False), ("dpo", True), ("reward-model", False)])
def test_fsdp_preference_tasks_equal_one_process(tmp_path, task, tied):
    """--shard fsdp with DPO, whose frozen reference is copied from the sharded policy (FSDP2 refuses deepcopy: the
    copy is sharded alike, its tied output layer still tied), and with a reward model, whose one-row score head
    does not split evenly across two processes: each trains the same weights as one process with the whole batch."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from tests.tasks.test_causal_lm import write_tiny_llama
    from tests.tasks.test_dpo import pair_rows, write_jsonl

    folder = write_tiny_llama(tmp_path / "llama")
    config = AutoConfig.from_pretrained(folder)
    config.tie_word_embeddings = tied
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(folder)
    pairs = write_jsonl(tmp_path / "pairs.jsonl", pair_rows(48))
    job = dict(EXACT_JOB, task=task, model=str(folder), data=str(pairs), max_length=32, max_steps=3, lr=0.05,
               cache_dir=str(tmp_path / "cache"), report=False)  # fmt: skip
    _, out_dir = sharded_equals_one_process(job, tmp_path / "run")
    layer = "model.layers.0.mlp.down_proj.weight"
    assert not torch.allclose(weights(out_dir)[layer], load_file(folder / "model.safetensors")[layer])  # it trained


@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2, reason="FSDP needs 2 GPUs")
def test_fsdp_on_two_gpus_trains_close_to_ddp(setup, tmp_path):  # pragma: no cover - GPU only
    _, base = setup
    runs = {}
    for shard in ("none", "fsdp"):
        out_dir = tmp_path / shard
        rc, _, err = run_job(
            [
                "-m",
                "leantrain",
                "train",
                *flags(**base, batch_size=8, max_steps=6, output_dir=out_dir, num_processes=2, shard=shard),
            ]
        )
        assert rc == 0, err[-3000:]
        runs[shard] = weights(out_dir)
    assert max_diff(runs["none"], runs["fsdp"]) <= 1e-4


# -- every optimizer across processes ------------------------------------------------------------------------------

#: learning rates at which each moves the tiny BERT in a few steps (schedule-free SGD's is SGD's)
OPTIMIZER_LR = {"muon": 3e-3, "schedule-free-adamw": 3e-3, "galore-adamw": 3e-3, "apollo-adamw": 3e-3}


def optimizer_job(base: dict, optimizer: str) -> dict:
    job = dict(base, optimizer=optimizer, lr=OPTIMIZER_LR[optimizer], epochs=1)
    if optimizer in ("galore-adamw", "apollo-adamw"):  # refreshed at steps 3 and 6 of the 7
        job.update(projection_rank=8, projection_update_interval=3)
    if optimizer.startswith("schedule-free"):
        job.update(scheduler="constant")
    return job


# two 2-process runs and two 1-process runs each: 60-90 s at load 12
@pytest.mark.parametrize("optimizer", list(OPTIMIZER_LR))
def test_two_processes_compute_exactly_what_one_does_on_the_same_micro_batches(setup, optimizer):
    """Two processes of 8 examples a step equal, bitwise, one process that accumulates the same two micro-batches of
    8 (the same forward passes; the all-reduce sums the same two gradients): the processes split the data, sum the
    gradients, and step (Muon's orthogonalisation, GaLore's SVD, APOLLO's seeded random projections, schedule-free's
    average) as one process does, and they agree (each evaluates half the held-out rows with its own weights). Against
    one micro-batch of 16, elementwise rules stay within 1e-5 (a tensor whose gradient is zero but for rounding
    excepted: Adam's division turns its noise into steps); Muon's bf16 Newton-Schulz and GaLore's SVD magnify the
    rounding of summing the batch in two parts (7.7e-4 and 4.0e-4 on this job), which is why the exact comparison is
    the one of the same micro-batches."""
    root, base = setup
    job = optimizer_job(base, optimizer)
    runs = {}
    for name, shape in {"accumulated": dict(batch_size=8, grad_accum=2), "two": dict(batch_size=8, num_processes=2),
                        "one": dict(batch_size=16)}.items():  # fmt: skip
        out_dir = root / f"{optimizer}-{name}"
        rc, _, err = run_job(["-m", "leantrain", "train", *flags(**job, **shape, output_dir=out_dir)])
        assert rc == 0, err[-3000:]
        runs[name] = (weights(out_dir), json.loads((out_dir / "metrics.json").read_text()))
    (acc, acc_metrics), (two, two_metrics), (one, _) = runs["accumulated"], runs["two"], runs["one"]
    assert two_metrics["num_processes"] == 2 and acc_metrics["optimizer_steps"] == two_metrics["optimizer_steps"] == 7
    different = [k for k in acc if not torch.equal(acc[k], two[k])]
    assert not different, f"{len(different)} tensors differ, e.g. {different[0]}"
    assert two_metrics["eval_loss"] == pytest.approx(acc_metrics["eval_loss"], abs=1e-6)
    if optimizer in ("schedule-free-adamw", "apollo-adamw"):
        diffs = {k: (one[k] - two[k]).abs().max().item() for k in one if not k.endswith("key.bias")}
        assert max(diffs.values()) <= TOL, max(diffs.items(), key=lambda kv: kv[1])


# one 2-process run and one in-process run: about 40 s at load 12
def test_schedule_free_sharded_with_fsdp_equals_one_process(setup):
    """--shard fsdp with schedule-free AdamW: each process switches its shards to the averaged weights and back
    around the evaluations and saves; model/ (gathered whole) is one process's within 1e-5 (the zero-gradient key
    biases excepted, as above)."""
    root, base = setup
    job = dict(optimizer_job(base, "schedule-free-adamw"), eval_every=3, save_every=3)
    one = train(TrainConfig(**job, batch_size=16, output_dir=str(root / "sf-fsdp-one"))).output_dir
    out_dir = root / "sf-fsdp-two"
    rc, _, err = run_job(
        ["-m", "leantrain", "train", *flags(**job, batch_size=8, output_dir=out_dir, num_processes=2, shard="fsdp")]
    )
    assert rc == 0, err[-3000:]
    a, b = weights(one), weights(out_dir)
    diffs = {k: (a[k] - b[k]).abs().max().item() for k in a if not k.endswith("key.bias")}
    assert max(diffs.values()) <= TOL, max(diffs.items(), key=lambda kv: kv[1])
    metrics = [json.loads((d / "metrics.json").read_text())["eval_loss"] for d in (one, out_dir)]
    assert metrics[0] == pytest.approx(metrics[1], abs=1e-5)


def test_muon_sharded_with_fsdp_orthogonalises_whole_matrices(tmp_path):
    """Under --shard fsdp each process holds rows of a matrix; Muon's Newton-Schulz iteration must run on the whole
    matrix (DTensor gathers it), not on each shard: one step of two sharded processes is the unsharded step up to bf16
    rounding, 20x closer than orthogonalising the halves apart would be (tests/parallel/muon_shards.py)."""
    script = Path(__file__).with_name("muon_shards.py")
    rc, _out, err = run_job(
        ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(script), str(tmp_path / "r.json")]
    )
    assert rc == 0, err[-3000:]
    result = json.loads((tmp_path / "r.json").read_text())
    assert result["sharded_vs_whole"] < result["per_shard_vs_whole"] / 10, result
