"""Image fingerprints: checking, not assuming, that "public" data holds none of the private images.

An image's fingerprint is a 64-bit BLAKE2b hash of its grey levels quantised to 8 bits (the channel mean), so
a copy in another file format (CSV, IDX, npz, PNG) or an RGB copy of a grey image has the same fingerprint.
A resized or re-encoded copy has another one: the check catches exact copies, not near-duplicates.
"""
from __future__ import annotations

import hashlib
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import torch

from ..errors import DataError
from ..utils.images import as_floats, to_uint8
from .base import Dataset

FINGERPRINTS = "fingerprints.npy"
SPLITS = ("train", "val", "test")
FINGERPRINT_CHUNK = 4096  # images converted to float at a time


def fingerprints(images: torch.Tensor) -> np.ndarray:
    """The sorted, distinct fingerprints of ``images`` (N x C x H x W, uint8 or in [0, 1]), a chunk at a time."""
    digests = [hashlib.blake2b(image.tobytes(), digest_size=8).digest() for chunk in images.split(FINGERPRINT_CHUNK)
               for image in to_uint8(as_floats(chunk).mean(dim=1))]
    return np.unique(np.frombuffer(b"".join(digests), dtype="<u8"))


def load_fingerprints(directory: str | Path, expected: int | None = None, at_most: int | None = None
                      ) -> np.ndarray | None:
    """The fingerprints saved in ``directory``, or None when it has none; DataError for an empty set, or one of
    another count than the ``expected`` one (or over ``at_most``) that the model's training record gives."""
    path = Path(directory) / FINGERPRINTS
    if not path.is_file():
        return None
    try:
        values = np.load(path, allow_pickle=False)
    except (OSError, ValueError) as exc:
        raise DataError(f"{path}: unreadable fingerprint file ({exc})") from None
    if values.dtype != np.uint64 or values.ndim != 1:
        raise DataError(f"{path}: expected a 1-D uint64 array of image fingerprints, found {values.dtype} "
                        f"{values.shape}")
    if len(values) == 0 or len(values) != (expected or len(values)) or len(values) > (at_most or len(values)):
        wanted = f"{expected}, as its training record says" if expected else f"1 to {at_most or 'any number'}"
        raise DataError(f"{path}: holds {len(values)} fingerprints, expected {wanted}: it cannot show that the "
                        "model's training images are not private ones; write it again with dpsynth pretrain")
    return values


def check_disjoint(public: Mapping[str, np.ndarray], private: Dataset) -> None:
    """DataError naming the counts when any public set (fingerprints by name) holds an image of any private split."""
    if not public:
        return
    private_prints = {split: fingerprints(private.split(split).images) for split in SPLITS}
    for name, prints in public.items():
        shared = {split: int(np.isin(found, prints).sum()) for split, found in private_prints.items()}
        if any(shared.values()):
            counts = ", ".join(f"{count} of the {len(private.split(split))} {split} images" for split, count in
                               shared.items())
            raise DataError(f"{name} is not disjoint from the private dataset {private.info.name!r}: it holds "
                            f"{counts} (exact copies, by fingerprint); using it as public data would release "
                            "private images. Choose public data that holds none of the private images")
