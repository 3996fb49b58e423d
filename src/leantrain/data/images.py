"""Images: decode with Pillow, read MNIST-style IDX files, prepare with the model's image processor.

Processed images are kept compact: when the processor can stop before rescaling and normalising
(every Pillow-backed Transformers image processor can), the resized pixels are stored as uint8 and
rescaled/normalised batch by batch (`normalise`); otherwise pixel_values are stored as float16.
"""

from __future__ import annotations

import gzip
import io
import math
import zlib
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


_IDX_TYPES: dict[int, Any] = {0x08: np.uint8, 0x09: np.int8, 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}
#: deflate cannot shrink data more than about 1032:1, so a gzip file of n bytes holds at most ~1032 n
_MAX_GZIP_RATIO = 1032


def read_idx(path: Path) -> np.ndarray:
    """An IDX array (gzip or plain): magic 0x0000 + type code + number of dimensions, big-endian sizes.

    The header is read first and never more data than it declares is decompressed: a small gzip file
    that expands to gigabytes is refused after reading what the header promised, plus one byte.
    """
    gz = path.suffix == ".gz"
    opener: Any = gzip.open if gz else open
    try:
        with opener(path, "rb") as f:
            head = f.read(4)
            if len(head) < 4 or head[0] != 0 or head[1] != 0 or head[2] not in _IDX_TYPES:
                raise DataError(f"{path}: not an IDX file (bad magic number)")
            ndim = head[3]
            dims = f.read(4 * ndim)
            if len(dims) < 4 * ndim:
                raise DataError(f"{path}: truncated IDX file (the header ends early)")
            shape = tuple(int.from_bytes(dims[4 * i : 4 * i + 4], "big") for i in range(ndim))
            dtype = np.dtype(_IDX_TYPES[head[2]])
            size = math.prod(shape) * dtype.itemsize
            on_disk = path.stat().st_size
            if not gz and size > on_disk - 4 - 4 * ndim:
                raise DataError(
                    f"{path}: truncated IDX file (header says {shape}, holds {on_disk - 4 - 4 * ndim} bytes)"
                )
            if gz and size > on_disk * _MAX_GZIP_RATIO:
                raise DataError(
                    f"{path}: the IDX header declares {shape} ({size:,} bytes), more than a "
                    f"{on_disk:,}-byte gzip file can hold; the file is damaged"
                )
            body = np.empty(size, dtype=np.uint8)
            view, got = body.data, 0
            while got < size:
                n = f.readinto(view[got : got + (1 << 20)])
                if not n:
                    break
                got += n
            if got < size:
                raise DataError(f"{path}: truncated IDX file (header says {shape}, holds {got} bytes)")
            if f.read(1):
                raise DataError(f"{path}: holds more data than its IDX header declares ({shape}); the file is damaged")
    except (OSError, EOFError, zlib.error) as exc:
        raise DataError(f"{path}: cannot read ({exc})") from None
    return body.view(dtype).reshape(shape)


#: an IDX image's last axis, when it has one of these sizes: grey, grey and alpha, RGB, RGBA (as Pillow reads them)
IDX_CHANNELS = (1, 2, 3, 4)


def idx_pixels(x: np.ndarray, path: Path) -> np.ndarray:
    """IDX images as 8-bit pixels: floats in 0..1 scaled to 0..255, integers of any width kept when they are 0..255;
    other values are refused (a cast would wrap or truncate them into other pixels)."""
    if x.dtype == np.uint8:
        return x
    kind = f"IDX {x.dtype.name} values"
    if x.dtype.kind == "f":
        if not np.isfinite(x).all():
            raise DataError(f"{path}: {kind} include NaN or infinity; write finite pixels in 0..1 (or bytes 0..255)")
        lo, hi = float(x.min()), float(x.max())
        if lo < 0 or hi > 1:
            raise DataError(
                f"{path}: {kind} span {lo:g}..{hi:g}, but float pixels are read as 0..1 (0 black, 1 white); "
                "scale them to 0..1, or write 0..255 as unsigned bytes (type 0x08)"
            )
        return np.rint(x.astype(np.float32) * 255).astype(np.uint8)
    lo, hi = int(x.min()), int(x.max())
    if lo < 0 or hi > 255:
        raise DataError(
            f"{path}: {kind} span {lo}..{hi}, outside the 0..255 of 8-bit pixels; scale them to 0..255 "
            "(unsigned bytes, type 0x08) or to 0..1 floats"
        )
    return x.astype(np.uint8)


# --- decoding ---------------------------------------------------------------------------------------


def decode_image(item: Any, channels: int) -> np.ndarray:
    """An image as an (H, W, channels) uint8 array, from a path, bytes, a datasets dict or an array."""
    from PIL import Image, ImageOps

    if isinstance(item, np.ndarray):  # an IDX image (`idx_pixels`): its channels converted as a file's would be
        arr = item[:, :, 0] if item.ndim == 3 and item.shape[-1] == 1 else item
        if arr.ndim == 3 and arr.shape[-1] == channels:
            return np.ascontiguousarray(arr)
        arr = np.asarray(Image.fromarray(np.ascontiguousarray(arr)).convert("RGB" if channels == 3 else "L"))
        return arr[:, :, None] if arr.ndim == 2 else arr

    if isinstance(item, dict):
        item = item.get("bytes") or item.get("path")
    source = io.BytesIO(item) if isinstance(item, bytes) else item
    with Image.open(source) as img:
        img.load()
        # upright, as a camera's EXIF orientation says and as transformers' `load_image` (pipeline) turns it
        upright = ImageOps.exif_transpose(img)
        # Pillow's convert clips these at 255: a 16-bit image would turn black and white
        grey = Image.fromarray(_to_8bit(np.asarray(upright))) if upright.mode in _WIDE_GREY else upright
        converted = grey.convert("RGB" if channels == 3 else "L")
    arr = np.asarray(converted, dtype=np.uint8)
    return arr[:, :, None] if arr.ndim == 2 else arr


#: Pillow's one-channel modes wider than 8 bits: 16-bit PNG and TIFF open as I;16 (or I in older Pillow)
_WIDE_GREY = frozenset({"I;16", "I;16L", "I;16B", "I;16N", "I"})


def _to_8bit(arr: np.ndarray) -> np.ndarray:
    """16-bit grey levels (0..65535) as 8-bit ones, scaled: 65535 is white, as 255 is."""
    return np.round(np.clip(arr.astype(np.float64), 0, 65535) / 257).astype(np.uint8)


def check_sizes(arrays: list[np.ndarray], expected: tuple[int, int] | None, source: str, names: list[str]) -> None:
    """Without a resizing processor every image must have one size, the model's; `names`: the images', to point at
    one of the odd size."""
    sizes = Counter(a.shape[:2] for a in arrays)
    if len(sizes) > 1:
        common = ", ".join(f"{h}x{w} ({n})" for (h, w), n in sizes.most_common(4))
        usual = expected if expected is not None else sizes.most_common(1)[0][0]
        odd = next((f", e.g. {n}" for a, n in zip(arrays, names) if a.shape[:2] != tuple(usual)), "")
        raise DataError(
            f"{source}: images of different sizes ({common}{odd}) and the model has no image processor to "
            "resize them; save one next to its config.json (e.g. ViTImageProcessor(size=...).save_pretrained(folder)) "
            "or resize the images"
        )
    if expected is not None and sizes and next(iter(sizes)) != tuple(expected):
        (h, w) = next(iter(sizes))
        raise DataError(
            f"{source}: images are {h}x{w}{f' (e.g. {names[0]})' if names else ''} but the model takes "
            f"{expected[0]}x{expected[1]} and has no image processor to resize them; save one next to its "
            "config.json or resize the images"
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
