"""A workload defined only here trains through `leantrain.train`: counting a word (regression), with its own
data, model head, collator, loss and metrics, and no change to the package; then `leantrain evaluate` and
`leantrain predict`, in another process, score and predict with it (the run records where the task lives)."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pytest
import torch

from leantrain import TrainConfig, train
from leantrain.tasks import Task, TaskData

REPO = Path(__file__).resolve().parents[2]


def counting_rows(n: int, seed: int) -> tuple[list[str], np.ndarray]:
    rng = random.Random(seed)
    texts, counts = [], []
    for _ in range(n):
        k = rng.randint(0, 3)
        words = rng.choices(["the", "film", "was", "a", "plot", "and"], k=rng.randint(3, 8)) + ["great"] * k
        rng.shuffle(words)
        texts.append(" ".join(words))
        counts.append(k)
    return texts, np.array(counts, dtype=np.float32)


class WordCount(Task):
    """How many times 'great' occurs: one float per text, mean squared error."""

    name: ClassVar[str] = "word-count"
    input_names: ClassVar[tuple[str, ...]] = ("input_ids", "attention_mask")
    auto_model: ClassVar[str] = "AutoModelForSequenceClassification"

    def prepare_data(self, model_path: str, model_config: Any) -> TaskData:
        from transformers import AutoTokenizer

        from leantrain.data.prepare import Examples
        from leantrain.data.tokenize import tokenize

        tokenizer = AutoTokenizer.from_pretrained(model_path)
        sets = []
        for n, seed in ((192, 0), (64, 1)):
            texts, counts = counting_rows(n, seed)
            sets.append(Examples(tokenize(tokenizer, texts, None, 32), counts))
        return TaskData(sets[0], sets[1], [], tokenizer, ["192 counting rows, 64 held out"])

    def build_model(self, model_path: str, data: TaskData):
        from transformers import AutoModelForSequenceClassification

        return AutoModelForSequenceClassification.from_pretrained(model_path, num_labels=1, problem_type="regression")

    def collator(self, data: TaskData, *, train: bool):
        from leantrain.data.batching import Collator

        pad = Collator(data.processor.pad_token_id)

        def collate(items: list[dict]) -> dict[str, Any]:
            batch = pad([{**x, "label": 0} for x in items])  # the padding collator's labels are class ids
            batch["labels"] = torch.tensor([float(x["label"]) for x in items])
            return batch

        return collate

    def loss_sum(self, outputs, batch) -> torch.Tensor:
        return ((outputs.logits.float().squeeze(-1) - batch["labels"]) ** 2).sum()

    def eval_rows(self, outputs, batch) -> dict[str, torch.Tensor]:
        return {"prediction": outputs.logits.float().squeeze(-1), "labels": batch["labels"]}

    def metrics(self, rows: dict[str, np.ndarray]) -> dict[str, float]:
        error = rows["prediction"] - rows["labels"]
        return {"loss": float((error**2).mean()), "rmse": float(np.sqrt((error**2).mean()))}

    # inference: a CSV of text,count to score; texts to count in
    def evaluation_data(self, model_path: str, model_config: Any) -> TaskData:
        import pandas as pd

        df = pd.read_csv(self.cfg.eval_data)
        return self._examples(model_path, df["text"].tolist(), df["count"].to_numpy(np.float32))

    def prediction_data(self, model_path: str, model_config: Any, inputs) -> tuple[TaskData, list[dict]]:
        data = self._examples(model_path, inputs.texts, np.zeros(len(inputs.texts), dtype=np.float32))
        return data, [{"text": x} for x in inputs.texts]

    def prediction_rows(self, rows: dict[str, np.ndarray], shown: list[dict]) -> list[dict]:
        out: list[dict] = [{} for _ in shown]
        for value, i in zip(rows["prediction"], rows["index"]):
            out[i] = {**shown[i], "count": round(float(value), 3)}
        return out

    def _examples(self, model_path: str, texts: list[str], counts: np.ndarray) -> TaskData:
        from transformers import AutoTokenizer

        from leantrain.data.prepare import Examples
        from leantrain.data.tokenize import tokenize

        tokenizer = AutoTokenizer.from_pretrained(model_path)
        return TaskData(None, Examples(tokenize(tokenizer, texts, None, 32), counts), [], tokenizer)


def job(tiny_model_dir, tmp_path: Path) -> TrainConfig:
    return TrainConfig(
        model=str(tiny_model_dir),
        data="unused: the task reads its own",
        output_dir=str(tmp_path / "run"),
        cache_dir=str(tmp_path / "cache"),
        batch_size=16,
        epochs=6,
        lr=2e-3,
        optimizer="adamw",
        precision="fp32",
        metric_for_best="loss",
        progress=False,
        report=False,
    )


@pytest.fixture(scope="module")
def counted(tiny_model_dir, tmp_path_factory):
    """A word-count run, trained once for the tests below."""
    return train(job(tiny_model_dir, tmp_path_factory.mktemp("word-count")), task=WordCount)


def test_a_task_defined_in_a_test_trains_through_leantrain_train(counted):
    result = counted
    _, held_out = counting_rows(64, 1)
    mean_predictor = float(np.sqrt(((held_out - held_out.mean()) ** 2).mean()))
    m = result.metrics
    assert set(m) >= {"eval_loss", "eval_rmse", "train_loss", "optimizer_steps"}
    assert m["optimizer_steps"] == 6 * 12 and m["num_labels"] == 0
    assert m["eval_rmse"] < 0.7 * mean_predictor  # it learned to count, not just the mean
    assert (result.model_dir / "model.safetensors").is_file() and (result.model_dir / "tokenizer.json").is_file()


def leantrain(*args: str) -> subprocess.CompletedProcess:
    """The `leantrain` command in a fresh process that can import this test module (the repository's root on its
    path), as a user's own package would be importable."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run(
        [sys.executable, "-m", "leantrain", *args], capture_output=True, text=True, env=env, timeout=300
    )


@pytest.mark.slow  # two `leantrain` processes: about 20 s
def test_evaluate_and_predict_in_another_process_find_the_task_the_run_recorded(counted, tmp_path):
    import yaml

    recorded = yaml.safe_load((counted.output_dir / "config.yaml").read_text())["task"]
    assert recorded == "tests.tasks.test_custom_task:WordCount"
    texts, counts = counting_rows(40, 7)
    scored = tmp_path / "counts.csv"
    scored.write_text("text,count\n" + "".join(f"{x},{int(c)}\n" for x, c in zip(texts, counts)))
    done = leantrain("evaluate", str(counted.output_dir), "--data", str(scored))
    assert done.returncode == 0, done.stderr
    scores = json.loads(done.stdout)
    mean_predictor = float(np.sqrt(((counts - counts.mean()) ** 2).mean()))
    assert set(scores) == {"loss", "rmse"} and scores["rmse"] < 0.7 * mean_predictor
    done = leantrain("predict", str(counted.output_dir), "--text", "great great great film", "--text", "a plot")
    assert done.returncode == 0, done.stderr
    rows = [json.loads(line) for line in done.stdout.splitlines()]
    assert [r["text"] for r in rows] == ["great great great film", "a plot"]
    assert rows[0]["count"] > rows[1]["count"] + 1.5  # it counts three against none


def test_a_task_named_by_its_path_is_imported_and_registered():
    from leantrain import tasks

    assert TrainConfig(task="tests.tasks.test_custom_task:WordCount").task == "word-count"
    assert tasks.task_class("word-count") is WordCount


def test_an_unknown_task_path_is_refused_in_one_line():
    from leantrain.errors import ConfigError

    with pytest.raises(ConfigError, match=r"--task tests\.tasks\.nowhere:Nothing: cannot import it"):
        TrainConfig(task="tests.tasks.nowhere:Nothing")
    with pytest.raises(ConfigError, match=r"not a leantrain\.tasks\.Task subclass"):
        TrainConfig(task="tests.tasks.test_custom_task:counting_rows")
