"""Tag schemes (data/tags.py): IOB1, IOB2 and BIOES round trips, detection, repairs, and agreement with seqeval."""

from __future__ import annotations

import itertools
import random

import pytest
from seqeval.metrics.sequence_labeling import get_entities
from seqeval.scheme import IOB1, IOB2, IOBES, Entities

from leantrain.data import tags as T

SEQEVAL = {"iob1": IOB1, "iob2": IOB2, "bioes": IOBES}
TYPES = ("PER", "LOC", "ORG")


def random_spans(rng: random.Random, length: int) -> list[T.Span]:
    """Non-overlapping entities, adjacent ones of one type included (IOB1 writes B- only there)."""
    out, i = [], 0
    while i < length:
        if rng.random() < 0.45:
            n = rng.randint(1, min(4, length - i))
            out.append(T.Span(rng.choice(TYPES[:2]), i, i + n))  # two types: adjacent same-type pairs are common
            i += n
        else:
            i += rng.randint(1, 2)
    return out


def test_every_scheme_round_trips_and_converts_to_every_other():
    rng = random.Random(0)
    adjacent_same_type = 0
    for _ in range(400):
        length = rng.randint(1, 14)
        spans = random_spans(rng, length)
        adjacent_same_type += any(a.end == b.start and a.type == b.type for a, b in itertools.pairwise(spans))
        for scheme in ("iob1", "iob2", "bioes"):
            tags = T.encode(spans, length, scheme)
            assert T.spans(tags, scheme) == (spans, 0), (scheme, tags)
            for target in ("iob1", "iob2", "bioes"):
                assert T.convert(tags, scheme, target) == (T.encode(spans, length, target), 0)
    assert adjacent_same_type > 40  # the case that tells IOB1 from IOB2


def test_valid_sequences_decode_as_seqeval_strict_mode_does():
    rng = random.Random(1)
    for _ in range(300):
        length = rng.randint(1, 12)
        spans = random_spans(rng, length)
        for scheme, seqeval_scheme in SEQEVAL.items():
            tags = T.encode(spans, length, scheme)
            theirs = [(e.tag, e.start, e.end) for e in Entities([tags], seqeval_scheme).entities[0]]
            assert [(s.type, s.start, s.end) for s in T.spans(tags, scheme)[0]] == theirs, (scheme, tags)


def test_invalid_iob2_is_repaired_as_the_conll_script_reads_it_and_counted():
    """conlleval (seqeval's default mode) opens an entity at an I- that continues nothing: so does the repair."""
    rng = random.Random(2)
    tags_of = ["O", "B-PER", "I-PER", "B-LOC", "I-LOC"]
    repaired = 0
    for _ in range(500):
        tags = [rng.choice(tags_of) for _ in range(rng.randint(1, 10))]
        found, invalid = T.spans(tags, "iob2")
        assert [(s.type, s.start, s.end - 1) for s in found] == get_entities(tags), tags
        starts_inside = sum(
            t.startswith("I-") and (i == 0 or tags[i - 1][2:] != t[2:] or tags[i - 1] == "O")
            for i, t in enumerate(tags)
        )
        assert invalid == starts_inside
        repaired += invalid
    assert repaired > 100


@pytest.mark.parametrize(
    "scheme,tags,expected,invalid",
    [
        ("iob2", ["I-PER", "I-PER", "O"], [("PER", 0, 2)], 1),  # I- without B-
        ("iob2", ["B-PER", "I-LOC"], [("PER", 0, 1), ("LOC", 1, 2)], 1),  # nested types
        ("iob2", ["B-PER", "B-PER"], [("PER", 0, 1), ("PER", 1, 2)], 0),  # adjacent entities
        ("iob1", ["I-PER", "B-PER", "O", "B-LOC"], [("PER", 0, 1), ("PER", 1, 2), ("LOC", 3, 4)], 1),  # B- after O
        ("bioes", ["B-PER", "O"], [("PER", 0, 1)], 1),  # B- never closed: ended before the O
        ("bioes", ["B-PER", "I-PER"], [("PER", 0, 2)], 1),  # open at the end
        ("bioes", ["E-PER"], [("PER", 0, 1)], 1),  # E- alone: an entity of one
        ("bioes", ["B-PER", "S-LOC"], [("PER", 0, 1), ("LOC", 1, 2)], 1),
        ("bioes", ["B-PER", "I-PER", "E-PER", "S-PER"], [("PER", 0, 3), ("PER", 3, 4)], 0),
    ],
)
def test_each_kind_of_invalid_tag_is_repaired_and_counted(scheme, tags, expected, invalid):
    found, bad = T.spans(tags, scheme)
    assert [(s.type, s.start, s.end) for s in found] == expected
    assert bad == invalid


def test_repaired_tags_convert_to_valid_iob2():
    converted, invalid = T.convert(["I-PER", "I-PER", "O", "I-LOC", "B-LOC", "I-ORG"], "iob2", "iob2")
    assert converted == ["B-PER", "I-PER", "O", "B-LOC", "B-LOC", "B-ORG"] and invalid == 3
    assert T.spans(converted, "iob2")[1] == 0


@pytest.mark.parametrize(
    "sequences,scheme",
    [
        ([["B-PER", "I-PER", "O", "B-LOC"]], "iob2"),
        ([["I-PER", "I-PER", "O", "I-LOC"], ["I-PER", "B-PER"]], "iob1"),  # B- only between same-type entities
        ([["I-PER", "O"], ["B-PER", "O"]], "iob2"),  # an IOB2 file with an I- to repair
        ([["S-PER", "O", "B-LOC", "E-LOC"]], "bioes"),
        ([["NN", "VBZ", "DT"], ["O", "NN"]], "none"),
    ],
)
def test_the_scheme_is_detected(sequences, scheme):
    assert T.detect(sequences) == scheme


def test_tags_that_mix_prefixed_and_bare_entity_tags_are_refused():
    with pytest.raises(ValueError, match="'PER' has no B-/I-/E-/S- prefix"):
        T.detect([["B-LOC", "PER", "O"]])


def test_scheme_names_and_the_iob2_label_set():
    assert [T.canonical_scheme(n) for n in ("BIO", "IOBES", "iob1", "plain")] == ["iob2", "bioes", "iob1", "none"]
    assert T.iob2_label_names(["PER", "LOC", "PER"]) == ["O", "B-LOC", "I-LOC", "B-PER", "I-PER"]
