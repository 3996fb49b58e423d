"""Tag schemes of token labels: IOB1, IOB2 (BIO) and BIOES, told apart, decoded into entity spans, repaired and
converted; tags without a scheme (part-of-speech tags) pass through.

A tag is "O" or a prefix, "-" and an entity type: "B-PER" (begin), "I-PER" (inside), "E-PER" (end), "S-PER"
(single). The schemes differ in how an entity starts:

- IOB2 (BIO): every entity starts with B-, continues with I-;
- IOB1: an entity starts with I-, and with B- only right after another entity of the same type (CoNLL-2003's files);
- BIOES: B- and E- open and close an entity of several tokens, S- is an entity of one; I- is inside.

Decoding (`spans`) reads a sequence as its scheme means it and counts each tag the scheme does not allow where it
stands (an I- that continues nothing in IOB2, a B- that no E- closes in BIOES): those are repaired as the CoNLL
evaluation script reads them (an I- or E- that continues nothing starts an entity; an entity left open ends at its
last tag), so a run trains on what the annotator most likely meant and says how many tags it repaired, never on an
invalid sequence. Encoding (`encode`) writes spans in any scheme; `convert` is the two, which is how leantrain turns
every input into IOB2, the scheme of the model it publishes (transformers' `pipeline("token-classification")` groups
B-/I- tags, and no other).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

#: the schemes `--tag-scheme` names; "none": tags that are not entities (part of speech), scored per token
SCHEMES = ("iob1", "iob2", "bioes", "none")
#: other spellings `--tag-scheme` accepts
SCHEME_ALIASES = {"bio": "iob2", "iobes": "bioes", "bilou": "bioes", "plain": "none"}
#: how predicted tags become entities, as transformers' `pipeline(aggregation_strategy=...)` names the ways
#: (tasks/entities.py)
AGGREGATIONS = ("simple", "first", "average", "max")
#: the tag outside every entity
OUTSIDE = "O"

_TAG = re.compile(r"([BIES])-(.+)")


@dataclass(frozen=True)
class Span:
    """An entity: its type and the half-open range of positions [start, end) it covers."""

    type: str
    start: int
    end: int


def parse(tag: str) -> tuple[str, str | None]:
    """("B", "PER") for "B-PER"; ("O", None) for "O"; ("", tag) for a tag without a prefix."""
    if tag == OUTSIDE:
        return OUTSIDE, None
    match = _TAG.fullmatch(tag)
    return (match.group(1), match.group(2)) if match else ("", tag)


def canonical_scheme(name: str) -> str:
    """A `--tag-scheme` spelling as one of SCHEMES (unknown names are returned as given, for the caller to refuse)."""
    lowered = name.strip().lower()
    return SCHEME_ALIASES.get(lowered, lowered)


def detect(sequences: Iterable[Sequence[str]]) -> str:
    """The scheme the sequences are written in: bioes when any tag starts E- or S-; iob1 when entities start with I-
    and B- appears only right after an entity of the same type; iob2 when B- starts entities; none when no tag has
    a prefix (every tag that is not "O" then stands for itself). Raises ValueError naming a tag that mixes styles
    (some tags prefixed, others not)."""
    prefixes: set[str] = set()
    bare: set[str] = set()
    prefixed: set[str] = set()
    b_opens, i_opens = False, False
    for seq in sequences:
        prev_prefix, prev_type = OUTSIDE, None
        for tag in seq:
            prefix, kind = parse(tag)
            if prefix == "":
                bare.add(tag)
            elif prefix != OUTSIDE:
                prefixes.add(prefix)
                prefixed.add(tag)
                continues = prev_prefix in ("B", "I") and prev_type == kind
                if prefix == "B" and not continues:
                    b_opens = True
                if prefix == "I" and not continues:
                    i_opens = True
            prev_prefix, prev_type = prefix, kind
    if bare and prefixed:
        raise ValueError(
            f"tag {sorted(bare)[0]!r} has no B-/I-/E-/S- prefix while {sorted(prefixed)[0]!r} has one: write "
            "every entity tag with a prefix (or none)"
        )
    if not prefixes:
        return "none"
    if prefixes & {"E", "S"}:
        return "bioes"
    return "iob1" if i_opens and not b_opens else "iob2"


def spans(tags: Sequence[str], scheme: str) -> tuple[list[Span], int]:
    """The entities of a sequence read in `scheme`, and how many of its tags that scheme does not allow where they
    stand (each repaired as the module docstring says)."""
    if scheme == "none":
        return [], 0
    found: list[Span] = []
    invalid = 0
    open_type: str | None = None  # the type of the entity the previous tag left open
    start = 0
    for i, tag in enumerate(tags):
        prefix, kind = parse(tag)
        if prefix == "":
            raise ValueError(f"tag {tag!r} has no B-/I-/E-/S- prefix; it cannot be read as {scheme.upper()}")
        opens, closes, bad = _step(scheme, prefix, kind, open_type)
        invalid += bad
        if opens and open_type is not None:  # a new entity ends the open one at the previous tag
            found.append(Span(open_type, start, i))
        if opens:
            open_type, start = kind, i
        elif prefix == OUTSIDE and open_type is not None:
            found.append(Span(open_type, start, i))
            open_type = None
        if closes and open_type is not None:
            found.append(Span(open_type, start, i + 1))
            open_type = None
    if open_type is not None:
        if scheme == "bioes":
            invalid += 1  # a B- or I- that no E- closed
        found.append(Span(open_type, start, len(tags)))
    return found, invalid


def _step(scheme: str, prefix: str, kind: str | None, open_type: str | None) -> tuple[bool, bool, int]:
    """For one tag after an entity of `open_type` (None: none open): whether it opens an entity, whether it closes
    the one it is in after itself, and whether the scheme forbids it there (0 or 1)."""
    same = open_type is not None and open_type == kind
    if prefix == OUTSIDE:
        return False, False, int(scheme == "bioes" and open_type is not None)  # BIOES ends an entity with E- or S-
    if scheme == "iob2":
        if prefix == "B":
            return True, False, 0
        if prefix == "I":
            return not same, False, int(not same)
    elif scheme == "iob1":
        if prefix == "I":
            return not same, False, 0
        if prefix == "B":
            return True, False, int(open_type != kind)  # B- only separates two entities of one type
    else:  # bioes
        left_open = int(open_type is not None)
        if prefix == "B":
            return True, False, left_open
        if prefix == "S":
            return True, True, left_open
        if prefix == "I":
            return not same, False, int(not same)
        if prefix == "E":
            return not same, True, int(not same)
    return True, False, 1  # E- or S- outside BIOES: an entity starts here


def encode(found: Iterable[Span], length: int, scheme: str) -> list[str]:
    """Tags of a sequence of `length` positions holding the (non-overlapping) entities `found`, in `scheme`."""
    tags = [OUTSIDE] * length
    last_end, last_type = -1, None
    for span in sorted(found, key=lambda s: s.start):
        n = span.end - span.start
        inside = ["I-" + span.type] * n
        if scheme == "iob2":
            inside[0] = "B-" + span.type
        elif scheme == "iob1":
            if last_end == span.start and last_type == span.type:
                inside[0] = "B-" + span.type
        elif scheme == "bioes":
            if n == 1:
                inside[0] = "S-" + span.type
            else:
                inside[0], inside[-1] = "B-" + span.type, "E-" + span.type
        tags[span.start : span.end] = inside
        last_end, last_type = span.end, span.type
    return tags


def convert(tags: Sequence[str], source: str, target: str) -> tuple[list[str], int]:
    """`tags` read in `source` and written in `target`, and the number of tags repaired on the way."""
    if source == "none":
        return list(tags), 0
    found, invalid = spans(tags, source)
    return encode(found, len(tags), target), invalid


def iob2_label_names(types: Iterable[str]) -> list[str]:
    """The IOB2 tag set of these entity types, "O" first, then B- and I- of each type in sorted order."""
    names = [OUTSIDE]
    for kind in sorted(set(types)):
        names += ["B-" + kind, "I-" + kind]
    return names
