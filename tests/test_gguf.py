"""A GGUF file (llama.cpp's format) as --model: converted once to a model folder that equals transformers' own
reading of the file, reused after, and trained like any folder. The file is written here with the gguf package: a
tiny Llama with Q8_0 blocks (so dequantization is on the path) and a byte-level BPE tokenizer."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

TEXTS = ["the film was great and lovely", "the film was awful and boring", "a great film", "an awful film"] * 4


def write_tiny_llama_gguf(path: Path, hidden: int = 64, layers: int = 2, ffn: int = 128, heads: int = 4) -> Path:
    import gguf  # the dev extra's
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    specials = ["<unk>", "<s>", "</s>"]
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    bpe.train_from_iterator(
        TEXTS, trainers.BpeTrainer(vocab_size=300, special_tokens=specials, initial_alphabet=alphabet)
    )
    state = json.loads(bpe.to_str())["model"]
    tokens = [t for t, _ in sorted(state["vocab"].items(), key=lambda kv: kv[1])]
    merges = [m if isinstance(m, str) else " ".join(m) for m in state["merges"]]
    vocab = len(tokens)

    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_block_count(layers)
    writer.add_context_length(128)
    writer.add_embedding_length(hidden)
    writer.add_feed_forward_length(ffn)
    writer.add_head_count(heads)
    writer.add_head_count_kv(heads)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_freq_base(10000.0)
    writer.add_vocab_size(vocab)
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list(tokens)
    writer.add_token_types([3 if t in specials else 1 for t in tokens])
    writer.add_token_merges(merges)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_unk_token_id(0)
    writer.add_pad_token_id(2)

    rng = np.random.default_rng(0)

    def add(name: str, *shape: int, quantize: bool = True) -> None:
        data = (rng.standard_normal(shape) * 0.05).astype(np.float32) if quantize else np.ones(shape, np.float32)
        if quantize:  # Q8_0: blocks of 32 int8 with one scale, as llama.cpp writes them
            kind = gguf.GGMLQuantizationType.Q8_0
            writer.add_tensor(name, gguf.quants.quantize(data, kind), raw_dtype=kind)
        else:
            writer.add_tensor(name, data)

    add("token_embd.weight", vocab, hidden)
    add("output_norm.weight", hidden, quantize=False)
    for i in range(layers):
        add(f"blk.{i}.attn_norm.weight", hidden, quantize=False)
        add(f"blk.{i}.ffn_norm.weight", hidden, quantize=False)
        for part in ("q", "k", "v", "output"):
            add(f"blk.{i}.attn_{part}.weight", hidden, hidden)
        add(f"blk.{i}.ffn_gate.weight", ffn, hidden)
        add(f"blk.{i}.ffn_up.weight", ffn, hidden)
        add(f"blk.{i}.ffn_down.weight", hidden, ffn)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.fixture(scope="module")
def gguf_file(tmp_path_factory) -> Path:
    return write_tiny_llama_gguf(tmp_path_factory.mktemp("gguf") / "tiny-llama.Q8_0.gguf")


def test_a_gguf_file_becomes_a_folder_equal_to_transformers_reading_it(gguf_file, tmp_path, capsys):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from leantrain.model import gguf as gguf_folders
    from leantrain.model.loading import resolve_model

    folder = Path(resolve_model(str(gguf_file)))
    assert folder.parent.name == "gguf" and "converting GGUF" in capsys.readouterr().err
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= {p.name for p in folder.iterdir()}
    assert "quantization_config" not in json.loads((folder / "config.json").read_text())

    direct = AutoModelForCausalLM.from_pretrained(str(gguf_file.parent), gguf_file=gguf_file.name).eval()
    ours = AutoModelForCausalLM.from_pretrained(folder).eval()
    tokenizer, direct_tokenizer = (
        AutoTokenizer.from_pretrained(folder),
        AutoTokenizer.from_pretrained(str(gguf_file.parent), gguf_file=gguf_file.name),
    )
    ids = tokenizer("the film was lovely", return_tensors="pt").input_ids
    assert ids.tolist() == direct_tokenizer("the film was lovely", return_tensors="pt").input_ids.tolist()
    assert ids.shape[1] > 1 and (ids != 0).all()  # real tokens, not <unk>
    with torch.no_grad():
        torch.testing.assert_close(ours(ids).logits, direct(ids).logits, rtol=0, atol=0)

    # The second use reads the folder: no conversion, the same path.
    assert resolve_model(str(gguf_file)) == str(folder)
    assert "converting" not in capsys.readouterr().err
    # A changed file (another version under the same name) is converted again, to its own folder.
    copy = tmp_path / gguf_file.name
    copy.write_bytes(gguf_file.read_bytes())
    assert gguf_folders.folder_for(copy) != folder


def test_training_a_gguf_model_end_to_end(gguf_file, tmp_path):
    from leantrain import TrainConfig, train

    data = tmp_path / "text.txt"
    data.write_text("\n\n".join(TEXTS) + "\n")
    result = train(
        TrainConfig(model=str(gguf_file), data=str(data), max_steps=2, batch_size=4, max_length=16,
                    output_dir=str(tmp_path / "run"), cache_dir=str(tmp_path / "cache"), report=False, progress=False)
    )  # fmt: skip
    assert (result.model_dir / "model.safetensors").is_file() and (result.model_dir / "tokenizer.json").is_file()
    assert np.isfinite(result.metrics["train_loss"])


def test_without_the_gguf_package_one_line_names_the_install(gguf_file, tmp_path, monkeypatch):
    from leantrain.errors import ModelError
    from leantrain.model import gguf as gguf_folders

    monkeypatch.setitem(sys.modules, "gguf", None)  # import gguf now raises ImportError
    with pytest.raises(ModelError, match=r"tiny-llama\.Q8_0\.gguf: reading a GGUF file needs .*pip install gguf"):
        gguf_folders.as_model_folder(gguf_file, cache=tmp_path)


def test_a_damaged_gguf_file_is_one_line(tmp_path):
    from leantrain.errors import ModelError
    from leantrain.model.loading import resolve_model

    bad = tmp_path / "broken.gguf"
    bad.write_bytes(b"GGUF" + b"\0" * 64)
    with pytest.raises(ModelError, match=r"broken\.gguf: cannot read as a GGUF model"):
        resolve_model(str(bad))


@pytest.mark.parametrize(
    ("content", "said"),
    [
        (b"version https://git-lfs.github.com/spec/v1\n", "b'version ', not b'GGUF': a Git LFS pointer); fetch"),
        (b"<!DOCTYPE html><html>", "b'<!DOCTYP', not b'GGUF': a web page); download the file itself"),
        (b"\x00\x01", "b'\\x00\\x01', not b'GGUF'); give a GGUF file"),
        (b"", "(it is empty); give a GGUF file"),
    ],
)
def test_a_file_named_gguf_that_is_not_one_is_refused_before_converting(tmp_path, capsys, sentiment_csv, content, said):
    """It said it was converting, then failed in transformers: its first bytes are checked first."""
    from leantrain.commands.cli import main

    bad = tmp_path / "x.gguf"
    bad.write_bytes(content)
    code = main(["train", "--model", str(bad), "--data", str(sentiment_csv), "--output-dir", str(tmp_path / "run")])
    err = capsys.readouterr().err
    assert code == 2 and "converting" not in err and "Traceback" not in err, err
    [line] = err.strip().splitlines()
    assert line.startswith(f"leantrain train: error: {bad} is not a GGUF file (") and said in line, line


def test_a_killed_conversions_staging_is_cleared_and_a_full_disk_is_one_line(gguf_file, tmp_path, monkeypatch):
    """A conversion killed before its rename leaves `<folder>.tmp-PID`: the next conversion removes it (its process
    is gone) and spares a live process's. A disk without room for the fp32 weights is refused in one line before
    anything is written, and a write that fails midway leaves no staging folder."""
    import shutil
    import subprocess
    from collections import namedtuple

    from leantrain.errors import ModelError
    from leantrain.model import gguf as gguf_folders

    folder = gguf_folders.folder_for(gguf_file, tmp_path)
    folder.parent.mkdir(parents=True)
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead = folder.with_name(f"{folder.name}.tmp-{gone.stdout.strip()}")
    alive = folder.with_name(f"{folder.name}.tmp-1")  # init: never this test's to remove
    for left in (dead, alive):
        (left / "model.safetensors").parent.mkdir()
        (left / "model.safetensors").write_bytes(b"partial")

    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda p: usage(1 << 30, (1 << 30) - (1 << 20), 1 << 20))
    with pytest.raises(ModelError, match=r"tiny-llama\.Q8_0\.gguf: no room to convert it in .*\(1 MB free, about "
                                         r"\d+ MB needed .*set LEANTRAIN_CACHE"):  # fmt: skip
        gguf_folders.as_model_folder(gguf_file, cache=tmp_path)
    assert not dead.exists() and alive.exists() and not folder.exists()
    monkeypatch.undo()

    def full(self, *a, **kw):
        (Path(a[0]) / "model.safetensors").parent.mkdir(parents=True, exist_ok=True)
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("transformers.PreTrainedModel.save_pretrained", full)
    with pytest.raises(ModelError, match="no room to convert it"):
        gguf_folders.as_model_folder(gguf_file, cache=tmp_path)
    assert sorted(p.name for p in folder.parent.iterdir() if p.is_dir()) == [alive.name]
