import pytest

from leantrain.config import TrainConfig
from leantrain.errors import ConfigError


def test_defaults_are_valid_and_round_trip_through_a_dict():
    cfg = TrainConfig()
    assert TrainConfig.from_dict(cfg.to_dict()) == cfg


@pytest.mark.parametrize(
    "key,value,flag",
    [
        ("batch_size", 0, "--batch-size"),
        ("max_length", -3, "--max-length"),
        ("limit", 0, "--limit"),
        ("max_steps", -1, "--max-steps"),
        ("eval_fraction", 1.0, "--eval-fraction"),
        ("eval_fraction", 0, "--eval-fraction"),
        ("epochs", 0, "--epochs"),
        ("lr", 0, "--lr"),
        ("warmup_ratio", 1.5, "--warmup-ratio"),
        ("scheduler", "exponential", "--scheduler"),
        ("precision", "int4", "--precision"),
        ("batch_size", 2.5, "--batch-size"),
        ("batch_size", "32", "--batch-size"),
        ("overwrite", "yes", "--overwrite"),
    ],
)
def test_bad_values_name_the_flag(key, value, flag):
    with pytest.raises(ConfigError, match=flag):
        TrainConfig(**{key: value})


def test_yaml_values_are_overridden_by_flags(tmp_path):
    path = tmp_path / "job.yaml"
    path.write_text("batch_size: 8\nlr: 1e-4\nmax-length: 64\n")
    cfg = TrainConfig.from_yaml(path, overrides={"batch_size": 16})
    assert (cfg.batch_size, cfg.lr, cfg.max_length) == (16, 1e-4, 64)


def test_unknown_yaml_key_is_refused_with_a_suggestion(tmp_path):
    path = tmp_path / "job.yaml"
    path.write_text("batch_sise: 8\n")
    with pytest.raises(ConfigError, match=r"job.yaml: unknown key 'batch_sise'; did you mean 'batch_size'"):
        TrainConfig.from_yaml(path)


def test_yaml_that_is_not_a_mapping_is_refused(tmp_path):
    path = tmp_path / "job.yaml"
    path.write_text("- 1\n- 2\n")
    with pytest.raises(ConfigError, match="expected a mapping"):
        TrainConfig.from_yaml(path)


def test_missing_yaml_file(tmp_path):
    with pytest.raises(ConfigError, match="--config: no such file"):
        TrainConfig.from_yaml(tmp_path / "nope.yaml")
