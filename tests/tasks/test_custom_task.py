"""A workload defined only here trains through `leantrain.train`: counting a word (regression), with its own
data, model head, collator, loss and metrics, and no change to the package."""

from __future__ import annotations

import random
from typing import Any, ClassVar

import numpy as np
import torch

from leantrain import TrainConfig, train
from leantrain.tasks import Task, TaskData


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


def test_a_task_defined_in_a_test_trains_through_leantrain_train(tiny_model_dir, tmp_path):
    cfg = TrainConfig(
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
    result = train(cfg, task=WordCount)
    _, held_out = counting_rows(64, 1)
    mean_predictor = float(np.sqrt(((held_out - held_out.mean()) ** 2).mean()))
    m = result.metrics
    assert set(m) >= {"eval_loss", "eval_rmse", "train_loss", "optimizer_steps"}
    assert m["optimizer_steps"] == 6 * 12 and m["num_labels"] == 0
    assert m["eval_rmse"] < 0.7 * mean_predictor  # it learned to count, not just the mean
    assert (result.model_dir / "model.safetensors").is_file() and (result.model_dir / "tokenizer.json").is_file()
