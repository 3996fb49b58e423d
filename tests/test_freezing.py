"""--freeze: what it names keeps its pretrained values (no gradient, no optimizer state) and the rest trains; a name
that matches nothing, or everything, is refused in one line; the default job freezes its word embeddings."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForSequenceClassification

from leantrain import TrainConfig, train
from leantrain.commands.cli import main
from leantrain.errors import ConfigError
from leantrain.model import freezing


def test_embeddings_and_globs_name_what_freezes(tiny_model_dir):
    model = AutoModelForSequenceClassification.from_pretrained(tiny_model_dir, num_labels=2)
    said = freezing.apply(model, "embeddings, bert.encoder.layer.0.*")
    frozen = {n for n, p in model.named_parameters() if not p.requires_grad}
    layer0 = {n for n, _ in model.named_parameters() if n.startswith("bert.encoder.layer.0.")}
    assert frozen == {"bert.embeddings.word_embeddings.weight"} | layer0 and len(layer0) > 4
    assert said is not None and f"{1 + len(layer0)} tensors" in said
    assert freezing.apply(model, "none") is None and freezing.apply(model, None) is None


@pytest.mark.parametrize(
    ("spec", "words"),
    [
        ("bert.decoder.*", ["--freeze bert.decoder.*", "no parameter", "embeddings or a glob"]),
        ("*", ["every", "nothing would train"]),
    ],
)
def test_a_name_that_matches_nothing_or_everything_is_refused(tiny_model_dir, spec, words):
    model = AutoModelForSequenceClassification.from_pretrained(tiny_model_dir, num_labels=2)
    with pytest.raises(ConfigError) as refused:
        freezing.apply(model, spec)
    assert all(w in str(refused.value) for w in words), refused.value
    assert all(p.requires_grad for p in model.parameters())  # nothing half-done


def test_frozen_weights_keep_their_values_while_the_rest_trains(tiny_model_dir, sentiment_csv, tmp_path):
    cfg = TrainConfig(
        model=str(tiny_model_dir), data=str(sentiment_csv), cache_dir=str(tmp_path / "cache"), batch_size=8,
        max_steps=3, lr=1e-2, precision="fp32", progress=False, report=False, output_dir=str(tmp_path / "run"),
        freeze="embeddings",
    )  # fmt: skip
    result = train(cfg)
    start = {f"bert.{k}": v for k, v in load_file(tiny_model_dir / "model.safetensors").items()}  # a BertModel's
    trained = load_file(result.output_dir / "model" / "model.safetensors")
    name = "bert.embeddings.word_embeddings.weight"
    assert torch.equal(trained[name], start[name])
    moved = [k for k in trained if k in start and k != name and not torch.equal(trained[k], start[k])]
    assert any("encoder.layer" in k for k in moved), moved


def test_freeze_refused_in_one_line_from_the_command_line(capsys, tiny_model_dir, sentiment_csv, tmp_path):
    argv = [
        "train", "--model", str(tiny_model_dir), "--data", str(sentiment_csv), "--output-dir", str(tmp_path / "run"),
        "--cache-dir", str(tmp_path / "cache"), "--no-progress", "--max-steps", "1",
    ]  # fmt: skip
    for extra, words in (
        (["--freeze", "encoder.nothing"], "--freeze encoder.nothing: no parameter"),
        (["--freeze", "embeddings", "--lora"], "--freeze with --lora"),
    ):
        assert main([*argv, *extra]) == 2
        err = capsys.readouterr().err
        lines = [line for line in err.strip().splitlines() if "error" in line or "Traceback" in line]
        assert len(lines) == 1 and words in lines[0] and "Traceback" not in err, err
    assert not (tmp_path / "run" / "model").exists()


def test_the_default_job_freezes_its_word_embeddings_and_your_data_nothing():
    assert TrainConfig(limit=9).resolved().freeze == "embeddings"
    assert TrainConfig(limit=9, freeze="none").resolved().freeze == "none"  # asked: kept
    assert TrainConfig(data="mine.csv").resolved().freeze == "none"
    assert TrainConfig(limit=9, lora=True).resolved().freeze == "none"  # LoRA freezes the base itself


def test_a_checkpoint_from_before_freeze_was_recorded_resumes_only_with_nothing_frozen(tmp_path):
    """An older checkpoint's config has no freeze: its run froze nothing, so resuming it with the default job's
    frozen embeddings is refused by name (its optimizer holds their state), and with nothing frozen it goes on."""
    from leantrain.run.checkpoint import Checkpoint, CheckpointError

    older = Checkpoint(tmp_path, {"config": {"lr": 1e-4}, "facts": {}})
    with pytest.raises(CheckpointError, match=r"freeze differs \('none' in the checkpoint, 'embeddings' now\)"):
        older.check_matches({"lr": 1e-4, "freeze": "embeddings"}, {})
    older.check_matches({"lr": 1e-4, "freeze": "none"}, {})


def test_frozen_matmul_weights_are_kept_in_bf16_in_a_bf16_run_and_published_in_fp32(
    tiny_model_dir, sentiment_csv, tmp_path, monkeypatch
):
    """A frozen Linear's weights are kept in bf16, as autocast computes with them (the same losses as kept in fp32);
    the planner counts them so; model/ holds them in fp32. Norms and embeddings stay fp32."""
    from leantrain.planner import memory as M

    def run(name):
        cfg = TrainConfig(
            model=str(tiny_model_dir), data=str(sentiment_csv), cache_dir=str(tmp_path / "cache"), batch_size=8,
            max_steps=3, lr=1e-2, precision="bf16", progress=False, report=False, output_dir=str(tmp_path / name),
            freeze="bert.encoder.layer.0.*", log_every=1,
        )  # fmt: skip
        result = train(cfg)
        rows = [json.loads(r) for r in (result.output_dir / "metrics.jsonl").read_text().splitlines()]
        losses = [(r["loss"], r["grad_norm"]) for r in rows if "loss" in r]
        return losses, load_file(result.output_dir / "model" / "model.safetensors")

    model = AutoModelForSequenceClassification.from_pretrained(tiny_model_dir, num_labels=2)
    freezing.apply(model, "bert.encoder.layer.0.*")
    said = freezing.store_frozen(model, torch.bfloat16)
    kept = {n for n, p in model.named_parameters() if p.dtype == torch.bfloat16}
    assert (
        said is not None and kept and all(n.startswith("bert.encoder.layer.0.") and "LayerNorm" not in n for n in kept)
    )
    facts = M.model_facts(str(tiny_model_dir))
    planned = M.estimate(facts, 4, 16, "bf16", False, "adamw", freeze="bert.encoder.layer.0.*").weights
    held = sum(t.numel() * t.element_size() for t in [*model.parameters(), *model.buffers()])
    assert planned == pytest.approx(held, rel=1e-4)  # (the frozen layer is 0.8% of them)

    losses, published = run("low")
    monkeypatch.setattr(freezing, "store_frozen", lambda model, dtype: None)
    assert losses == run("fp32")[0]
    start = {f"bert.{k}": v for k, v in load_file(tiny_model_dir / "model.safetensors").items()}
    assert {v.dtype for v in published.values() if v.is_floating_point()} == {torch.float32}
    assert all(torch.equal(published[n], start[n].to(torch.bfloat16).float()) for n in kept)
