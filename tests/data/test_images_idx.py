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
