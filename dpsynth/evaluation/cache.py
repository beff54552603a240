"""On-disk cache of Inception features of real images, keyed by the images' bytes and the preprocessing."""
from __future__ import annotations

import hashlib
import io
import os
from collections.abc import Callable
from pathlib import Path

import numpy as np

from ..utils.io import atomic_write


def default_cache_dir() -> Path:
    """``$DPSYNTH_CACHE`` or ``~/.cache/dpsynth``."""
    return Path(os.environ.get("DPSYNTH_CACHE", Path.home() / ".cache" / "dpsynth"))


def cache_key(images: np.ndarray, preprocessing: str) -> str:
    """SHA-256 of the uint8 images (shape included) and the feature extractor's preprocessing tag."""
    digest = hashlib.sha256(f"{images.shape}|{images.dtype}|{preprocessing}".encode())
    digest.update(np.ascontiguousarray(images).data)
    return digest.hexdigest()[:32]


class FeatureCache:
    """Features of a fixed image set are computed once, then read from ``<dir>/features/<key>.npy``."""

    def __init__(self, directory: str | Path | None = None) -> None:
        self.directory = Path(directory) if directory is not None else default_cache_dir()

    def get(self, images: np.ndarray, preprocessing: str, compute: Callable[[np.ndarray], np.ndarray]
            ) -> np.ndarray:
        """Cached features of ``images``, computing (and storing) them with ``compute`` on a miss."""
        path = self.directory / "features" / f"{cache_key(images, preprocessing)}.npy"
        if path.is_file():
            try:
                features = np.load(path)
                if features.shape[0] == len(images):
                    return features
            except (OSError, ValueError):
                pass  # a damaged entry is recomputed and overwritten
        features = compute(images)
        path.parent.mkdir(parents=True, exist_ok=True)
        buffer = io.BytesIO()
        np.save(buffer, features)
        atomic_write(path, lambda handle: handle.write(buffer.getvalue()))
        return features
