"""LocalSGD over two real gloo processes, checked against a single-process replay of each rank's steps.

One spawn of two processes runs every distributed scenario; each rank writes its records to a file
and the tests compare them with the replay computed here.
"""

from __future__ import annotations

import contextlib
import socket
import traceback
from datetime import timedelta

import pytest
import torch
import torch.multiprocessing as mp
from torch import nn

from leantrain.parallel.local_sgd import LocalSGD

WORLD = 2
LR = 0.1
ATOL = 1e-6


class Net(nn.Module):
    """Linear → BatchNorm → Tanh → Linear, times a frozen scale: trainable and frozen parameters,
    float buffers (running stats) and an integer buffer (num_batches_tracked)."""

    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(4, 8)
        self.bn = nn.BatchNorm1d(8)
        self.fc2 = nn.Linear(8, 2)
        self.scale = nn.Parameter(torch.tensor(1.5), requires_grad=False)

    def forward(self, x):
        return self.fc2(torch.tanh(self.bn(self.fc1(x)))) * self.scale


def make_model() -> Net:
    torch.manual_seed(0)
    return Net()


def batch(rank: int, step: int):
    g = torch.Generator().manual_seed(1000 * rank + step)
    return torch.randn(6, 4, generator=g), torch.randn(6, 2, generator=g)


def train_step(model, opt, rank, step, no_sync=contextlib.nullcontext):
    x, y = batch(rank, step)
    opt.zero_grad()
    with no_sync():
        nn.functional.mse_loss(model(x), y).backward()
    opt.step()


def snapshot(model) -> dict[str, torch.Tensor]:
    inner = model.module if isinstance(model, nn.parallel.DistributedDataParallel) else model
    return {k: v.detach().clone() for k, v in inner.state_dict().items()}


# name: (local_sgd_steps, optimizer steps, LocalSGD kwargs, wrap in DDP)
SCENARIOS = {
    "plain": (3, 7, {}, False),
    "ddp": (3, 7, {"bucket_bytes": 100}, True),  # tiny buckets: many all-reduces
    "outer_identity": (3, 7, {"outer_lr": 1.0, "outer_momentum": 0.0}, False),
    "nesterov": (2, 4, {"outer_lr": 0.7, "outer_momentum": 0.9}, False),
}


def _run_rank(rank: int, port: int, out: str) -> None:
    torch.set_num_threads(1)
    torch.distributed.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD, timeout=timedelta(seconds=60)
    )
    results = {}
    for name, (k, steps, kwargs, ddp) in SCENARIOS.items():
        model = make_model()
        if ddp:
            model = nn.parallel.DistributedDataParallel(model)
        opt = torch.optim.SGD(model.parameters(), lr=LR)
        records = []  # (step, synced, state after the step)
        with LocalSGD(model, local_sgd_steps=k, **kwargs) as local_sgd:
            no_sync_type = type(local_sgd.no_sync()).__name__
            for step in range(steps):
                train_step(model, opt, rank, step, local_sgd.no_sync)
                synced = local_sgd.step()
                records.append((step, synced, snapshot(model)))
        results[name] = {
            "records": records,
            "final": snapshot(model),
            "enabled": local_sgd.enabled,
            "reason": local_sgd.reason,
            "num_syncs": local_sgd.num_syncs,
            "bytes": local_sgd.bytes_communicated,
            "no_sync_type": no_sync_type,
        }
    torch.save(results, f"{out}/rank{rank}.pt")
    torch.distributed.destroy_process_group()


def _worker(rank: int, port: int, out: str) -> None:
    try:
        _run_rank(rank, port, out)
    except BaseException:
        with open(f"{out}/rank{rank}.err", "w") as f:
            f.write(traceback.format_exc())
        raise


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    out = tmp_path_factory.mktemp("local_sgd")
    ctx = mp.get_context("spawn")
    port = _free_port()
    procs = [ctx.Process(target=_worker, args=(rank, port, str(out))) for rank in range(WORLD)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=120)
    for p in procs:
        if p.is_alive():
            p.terminate()
    errors = [f.read_text() for f in sorted(out.glob("*.err"))]
    assert not errors, "\n".join(errors)
    assert all(p.exitcode == 0 for p in procs), [p.exitcode for p in procs]
    return [torch.load(out / f"rank{rank}.pt") for rank in range(WORLD)]


# -- single-process replay ------------------------------------------------------------------------------------
TRAINABLE = [n for n, p in make_model().named_parameters() if p.requires_grad]


@contextlib.contextmanager
def one_thread():
    # Tiny ops on a busy 2-core machine: a second intra-op thread makes the replay 100x slower.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


@one_thread()
def replay(k: int, steps: int, outer_lr=None, outer_momentum=0.0):
    """The synced states, computed by running each rank's round on one process and averaging by hand."""
    start = make_model().state_dict()
    anchor = {n: start[n].clone() for n in TRAINABLE}
    momentum = {n: torch.zeros_like(start[n]) for n in TRAINABLE}
    synced, step = [], 0
    while step < steps:
        round_steps = range(step, min(step + k, steps))
        ends = []
        for rank in range(WORLD):
            model = make_model()
            model.load_state_dict(start)
            opt = torch.optim.SGD(model.parameters(), lr=LR)
            for s in round_steps:
                train_step(model, opt, rank, s)
            ends.append(model.state_dict())
        mean = {n: (sum(e[n] for e in ends) / WORLD if v.is_floating_point() else ends[0][n]) for n, v in start.items()}
        if outer_lr is not None:
            for n in TRAINABLE:
                grad = anchor[n] - mean[n]
                momentum[n] = outer_momentum * momentum[n] + grad
                update = grad + outer_momentum * momentum[n] if outer_momentum else grad
                anchor[n] = anchor[n] - outer_lr * update
                mean[n] = anchor[n].clone()
        synced.append((round_steps[-1], mean))
        start = mean
        step += k
    return synced


def assert_states_close(a, b, atol=ATOL):
    assert a.keys() == b.keys()
    for n in a:
        torch.testing.assert_close(a[n], b[n], atol=atol, rtol=0, msg=lambda m: f"{n}: {m}")  # noqa: B023 - called within this iteration


def states_equal(a, b) -> bool:
    return all(torch.equal(a[n], b[n]) for n in a)


# -- tests ----------------------------------------------------------------------------------------------------
@pytest.mark.slow  # spawns 2 processes (the `runs` fixture)
@pytest.mark.parametrize("name", list(SCENARIOS))
def test_ranks_identical_after_sync_and_different_between(runs, name):
    r0, r1 = (run[name] for run in runs)
    assert r0["enabled"] and r1["enabled"]
    assert "every" in r0["reason"]
    for (step, synced, s0), (_, synced1, s1) in zip(r0["records"], r1["records"]):
        assert synced == synced1
        assert states_equal(s0, s1) == synced, f"step {step}: synced={synced}"
    assert states_equal(r0["final"], r1["final"])


@pytest.mark.slow  # spawns 2 processes (the `runs` fixture)
@pytest.mark.parametrize("name", ["plain", "ddp"])
def test_synced_params_are_the_mean_of_the_ranks_local_runs(runs, name):
    k, steps, _, _ = SCENARIOS[name]
    expected = replay(k, steps)
    assert [s for s, _ in expected] == [2, 5, 6]  # syncs at steps 3 and 6, and the last partial round on exit
    records = runs[0][name]["records"]
    assert [step for step, synced, _ in records if synced] == [2, 5]
    for step, state in expected[:-1]:
        assert_states_close(records[step][2], state)
    assert_states_close(runs[0][name]["final"], expected[-1][1])
    assert runs[0][name]["num_syncs"] == 3


@pytest.mark.slow  # spawns 2 processes (the `runs` fixture)
def test_ddp_no_sync_is_ddps_and_plain_no_sync_is_null(runs):
    assert runs[0]["ddp"]["no_sync_type"] != "nullcontext"
    assert runs[0]["plain"]["no_sync_type"] == "nullcontext"


@pytest.mark.slow  # spawns 2 processes (the `runs` fixture)
def test_outer_lr_one_without_momentum_is_plain_averaging(runs):
    plain, outer = runs[0]["plain"], runs[0]["outer_identity"]
    for (_, synced, a), (_, _, b) in zip(plain["records"], outer["records"]):
        if synced:
            assert_states_close(a, b)
    assert_states_close(plain["final"], outer["final"])


@pytest.mark.slow  # spawns 2 processes (the `runs` fixture)
def test_nesterov_outer_step_matches_hand_computed_reference(runs):
    k, steps, kwargs, _ = SCENARIOS["nesterov"]
    expected = replay(k, steps, **kwargs)
    assert len(expected) == 2
    r0 = runs[0]["nesterov"]
    assert r0["num_syncs"] == 2  # the exit sync is skipped: no step since the last one
    assert_states_close(r0["records"][1][2], expected[0][1])
    assert_states_close(r0["final"], expected[1][1])
    # and momentum made a difference: not the same as plain averaging of the same rounds
    plain = replay(k, steps)[-1][1]
    assert not all(torch.allclose(r0["final"][n], plain[n], atol=1e-4) for n in TRAINABLE)


@pytest.mark.slow  # spawns 2 processes (the `runs` fixture)
@pytest.mark.parametrize("name", list(SCENARIOS))
def test_bytes_communicated_is_synced_bytes_times_syncs(runs, name):
    model = make_model()
    trainable = sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
    float_buffers = sum(b.numel() * b.element_size() for b in model.buffers() if b.is_floating_point())
    assert trainable == (4 * 8 + 8 + 8 + 8 + 8 * 2 + 2) * 4  # the frozen scale is not sent
    for run in runs:
        assert run[name]["bytes"] == (trainable + float_buffers) * run[name]["num_syncs"]


def test_single_process_is_a_no_op_that_says_so():
    import torch.distributed as dist

    assert not dist.is_initialized()
    model = make_model()
    before = snapshot(model)
    with LocalSGD(model, local_sgd_steps=2, outer_lr=0.7, outer_momentum=0.9) as local_sgd:
        assert not local_sgd.enabled
        assert "single process" in local_sgd.reason
        assert isinstance(local_sgd.no_sync(), contextlib.nullcontext)
        for _ in range(5):
            assert local_sgd.step() is False
        assert local_sgd.sync() is False
    assert states_equal(snapshot(model), before)
    assert local_sgd.num_steps == 5 and local_sgd.num_syncs == 0 and local_sgd.bytes_communicated == 0

    off = LocalSGD(model, local_sgd_steps=2, enabled=False)
    assert not off.enabled and "disabled" in off.reason


def test_rejects_bad_arguments():
    model = make_model()
    with pytest.raises(ValueError):
        LocalSGD(model, local_sgd_steps=0)
    with pytest.raises(ValueError):
        LocalSGD(model, local_sgd_steps=2, outer_momentum=0.9)  # momentum without an outer optimizer
    with pytest.raises(ValueError):
        LocalSGD(model, local_sgd_steps=2, outer_lr=0.7, outer_momentum=1.0)
