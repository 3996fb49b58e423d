"""GGUF files (llama.cpp's format) as Hugging Face model folders, so every model path of leantrain reads them.

transformers reads a GGUF file's weights (dequantized: training needs real tensors, not 4-bit blocks), its config
and its tokenizer. Reading dequantizes every tensor, seconds for a small model and minutes for a large one, so the
result is written once, as an ordinary folder (safetensors, config, tokenizer), under leantrain's cache and keyed
by the file's path, size and modification time. The trained model is saved as a Hugging Face folder too.
"""

from __future__ import annotations

import errno
import hashlib
import os
import shutil
from pathlib import Path

from leantrain.errors import ModelError
from leantrain.paths import leantrain_cache, left_by_dead_run
from leantrain.telemetry.console import Console


def is_gguf(path: Path) -> bool:
    return path.suffix.lower() == ".gguf" and path.is_file()


def folder_for(path: Path, cache: Path | None = None) -> Path:
    """Where `path`'s converted folder lives: one per file version (a replaced file converts again)."""
    path = path.expanduser().resolve()
    stat = path.stat()
    key = hashlib.sha256(f"{path}|{stat.st_size}|{stat.st_mtime_ns}".encode()).hexdigest()[:16]
    return (cache or leantrain_cache()) / "gguf" / f"{path.stem}-{key}"


def as_model_folder(path: Path, cache: Path | None = None) -> Path:
    """`path` (a .gguf file) as a model folder: converted on first use, then read from the cache."""
    _check_magic(path)
    folder = folder_for(path, cache)
    if (folder / "config.json").is_file():
        return folder
    try:
        import gguf  # noqa: F401  (transformers reads GGUF through it)
    except ImportError:
        raise ModelError(f"{path}: reading a GGUF file needs the gguf package: pip install gguf") from None
    import torch
    from filelock import FileLock
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder.parent.mkdir(parents=True, exist_ok=True)
    # one process converts (the others of a multi-process run wait here, then read its folder)
    with FileLock(str(folder) + ".lock"):
        if (folder / "config.json").is_file():
            return folder
        for left in folder.parent.glob(f"{folder.name}.tmp-*"):  # a conversion killed before its rename
            if left_by_dead_run(left.name):
                shutil.rmtree(left, ignore_errors=True)
        Console().info(f"{path.name}: converting GGUF to a model folder once (weights dequantized to fp32): {folder}")
        parent, name = str(path.parent), path.name
        try:
            tokenizer = AutoTokenizer.from_pretrained(parent, gguf_file=name)
            model = AutoModelForCausalLM.from_pretrained(parent, gguf_file=name, dtype=torch.float32)
        except (OSError, ValueError, KeyError, RuntimeError) as exc:
            raise ModelError(f"{path}: cannot read as a GGUF model ({str(exc).splitlines()[0][:200]})") from None
        # The weights are plain fp32 tensors now; the quantization marks only stop save_pretrained.
        model.hf_quantizer = None  # type: ignore[assignment]
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        model.config.architectures = [type(model).__name__]
        need = 4 * sum(p.numel() for p in model.state_dict().values()) + (64 << 20)  # and the tokenizer's files
        free = shutil.disk_usage(folder.parent).free
        if free < need:
            raise ModelError(_no_room(path, folder, free, need))
        staging = folder.with_name(f"{folder.name}.tmp-{os.getpid()}")
        try:
            model.save_pretrained(staging)
            tokenizer.save_pretrained(staging)
            staging.rename(folder)  # whole or absent: a reader never sees half a folder
        except BaseException as exc:  # an error, a full disk, Ctrl-C: no half-written folder stays
            shutil.rmtree(staging, ignore_errors=True)
            full = isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT)
            if full or "os error 28" in str(exc):  # (safetensors reports a full disk as its own error)
                raise ModelError(_no_room(path, folder, shutil.disk_usage(folder.parent).free, need)) from None
            if isinstance(exc, OSError):
                raise ModelError(f"{path}: cannot write its model folder {folder} ({exc.strerror or exc})") from None
            raise
    return folder


#: what a file named .gguf often is instead, by its first bytes: (what it is, what to do)
LOOKALIKES = {
    b"version https://git-lfs": ("a Git LFS pointer", "fetch the file itself with git lfs pull"),
    b"<": ("a web page", "download the file itself, not the page that links to it"),
}
GIVE = "give a GGUF file written by llama.cpp or the gguf package, or a Hugging Face model folder"


def _check_magic(path: Path) -> None:
    """Refuse a file that does not start with GGUF's magic before anything says it converts (one line)."""
    try:
        with path.open("rb") as f:
            head = f.read(24)
    except OSError as exc:
        raise ModelError(f"{path}: cannot read it ({exc.strerror or exc})") from None
    if head.startswith(b"GGUF"):
        return
    what, fix = next((v for k, v in LOOKALIKES.items() if head.lstrip().startswith(k)), (None, GIVE))
    starts = f"it starts with {head[:8]!r}, not b'GGUF'" if head else "it is empty"
    raise ModelError(f"{path} is not a GGUF file ({starts}{': ' + what if what else ''}); {fix}")


def _no_room(path: Path, folder: Path, free: int, need: int) -> str:
    return (
        f"{path}: no room to convert it in {folder.parent} ({free / 2**20:,.0f} MB free, about {need / 2**20:,.0f} "
        "MB needed for its fp32 weights); free some space or set LEANTRAIN_CACHE to a folder on a bigger disk"
    )
