"""IDX (MNIST) files: the header is read first, and never more is decompressed than it declares (issue #19.7)."""

import gzip
import struct
import tracemalloc
import zlib
from pathlib import Path

import numpy as np
import pytest

from leantrain.data.images import read_idx
from leantrain.errors import DataError


def _write_inflating_gzip(path: Path, header: bytes, zero_mib: int) -> None:
    """A valid gzip file holding `header` and then `zero_mib` MiB of zeros, written without holding them.

    After a full flush deflate restarts, so one compressed MiB of zeros can be repeated verbatim: the
    file is about 1 KiB per MiB it holds, and the CRC is computed over the zeros MiB by MiB.
    """
    zeros = bytes(1 << 20)
    deflate = zlib.compressobj(9, zlib.DEFLATED, -15)
    crc = zlib.crc32(header)
    with path.open("wb") as f:
        f.write(b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\xff")  # gzip member header, no name, no mtime
        f.write(deflate.compress(header) + deflate.flush(zlib.Z_FULL_FLUSH))
        block = deflate.compress(zeros) + deflate.flush(zlib.Z_FULL_FLUSH)
        for _ in range(zero_mib):
            f.write(block)
            crc = zlib.crc32(zeros, crc)
        f.write(deflate.flush(zlib.Z_FINISH))
        f.write(struct.pack("<II", crc, (len(header) + zero_mib * (1 << 20)) & 0xFFFFFFFF))


def _idx_header(shape: tuple[int, ...]) -> bytes:
    return b"\x00\x00\x08" + bytes([len(shape)]) + b"".join(n.to_bytes(4, "big") for n in shape)


def test_a_gzip_claiming_a_few_images_but_holding_a_gibibyte_is_refused_in_bounded_memory(tmp_path):
    path = tmp_path / "bomb-images-idx3-ubyte.gz"
    _write_inflating_gzip(path, _idx_header((10, 28, 28)), zero_mib=1024)
    assert path.stat().st_size < 2 << 20  # the test itself stays small
    tracemalloc.start()
    try:
        with pytest.raises(DataError, match="more data than its IDX header declares") as info:
            read_idx(path)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert str(path) in str(info.value)
    # what the header declares is 7,840 bytes; reading it all would have held 1 GiB
    assert peak < 32 << 20, f"peak {peak / 2**20:.0f} MiB"


def test_a_header_declaring_more_than_the_gzip_can_hold_is_refused_before_reading(tmp_path):
    path = tmp_path / "huge-images-idx3-ubyte.gz"
    with gzip.open(path, "wb") as f:
        f.write(_idx_header((60000, 4096, 4096)) + bytes(100))
    with pytest.raises(DataError, match=r"more than a .*-byte gzip file can hold"):
        read_idx(path)


def test_an_honest_gzip_idx_file_is_read_whole(tmp_path):
    images = np.arange(3 * 4 * 5, dtype=np.uint8).reshape(3, 4, 5)
    path = tmp_path / "ok-images-idx3-ubyte.gz"
    with gzip.open(path, "wb") as f:
        f.write(_idx_header(images.shape) + images.tobytes())
    np.testing.assert_array_equal(read_idx(path), images)
    short = tmp_path / "short-images-idx3-ubyte.gz"
    with gzip.open(short, "wb") as f:
        f.write(_idx_header(images.shape) + images.tobytes()[:-1])
    with pytest.raises(DataError, match="truncated IDX file"):
        read_idx(short)


#: IDX type codes of the dtypes below (big-endian, as the format stores them)
_CODES = {"u1": 0x08, "i1": 0x09, ">i2": 0x0B, ">i4": 0x0C, ">f4": 0x0D, ">f8": 0x0E}


def _idx_folder(folder: Path, images: np.ndarray, dtype: str, labels=None, gz: bool = True) -> Path:
    """An IDX pair of `images` stored as `dtype`, labels 0, 1, 0, ... unless given (as unsigned bytes)."""
    folder.mkdir(parents=True, exist_ok=True)
    labels = np.arange(len(images)) % 2 if labels is None else labels
    suffix = ".gz" if gz else ""
    label_dtype = "u1" if np.asarray(labels).dtype.kind in "iu" else ">f4"
    for name, array, kind in (("images-idx3", images, dtype), ("labels-idx1", labels, label_dtype)):
        array = np.asarray(array).astype(kind)
        head = bytes([0, 0, _CODES[kind], array.ndim]) + b"".join(int(n).to_bytes(4, "big") for n in array.shape)
        opener = gzip.open if gz else open
        with opener(folder / f"t-{name}-ubyte{suffix}", "wb") as f:
            f.write(head + array.tobytes())
    return folder


def _pixels(folder: Path, channels: int = 3) -> list[np.ndarray]:
    """The images of an IDX folder as the model's reader decodes them: (H, W, channels) uint8."""
    from leantrain.data.images import decode_image
    from leantrain.data.media import IMAGE, list_source

    return [decode_image(item, channels) for item in list_source(str(folder), IMAGE).items]


@pytest.mark.parametrize("gz", [True, False], ids=["gzip", "plain"])
@pytest.mark.parametrize("dtype", [">f4", ">f8"])
def test_float_idx_pixels_in_0_to_1_are_scaled_to_0_to_255_not_cast(tmp_path, dtype, gz):
    """A cast made 0.5 black and 1.0 all but black (1): floats are 0..1, as torchvision's ToTensor writes them."""
    grey = np.array([[[0.0, 0.5], [0.25, 1.0]], [[1.0, 1.0], [0.0, 0.003]]])
    got = _pixels(_idx_folder(tmp_path / "f", grey, dtype, gz=gz), channels=1)
    assert [g[:, :, 0].tolist() for g in got] == [[[0, 128], [64, 255]], [[255, 255], [0, 1]]]


@pytest.mark.parametrize(
    ("values", "needle"),
    [
        ([[[-0.4, 0.1]], [[0.2, 0.3]]], "span -0.4..0.3, but float pixels are read as 0..1"),  # normalised images
        ([[[0.0, 255.0]], [[17.0, 3.0]]], "span 0..255, but float pixels are read as 0..1"),
        ([[[0.0, np.nan]], [[0.5, 0.5]]], "include NaN or infinity"),
    ],
    ids=["normalised", "levels", "nan"],
)
def test_float_idx_pixels_outside_0_to_1_exit_2_naming_the_file(tmp_path, capsys, values, needle):
    from leantrain.commands.cli import main

    folder = _idx_folder(tmp_path / "f", np.array(values), ">f4")
    argv = ["train", "--model", "preset:tiny-vit", "--data", str(folder), "--cache-dir", str(tmp_path / "c"),
            "--output-dir", str(tmp_path / "r"), "--no-progress"]  # fmt: skip
    code = main(argv)
    err = capsys.readouterr().err
    assert code == 2 and needle in err and "t-images-idx3-ubyte.gz" in err and "Traceback" not in err, err
    assert len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("dtype", ["i1", ">i2", ">i4"])
def test_wider_integer_idx_pixels_in_0_to_255_are_read_and_others_refused(tmp_path, dtype):
    levels = np.array([[[0, 100], [200, 255]], [[7, 8], [9, 10]]])
    if dtype == "i1":
        levels = levels // 2  # 0..127: all a signed byte holds of 0..255
    assert [g[:, :, 0].tolist() for g in _pixels(_idx_folder(tmp_path / "ok", levels, dtype), 1)] == levels.tolist()
    wide = levels.copy()
    wide[1, 0, 0] = -3 if dtype == "i1" else 4095  # a 12-bit sensor's white: a cast kept its low byte
    with pytest.raises(DataError, match=r"t-images-idx3-ubyte.gz: IDX int\d+ values span .*outside the 0..255"):
        _pixels(_idx_folder(tmp_path / "wide", wide, dtype))


def test_rgba_idx_images_keep_their_rgb_as_pillow_converts_them(tmp_path):
    """An (N, H, W, 4) file kept only its red channel (three times); its RGB is kept and alpha dropped."""
    from PIL import Image

    rng = np.random.default_rng(0)
    rgba = rng.integers(0, 256, (3, 4, 5, 4)).astype(np.uint8)
    folder = _idx_folder(tmp_path / "rgba", rgba, "u1")
    for got, want in zip(_pixels(folder, 3), rgba):
        np.testing.assert_array_equal(got, want[:, :, :3])
    for got, want in zip(_pixels(folder, 1), rgba):  # grey as Pillow makes it of a PNG: the luma of RGB
        np.testing.assert_array_equal(got[:, :, 0], np.asarray(Image.fromarray(want).convert("L")))
    rgb = _idx_folder(tmp_path / "rgb", rgba[..., :3], "u1", gz=False)
    for got, want in zip(_pixels(rgb, 3), rgba):
        np.testing.assert_array_equal(got, want[:, :, :3])


def test_idx_images_of_other_channel_counts_and_fractional_labels_are_refused(tmp_path):
    five = np.zeros((2, 3, 3, 5), dtype=np.uint8)
    with pytest.raises(DataError, match=r"have 5 channels; .*3 \(RGB\) or 4 \(RGBA\)"):
        _pixels(_idx_folder(tmp_path / "five", five, "u1"))
    grey = np.zeros((3, 2, 2), dtype=np.uint8)
    with pytest.raises(DataError, match=r"t-labels-idx1-ubyte.gz: IDX labels are class numbers, but label 1 is 1.5"):
        _pixels(_idx_folder(tmp_path / "frac", grey, "u1", labels=np.array([1.0, 1.5, 2.0])))
    from leantrain.data.media import IMAGE, list_source

    whole = _idx_folder(tmp_path / "whole", grey, "u1", labels=np.array([1.0, 0.0, 2.0]))
    assert list_source(str(whole), IMAGE).labels == ["1", "0", "2"]
