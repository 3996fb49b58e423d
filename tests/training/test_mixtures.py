"""Training on a mixture: each source scored on its own rows, labels merged into one head, duplicates and
contamination counted and dropped (docs/mixtures.md). The exact equivalences are in test_equivalence.py (accumulation),
tests/parallel/test_data_parallel.py (two processes) and tests/test_checkpoint.py (resume)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from leantrain import TrainConfig, train
from leantrain.errors import DataError
from leantrain.inference import evaluate
from leantrain.model import loading
from leantrain.tasks.text_classification import TextClassification
from tests.conftest import EXACT_JOB, make_sentiment_rows, write_csv


@pytest.fixture()
def job(tiny_model_dir, tmp_path):
    def make(data, **changes) -> TrainConfig:
        base = dict(
            model=str(tiny_model_dir),
            data=data,
            cache_dir=str(tmp_path / "cache"),
            output_dir=str(tmp_path / "run"),
            report=False,
            batch_size=16,
            max_steps=6,
            **{**EXACT_JOB, "lr": 0.2},
        )
        return TrainConfig(**{**base, **changes})

    return make


def prepared(cfg: TrainConfig):
    """The task's data for `cfg`, as a run prepares it."""
    cfg = cfg.resolved()
    return TextClassification(cfg).prepare_data(cfg.model, loading.load_config(cfg.model))


def test_each_source_is_scored_on_its_own_rows_as_evaluate_scores_them(job, tmp_path):
    sources = []
    for name, seed, n in (("reviews", 1, 160), ("notes", 2, 50)):
        train_file = write_csv(tmp_path / f"{name}.csv", make_sentiment_rows(n, seed=seed))
        dev = write_csv(tmp_path / f"{name}-dev.csv", make_sentiment_rows(n // 4, seed=seed + 10))
        sources.append({"path": str(train_file), "weight": 0.5, "eval_data": str(dev)})
    result = train(job(sources, eval_every=3, report=True))
    metrics = json.loads((result.output_dir / "metrics.json").read_text())
    for source in sources:
        name = Path(source["path"]).stem
        alone = evaluate(str(result.model_dir), source["eval_data"])
        mine = metrics["sources"][name]
        assert mine["eval_rows"] == alone["examples"]
        for key in ("accuracy", "macro_f1", "loss"):
            assert mine[f"eval_{key}"] == pytest.approx(alone[key], abs=1e-5), (name, key)
    # `leantrain evaluate RUN` rescores the run's own held-out rows: each source as the run reported it
    again = evaluate(str(result.output_dir))
    assert again["loss"] == pytest.approx(metrics["eval_loss"], abs=1e-5)
    for name, mine in metrics["sources"].items():
        assert again["sources"][name]["accuracy"] == pytest.approx(mine["eval_accuracy"], abs=1e-6)
        assert again["sources"][name]["loss"] == pytest.approx(mine["eval_loss"], abs=1e-5)
    # the pooled figures are every evaluation row's; the log has each source's evaluation at every one
    assert metrics["sources"]["reviews"]["eval_loss"] != metrics["sources"]["notes"]["eval_loss"]
    rows = [json.loads(line) for line in (result.output_dir / "metrics.jsonl").read_text().splitlines()]
    evals = [r for r in rows if "eval_loss" in r]
    assert [r["step"] for r in evals] == [3, 6] and all(set(r["sources"]) == {"reviews", "notes"} for r in evals)
    assert all(r["sources"]["notes"]["loss"] is not None for r in rows if "loss" in r)  # per-source training loss
    page = (result.output_dir / "report.html").read_text()
    assert "data-plot='sources'" in page and "Sources of the mixture" in page
    card = (result.model_dir / "README.md").read_text()
    assert "a mixture of 2 sources" in card and "| `reviews` |" in card and "| `notes` |" in card


def test_labels_merge_into_one_head_and_two_id_maps_that_clash_are_refused(job, tmp_path):
    two = write_csv(tmp_path / "two.csv", make_sentiment_rows(60, seed=3))
    # a third class that only this source has, and a source of one class: both fine in a mixture
    three = write_csv(tmp_path / "three.csv", make_sentiment_rows(40, seed=4) + [("so-so film", "meh")] * 12)
    only = write_csv(tmp_path / "only.csv", [(t, "pos") for t, _ in make_sentiment_rows(30, seed=5)])
    data = prepared(job([str(two), str(three), str(only)]))
    assert data.label_names == ["meh", "neg", "pos"]
    spans = {s.name: s for s in data.eval.spans}
    held = data.eval.labels[spans["only"].start : spans["only"].stop]
    assert set(held.tolist()) == {2}  # 'pos' is id 2 in the head, whatever it was in its own source
    # explicit id maps: the label column holds 0 and 1, which mean other things in each source
    ids_a = write_csv(tmp_path / "ids_a.csv", [(t, "1" if y == "pos" else "0") for t, y in make_sentiment_rows(40)])
    ids_b = write_csv(tmp_path / "ids_b.csv", [(t, "0" if y == "pos" else "1") for t, y in make_sentiment_rows(40, 1)])
    agreed = [{"path": str(ids_a), "labels": ["neg", "pos"]}, {"path": str(ids_b), "labels": ["pos", "neg"]}]
    with pytest.raises(DataError, match=r"label id 0 is 'neg' in ids_a but 'pos' in ids_b") as clash:
        prepared(job(agreed))
    assert "\n" not in str(clash.value)
    renamed = [{"path": str(ids_a), "labels": ["neg", "pos"]}, {"path": str(three)}]
    data = prepared(job(renamed))
    assert data.label_names == ["neg", "pos", "meh"]  # the explicit map's ids first, the rest after


def test_duplicates_and_contamination_are_counted_and_dropped_when_asked(job, tmp_path):
    rows = make_sentiment_rows(80, seed=6)
    texts = {t for t, _ in rows}
    # 5 rows repeated within (in other case and spacing), 7 of the first source's rows in the second
    a_rows = rows + [(f"  {t.upper()}  ", y) for t, y in rows[:5]]
    b_rows = make_sentiment_rows(40, seed=7) + rows[10:17]
    b_rows = [(t, y) for t, y in b_rows if t not in texts or (t, y) in rows[10:17]]
    a = write_csv(tmp_path / "a.csv", a_rows)
    b = write_csv(tmp_path / "b.csv", b_rows)
    # evaluation rows: 3 of a's training rows, 2 of b's own, and 10 new ones
    dev_a = write_csv(tmp_path / "dev_a.csv", rows[20:23] + make_sentiment_rows(10, seed=8))
    dev_b = write_csv(tmp_path / "dev_b.csv", make_sentiment_rows(40, seed=7)[:2])
    sources = [{"path": str(a), "eval_data": str(dev_a)}, {"path": str(b), "eval_data": str(dev_b)}]
    counted = prepared(job(sources))
    facts = counted.sources
    assert facts["a"]["duplicate_train_rows"] == 5 and facts["b"]["duplicate_train_rows"] == 7
    assert facts["a"]["contaminated_eval_rows"] == 3 and facts["b"]["contaminated_eval_rows"] == 2
    assert any("contamination: 5 evaluation rows also occur in training" in n for n in counted.notes)
    assert any("3 of a in a" in n and "2 of b in b" in n for n in counted.notes)
    assert [facts[n]["train_rows"] for n in "ab"] == [85, len(b_rows)]
    deduped = prepared(job(sources, dedupe=True)).sources
    assert [deduped[n]["train_rows"] for n in "ab"] == [80, len(b_rows) - 7]
    clean = prepared(job(sources, decontaminate=True)).sources
    assert [clean[n]["train_rows"] for n in "ab"] == [85 - 3, len(b_rows) - 2]
    both = prepared(job(sources, dedupe=True, decontaminate=True)).sources
    assert [both[n]["train_rows"] for n in "ab"] == [80 - 3, len(b_rows) - 7 - 2]
