"""Reading a synthetic release (``synthetic.npz``) back, checked against the dataset it imitates."""
from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ..data import Dataset, DatasetInfo, ImageSet
from ..data.fingerprints import fingerprints
from ..data.sources import LoadOptions, load_npz
from ..errors import DataError
from ..privacy import PrivacyLedger

LEDGER_DIR_VARIABLE = "DPSYNTH_LEDGER_DIR"


@dataclass(frozen=True)
class Release:
    """Synthetic uint8 images N x C x H x W, hard labels, optional soft labels N x K at a temperature, and the
    class names."""

    images: np.ndarray
    labels: np.ndarray
    soft_labels: np.ndarray | None = None
    soft_label_temperature: float = 1.0
    class_names: tuple[str, ...] = ()

    def __len__(self) -> int:
        return len(self.labels)

    def image_set(self) -> ImageSet:
        return ImageSet(torch.from_numpy(self.images).float().div_(255), torch.from_numpy(self.labels))

    def soft_label_tensor(self, temperature: float | None = None) -> torch.Tensor | None:
        """The soft labels, re-tempered to ``temperature`` when given: softmax((T / temperature) log p), the
        teacher's softmax at that temperature (its logits are T log p up to a constant)."""
        if self.soft_labels is None:
            return None
        probabilities = torch.from_numpy(self.soft_labels).double()
        if temperature is None or temperature == self.soft_label_temperature:
            return probabilities.float()
        return torch.softmax(probabilities.log() * (self.soft_label_temperature / temperature), dim=1).float()


def selection_ledger(dataset: Dataset, split_seed: int) -> PrivacyLedger:
    """The ledger of every model selection on ``dataset``'s validation split, under ``$DPSYNTH_LEDGER_DIR``
    (default ``~/.local/share/dpsynth/evaluation-ledgers``), named by the dataset, the split seed and the
    fingerprints of the validation images: every evaluation that selects on the same private records, of a run
    or of a file, of any release, adds to the same ledger."""
    root = Path(os.environ.get(LEDGER_DIR_VARIABLE) or Path.home() / ".local/share/dpsynth/evaluation-ledgers")
    digest = hashlib.sha256(f"{dataset.info.name}|{split_seed}|".encode())
    digest.update(fingerprints(dataset.val.images).tobytes())
    path = root / f"validation-{digest.hexdigest()}.json"
    return PrivacyLedger.load(path) if path.exists() else PrivacyLedger(path)


def read_release(path: str | Path, num_classes: int | None = None) -> Release:
    """The release in ``path`` (a ``synthetic.npz``), its arrays checked (against ``num_classes`` when given,
    which stands in for missing class names); DataError naming the file otherwise."""
    path = Path(path)
    raw = load_npz(LoadOptions(data_dir=path, num_classes=num_classes))
    with np.load(path, allow_pickle=False) as archive:
        soft = archive["soft_labels"].astype(np.float32) if "soft_labels" in archive.files else None
        temperature = float(archive["soft_label_temperature"]) if "soft_label_temperature" in archive.files else 1.0
    if soft is not None:
        _check_soft_labels(soft, len(raw.labels), len(raw.class_names), path)
    if not (np.isfinite(temperature) and temperature > 0):
        raise DataError(f"{path}: 'soft_label_temperature' must be a positive number, got {temperature}")
    return Release(raw.images, raw.labels, soft, temperature, tuple(raw.class_names))


def load_release(path: str | Path, info: DatasetInfo) -> Release:
    """The release in ``path``; DataError unless its images and labels fit ``info``'s shape and classes."""
    path = Path(path)
    release = read_release(path, info.num_classes)
    if release.images.shape[1:] != info.shape:
        raise DataError(f"{path}: images are {release.images.shape[1:]} (C x H x W) but dataset {info.name!r} "
                        f"has {info.shape}; evaluate against the dataset the release imitates")
    return release


def _check_soft_labels(soft: np.ndarray, count: int, num_classes: int, path: Path) -> None:
    if soft.shape != (count, num_classes):
        raise DataError(f"{path}: 'soft_labels' must be {count} x {num_classes}, got {soft.shape}")
    if not np.isfinite(soft).all() or soft.min() < 0 or not np.allclose(soft.sum(axis=1), 1, atol=1e-3):
        raise DataError(f"{path}: 'soft_labels' rows must be probability vectors (non-negative, summing to 1)")
