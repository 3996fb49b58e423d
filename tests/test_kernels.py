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


def test_the_kernels_go_in_after_the_checks_that_run_the_model_on_the_cpu(tmp_path, monkeypatch):
    """Liger's Triton kernels cannot run on CPU tensors, and the causal LM's checks (packing keeps documents apart,
    the head's rows) run a few tokens through the model on the CPU before it is placed: with the kernels put in
    first, a GPU run with --kernels liger failed while setting up ("cannot be accessed from Triton (cpu tensor?)")."""
    import torch

    from leantrain import train
    from leantrain.training.trainer import Trainer
    from tests.tasks.test_causal_lm import documents, write_tiny_llama

    def triton_like(model, name):  # what Liger's kernels do with a tensor on the CPU
        def refuse(self, hidden_states):
            raise ValueError("Pointer argument (at 0) cannot be accessed from Triton (cpu tensor?)")

        for module in model.modules():
            if type(module).__name__ == "LlamaRMSNorm":
                module.forward = refuse.__get__(module)
        return "kernels: Triton-like norms"

    monkeypatch.setattr(kernels, "check", lambda *args: None)
    monkeypatch.setattr(kernels, "apply", triton_like)
    built = []
    monkeypatch.setattr(Trainer, "fit", lambda self: built.append(self))  # set up, not trained (no GPU here)
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n\n".join(documents(40, seed=0)) + "\n")
    model = write_tiny_llama(tmp_path / "llama")
    train(model=str(model), data=str(corpus), kernels="liger", packing=True, max_length=32, report=False,
          output_dir=str(tmp_path / "run"), cache_dir=str(tmp_path / "cache"))  # fmt: skip
    assert built and isinstance(built[0].model, torch.nn.Module)
    assert all(type(m).__name__ != "LlamaRMSNorm" or "refuse" in str(m.forward) for m in built[0].model.modules())
