"""The real thing: fine-tune the embedded MiniLM on 1,000 SST-2 sentences and score the dev set."""

import pytest

from leantrain import TrainConfig, train


@pytest.mark.slow  # one epoch, 32 steps: 74-86 s at load 3.5 (3 epochs at lr 1e-4 took 85 s in CI at load 1-3)
def test_minilm_learns_sst2(shared_data, tmp_path):
    result = train(
        TrainConfig(
            data=str(shared_data / "sst2" / "train_1k.tsv"),
            eval_data=str(shared_data / "sst2" / "dev.tsv"),
            output_dir=str(tmp_path / "run"),
            cache_dir=str(tmp_path / "cache"),
            epochs=1,
            # measured: dev accuracy 0.799 (seed 42, the default) and 0.779 (seed 1); one epoch at 1e-4 gave 0.682
            lr=3e-4,
            batch_size=32,
            progress=False,
        )
    )
    assert result.metrics["eval_accuracy"] > 0.75
    assert result.metrics["train_examples"] == 1000
