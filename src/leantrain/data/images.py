"""Images: decode with Pillow, read MNIST-style IDX files, prepare with the model's image processor.

Processed images are kept compact: when the processor can stop before rescaling and normalising
(every Pillow-backed Transformers image processor can), the resized pixels are stored as uint8 and
rescaled/normalised batch by batch (`normalise`); otherwise pixel_values are stored as float16.
"""

from __future__ import annotations

import gzip
import io
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

from leantrain.errors import DataError

IMAGE_SUFFIXES = frozenset({".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".tif", ".tiff", ".ppm", ".pgm"})


# --- IDX (the MNIST format) -----------------------------------------------------------------------


def find_idx_pair(folder: Path) -> tuple[Path, Path] | None:
    """The (images, labels) IDX files of a folder such as MNIST's, or None."""
    images = sorted(p for p in folder.iterdir() if "idx3-ubyte" in p.name)
    labels = sorted(p for p in folder.iterdir() if "idx1-ubyte" in p.name)
    if not images and not labels:
        return None
    if len(images) != 1 or len(labels) != 1:
        raise DataError(
            f"{folder}: expected one *idx3-ubyte[.gz] (images) and one *idx1-ubyte[.gz] (labels) file, "
            f"found {len(images)} and {len(labels)}"
        )
    return images[0], labels[0]


def read_idx(path: Path) -> np.ndarray:
    """An IDX array (gzip or plain): magic 0x0000 + type code + number of dimensions, big-endian sizes."""
    opener: Any = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rb") as f:
            raw = f.read()
    except (OSError, EOFError) as exc:
        raise DataError(f"{path}: cannot read ({exc})") from None
    types: dict[int, Any] = {0x08: np.uint8, 0x09: np.int8, 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] not in types:
        raise DataError(f"{path}: not an IDX file (bad magic number)")
    ndim = raw[3]
    shape = tuple(int.from_bytes(raw[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim))
    dtype = np.dtype(types[raw[2]])
    body = raw[4 + 4 * ndim :]
    if len(body) != int(np.prod(shape)) * dtype.itemsize:
        raise DataError(f"{path}: truncated IDX file (header says {shape}, holds {len(body)} bytes)")
    return np.frombuffer(body, dtype=dtype).reshape(shape)


# --- decoding ---------------------------------------------------------------------------------------


def decode_image(item: Any, channels: int) -> np.ndarray:
    """An image as an (H, W, channels) uint8 array, from a path, bytes, a datasets dict or an array."""
    if isinstance(item, np.ndarray):
        arr = item
        if arr.ndim == 2:
            arr = arr[:, :, None]
        if arr.shape[-1] != channels:
            arr = np.repeat(arr[:, :, :1], channels, axis=2) if channels == 3 else arr.mean(-1, keepdims=True)
        return np.ascontiguousarray(arr.astype(np.uint8))
    from PIL import Image

    if isinstance(item, dict):
        item = item.get("bytes") or item.get("path")
    source = io.BytesIO(item) if isinstance(item, bytes) else item
    with Image.open(source) as img:
        img.load()
        converted = img.convert("RGB" if channels == 3 else "L")
    arr = np.asarray(converted, dtype=np.uint8)
    return arr[:, :, None] if arr.ndim == 2 else arr


def check_sizes(arrays: list[np.ndarray], expected: tuple[int, int] | None, source: str) -> None:
    """Without a resizing processor every image must have one size, the model's."""
    sizes = Counter(a.shape[:2] for a in arrays)
    if len(sizes) > 1:
        common = ", ".join(f"{h}x{w} ({n})" for (h, w), n in sizes.most_common(4))
        raise DataError(
            f"{source}: images of different sizes ({common}) and the model has no image processor to resize "
            "them; save one next to its config.json (e.g. ViTImageProcessor(size=...).save_pretrained(folder)) "
            "or resize the images"
        )
    if expected is not None and sizes and next(iter(sizes)) != tuple(expected):
        (h, w) = next(iter(sizes))
        raise DataError(
            f"{source}: images are {h}x{w} but the model takes {expected[0]}x{expected[1]} and has no image "
            "processor to resize them; save one next to its config.json or resize the images"
        )


# --- processing -------------------------------------------------------------------------------------


def process_images(processor, arrays: list[np.ndarray]) -> tuple[np.ndarray, dict[str, Any] | None]:
    """pixel_values for a chunk of images: uint8 plus the normalisation to apply later, or float16."""
    fmt = {"input_data_format": "channels_last"}
    if all(hasattr(processor, a) for a in ("do_rescale", "do_normalize", "image_mean", "image_std")):
        try:
            out = processor(arrays, return_tensors="np", do_rescale=False, do_normalize=False, **fmt)["pixel_values"]
        except (TypeError, ValueError):
            out = None
        if out is not None and out.dtype == np.uint8:
            return out, normalisation(processor, out.shape[1])
    out = processor(arrays, return_tensors="np", **fmt)["pixel_values"]
    return np.asarray(out, dtype=np.float16), None


def normalisation(processor, channels: int) -> dict[str, Any]:
    def per_channel(value) -> list[float]:
        values = [float(v) for v in np.atleast_1d(np.asarray(value, dtype=np.float64))]
        return (values * channels)[:channels] if len(values) == 1 else values[:channels]

    return {
        "scale": float(processor.rescale_factor) if processor.do_rescale else 1.0,
        "mean": per_channel(processor.image_mean) if processor.do_normalize else [0.0] * channels,
        "std": per_channel(processor.image_std) if processor.do_normalize else [1.0] * channels,
    }


def normalise(pixels, norm: dict[str, Any] | None):
    """uint8 (B, C, H, W) pixels to the model's float input; float16 input is only widened."""
    import torch

    x = pixels.float()
    if norm is None:
        return x
    mean = torch.tensor(norm["mean"], dtype=torch.float32).view(1, -1, 1, 1)
    std = torch.tensor(norm["std"], dtype=torch.float32).view(1, -1, 1, 1)
    return (x * norm["scale"] - mean) / std


def shift_images(x, rng: np.random.Generator, fraction: float = 0.125):
    """Augmentation: shift each image by up to `fraction` of its size, filling with the border's mean."""
    import torch

    out = torch.empty_like(x)
    h, w = x.shape[-2:]
    for i in range(x.shape[0]):
        dy, dx = (int(v) for v in rng.integers(-round(h * fraction), round(h * fraction) + 1, size=2))
        fill = torch.cat([x[i, :, 0, :], x[i, :, -1, :]], dim=-1).mean(dim=-1).view(-1, 1, 1)
        out[i] = fill
        ys, yd = (slice(0, h - dy), slice(dy, h)) if dy >= 0 else (slice(-dy, h), slice(0, h + dy))
        xs, xd = (slice(0, w - dx), slice(dx, w)) if dx >= 0 else (slice(-dx, w), slice(0, w + dx))
        out[i, :, yd, xd] = x[i, :, ys, xs]
    return out
