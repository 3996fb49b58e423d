"""Token classification's scores and predicted entities.

Scores: entity-level precision, recall and F1 as `seqeval` computes them in strict IOB2 mode (an entity counts when
its type and both ends are right; an I- that continues nothing opens no entity), micro-averaged and per entity type,
and token accuracy, over every word of every evaluation sentence (a word the tokenizer gives no token is predicted O).
Tags without a scheme (part of speech) are scored per tag instead: macro precision, recall and F1 over the tags.

Entities: transformers' `TokenClassificationPipeline` rules. "simple": each token's most probable tag; "first",
"average", "max": each word's tag from its first token's probabilities, their mean, or its most confident token's;
then adjacent tokens (words) of one type form an entity unless the later one is B-, its score the mean of theirs.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from leantrain.data.tags import AGGREGATIONS

__all__ = ["AGGREGATIONS", "entity_report", "entity_scores", "group", "pieces"]


def entity_scores(gold: list[list[str]], predicted: list[list[str]], scheme: str) -> dict[str, float]:
    """f1, precision, recall (entities, micro; tags: macro), accuracy and each entity type's f1 (`f1_TYPE`)."""
    words = sum(len(seq) for seq in gold)
    right = sum(g == p for gs, ps in zip(gold, predicted) for g, p in zip(gs, ps))
    out = {"accuracy": right / words if words else 0.0}  # seqeval's accuracy_score: every word's tag
    if scheme == "none":
        return {**_tag_scores(gold, predicted), **out}
    report = entity_report(gold, predicted)
    micro = report.pop("micro avg")
    out = {"f1": micro["f1-score"], "precision": micro["precision"], "recall": micro["recall"], **out}
    out.update({f"f1_{kind}": row["f1-score"] for kind, row in report.items()})
    return {k: float(v) for k, v in out.items()}


def entity_report(gold: list[list[str]], predicted: list[list[str]]) -> dict[str, dict[str, float]]:
    """seqeval's `classification_report(mode="strict", scheme=IOB2, zero_division=0)`: per type and 'micro avg',
    each precision, recall, f1-score and support. The entities are read by seqeval's own `Entities`; the counting is
    its arithmetic, done here because `seqeval.metrics` imports scikit-learn and SciPy (half a second of every run)
    for none of it."""
    from seqeval.scheme import IOB2, Entities

    true, found = Entities(gold, IOB2), Entities(predicted, IOB2)
    counts: dict[str, tuple[int, int, int]] = {}  # type: (right, predicted, true)
    for kind in sorted(true.unique_tags | found.unique_tags):
        t, p = true.filter(kind), found.filter(kind)
        counts[kind] = (len(t & p), len(p), len(t))
    report = {kind: _scores(*c) for kind, c in counts.items()}
    right, predicted_n, true_n = (sum(c[i] for c in counts.values()) for i in range(3))
    report["micro avg"] = _scores(right, predicted_n, true_n)
    return report


def _scores(right: int, predicted: int, true: int) -> dict[str, float]:
    """Precision, recall and F1 as seqeval divides them (0 where a count is 0), and the support."""
    precision = right / predicted if predicted else 0.0
    recall = right / true if true else 0.0
    f1 = 2.0 * precision * recall / (precision + recall) if precision + recall else 0.0
    return {"precision": precision, "recall": recall, "f1-score": f1, "support": true}


def _tag_scores(gold: list[list[str]], predicted: list[list[str]]) -> dict[str, float]:
    """Macro precision, recall and F1 over the tags that occur in `gold` or `predicted` (scikit-learn's macro)."""
    y = [t for seq in gold for t in seq]
    p = [t for seq in predicted for t in seq]
    names = sorted(set(y) | set(p))
    index = {n: i for i, n in enumerate(names)}
    k = len(names)
    counts = np.bincount(
        np.array([index[a] * k + index[b] for a, b in zip(y, p)], dtype=np.int64), minlength=k * k
    ).reshape(k, k)
    tp, predicted_n, true_n = np.diag(counts), counts.sum(0), counts.sum(1)
    with np.errstate(divide="ignore", invalid="ignore"):
        precision = np.where(predicted_n > 0, tp / np.maximum(predicted_n, 1), 0.0)
        recall = np.where(true_n > 0, tp / np.maximum(true_n, 1), 0.0)
        f1 = np.where(true_n + predicted_n > 0, 2 * tp / np.maximum(true_n + predicted_n, 1), 0.0)
    return {"f1": float(f1.mean()), "precision": float(precision.mean()), "recall": float(recall.mean())}


# -- entities of one sentence, as the pipeline groups them -----------------------------------------------------------


def split_tag(name: str) -> tuple[str, str]:
    """("B", "PER") for B-PER, ("I", "PER") for I-PER, else ("I", name): the pipeline's `get_tag`."""
    if name.startswith(("B-", "I-")):
        return name[0], name[2:]
    return "I", name


def pieces(
    probs: np.ndarray, token_words: np.ndarray, token_chars: np.ndarray, names: Sequence[str], aggregation: str
) -> list[dict[str, Any]]:
    """The units the pipeline groups: each token ("simple") or each word (the others), with its tag, score and
    character span."""
    if aggregation == "simple":
        best = probs.argmax(-1)
        return [
            {
                "entity": names[b],
                "score": float(probs[t, b]),
                "start": int(token_chars[t, 0]),
                "end": int(token_chars[t, 1]),
            }
            for t, b in enumerate(best)
        ]
    out = []
    bounds = np.flatnonzero(np.diff(token_words)) + 1
    for group in np.split(np.arange(len(token_words)), bounds):
        if not len(group):
            continue
        if aggregation == "first":
            scores = probs[group[0]]
        elif aggregation == "max":
            scores = probs[group[probs[group].max(-1).argmax()]]
        else:
            scores = np.nanmean(probs[group], axis=0)
        best = int(scores.argmax())
        start, end = int(token_chars[group[0], 0]), int(token_chars[group[-1], 1])
        out.append({"entity": names[best], "score": float(scores[best]), "start": start, "end": end})
    return out


def group(units: list[dict[str, Any]], text: str) -> list[dict[str, Any]]:
    """Adjacent units of one type joined (a B- starts anew), O dropped: the pipeline's `group_entities`."""
    groups: list[list[dict[str, Any]]] = []
    for unit in units:
        bi, kind = split_tag(unit["entity"])
        if groups and bi != "B" and split_tag(groups[-1][-1]["entity"])[1] == kind:
            groups[-1].append(unit)
        else:
            groups.append([unit])
    out = []
    for members in groups:
        kind = split_tag(members[0]["entity"])[1]
        if kind == "O":
            continue
        start, end = members[0]["start"], members[-1]["end"]
        score = float(np.mean([m["score"] for m in members]))
        out.append({"entity_group": kind, "score": score, "word": text[start:end], "start": start, "end": end})
    return out
