"""Images a Python user holds in memory (NumPy arrays or tensors, as a notebook has them) as a dataset, the ``memory``
source: held in this process under the SHA-256 of their contents, which names them in a run's configuration
(``dataset.data_dir: memory:<digest>``) and in the holder's ledger, so the same arrays fitted again are the same
data (and a stopped run resumes once they are held again). They are held while a fit runs, not after it."""
from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..errors import DataError
from .base import RawDataset
from .sources import LoadOptions, checked_image_array, group_ids

PREFIX = "memory:"
_HELD: dict[str, RawDataset] = {}


def hold_arrays(images: Any, labels: Any, groups: Any = None, class_names: Sequence[str] | None = None,
                num_classes: int | None = None) -> str:
    """Hold ``images`` (N x C x H x W, N x H x W x C or N x H x W; uint8, or floats in [0, 1]) with their integer
    ``labels``, optional ``groups`` (a person's id per image) and class names (or ``num_classes``: they are not
    read from the labels, which would leak which classes the private records hold); returns the ``data_dir`` that
    names them. DataError naming the argument otherwise."""
    label_array = _array(labels, "labels")
    if label_array.ndim != 1 or not np.issubdtype(label_array.dtype, np.integer):
        raise DataError(f"labels must be a 1-D integer array, got {label_array.dtype} {label_array.shape}")
    image_array = checked_image_array(_array(images, "images"), "images")
    if len(image_array) != len(label_array):
        raise DataError(f"images ({len(image_array)}) and labels ({len(label_array)}) must be as many")
    if class_names is None and num_classes is None:
        raise DataError("give class_names (or num_classes): they are not read from the labels, which would leak "
                        "which classes the private records hold")
    names = [str(name) for name in class_names] if class_names is not None else \
        [str(c) for c in range(num_classes or 0)]
    if label_array.min(initial=0) < 0 or label_array.max(initial=0) >= len(names):
        raise DataError(f"labels must lie in 0 .. {len(names) - 1} (one per class name)")
    group_array = None if groups is None else group_ids(_array(groups, "groups"), len(label_array), "groups")
    digest = hashlib.sha256()
    for part in (image_array, label_array.astype(np.int64), group_array, np.array(names)):
        if part is not None:
            digest.update(str(part.shape).encode() + np.ascontiguousarray(part).tobytes())
    key = PREFIX + digest.hexdigest()
    _HELD[key] = RawDataset(image_array, label_array.astype(np.int64), names, "arrays in memory", groups=group_array)
    return key


def let_go(data_dir: str) -> None:
    """Stop holding the arrays named ``data_dir`` (a fit that ended no longer needs them; resuming hands them over
    again)."""
    _HELD.pop(data_dir, None)


def load_memory(options: LoadOptions) -> RawDataset:
    """The arrays held under ``options.data_dir``; DataError when this process holds none under that name."""
    key = str(options.data_dir or "")
    if key not in _HELD:
        raise DataError(f"dataset 'memory': no arrays held as {key or 'nothing'!r} in this process; hand them to "
                        "dpsynth.Synthesizer.fit (the same arrays are held under the same name)")
    return _HELD[key]


def _array(value: Any, name: str) -> np.ndarray:
    """``value`` (an array, a tensor or a sequence) as a NumPy array."""
    if hasattr(value, "detach"):  # a torch tensor, on any device
        value = value.detach().cpu().numpy()
    try:
        return np.asarray(value)
    except (TypeError, ValueError) as error:
        raise DataError(f"{name}: not an array ({error})") from None
