"""Train, evaluate and predict from Python with leantrain's API.

    python examples/train_api.py                      # GLUE SST-2 from ../shared/data/sst2
    python examples/train_api.py path/to/SST-2        # the GLUE release's folder (train.tsv, dev.tsv)

Data: GLUE SST-2, on the Hub as nyu-mll/glue, config sst2; the GLUE release's TSV files.
"""

import sys
from pathlib import Path

import leantrain


def main(data_dir: str = "../shared/data/sst2", **overrides):
    config = leantrain.TrainConfig(
        data=str(Path(data_dir) / "train.tsv"),
        eval_data=str(Path(data_dir) / "dev.tsv"),
        limit=1000,  # a stratified sample of the 67k phrases: a few minutes on a laptop CPU
        epochs=1,
        output_dir="runs/api-example",
        overwrite=True,
    ).replace(**overrides)
    result = leantrain.train(config)
    print("dev accuracy", result.metrics["eval_accuracy"], "model in", result.model_dir)
    print(leantrain.predict(str(result.output_dir), texts=["a gripping, beautiful film", "a dull mess"]))
    return result


if __name__ == "__main__":
    main(*sys.argv[1:2])
