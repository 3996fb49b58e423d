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


def test_the_default_job_is_sized_for_the_cpu_and_an_explicit_limit_wins(monkeypatch):
    """About four minutes of training on 2 cores either way: AVX-512 trains MiniLM 2.5x faster than AVX2."""
    from leantrain import parallel
    from leantrain.config.sections import DEFAULT_JOB_LR, DEFAULT_JOB_ROWS

    monkeypatch.setattr(parallel, "device_type", lambda: "cpu")
    monkeypatch.delenv("ATEN_CPU_CAPABILITY", raising=False)
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)
    monkeypatch.setattr(parallel, "cpu_flags", lambda: frozenset({"avx2", "avx512f", "amx_bf16"}))
    assert TrainConfig().resolved().limit == DEFAULT_JOB_ROWS["avx512"]
    assert TrainConfig(limit=500).resolved().limit == 500
    assert TrainConfig(data="mine.csv").resolved().limit is None  # your own data: every row
    assert TrainConfig().resolved().lr == DEFAULT_JOB_LR != TrainConfig().lr  # the default job's own rate
    assert TrainConfig(lr=3e-5).resolved().lr == 3e-5 and TrainConfig(data="mine.csv").resolved().lr == 5e-5
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "avx2")  # torch held to AVX2 in this process
    assert TrainConfig().resolved().limit == DEFAULT_JOB_ROWS["avx2"]
    monkeypatch.delenv("ATEN_CPU_CAPABILITY")
    monkeypatch.setattr(parallel, "cpu_flags", lambda: frozenset({"avx2", "fma"}))
    assert TrainConfig().resolved().limit == DEFAULT_JOB_ROWS["avx2"] < DEFAULT_JOB_ROWS["avx512"]
