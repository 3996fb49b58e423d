"""--metric-for-best: each task's default when not given, any metric it reports when given, one line otherwise."""

import pytest

from leantrain import TrainConfig
from leantrain.errors import ConfigError
from leantrain.tasks import task_class
from leantrain.tasks.text_classification import TEXT_PROBLEMS


@pytest.mark.parametrize(
    "task,default",
    [
        (task_class("text-classification"), "accuracy"),
        (task_class("image-classification"), "accuracy"),
        (task_class("causal-lm"), "loss"),
        (TEXT_PROBLEMS["regression"], "loss"),
        (TEXT_PROBLEMS["multi-label"], "micro_f1"),
    ],
)
def test_each_task_has_a_default_it_reports(task, default):
    chosen = task(TrainConfig())
    assert chosen.metric_for_best(None) == default
    assert default in chosen.metric_names  # the default is one of the metrics the task's evaluation reports


def test_a_metric_the_task_reports_is_taken_and_one_it_does_not_is_refused():
    classifier = task_class("text-classification")(TrainConfig(metrics="accuracy,mcc"))
    assert classifier.metric_for_best("eval_mcc") == "mcc"
    with pytest.raises(ConfigError, match="--metric-for-best 'accuracy' is not an evaluation metric"):
        task_class("causal-lm")(TrainConfig()).metric_for_best("accuracy")
    with pytest.raises(ConfigError, match="roc_auc"):
        classifier.metric_for_best("roc_auc")  # not asked for with --metrics
