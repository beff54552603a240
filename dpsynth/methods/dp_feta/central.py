"""DP central images (DP-FETA, Alg. 1 and 2): noisy mean images and noisy mode images, per class.

Each query Poisson-samples the class's training images at rate q. Classes are disjoint, so the queries of
different classes compose in parallel; the whole set of queries is recorded in the ledger, as one
parallel composition, before any noisy output exists.

Mean images (Alg. 1) divide a noisy clipped sum by the expected sample size q * n_c. The paper takes
the class size n_c as known; it is a statistic of the private data, so here each class's size is
released once with Gaussian noise (``count_noise``) and recorded too. Mode images (Alg. 2) need no size.

As in the authors' code (not the paper's text), both queries can run at 1/``downsample`` of the
resolution: an f x f average pool maps an image of L2 norm C to one of norm at most C / f, and a
histogram over P / f^2 pooled pixels has L2 sensitivity sqrt(P) / f, so the same noise multiplier
gives f times less noise per pixel. The result is upsampled bilinearly and, with ``denoise``, median
filtered and sharpened (post-processing, free).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from kornia.filters import filter2d, median_blur

from ...data import ImageSet
from ...errors import ConfigError
from ...privacy import GaussianMechanism, ParallelComposition, PrivacyLedger, SubsampledGaussianMechanism
from ...privacy.events import SimpleEvent
from ...privacy.mechanisms import clip_rows, gaussian_noise, noisy_count, poisson_sample
from ...privacy.randomness import SecretStream

KINDS = ("mean", "mode")


@dataclass(frozen=True)
class CentralQuery:
    """``count`` queries per class at rate ``sample_rate`` with noise multiplier ``noise``.

    ``clip`` bounds each image's L2 norm (mean images); ``bins`` is the histogram size (mode images);
    ``count_noise`` is the noise multiplier of each class-size release (mean images); ``downsample``
    is the pooling factor the queries run at; ``denoise`` median-filters and sharpens the results.
    """

    kind: str
    count: int
    sample_rate: float
    noise: float
    clip: float
    bins: int
    count_noise: float
    downsample: int = 1
    denoise: bool = False

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ConfigError(f"central.kind must be one of {', '.join(KINDS)}, got {self.kind!r}")
        if not 0 < self.sample_rate <= 1:
            raise ConfigError(f"central.batch_size gives a sampling rate of {self.sample_rate:.4g}; "
                              "it must lie in (0, 1]: use a batch size no larger than the training set")
        if self.kind == "mode" and self.bins < 2:
            raise ConfigError(f"central.bins must be at least 2, got {self.bins}")
        if self.downsample < 1:
            raise ConfigError(f"central.downsample must be a positive integer, got {self.downsample}")

    def class_events(self) -> tuple[SimpleEvent, ...]:
        """What the queries of one class do."""
        queries: tuple[SimpleEvent, ...] = (SubsampledGaussianMechanism(self.noise, self.sample_rate, self.count),)
        return queries + ((GaussianMechanism(self.count_noise),) if self.kind == "mean" else ())

    def event(self, num_classes: int) -> ParallelComposition:
        return ParallelComposition("label", {str(c): self.class_events() for c in range(num_classes)})


def pooled(images: torch.Tensor, factor: int) -> torch.Tensor:
    """``images`` average-pooled by ``factor`` (each side must divide); L2 norms shrink by at least ``factor``."""
    if images.shape[-1] % factor or images.shape[-2] % factor:
        raise ConfigError(f"central.downsample = {factor} must divide the image size {tuple(images.shape[-2:])}")
    return F.avg_pool2d(images, factor) if factor > 1 else images


def mean_image(images: torch.Tensor, query: CentralQuery, size: float, noise: SecretStream) -> torch.Tensor:
    """One noisy mean (Alg. 1) at 1/f resolution: clipped sum of a Poisson sample plus N(0, (sigma C / f)^2),
    over q * size."""
    clip = query.clip / query.downsample
    small = pooled(images[poisson_sample(len(images), query.sample_rate, noise)], query.downsample)
    total = clip_rows(small, clip).sum(dim=0)
    total = total + gaussian_noise(total.shape, query.noise * clip, noise, total)
    return (total / (query.sample_rate * size)).clamp(0, 1)


def pixel_histogram(images: torch.Tensor, bins: int) -> torch.Tensor:
    """Counts per pixel and bin (P x bins) of images in [0, 1]; bin k holds [k / bins, (k + 1) / bins)."""
    index = (images.flatten(1) * bins).long().clamp(0, bins - 1)
    return torch.nn.functional.one_hot(index, bins).sum(dim=0)


def mode_image(images: torch.Tensor, query: CentralQuery, noise: SecretStream) -> torch.Tensor:
    """One noisy mode image (Alg. 2) at 1/f resolution: per-pixel histogram plus N(0, sigma^2 P), centre of
    the noisy argmax bin.

    Adding or removing one image changes one bin of every one of the P pooled pixels by 1: L2 sensitivity
    sqrt(P).
    """
    small = pooled(images[poisson_sample(len(images), query.sample_rate, noise)], query.downsample)
    histogram = pixel_histogram(small, query.bins)
    pixels = histogram.shape[0]
    noisy = histogram.double() + gaussian_noise(histogram.shape, query.noise * pixels ** 0.5, noise,
                                                histogram.double())
    return ((noisy.argmax(dim=1).float() + 0.5) / query.bins).reshape(small.shape[1:])


SHARPEN = torch.tensor([[[0.0, -1.0, 0.0], [-1.0, 5.0, -1.0], [0.0, -1.0, 0.0]]])


def restored(images: torch.Tensor, size: tuple[int, int], denoise: bool) -> torch.Tensor:
    """Low-resolution central images upsampled bilinearly to ``size``, then median-filtered and sharpened."""
    if images.shape[-2:] != size:
        images = F.interpolate(images, size=size, mode="bilinear", align_corners=False)
    if denoise:
        images = filter2d(median_blur(images, 3), SHARPEN.to(images), border_type="replicate")
    return images.clamp(0, 1)


def central_images(train: ImageSet, num_classes: int, query: CentralQuery, ledger: PrivacyLedger, stage: str,
                   noise: SecretStream) -> ImageSet:
    """``query.count`` central images per class, labelled; the queries are recorded before they run."""
    ledger.record(stage, query.event(num_classes))
    images, labels = [], []
    for label in range(num_classes):
        members = train.images[train.labels == label]
        if query.kind == "mean":
            size = max(1, noisy_count(len(members), query.count_noise, noise))
            images += [mean_image(members, query, size, noise) for _ in range(query.count)]
        else:
            images += [mode_image(members, query, noise) for _ in range(query.count)]
        labels += [label] * query.count
    height, width = train.images.shape[-2:]
    full = restored(torch.stack(images), (height, width), query.denoise)
    return ImageSet(full, torch.tensor(labels, dtype=torch.long))
