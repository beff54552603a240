"""DP central images (DP-FETA, Alg. 1 and 2): noisy mean images and noisy mode images, per class.

Each query Poisson-samples the class's training images at rate q. Classes are disjoint, so the queries of
different classes compose in parallel; the whole set of queries is recorded in the ledger, as one
parallel composition, before any noisy output exists.

Mean images (Alg. 1) divide a noisy clipped sum by the expected sample size q * n_c. The paper takes
the class size n_c as known; it is a statistic of the private data, so here each class's size is
released once with Gaussian noise (``count_noise``) and recorded too. Mode images (Alg. 2) need no size.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ...data import ImageSet
from ...errors import ConfigError
from ...privacy import GaussianMechanism, ParallelComposition, PrivacyLedger, SubsampledGaussianMechanism
from ...privacy.events import SimpleEvent
from ...privacy.mechanisms import clip_rows, gaussian_noise, poisson_sample

KINDS = ("mean", "mode")


@dataclass(frozen=True)
class CentralQuery:
    """``count`` queries per class at rate ``sample_rate`` with noise multiplier ``noise``.

    ``clip`` bounds each image's L2 norm (mean images); ``bins`` is the histogram size (mode images);
    ``count_noise`` is the noise multiplier of each class-size release (mean images).
    """

    kind: str
    count: int
    sample_rate: float
    noise: float
    clip: float
    bins: int
    count_noise: float

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ConfigError(f"central.kind must be one of {', '.join(KINDS)}, got {self.kind!r}")
        if not 0 < self.sample_rate <= 1:
            raise ConfigError(f"central.batch_size gives a sampling rate of {self.sample_rate:.4g}; "
                              "it must lie in (0, 1]: use a batch size no larger than the training set")
        if self.kind == "mode" and self.bins < 2:
            raise ConfigError(f"central.bins must be at least 2, got {self.bins}")

    def class_events(self) -> tuple[SimpleEvent, ...]:
        """What the queries of one class do."""
        queries: tuple[SimpleEvent, ...] = (SubsampledGaussianMechanism(self.noise, self.sample_rate, self.count),)
        return queries + ((GaussianMechanism(self.count_noise),) if self.kind == "mean" else ())

    def event(self, num_classes: int) -> ParallelComposition:
        return ParallelComposition("label", {str(c): self.class_events() for c in range(num_classes)})


def mean_image(images: torch.Tensor, query: CentralQuery, size: float, generator: torch.Generator) -> torch.Tensor:
    """One noisy mean (Alg. 1): clipped sum of a Poisson sample plus N(0, (sigma C)^2), over q * size."""
    chosen = clip_rows(images[poisson_sample(len(images), query.sample_rate, generator)], query.clip)
    total = chosen.sum(dim=0) + gaussian_noise(images.shape[1:], query.noise * query.clip, generator, images)
    return (total / (query.sample_rate * size)).clamp(0, 1)


def pixel_histogram(images: torch.Tensor, bins: int) -> torch.Tensor:
    """Counts per pixel and bin (P x bins) of images in [0, 1]; bin k holds [k / bins, (k + 1) / bins)."""
    index = (images.flatten(1) * bins).long().clamp(0, bins - 1)
    return torch.nn.functional.one_hot(index, bins).sum(dim=0)


def mode_image(images: torch.Tensor, query: CentralQuery, generator: torch.Generator) -> torch.Tensor:
    """One noisy mode image (Alg. 2): per-pixel histogram plus N(0, sigma^2 P), centre of the noisy argmax bin.

    Adding or removing one image changes one bin of every pixel by 1: L2 sensitivity sqrt(P).
    """
    histogram = pixel_histogram(images[poisson_sample(len(images), query.sample_rate, generator)], query.bins)
    pixels = histogram.shape[0]
    noisy = histogram.double() + gaussian_noise(histogram.shape, query.noise * pixels ** 0.5, generator,
                                                histogram.double())
    return ((noisy.argmax(dim=1).float() + 0.5) / query.bins).reshape(images.shape[1:])


def central_images(train: ImageSet, num_classes: int, query: CentralQuery, ledger: PrivacyLedger, stage: str,
                   generator: torch.Generator) -> ImageSet:
    """``query.count`` central images per class, labelled; the queries are recorded before they run."""
    ledger.record(stage, query.event(num_classes))
    images, labels = [], []
    for label in range(num_classes):
        members = train.images[train.labels == label]
        if query.kind == "mean":
            size = max(1.0, len(members) + float(torch.randn((), generator=generator, dtype=torch.float64))
                       * query.count_noise)
            images += [mean_image(members, query, size, generator) for _ in range(query.count)]
        else:
            images += [mode_image(members, query, generator) for _ in range(query.count)]
        labels += [label] * query.count
    return ImageSet(torch.stack(images), torch.tensor(labels, dtype=torch.long))
