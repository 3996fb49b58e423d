"""--kernels liger: Liger's Triton kernels for Llama-family models on CUDA; anywhere else refused in one line, before
any data is read (the GPU check, benchmarks/gpu_check.py, trains with them)."""

from __future__ import annotations

import pytest

from leantrain.errors import ConfigError
from leantrain.model import kernels


def test_liger_on_a_cpu_is_refused_in_one_line_with_exit_2(tiny_model_dir, sentiment_csv, tmp_path, capsys):
    from leantrain.commands.cli import main

    args = ["train", "--model", str(tiny_model_dir), "--data", str(sentiment_csv), "--kernels", "liger"]
    code = main([*args, "--output-dir", str(tmp_path / "run"), "--cache-dir", str(tmp_path / "cache")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert err[-1].startswith("leantrain train: error: --kernels liger: Liger's kernels are Triton kernels for CUDA")
    assert "Traceback" not in "\n".join(err)
    assert not (tmp_path / "cache").exists()  # refused before any data was read


def test_liger_is_for_llama_family_models_and_needs_its_package():
    class Config:
        model_type = "bert"

    with pytest.raises(ConfigError, match=r"for Llama-family models .* this model is bert"):
        kernels.check("liger", "cuda", Config())
    Config.model_type = "llama"
    try:
        import liger_kernel  # noqa: F401
    except ImportError:
        with pytest.raises(ConfigError, match="pip install liger-kernel"):
            kernels.check("liger", "cuda", Config())
    kernels.check("none", "cpu", Config())  # the default asks nothing


def test_an_unknown_kernel_set_is_refused():
    from leantrain import TrainConfig

    with pytest.raises(ConfigError, match="--kernels must be one of none, liger"):
        TrainConfig(kernels="fast")
