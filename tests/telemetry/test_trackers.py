"""--report-to through Accelerate (issue #17), with the real backends offline: TensorBoard's event files, MLflow's
local file store read back through its API, W&B's offline run folder; --log tensorboard is the same tracker."""

from __future__ import annotations

import importlib.util
import json

import pytest

from leantrain import TrainConfig, train
from leantrain.errors import ConfigError
from leantrain.parallel.trackers import tracker_names

needs = {name: importlib.util.find_spec(name) is None for name in ("tensorboard", "mlflow", "wandb")}


def skip_without(name: str):
    return pytest.mark.skipif(needs[name], reason=f"{name} is not installed (optional extra)")


@pytest.fixture()
def job(tiny_model_dir, sentiment_csv, cache_dir, tmp_path):
    def make(**changes):
        base = dict(
            model=str(tiny_model_dir),
            data=str(sentiment_csv),
            output_dir=str(tmp_path / "run"),
            cache_dir=str(cache_dir),
            batch_size=16,
            max_steps=6,
            eval_every=3,
            log_every=2,
            lr=1e-3,
            progress=False,
            precision="fp32",
            report=False,
        )
        return TrainConfig(**{**base, **changes})

    return make


def logged(result) -> tuple[dict[int, float], dict[int, float]]:
    """metrics.jsonl's train loss and eval accuracy by step: what every tracker must hold."""
    rows = [json.loads(x) for x in (result.output_dir / "metrics.jsonl").read_text().splitlines()]
    loss = {r["step"]: r["loss"] for r in rows if "loss" in r}
    accuracy = {r["step"]: r["eval_accuracy"] for r in rows if "eval_accuracy" in r}
    return loss, accuracy


def test_tracker_names_take_the_old_spelling_and_refuse_unknown_ones():
    assert tracker_names("wandb, mlflow", "tensorboard") == ["wandb", "mlflow", "tensorboard"]
    assert tracker_names(None, "jsonl") == [] and tracker_names("none", "jsonl") == []
    with pytest.raises(ConfigError, match="--report-to: unknown tracker 'neptune'"):
        TrainConfig(report_to="tensorboard,neptune")


@skip_without("tensorboard")
@pytest.mark.parametrize("how", [dict(report_to="tensorboard"), dict(log="tensorboard")])
def test_tensorboard_event_files_hold_the_logged_rows(job, how):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    result = train(job(**how))
    events = EventAccumulator(str(result.output_dir / "trackers" / "leantrain"))
    events.Reload()
    loss, accuracy = logged(result)
    assert {e.step: pytest.approx(e.value) for e in events.Scalars("train/loss")} == loss
    assert {e.step: pytest.approx(e.value) for e in events.Scalars("eval/accuracy")} == accuracy
    assert {"throughput/samples_per_second", "train/lr"} <= set(events.Tags()["scalars"])
    assert sorted(loss) == [2, 4, 6] and sorted(accuracy) == [3, 6]  # logs every 2 steps; evaluations: 3, the end


@skip_without("mlflow")
def test_mlflow_local_store_read_back_through_its_api(job, monkeypatch):
    import mlflow
    from mlflow.tracking import MlflowClient

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    result = train(job(report_to="mlflow", lr=2e-3))
    folder = result.output_dir / "trackers"
    db = folder / "mlflow.db"  # SQLite with full mlflow; the file store with mlflow-skinny
    store = f"sqlite:///{db.resolve()}" if db.is_file() else (folder / "mlruns").resolve().as_uri()
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    client = MlflowClient(tracking_uri=store)
    (experiment,) = [e for e in client.search_experiments() if e.name == "leantrain"]
    (run,) = client.search_runs([experiment.experiment_id])
    loss, accuracy = logged(result)
    history = {m.step: m.value for m in client.get_metric_history(run.info.run_id, "train/loss")}
    assert history == pytest.approx(loss)
    assert {m.step: m.value for m in client.get_metric_history(run.info.run_id, "eval/accuracy")} == accuracy
    assert run.data.params["lr"] == "0.002" and run.info.status == "FINISHED"
    assert mlflow.active_run() is None  # the run was ended, not left open for the next one


@skip_without("mlflow")
def test_two_mlflow_runs_in_one_process_each_keep_their_own_store(job, tmp_path, monkeypatch):
    import os

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE", raising=False)
    for name in ("first", "second"):  # as a notebook trains one run after another
        result = train(job(report_to="mlflow", max_steps=2, output_dir=str(tmp_path / name)))
        assert {p.name for p in (result.output_dir / "trackers").iterdir()} & {"mlflow.db", "mlruns"}
        # MLflow's settings are the process's again: the next run, and the caller's own MLflow calls, pick theirs
        assert "MLFLOW_TRACKING_URI" not in os.environ and "MLFLOW_ALLOW_FILE_STORE" not in os.environ


@skip_without("wandb")
def test_wandb_offline_run_folder_holds_the_history(job, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    result = train(job(report_to="wandb"))
    runs = list((result.output_dir / "trackers" / "wandb").glob("offline-run-*"))
    assert len(runs) == 1
    (data,) = runs[0].glob("run-*.wandb")
    history = {int(row["_step"]): row["train/loss"] for row in wandb_history(data) if "train/loss" in row}
    loss, _ = logged(result)
    assert history == pytest.approx(loss)


def test_wandb_without_a_login_is_one_line(job, tmp_path):
    """W&B online without an API key raises its UsageError from `init_trackers` (a 40-line traceback, exit 1): one
    line saying how to log in or keep the run offline. In a process of its own: wandb keeps its settings per process
    (an offline run before it in this one would pass)."""
    import dataclasses
    import os
    import subprocess
    import sys

    from leantrain.config import to_flags

    cfg = dataclasses.asdict(job(report_to="wandb"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")}
    env.update(WANDB_MODE="online", WANDB_SILENT="true", NETRC=str(tmp_path / "none"), HF_HUB_OFFLINE="1")
    env.update(WANDB_CONFIG_DIR=str(tmp_path / "wandb-config"))
    flags = to_flags({k: v for k, v in cfg.items() if v != getattr(TrainConfig(), k)})
    done = subprocess.run([sys.executable, "-m", "leantrain", "train", *flags], capture_output=True, text=True, env=env)
    errors = [line for line in done.stderr.splitlines() if "error" in line.lower()]
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert len(errors) == 1 and "(run `wandb login` or set WANDB_API_KEY" in errors[0], errors


def test_a_tracker_that_is_not_installed_is_refused_before_any_work(job, monkeypatch):
    import accelerate.tracking

    monkeypatch.setattr(accelerate.tracking, "get_available_trackers", lambda: [])
    with pytest.raises(ConfigError, match="--report-to mlflow needs the mlflow package: pip install"):
        train(job(report_to="mlflow"))


def wandb_history(path) -> list[dict]:
    """The history rows of an offline W&B run file: LevelDB-style log records (a 7-byte file header, 32 KiB
    blocks, each record a 7-byte header of checksum, length and type: full, first, middle, last) holding
    wandb's protobuf `Record`s. wandb 0.31 reads these files in its Go core only, so the test reads them here."""
    import struct

    from wandb.proto import wandb_internal_pb2

    data, block, pos = path.read_bytes(), 32768, 7
    assert data[:4] == b":W&B"
    records, partial = [], b""
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:  # a block's tail too short for a header is padding
            pos += left
            continue
        _, size, kind = struct.unpack("<IHB", data[pos : pos + 7])
        chunk, pos = data[pos + 7 : pos + 7 + size], pos + 7 + size
        if kind in (1, 2):
            partial = chunk
        elif kind in (3, 4):
            partial += chunk
        if kind in (1, 4):
            records.append(partial)
    rows = []
    for raw in records:
        record = wandb_internal_pb2.Record()
        record.ParseFromString(raw)
        if record.WhichOneof("record_type") == "history":
            rows.append({i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in record.history.item})
    return rows
