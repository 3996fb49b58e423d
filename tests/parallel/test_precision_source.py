"""--precision left to auto honours the user's Accelerate configuration (issue #17) and says which source won."""

from __future__ import annotations

import pytest

from leantrain import parallel
from leantrain.errors import ConfigError


@pytest.fixture()
def accelerate_home(tmp_path, monkeypatch):
    """An HF_HOME of the test's own, and no Accelerate settings in the environment."""
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    for name in ("ACCELERATE_MIXED_PRECISION", "LEANTRAIN_LAUNCHED"):
        monkeypatch.delenv(name, raising=False)

    def write_config(text: str) -> None:
        folder = tmp_path / "hf" / "accelerate"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "default_config.yaml").write_text(text)

    return write_config


def test_accelerate_launch_mixed_precision_is_used_when_precision_is_auto(accelerate_home, monkeypatch):
    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "fp16")
    precision, why = parallel.choose_precision("auto")
    assert precision == "fp16" and why.startswith("from ACCELERATE_MIXED_PRECISION=fp16")
    assert parallel.choose_precision("fp32") == ("fp32", "set by --precision")  # a given --precision wins


def test_the_accelerate_config_file_is_used_when_nothing_else_says(accelerate_home):
    accelerate_home("compute_environment: LOCAL_MACHINE\nmixed_precision: bf16\nnum_processes: 1\n")
    precision, why = parallel.choose_precision("auto")
    assert precision == "bf16" and "mixed_precision: bf16 in" in why and "default_config.yaml" in why


def test_accelerate_launchs_own_default_is_not_a_choice(accelerate_home, monkeypatch):
    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "no")  # what `accelerate launch` sets when nothing is configured
    assert parallel.choose_precision("auto")[1].startswith("auto:")
    accelerate_home("mixed_precision: 'no'\n")  # configured: then it is the user's
    assert parallel.choose_precision("auto") == (
        "fp32",
        "from ACCELERATE_MIXED_PRECISION=no (accelerate launch --mixed_precision or its config)",
    )


def test_leantrains_own_launcher_setting_is_ignored(accelerate_home, monkeypatch):
    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "fp16")
    monkeypatch.setenv("LEANTRAIN_LAUNCHED", "1")
    assert parallel.choose_precision("auto")[1].startswith("auto:")


def test_fp8_is_refused_in_one_line(accelerate_home, monkeypatch):
    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "fp8")
    with pytest.raises(ConfigError, match="leantrain runs fp32, bf16 or fp16, not fp8; pass --precision"):
        parallel.choose_precision("auto")


def test_a_run_trains_in_the_configured_precision_and_says_so(
    accelerate_home, monkeypatch, tiny_model_dir, sentiment_csv, tmp_path, capsys
):
    from leantrain import TrainConfig, train

    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "bf16")
    cfg = TrainConfig(
        model=str(tiny_model_dir),
        data=str(sentiment_csv),
        output_dir=str(tmp_path / "run"),
        cache_dir=str(tmp_path / "cache"),
        max_steps=1,
        progress=False,
        report=False,
    )
    result = train(cfg)
    assert result.metrics["precision"] == "bf16"
    assert "precision bf16 (from ACCELERATE_MIXED_PRECISION=bf16" in capsys.readouterr().err


def test_a_chosen_half_precision_that_runs_no_faster_here_says_why(accelerate_home, monkeypatch):
    """--precision bf16 on a CPU with AVX2 only (bf16 emulated, many times slower than fp32) keeps bf16 and says
    so in the line that names the precision; where bf16 is fast, nothing is added."""
    monkeypatch.setattr(parallel, "cpu_flags", lambda: {"avx2"})
    assert parallel.choose_precision("bf16", "cpu") == (
        "bf16",
        "set by --precision; no AVX-512 BF16 or AMX: bf16 is emulated, many times slower than fp32",
    )
    accelerate_home("mixed_precision: bf16\n")
    assert parallel.choose_precision("auto", "cpu")[1].endswith(
        "; no AVX-512 BF16 or AMX: bf16 is emulated, many times slower than fp32"
    )
    assert parallel.choose_precision("fp32", "cpu") == ("fp32", "set by --precision")
    monkeypatch.setattr(parallel, "cpu_flags", lambda: {"avx2", "avx512_bf16"})
    assert parallel.choose_precision("bf16", "cpu") == ("bf16", "set by --precision")
