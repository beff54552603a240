"""DP central images (DP-FETA, Alg. 1 and 2): noisy mean images and noisy mode images, per class.

Each query Poisson-samples the training units (images, or groups) at rate q, once for all classes, and
releases every class's image from that sample. Classes are disjoint, so over images the queries of
different classes compose in parallel; with groups, whose images are weighted 1 / (the group's images) and
may be of several classes, each query is one mechanism on all classes' images together
(:func:`~dpsynth.privacy.events.per_class`). The queries are recorded in the ledger before any noisy output
exists.

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

from ..data import ImageSet
from ..errors import ConfigError
from ..utils.images import as_floats
from .events import Event, GaussianMechanism, SimpleEvent, SubsampledGaussianMechanism, per_class
from .ledger import PrivacyLedger
from .mechanisms import clip_rows, gaussian_noise, noisy_count, poisson_sample
from .randomness import SecretStream

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

    def events(self, num_classes: int, grouped: bool) -> tuple[Event, ...]:
        """What the queries of all classes do, over images or over groups (``grouped``)."""
        return per_class(self.class_events(), num_classes, grouped)


def pooled(images: torch.Tensor, factor: int) -> torch.Tensor:
    """``images`` average-pooled by ``factor`` (each side must divide); L2 norms shrink by at least ``factor``."""
    if images.shape[-1] % factor or images.shape[-2] % factor:
        raise ConfigError(f"central.downsample = {factor} must divide the image size {tuple(images.shape[-2:])}")
    return F.avg_pool2d(images, factor) if factor > 1 else images


def mean_image(images: torch.Tensor, weights: torch.Tensor, query: CentralQuery, size: float,
               noise: SecretStream) -> torch.Tensor:
    """One noisy mean (Alg. 1) of a sample of pooled ``images``: their clipped sum, each weighted by ``weights``,
    plus N(0, (sigma C / f)^2), over q * size."""
    clip = query.clip / query.downsample
    total = (clip_rows(images, clip) * weights.to(images.dtype).reshape(-1, 1, 1, 1)).sum(dim=0)
    total = total + gaussian_noise(total.shape, query.noise * clip, noise, total)
    return (total / (query.sample_rate * size)).clamp(0, 1)


def pixel_histogram(images: torch.Tensor, bins: int, weights: torch.Tensor) -> torch.Tensor:
    """Per pixel and bin (P x bins, float64), the summed ``weights`` of the images in [0, 1] whose pixel lies in
    the bin; bin k holds [k / bins, (k + 1) / bins)."""
    index = (images.flatten(1) * bins).long().clamp(0, bins - 1)
    pixels = index.shape[1]
    cells = (index + torch.arange(pixels) * bins).flatten()
    histogram = torch.zeros(pixels * bins, dtype=torch.float64)
    return histogram.index_add_(0, cells, weights.double().repeat_interleave(pixels)).reshape(pixels, bins)


def mode_image(images: torch.Tensor, weights: torch.Tensor, query: CentralQuery, noise: SecretStream
               ) -> torch.Tensor:
    """One noisy mode image (Alg. 2) of a sample of pooled ``images``: per-pixel histogram of their ``weights``
    plus N(0, sigma^2 P), centre of the noisy argmax bin.

    One image of weight at most 1 changes one bin of every one of the P pooled pixels by at most 1: L2
    sensitivity sqrt(P).
    """
    histogram = pixel_histogram(images, query.bins, weights)
    pixels = histogram.shape[0]
    noisy = histogram + gaussian_noise(histogram.shape, query.noise * pixels ** 0.5, noise, histogram)
    return ((noisy.argmax(dim=1).float() + 0.5) / query.bins).reshape(images.shape[1:])


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
    for event in query.events(num_classes, train.groups is not None):
        ledger.record(stage, event)
    units, weights = train.unit_index(), train.unit_weights()
    classes = [train.labels == label for label in range(num_classes)]
    if query.kind == "mean":
        sizes = [max(1, noisy_count(float(weights[members].sum()), query.count_noise, noise)) for members in classes]
    images: list[list[torch.Tensor]] = [[] for _ in classes]
    num_units = train.num_units
    for _ in range(query.count):
        sampled = torch.zeros(num_units, dtype=torch.bool)
        sampled[poisson_sample(num_units, query.sample_rate, noise)] = True
        for label, members in enumerate(classes):
            chosen = sampled[units] & members
            small = pooled(as_floats(train.images[chosen]), query.downsample)
            images[label].append(mean_image(small, weights[chosen], query, sizes[label], noise)
                                 if query.kind == "mean" else mode_image(small, weights[chosen], query, noise))
    height, width = train.images.shape[-2:]
    full = restored(torch.stack([image for per_label in images for image in per_label]), (height, width),
                    query.denoise)
    labels = torch.arange(num_classes).repeat_interleave(query.count)
    return ImageSet(full, labels)
