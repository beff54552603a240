"""Reading the IDX files of MNIST and Fashion-MNIST, gzipped or not."""
from __future__ import annotations

import gzip
import zlib
from pathlib import Path

import numpy as np

from ..errors import DataError

_GZIP_MAGIC = b"\x1f\x8b"
_UBYTE = 0x08


def read_bytes(path: Path) -> bytes:
    """The file's content, decompressed if it is gzip; DataError on a truncated or corrupt archive."""
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise DataError(f"{path}: cannot read file ({exc.strerror})") from None
    if not raw.startswith(_GZIP_MAGIC):
        return raw
    try:
        return gzip.decompress(raw)
    except (EOFError, OSError, zlib.error) as exc:
        raise DataError(f"{path}: corrupt or truncated gzip archive ({exc})") from None


def read_idx(path: Path, ndim: int) -> np.ndarray:
    """Read an unsigned-byte IDX array with ``ndim`` dimensions (3 for images, 1 for labels)."""
    data = read_bytes(path)
    header_size = 4 + 4 * ndim
    if len(data) < header_size:
        raise DataError(f"{path}: file too short for an IDX header ({len(data)} bytes)")
    if data[0] != 0 or data[1] != 0 or data[2] != _UBYTE or data[3] != ndim:
        raise DataError(
            f"{path}: not an IDX unsigned-byte file with {ndim} dimension(s): "
            f"magic bytes {data[:4].hex()}, expected 000008{ndim:02x}"
        )
    dims = tuple(int.from_bytes(data[4 + 4 * i: 8 + 4 * i], "big") for i in range(ndim))
    expected = int(np.prod(dims))
    payload = len(data) - header_size
    if payload != expected:
        raise DataError(
            f"{path}: header declares shape {dims} ({expected} bytes of data) but the file holds {payload}; "
            "it is truncated or corrupt"
        )
    return np.frombuffer(data, dtype=np.uint8, offset=header_size).reshape(dims)


def find_idx_file(directory: Path, stem: str) -> Path | None:
    """The file for ``stem`` (e.g. ``train-images-idx3-ubyte``) in its usual spellings, if present."""
    dotted = stem.replace("-idx", ".idx")
    for name in (stem, f"{stem}.gz", dotted, f"{dotted}.gz"):
        candidate = directory / name
        if candidate.is_file():
            return candidate
    return None
