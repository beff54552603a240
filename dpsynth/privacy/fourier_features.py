"""Random Fourier features and their DP per-class means: FETA-Pro's frequency features (Eq. 5-6) and DP-MERF's
mean embeddings.

phi(x) = sqrt(2 / D) [cos(W x), sin(W x)] with the D / 2 rows of W drawn from N(0, I / bandwidth), so
||phi(x)|| = 1 exactly for every image x. The frequencies W are public: drawn from a fixed seed, never
from the data.

Per class, the sum of phi over the class's images changes by at most ||phi(x)|| = 1 (L2) when one image
is added or removed, so it gets N(0, sigma_f^2 I) noise (sensitivity 1, noise multiplier sigma_f). The
paper divides by the class size n_c and ignores that n_c is itself private; here each class's size is
released once with Gaussian noise (``count_noise``) and recorded, and the noisy sum is divided by the
noisy size. Classes are disjoint: both releases of every class compose in parallel. With groups, each
image is weighted 1 / (its group's images) in the sums and sizes, so a group moves all classes' sums
together by at most 1, and their sizes too (:func:`~dpsynth.privacy.events.per_class`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ..config import at_least, one_of, positive
from ..data import DatasetInfo, ImageSet
from ..errors import ConfigError
from ..utils.images import as_floats
from .events import Event, GaussianMechanism, per_class
from .ledger import PrivacyLedger
from .mechanisms import gaussian_noise, noisy_count, release_gaussian
from .randomness import SecretStream

CLASS_ROW_SENSITIVITY = math.sqrt(2)  # one image moves its class's (feature sum, size) row by (phi(x), 1)


class RandomFourierFeatures:
    """``features`` random Fourier features (cos and sin halves) of flattened images of ``dimension`` values."""

    def __init__(self, dimension: int, features: int, bandwidth: float, seed: int) -> None:
        if features < 2 or features % 2:
            raise ValueError(f"the number of features must be even and at least 2, got {features}")
        if not bandwidth > 0:
            raise ValueError(f"the bandwidth must be positive, got {bandwidth}")
        generator = torch.Generator().manual_seed(seed)
        self.frequencies = torch.randn((features // 2, dimension), generator=generator) / bandwidth ** 0.5
        self.features = features

    def __call__(self, images: torch.Tensor) -> torch.Tensor:
        """N x D features of N images (any shape with C * H * W = dimension values); each row has norm 1."""
        projected = images.flatten(1) @ self.frequencies.to(images).T
        return torch.cat([projected.cos(), projected.sin()], dim=1) * (2 / self.features) ** 0.5

    def summed(self, images: torch.Tensor, weights: torch.Tensor, chunk: int = 2048) -> torch.Tensor:
        """Sum of the features of ``images``, each times its weight, computed ``chunk`` images at a time."""
        total = torch.zeros(self.features, dtype=torch.float64)
        for start in range(0, len(images), chunk):
            features = self(as_floats(images[start:start + chunk])).double()
            total += (features * weights[start:start + chunk, None].double()).sum(dim=0)
        return total


def class_feature_sums(train: ImageSet, num_classes: int, rff: RandomFourierFeatures
                       ) -> tuple[torch.Tensor, torch.Tensor]:
    """Per class (rows), the features of its images summed with their unit weights (num_classes x D, float64) and
    the weights summed, its size in units (num_classes): one unit moves the sums, side by side, by at most 1 in L2
    norm, and the sizes by at most 1 (:meth:`~dpsynth.data.ImageSet.unit_weights`)."""
    weights = train.unit_weights()
    members = [train.labels == label for label in range(num_classes)]
    sums = torch.stack([rff.summed(train.images[chosen], weights[chosen]) for chosen in members])
    return sums, torch.stack([weights[chosen].sum() for chosen in members])


KERNEL_VALUES = 784  # the values of a 28 x 28 grey image, where DPImageBench's bandwidth 105 was tuned


@dataclass(frozen=True, kw_only=True)
class FrequencySettings:
    """The ``frequency`` section: ``features`` random Fourier features (an even number) at ``bandwidth`` from a
    public ``seed`` (DPImageBench's DP-MERF: 10,000 at 105). ``bandwidth_scaling``: ``none`` uses ``bandwidth`` at
    every shape; ``values`` reads it as the bandwidth of a 28 x 28 grey image and scales it by the image's number of
    values over 784, as squared distances between images grow with it (on the scan folders the median squared
    distance between two images was 97 at 28 px, 597 at 64 and 2,488 at 128: 105, 549 and 2,194 scaled)."""

    features: int = at_least(2, default=10000)
    bandwidth: float = positive(default=105.0)
    bandwidth_scaling: str = one_of("none", "values", default="none")
    seed: int = 0

    def bandwidth_for(self, dimension: int) -> float:
        """The kernel's bandwidth for images of ``dimension`` values."""
        return self.bandwidth * (dimension / KERNEL_VALUES if self.bandwidth_scaling == "values" else 1.0)

    def __post_init__(self) -> None:
        if self.features % 2:
            raise ConfigError(f"frequency.features must be an even number (cos and sin halves), got {self.features}")

    def features_of(self, info: DatasetInfo) -> RandomFourierFeatures:
        """The features of ``info``'s images (all their values, flattened)."""
        dimension = info.channels * info.height * info.width
        return RandomFourierFeatures(dimension, self.features, self.bandwidth_for(dimension), self.seed)


@dataclass(frozen=True)
class FrequencyQuery:
    """Per class: the feature sum with noise multiplier ``noise`` and the size with ``count_noise``."""

    noise: float
    count_noise: float

    def events(self, num_classes: int, grouped: bool) -> tuple[Event, ...]:
        """What the releases of all classes do, over images or over groups (``grouped``)."""
        return per_class((GaussianMechanism(self.noise), GaussianMechanism(self.count_noise)), num_classes, grouped)


def noisy_class_means(train: ImageSet, num_classes: int, rff: RandomFourierFeatures, query: FrequencyQuery,
                      ledger: PrivacyLedger, stage: str, noise: SecretStream) -> torch.Tensor:
    """num_classes x D noisy mean features; the releases are recorded before they run."""
    for event in query.events(num_classes, train.groups is not None):
        ledger.record(stage, event)
    sums, sizes = class_feature_sums(train, num_classes, rff)
    means = []
    for total, size in zip(sums, sizes.tolist(), strict=True):
        total = total + gaussian_noise(total.shape, query.noise, noise, total)
        means.append(total / max(1, noisy_count(size, query.count_noise, noise)))
    return torch.stack(means).float()


def released_class_means(train: ImageSet, num_classes: int, rff: RandomFourierFeatures, noise_multiplier: float,
                         ledger: PrivacyLedger, stage: str, noise: SecretStream) -> torch.Tensor:
    """num_classes x D: per class, the noisy feature sum over the noisy size, from one Gaussian mechanism on
    the (sum, size) rows (L2 sensitivity sqrt(2)), recorded before it runs."""
    sums, sizes = class_feature_sums(train, num_classes, rff)
    rows = torch.cat([sums, sizes[:, None]], dim=1)
    noisy = release_gaussian(rows, CLASS_ROW_SENSITIVITY, noise_multiplier, ledger, stage, noise)
    return (noisy[:, :-1] / noisy[:, -1:].round().clamp_min(1.0)).float()  # the size rounded: see release_counts
