"""Mixtures at the data layer: how sources are written, and what the sampler draws from them (docs/mixtures.md)."""

from __future__ import annotations

import numpy as np
import pytest
import yaml

from leantrain import TrainConfig
from leantrain.data.mixture import MixtureSampler, apportion, mix
from leantrain.data.prepare import Examples
from leantrain.data.spec import parse_sources, split_weight
from leantrain.data.tokenize import TokenizedText
from leantrain.errors import ConfigError


# -- how sources are written ---------------------------------------------------------------------------------------
def test_a_weight_follows_the_last_at_and_a_path_that_exists_is_read_whole(tmp_path):
    odd = tmp_path / "notes@2"  # a file whose name holds '@' and a number
    odd.write_text("x")
    folder = tmp_path / "data@home"
    folder.mkdir()
    (folder / "a.csv").write_text("x")
    assert split_weight("corpus.txt@0.7") == ("corpus.txt", 0.7)
    assert split_weight("wiki:20231101.en@0.3") == ("wiki:20231101.en", 0.3)
    assert split_weight(str(odd)) == (str(odd), None)
    assert split_weight(f"{odd}@1e-1") == (str(odd), 0.1)
    assert split_weight(f"{folder}/a.csv") == (f"{folder}/a.csv", None)
    assert split_weight("user@host.csv") == ("user@host.csv", None)  # not a number, and 'user' is no file


@pytest.mark.parametrize(
    "value,message",
    [
        (["a.csv@0", "b.csv@1"], "weight must be a positive number, got '0'"),
        (["a.csv@-2", "b.csv@1"], "weight must be a positive number, got '-2'"),
        (["a.csv@inf", "b.csv@1"], "weight must be a positive number"),
        (["a.csv@1e308", "b.csv@1e308"], "the weights 1e+308, 1e+308 cannot be made shares"),  # a hang
        (["a.csv@1e300", "b.csv@1e-300"], "write them as shares, e.g. 0.7 and 0.3"),  # b's share: 0
        ([{"path": "a.csv", "weight": "heavy"}, "b.csv@1"], "the weight 'heavy' is not a number"),
        ([{"path": "a.csv", "weight": True}, "b.csv@1"], "is not a number"),
        (["a.csv@0.5", "b.csv"], "weights are given for some sources and not for b.csv"),
        ([{"path": "a.csv", "repeat": 2}, "b.csv@1"], "weights are given for some"),
        ([{"path": "a.csv", "repeat": 2, "weight": 1}, "b.csv@1"], "both weights and repeat"),
        (["x/a.csv", "y/a.csv"], "two sources are named 'a'"),
        ([{"path": "a.csv", "wieght": 1}], "unknown key 'wieght'; did you mean 'weight'"),
        ([{"weight": 1}], "needs a 'path'"),
        ([{"path": "a.csv", "limit": 0}], "limit must be a positive whole number"),
        ([{"path": "a.csv", "labels": ["ham", "ham"]}], "names a class twice"),
        ([], "an empty list"),
        (["{path: a.csv, weight: [1}"], "not a YAML mapping"),
    ],
)
def test_bad_sources_are_refused_in_one_line(value, message):
    with pytest.raises(ConfigError, match=None) as caught:
        TrainConfig(data=value)
    assert message in str(caught.value) and "\n" not in str(caught.value)


def test_sources_round_trip_through_config_yaml_and_the_command_line(tmp_path):
    from leantrain.commands.cli import build_parser, config_from_args

    sms = {"path": "sms.tsv", "name": "texts", "weight": 0.3, "format": "tsv", "column_names": "label,text"}
    given = ["a.csv@0.7", {**sms, "limit": 500}]
    cfg = TrainConfig(data=given, mix_by="tokens", dedupe=True)
    assert cfg.data == [
        {"path": "a.csv", "weight": 0.7},
        {
            "path": "sms.tsv",
            "name": "texts",
            "weight": 0.3,
            "column_names": "label,text",
            "format": "tsv",
            "limit": 500,
        },
    ]
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(cfg.to_dict(), sort_keys=False))
    assert TrainConfig.from_yaml(path) == cfg
    args = build_parser().parse_args(["train", *cfg.to_argv()])
    assert config_from_args(args) == cfg
    # one source stays what it always was: a string, in the config and in config.yaml
    assert TrainConfig(data="x.csv").data == "x.csv" and TrainConfig(data=["x.csv"]).data == "x.csv"
    assert config_from_args(build_parser().parse_args(["train", "--data", "x.csv"])).data == "x.csv"
    # a source's mapping on the command line, as YAML's inline form
    flags = ["train", "--data", "a.csv@2", "--data", "{path: b.csv, weight: 1, text_column: body}"]
    mixed = config_from_args(build_parser().parse_args(flags))
    assert [s.option("text_column") for s in parse_sources(mixed.data)] == [None, "body"]


# -- what the sampler draws -------------------------------------------------------------------------------------
def fake_examples(lengths: list[int] | np.ndarray) -> Examples:
    lengths = np.asarray(lengths, dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    tokens = TokenizedText(np.ones(int(lengths.sum()), dtype=np.int32), offsets)
    return Examples(tokens, np.zeros(len(lengths), np.int64))


def three_sources(by: str = "examples"):
    rng = np.random.default_rng(0)
    parts = [
        ("long", fake_examples(rng.integers(60, 120, size=900))),
        ("short", fake_examples(rng.integers(5, 15, size=300))),
        ("tiny", fake_examples(rng.integers(20, 40, size=37))),
    ]
    specs = parse_sources(["long.txt@0.5", "short.txt@0.3", "tiny.txt@0.2"])
    return mix(parts, specs, by)


def drawn(sampler: MixtureSampler, examples: int) -> np.ndarray:
    """The examples the first `examples` draws hold, epoch after epoch."""
    out, epoch = [], 0
    while sum(len(b) for b in out) < examples:
        sampler.set_epoch(epoch)
        out += sampler.global_batches()
        epoch += 1
    return np.concatenate(out)[:examples]


@pytest.mark.parametrize("by", ["examples", "tokens"])
def test_realised_shares_are_the_weights_within_one_percent_over_20000_examples(by):
    mixture = three_sources(by)
    sampler = MixtureSampler(mixture, micro_batch=16, accumulation=2, num_processes=2, seed=7)
    first = drawn(sampler, 20_000)
    source = np.searchsorted([s.span.stop for s in mixture.sources], first, side="right")
    lengths = mixture.lengths[first]
    if by == "examples":
        shares = np.bincount(source, minlength=3) / len(first)
    else:
        shares = np.bincount(source, weights=lengths, minlength=3) / lengths.sum()
    assert shares == pytest.approx([0.5, 0.3, 0.2], abs=0.01)
    # and not by chance: by examples the token shares are far from the weights, and the other way round
    other = (
        np.bincount(source, weights=lengths, minlength=3) / lengths.sum()
        if by == "examples"
        else np.bincount(source, minlength=3) / len(first)
    )
    assert abs(other[0] - 0.5) > 0.1


def steps(sampler: MixtureSampler, epoch: int) -> list[list[int]]:
    """Each optimizer step's examples, sorted, however the step is split over micro-batches and processes."""
    sampler.set_epoch(epoch)
    out, current, ended = [], [], 0
    for micro in sampler:
        current += [s.index for s in micro]
        ended += micro[-1].step_end
        if ended == sampler.num_processes:
            out.append(sorted(current))
            current, ended = [], 0
    return out


@pytest.mark.parametrize("micro,accum,procs", [(8, 4, 1), (16, 1, 2), (4, 2, 4), (3, 3, 3)])
def test_every_step_holds_the_same_examples_however_the_batch_is_split(micro, accum, procs):
    mixture = three_sources()
    reference = MixtureSampler(mixture, 32 if micro * accum * procs == 32 else 27, seed=3)
    split = MixtureSampler(mixture, micro, accum, procs, seed=3)
    for epoch in (0, 1, 4):
        assert steps(split, epoch) == steps(reference, epoch)
    assert len(steps(split, 0)) == split.steps_per_epoch() == reference.steps_per_epoch()


def test_a_small_source_restarts_its_own_passes_without_moving_the_others():
    mixture = three_sources()
    tiny = mixture.sources[2]
    sampler = MixtureSampler(mixture, 32, seed=5)
    # an epoch draws 247 examples from the 37 rows of 'tiny': 6.7 passes, each one every row once, reshuffled
    assert tiny.quota == 247
    stream = sampler.stream(2, 0, 37 * 7) - tiny.span.start
    passes = stream.reshape(7, 37)
    assert all(sorted(p) == list(range(37)) for p in passes)
    assert len({tuple(p) for p in passes}) == 7
    # epoch 1 continues the stream where epoch 0 stopped: its 248th draw is the 26th of its 7th pass
    sampler.set_epoch(1)
    order = np.concatenate(sampler.global_batches())
    own = order[(order >= tiny.span.start) & (order < tiny.span.stop)]
    assert sorted(own) == sorted(sampler.stream(2, 247, 494))
    # another source's draws do not depend on this one: with 'tiny' twice as large the others' streams are the same
    rng = np.random.default_rng(0)
    parts = [("long", fake_examples(rng.integers(60, 120, 900))), ("short", fake_examples(rng.integers(5, 15, 300)))]
    parts.append(("tiny", fake_examples(rng.integers(20, 40, 74))))
    bigger = MixtureSampler(mix(parts, parse_sources(["long.txt@0.5", "short.txt@0.3", "tiny.txt@0.2"])), 32, seed=5)
    for i in (0, 1):
        assert np.array_equal(bigger.stream(i, 0, 2000), sampler.stream(i, 0, 2000))
    assert sampler.passes(3)["tiny"] == pytest.approx(3 * 247 / 37)


def test_a_seek_to_a_step_equals_iterating_past_it():
    mixture = three_sources()
    full = MixtureSampler(mixture, 4, 2, 2, seed=1)
    full.set_epoch(3)
    micro = list(full)
    seek = MixtureSampler(mixture, 4, 2, 2, seed=1)
    seek.start_at(3, 9)
    seek.set_epoch(3)
    assert list(seek) == micro[9 * 4 :]
    assert [s.source for m in micro for s in m][:20] == [
        int(np.searchsorted([s.span.stop for s in mixture.sources], s.index, side="right")) for m in micro for s in m
    ][:20]


def test_a_repeat_that_asks_for_an_epoch_larger_than_memory_is_refused():
    """repeat: 1e20 overflowed the epoch's size (a negative count, exit 0); 1e6 on 216 rows built 9 GB of order."""
    from leantrain.errors import DataError

    rng = np.random.default_rng(1)
    parts = [("a", fake_examples(rng.integers(5, 9, 100))), ("b", fake_examples(rng.integers(5, 9, 30)))]
    for repeat in (1e20, 1e7):
        with pytest.raises(DataError, match=r"repeat asks for an epoch of [\d,]+ examples, more than the"):
            mix(parts, parse_sources(["a.csv", {"path": "b.csv", "repeat": repeat}]), "examples")
    assert mix(parts, parse_sources(["a.csv", {"path": "b.csv", "repeat": 1e5}]), "examples").epoch_size == 3_000_100


def test_without_weights_each_source_counts_its_rows_times_its_repeat():
    rng = np.random.default_rng(1)
    parts = [("a", fake_examples(rng.integers(5, 9, 100))), ("b", fake_examples(rng.integers(5, 9, 30)))]
    mixture = mix(parts, parse_sources(["a.csv", {"path": "b.csv", "repeat": 3}]), "examples")
    assert [s.quota for s in mixture.sources] == [100, 90] and mixture.epoch_size == 190
    assert mixture.requested() == pytest.approx({"a": 100 / 190, "b": 90 / 190})
    sampler = MixtureSampler(mixture, 10, seed=0)
    batches = np.concatenate(sampler.global_batches())
    counts = np.bincount(batches[batches >= 100] - 100, minlength=30)
    assert set(counts.tolist()) == {3}  # every row of b three times an epoch, every row of a once
    assert sorted(batches[batches < 100]) == list(range(100))


def test_apportioning_adds_up_and_gives_every_share_at_least_one():
    assert apportion(10, np.array([0.5, 0.3, 0.2])).tolist() == [5, 3, 2]
    assert apportion(7, np.array([1 / 3, 1 / 3, 1 / 3])).tolist() == [3, 2, 2]
    tiny = apportion(100, np.array([0.999, 0.0005, 0.0005]))
    assert tiny.sum() == 100 and tiny.tolist()[1:] == [1, 1]


def test_the_contamination_line_names_sources_only_where_they_say_something():
    """A single source's held-out rows in its own training rows read "8 of h in h": said without the pair. In a
    mixture every pair is named, also when only one source's rows are contaminated (docs/mixtures.md)."""
    from leantrain.data.dedupe import Overlap

    alone = Overlap(within={"h": 0}, contaminated={("h", "h"): 8}, eval_hits={"h": 8}).notes(False, False)
    assert alone == ["contamination: 8 evaluation rows also occur in training; kept (--decontaminate drops them)"]
    mixed = Overlap(within={"h": 0, "s": 0}, contaminated={("h", "h"): 1}, eval_hits={"h": 1, "s": 0})
    assert mixed.notes(False, True) == [
        "contamination: 1 evaluation row also occurs in training (1 of h in h); dropped from training (--decontaminate)"
    ]
    two = Overlap(
        within={"a": 0, "b": 0}, contaminated={("a", "a"): 3, ("b", "a"): 2}, eval_hits={"a": 3, "b": 2}
    ).notes(False, True)
    assert two == [
        "contamination: 5 evaluation rows also occur in training (3 of a in a, 2 of b in a); dropped from training "
        "(--decontaminate)"
    ]


def test_the_duplicates_line_separates_the_sources_by_semicolons():
    """As docs/mixtures.md shows it: each source's counts hold a comma, so sources are set apart by ';'."""
    from leantrain.data.dedupe import Overlap

    found = Overlap(within={"reviews": 12, "notes": 0, "clean": 0}, across={"reviews": 0, "notes": 7, "clean": 0})
    assert found.notes(False, False) == [
        "exact duplicate training rows (reviews: 12 within, 0 across; notes: 0 within, 7 across); kept (--dedupe "
        "drops them)"
    ]
