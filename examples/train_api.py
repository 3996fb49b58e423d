"""Train, evaluate and predict from Python with leantrain's API.

    python examples/train_api.py
"""

import leantrain

config = leantrain.TrainConfig(
    data="../shared/data/sst2/train_1k.tsv",
    eval_data="../shared/data/sst2/dev.tsv",
    epochs=1,
    output_dir="runs/api-example",
    overwrite=True,
)
result = leantrain.train(config)
print("dev accuracy", result.metrics["eval_accuracy"], "model in", result.model_dir)
print(leantrain.predict(str(result.output_dir), texts=["a gripping, beautiful film", "a dull mess"]))
