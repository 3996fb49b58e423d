import itertools

import numpy as np
import pytest
import torch

from leantrain.data.batching import Collator, GlobalBatchSampler, Slot, eval_batches


def _steps(sampler):
    """Group the yielded micro-batches into optimizer steps, per process (round-robin sharding)."""
    n = sampler.num_processes
    steps, current = [], []
    for k, micro in enumerate(sampler):
        current.append((k % n, [s.index for s in micro], micro[0].step_units, micro[-1].step_end))
        if k % n == n - 1 and micro[-1].step_end:
            steps.append(current)
            current = []
    assert not current
    return steps


@pytest.mark.parametrize("longest_first", [False, True], ids=["shuffled", "longest-first"])
@pytest.mark.parametrize("micro,accum,procs", [(8, 1, 1), (4, 2, 1), (2, 2, 2), (1, 8, 1), (4, 1, 2)])
def test_each_step_holds_the_same_examples_however_the_batch_is_split(micro, accum, procs, longest_first):
    lengths = np.random.default_rng(0).integers(3, 60, size=203)
    reference = GlobalBatchSampler(lengths, micro_batch=8, seed=7, longest_first=longest_first)
    split = GlobalBatchSampler(
        lengths, micro_batch=micro, accumulation=accum, num_processes=procs, seed=7, longest_first=longest_first
    )
    for epoch in (0, 1):
        reference.set_epoch(epoch)
        split.set_epoch(epoch)
        want = [sorted(i for _, idx, _, _ in step for i in idx) for step in _steps(reference)]
        got_steps = _steps(split)
        got = [sorted(i for _, idx, _, _ in step for i in idx) for step in got_steps]
        assert got == want
        for step, examples in zip(got_steps, want):
            assert all(w == len(examples) for _, _, w, _ in step)  # the loss normaliser is the whole step


def test_an_epoch_sees_every_example_exactly_once_and_the_order_changes():
    lengths = np.random.default_rng(1).integers(1, 100, size=150)
    sampler = GlobalBatchSampler(lengths, micro_batch=16, accumulation=2, num_processes=1, seed=3)
    seen = [s.index for micro in sampler for s in micro]
    assert sorted(seen) == list(range(150))
    assert len(list(sampler)) == len(sampler)
    sampler.set_epoch(1)
    assert [s.index for micro in sampler for s in micro] != seen


def test_length_grouping_sorts_within_chunks_so_batches_mix_differently_each_epoch():
    """Sorting the whole epoch by length would give the same batches every epoch (only their order shuffled);
    sorting within chunks of `chunk_batches` global batches keeps batches of alike lengths that still change.
    Mutation testing: a chunk boundary dropped (one chunk) survived every other test."""
    lengths = np.arange(1, 193)  # all distinct: a whole-epoch sort would fix each batch's members
    sampler = GlobalBatchSampler(lengths, micro_batch=8, accumulation=2, seed=5, chunk_batches=3)
    members = []
    for epoch in (0, 1):
        sampler.set_epoch(epoch)
        batches = sampler.global_batches()
        members.append({frozenset(b.tolist()) for b in batches})
        spread = [lengths[b].max() - lengths[b].min() for b in batches]
        assert max(spread) < 100  # grouped: a random batch of 16 of 192 would span ~170
    assert len(members[0] & members[1]) <= 2, "the same batches came back in the next epoch"


@pytest.mark.parametrize("rows", [1000, 150])  # chunks of 50 batches; a small epoch's four chunks of 9
def test_longest_first_is_the_hf_trainers_group_by_length_order(rows, monkeypatch):
    """--batch-order longest-first yields the HF Trainer's LengthGroupedSampler order given the same shuffle: chunks
    of min(50, epoch / 4) batches, each longest first, the longest example first of all. Shuffled draws the same
    chunks' batches in another order."""
    from transformers.trainer_pt_utils import get_length_grouped_indices

    lengths = np.random.default_rng(3).integers(1, 90, size=rows)  # ties included: both keep the shuffle's order
    lengths[7] = 500  # one longest example, outside the first chunk in some epoch: it moves to the front
    sampler = GlobalBatchSampler(lengths, micro_batch=4, seed=11, longest_first=True)
    moved = False
    for epoch in (0, 1, 2):
        sampler.set_epoch(epoch)
        shuffle = sampler.epoch_order(np.random.default_rng([11, epoch]))
        moved |= shuffle.tolist().index(7) >= 4 * sampler._chunk_batches(rows)
        monkeypatch.setattr(torch, "randperm", lambda n, generator=None, order=shuffle: torch.as_tensor(order))
        want = get_length_grouped_indices(lengths.tolist(), 4)
        ours = np.concatenate(sampler.global_batches()).tolist()
        assert ours == want
        assert ours[0] == 7
    assert moved
    shuffled = GlobalBatchSampler(lengths, micro_batch=4, seed=11)
    longest = [lengths[b].max() for b in shuffled.global_batches()[:-1]]
    assert longest != sorted(longest, reverse=True)


def test_ties_in_length_keep_the_seeded_shuffles_order():
    """Equal lengths are ordered by the epoch's seeded permutation, not by the sort algorithm: an unstable sort
    breaks ties by its own internals, which differ between numpy builds and CPUs (SIMD sorts), so a run resumed
    on another machine could see other batches. Mutation testing: `kind="stable"` dropped survived."""
    seed, epoch, n = 4, 1, 300
    lengths = np.random.default_rng(0).integers(1, 6, size=n)  # many ties
    sampler = GlobalBatchSampler(lengths, micro_batch=10, accumulation=1, seed=seed, chunk_batches=30)
    sampler.set_epoch(epoch)
    shuffled = np.random.default_rng([seed, epoch]).permutation(n)  # the documented seed: (seed, epoch)
    position = np.empty(n, dtype=int)
    position[shuffled] = np.arange(n)
    for batch in sampler.global_batches():
        for a, b in itertools.pairwise(batch):
            assert lengths[a] > lengths[b] or position[a] < position[b], (a, b)


def test_last_short_step_takes_fewer_micro_steps():
    sampler = GlobalBatchSampler(np.ones(76, dtype=int), micro_batch=8, accumulation=4, seed=0)
    steps = _steps(sampler)
    assert [len(s) for s in steps] == [4, 4, 2]  # 32, 32, then 12 examples: two micro-batches, not four
    assert [len(idx) for _, idx, _, _ in steps[-1]] == [6, 6]
    assert all(w == 12 for _, _, w, _ in steps[-1])
    assert sampler.steps_per_epoch() == 3 and len(sampler) == 10


def test_length_grouping_cuts_padding():
    lengths = np.random.default_rng(2).integers(5, 128, size=4000)

    def padding(sampler):
        real = padded = 0
        for micro in sampler:
            ls = lengths[[s.index for s in micro]]
            real += ls.sum()
            padded += ls.max() * len(ls)
        return 1 - real / padded

    grouped = padding(GlobalBatchSampler(lengths, 32, seed=0))
    random_order = padding(GlobalBatchSampler(lengths, 32, seed=0, group_by_length=False))
    assert grouped < 0.05 < 0.3 < random_order


def test_collator_pads_to_the_longest_row_and_masks_padding():
    items = [
        {"input_ids": np.array([101, 5, 102]), "label": 1, "slot": Slot(0, 2.0, False)},
        {"input_ids": np.array([101, 102]), "label": 0, "slot": Slot(1, 2.0, True)},
    ]
    batch = Collator(pad_token_id=0)(items)
    assert batch["input_ids"].tolist() == [[101, 5, 102], [101, 102, 0]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1], [1, 1, 0]]
    assert batch["num_tokens"].item() == 5 and batch["step_end"].item() is True


def test_eval_batches_cover_everything_once():
    batches = eval_batches(np.array([3, 9, 1, 7, 5]), 2)
    assert sorted(i for b in batches for i in b) == [0, 1, 2, 3, 4]
    assert batches[0] == [1, 3]


@pytest.mark.parametrize("micro,accum,procs", [(8, 1, 1), (4, 2, 1), (2, 2, 2), (3, 1, 2)])
def test_len_is_what_iteration_yields_for_every_remainder_and_start(micro, accum, procs):
    """Mutation testing found `len()` unchecked where the last global batch holds exactly as many examples as
    processes (one each): every dataset size across two global batches, and seeks, are compared here."""
    global_batch = micro * accum * procs
    for n in range(1, 2 * global_batch + 2):
        sampler = GlobalBatchSampler(np.arange(n) % 7 + 1, micro_batch=micro, accumulation=accum, num_processes=procs)
        for start in range(sampler.steps_per_epoch() + 1):
            sampler.start_at(0, start)
            assert len(sampler) == len(list(sampler)), (n, start)


@pytest.mark.parametrize("micro,accum,procs", [(8, 1, 1), (2, 1, 2), (2, 2, 2), (1, 1, 4)])
def test_steps_per_epoch_is_the_optimizer_steps_iteration_yields(micro, accum, procs):
    """Mutation testing (benchmarks/results/mutation.md) found `steps_per_epoch` unchecked where an epoch's last
    global batch holds fewer examples than processes: iteration skips it, and the count (the schedule's length,
    the epoch of a resumed step) counted it. Every dataset size across two global batches, and fewer rows than
    processes."""
    for n in range(1, 2 * micro * accum * procs + 2):
        sampler = GlobalBatchSampler(np.arange(n) % 7 + 1, micro_batch=micro, accumulation=accum, num_processes=procs)
        steps = sum(micro_batch[0].step_end for micro_batch in sampler) // procs
        assert sampler.steps_per_epoch() == steps, n


@pytest.mark.parametrize("micro,accum,procs", [(8, 1, 1), (4, 2, 1), (2, 2, 2)])
def test_step_units_sum_the_units_of_the_whole_global_batch(micro, accum, procs):
    """A task's loss units (counted tokens, class weights) are summed over the whole step, however it is split,
    and each micro-batch carries its own share: what token-level and weighted normalisation divide by."""
    units = np.arange(1, 38, dtype=float) * 0.5
    sampler = GlobalBatchSampler(np.arange(37) % 5 + 1, micro, accum, procs, seed=2, units=units)
    expected = {tuple(sorted(b.tolist())): units[b].sum() for b in sampler.global_batches()}
    steps: dict[float, list[int]] = {}
    for micro_batch in sampler:
        assert all(s.units == units[s.index] for s in micro_batch)
        steps.setdefault(micro_batch[0].step_units, []).extend(s.index for s in micro_batch)
    assert {tuple(sorted(v)): k for k, v in steps.items()} == expected
    batch = Collator(pad_token_id=0)(
        [{"input_ids": np.array([1, 2]), "label": 0, "slot": s} for s in next(iter(sampler))]
    )
    assert batch["units"].item() == pytest.approx(sum(units[batch["index"].numpy()]))


# -- static shapes (--static-shapes, on with --compile) -------------------------------------------------------------


def test_length_buckets_add_at_most_a_third_of_padding_and_end_at_max_length():
    from leantrain.data.batching import length_buckets

    assert length_buckets(128) == [16, 24, 32, 48, 64, 96, 128]
    assert length_buckets(100)[-2:] == [96, 100] and length_buckets(16) == [16]
    buckets = length_buckets(512)
    assert all(b / a <= 1.5 for a, b in itertools.pairwise(buckets))


def _items(lengths, step_end=True):
    from leantrain.data.batching import Slot

    return [
        {"input_ids": np.arange(1, n + 1), "label": i % 2, "slot": Slot(i, 10.0, step_end and i == len(lengths) - 1)}
        for i, n in enumerate(lengths)
    ]


class _Sampler:
    micro_batch = 4


def test_a_short_micro_batch_is_filled_with_masked_rows_and_padded_to_its_bucket():
    from leantrain.data.batching import BatchFacts, Collator, StaticShapes

    batch = StaticShapes(Collator(pad_token_id=0), 0, 128, _Sampler())(_items([20, 7, 3]))
    assert batch["input_ids"].shape == (4, 24) and batch["attention_mask"].shape == (4, 24)
    assert batch["labels"].tolist() == [0, 1, 0, -100]  # the masked row's loss is ignored
    assert batch["attention_mask"][3].tolist() == [1] + [0] * 23  # one token, or its attention would be NaN
    assert batch["attention_mask"][:3].sum(1).tolist() == [20, 7, 3]  # the real rows as collated
    facts = BatchFacts.of(batch)
    assert (facts.rows, facts.units, facts.num_tokens, facts.padded_tokens) == (3, 3.0, 30, 96)  # counted once


def test_the_masked_row_adds_no_loss_and_no_gradient():
    import torch.nn.functional as F

    from leantrain.data.batching import Collator, StaticShapes

    plain = Collator(pad_token_id=0)(_items([5, 2, 3]))
    static = StaticShapes(Collator(pad_token_id=0), 0, 128, _Sampler())(_items([5, 2, 3]))
    logits = torch.randn(4, 2, requires_grad=True)
    F.cross_entropy(logits, static["labels"], reduction="sum").backward()
    assert logits.grad is not None and logits.grad[3].abs().sum() == 0
    loss = F.cross_entropy(logits[:3], plain["labels"], reduction="sum")
    assert F.cross_entropy(logits, static["labels"], reduction="sum") == loss


def test_a_batch_with_keys_it_cannot_pad_is_left_as_collated():
    from leantrain.data.batching import Collator, StaticShapes

    def with_sources(items):
        batch = Collator(pad_token_id=0)(items)
        batch["source"] = torch.zeros(len(items), dtype=torch.long)  # a mixture's per-row source
        return batch

    batch = StaticShapes(with_sources, 0, 128, _Sampler())(_items([5, 2, 3]))
    assert batch["input_ids"].shape == (3, 5)
