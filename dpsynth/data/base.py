"""Dataset containers shared by every loader."""
from __future__ import annotations

import warnings
from dataclasses import dataclass, field, replace

import numpy as np
import torch
from torch.nn import functional

from ..errors import DataError


@dataclass(frozen=True)
class ImageSet:
    """Images N x C x H x W with int64 labels, and each image's group (the person it is of; int64 ids) where the
    data has groups. Loaded data holds its images as uint8 0..255 (a quarter of float32's memory) and its readers
    convert what they use (:func:`~dpsynth.utils.images.as_floats`); generated sets hold float32 in [0, 1]."""

    images: torch.Tensor
    labels: torch.Tensor
    groups: torch.Tensor | None = None

    def __len__(self) -> int:
        return int(self.labels.shape[0])

    def subset(self, index: torch.Tensor) -> ImageSet:
        """The images, labels and groups at ``index``."""
        return ImageSet(self.images[index], self.labels[index], None if self.groups is None else self.groups[index])

    def joined(self, other: ImageSet) -> ImageSet:
        """This set's images followed by ``other``'s (both with groups, or neither; both uint8, or both float)."""
        if (self.groups is None) != (other.groups is None):
            raise DataError("image sets to join must both have groups or neither")
        if self.images.dtype != other.images.dtype:
            raise DataError(f"image sets to join must hold the same pixel type, got {self.images.dtype} and "
                            f"{other.images.dtype}")
        groups = None if self.groups is None or other.groups is None else torch.cat([self.groups, other.groups])
        return ImageSet(torch.cat([self.images, other.images]), torch.cat([self.labels, other.labels]), groups)

    @property
    def num_units(self) -> int:
        """The records that privacy protects: groups where the set has them, else images."""
        return len(self) if self.groups is None else int(self.groups.unique().numel())

    def unit_index(self) -> torch.Tensor:
        """Each image's unit as 0 .. num_units - 1: its group's rank among the set's groups, else its own index."""
        if self.groups is None:
            return torch.arange(len(self))
        return torch.unique(self.groups, return_inverse=True)[1]

    def unit_weights(self) -> torch.Tensor:
        """Each image's weight (float64) in a sum that bounds what one unit adds: 1 / the number of its group's
        images in the set, so a group's images weigh 1 together and add at most what one image may to any sum
        of per-image terms (the triangle inequality); ones without groups."""
        if self.groups is None:
            return torch.ones(len(self), dtype=torch.float64)
        index = self.unit_index()
        return 1.0 / torch.bincount(index).double()[index]


@dataclass(frozen=True)
class RawDataset:
    """What a loader reads from disk: uint8 N x C x H x W arrays, labels, optional official test part."""

    images: np.ndarray
    labels: np.ndarray
    class_names: list[str]
    source: str
    test_images: np.ndarray | None = None
    test_labels: np.ndarray | None = None
    shape_decision: str | None = None  # how a loader chose the channels and size it read the images at
    groups: np.ndarray | None = None  # each image's group (int64 ids), where the data names them
    group_source: str | None = None  # where the groups come from (a folder's groups.csv or person folders)
    pixel_rule: str | None = None  # how a loader maps high-depth values to 8 bits
    skipped: tuple[str, ...] = ()  # files a loader passed over (no image format's suffix)


# How the training split's size used for planning became public (:attr:`DatasetInfo.size_rule`).
SIZE_RULES = ("published", "declared", "noisy")


@dataclass(frozen=True)
class DatasetInfo:
    """Metadata of a loaded dataset.

    ``split_sizes`` are the exact counts, private to the data holder. ``public_train`` is the training split's size
    that planning uses (sample rates, steps, delta, the divisors of noisy sums) and a release may show, and
    ``size_rule`` says how it became public (:data:`SIZE_RULES`); ``"private"`` while it has not (own data before a
    run draws a noisy count). ``official_test`` says whether the test split is the dataset's own test part;
    ``public_held_out``, a standard set's validation and test sizes as its published sizes give them.
    ``shape_decision``: how the channels and size were chosen from the images, where the loader chose them;
    ``pixel_rule``: how high-depth values map to 8 bits; ``skipped``: files the loader passed over. With groups
    (``group_counts``, from ``group_source``), the unit of privacy is one group: N and every size rule count
    groups.
    """

    name: str
    channels: int
    height: int
    width: int
    class_names: list[str]
    source: str
    split_sizes: dict[str, int] = field(default_factory=dict)
    public_train: int | None = None
    size_rule: str = "private"
    official_test: bool = False
    public_held_out: dict[str, int] | None = None  # a standard set's validation and test sizes as published
    shape_decision: str | None = None
    group_counts: dict[str, int] | None = None  # groups per split, where the data has groups (private, as sizes)
    group_source: str | None = None
    pixel_rule: str | None = None
    skipped: tuple[str, ...] = ()
    release_side: int | None = None  # where training reads the images smaller: the side a release is lifted to

    @property
    def num_classes(self) -> int:
        return len(self.class_names)

    @property
    def shape(self) -> tuple[int, int, int]:
        return (self.channels, self.height, self.width)

    @property
    def unit_counts(self) -> dict[str, int]:
        """The exact number of privacy units per split: groups where the data has them, else images."""
        return self.group_counts if self.group_counts is not None else self.split_sizes

    @property
    def unit(self) -> str:
        return "group" if self.group_counts is not None else "image"

    def unit_words(self) -> str:
        """The unit of privacy in words; without groups, what that means for a person and how to add groups."""
        if self.group_counts is not None:
            return f"one group of images (a person; from {self.group_source or 'the data'})"
        return ("one image. A person with k images in the data is protected as k records: their epsilon is up to "
                "k times larger. If a person can have several images, give each person a sub-folder of their own "
                "under the class folder (class/person/image), or name their images in groups.csv")

    @property
    def num_train(self) -> int:
        """N, the training split's number of units for planning: the public one when there is one, else
        (``size_rule`` private, never released) the exact count."""
        return self.public_train if self.public_train is not None else self.unit_counts["train"]


@dataclass(frozen=True)
class Dataset:
    """A dataset split into private train, private validation and test parts."""

    info: DatasetInfo
    train: ImageSet
    val: ImageSet
    test: ImageSet

    def at_side(self, side: int) -> Dataset:
        """This dataset with every split's images shrunk to ``side`` x ``side`` by area averaging (uint8 stays uint8),
        its info saying the side it was read at (``release_side``)."""
        def shrunk(images: ImageSet) -> ImageSet:
            chunks = [functional.interpolate(chunk.float(), size=(side, side), mode="area") for chunk
                      in images.images.split(4096)]
            pixels = torch.cat(chunks)
            return ImageSet(pixels.round().to(torch.uint8) if images.images.dtype == torch.uint8 else pixels,
                            images.labels, images.groups)

        info = replace(self.info, height=side, width=side, release_side=self.info.release_side or self.info.height)
        return Dataset(info, shrunk(self.train), shrunk(self.val), shrunk(self.test))

    def split(self, name: str) -> ImageSet:
        """The split called ``name`` (train, val or test)."""
        if name not in ("train", "val", "test"):
            raise DataError(f"unknown split {name!r}: expected one of train, val, test")
        return getattr(self, name)


def to_image_set(images: np.ndarray, labels: np.ndarray, groups: np.ndarray | None = None) -> ImageSet:
    """Convert uint8 N x C x H x W images (kept uint8, not copied: a cached folder's memory map stays one until
    the splits are drawn from it), integer labels and group ids to tensors."""
    with warnings.catch_warnings():  # a read-only memory map: nothing writes to loaded images
        warnings.filterwarnings("ignore", "The given NumPy array is not writable")
        pixels = torch.from_numpy(np.asarray(images, dtype=np.uint8))
    return ImageSet(
        pixels,
        torch.from_numpy(np.asarray(labels, dtype=np.int64)),
        None if groups is None else torch.from_numpy(np.asarray(groups, dtype=np.int64)),
    )


def check_images_labels(images: np.ndarray, labels: np.ndarray, num_classes: int, where: str) -> None:
    """Raise DataError unless images and labels agree in count and labels lie in [0, num_classes)."""
    if images.ndim != 4:
        raise DataError(f"{where}: expected images of shape N x C x H x W, got shape {images.shape}")
    if labels.ndim != 1:
        raise DataError(f"{where}: expected a 1-D label array, got shape {labels.shape}")
    if images.shape[0] != labels.shape[0]:
        raise DataError(f"{where}: {images.shape[0]} images but {labels.shape[0]} labels; the counts must match")
    if images.shape[0] == 0:
        raise DataError(f"{where}: no images")
    low, high = int(labels.min()), int(labels.max())
    if low < 0 or high >= num_classes:
        raise DataError(f"{where}: labels must lie in [0, {num_classes - 1}], found values from {low} to {high}")
