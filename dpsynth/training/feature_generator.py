"""A one-step generator fitted to noisy mean random features: FETA-Pro's auxiliary generator (Eq. 8) and
DP-MERF's generator.

The critic is explicit, as in DP-MERF: per class, the squared distance between the mean features of a
generated batch and the noisy private mean. It reads only the released means, so training is
post-processing and costs no privacy.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from tqdm.auto import tqdm

from ..config import positive
from ..data import DatasetInfo, ImageSet
from ..generators import balanced_labels, one_step_images
from ..models.generator import ConditionalGenerator
from ..privacy.fourier_features import FrequencySettings, RandomFourierFeatures
from .probes import timed

FEATURES_PHASE = "fourier features"  # per private image
PROBE_IMAGES, PROBE_ITERATIONS = 256, 3


@dataclass(frozen=True, kw_only=True)
class GeneratorSettings:
    """The ``generator`` section: the generator's latent size and width; Adam at ``lr``, multiplied by ``lr_decay``
    after each of ``epochs`` epochs of ``iterations_per_epoch`` batches of ``batch_size`` (DPImageBench's
    DP-MERF)."""

    latent: int = positive(default=60)
    width: int = positive(default=64)
    epochs: int = positive(default=5)
    iterations_per_epoch: int = positive(default=550)
    batch_size: int = positive(default=100)
    lr: float = positive(default=0.01)
    lr_decay: float = positive(default=0.9)

    def build(self, info: DatasetInfo) -> ConditionalGenerator:
        """A generator of ``info``'s images and classes."""
        return ConditionalGenerator(info.channels, info.height, info.width, info.num_classes, self.latent, self.width)


def feature_matching_loss(images: torch.Tensor, labels: torch.Tensor, targets: torch.Tensor,
                          rff: RandomFourierFeatures) -> torch.Tensor:
    """Sum over the classes present of ||mean features of the class's images - its target||^2."""
    features = rff(images)
    one_hot = torch.nn.functional.one_hot(labels, len(targets)).to(features)
    counts = one_hot.sum(dim=0)
    present = counts > 0
    means = (one_hot.T @ features)[present] / counts[present, None]
    return (means - targets.to(features)[present]).pow(2).sum()


def fit_generator(generator: ConditionalGenerator, targets: torch.Tensor, rff: RandomFourierFeatures,
                  settings: GeneratorSettings, device: torch.device, rng: torch.Generator,
                  phase: str = "generator") -> list[float]:
    """Train ``generator`` so each class's mean features approach ``targets`` (C x D), under a progress bar
    named ``phase``; the loss per epoch."""
    optimizer = torch.optim.Adam(generator.parameters(), lr=settings.lr)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, 1, gamma=settings.lr_decay)
    labels = balanced_labels(settings.batch_size, generator.num_classes).to(device)
    losses = []
    generator.train()
    for _ in tqdm(range(settings.epochs), desc=phase, dynamic_ncols=True):
        total = torch.zeros((), device=device)  # read once per epoch: no host synchronisation per iteration
        for _ in range(settings.iterations_per_epoch):
            total += _fitting_step(generator, optimizer, labels, targets, rff, device, rng)
        scheduler.step()
        losses.append(float(total) / settings.iterations_per_epoch)
    return losses


def _fitting_step(generator: ConditionalGenerator, optimizer: torch.optim.Optimizer, labels: torch.Tensor,
                  targets: torch.Tensor, rff: RandomFourierFeatures, device: torch.device,
                  rng: torch.Generator) -> torch.Tensor:
    """One Adam step of the feature-matching loss on a batch of ``len(labels)`` generated images; its loss."""
    z = torch.randn((len(labels), generator.latent), generator=rng).to(device)
    loss = feature_matching_loss(generator(z, labels), labels, targets, rff)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    return loss.detach()


def fitting_probes(settings: GeneratorSettings, frequency: FrequencySettings, shape: tuple[int, int, int],
                   num_classes: int, device: torch.device, phase: str) -> dict[str, Callable[[], float]]:
    """For the planner's probe, on random public tensors: the seconds per private image of the features
    (:data:`FEATURES_PHASE`) and per iteration of fitting the generator (``phase``), each after a warm-up."""
    rng = torch.Generator().manual_seed(0)

    def features() -> RandomFourierFeatures:
        dimension = shape[0] * shape[1] * shape[2]
        return RandomFourierFeatures(dimension, frequency.features, frequency.bandwidth_for(dimension), 0)

    def per_image() -> float:
        rff, images = features(), torch.rand(PROBE_IMAGES, *shape, generator=rng)
        weights = torch.ones(PROBE_IMAGES)
        rff.summed(images[:2], weights[:2])
        return timed(lambda: rff.summed(images, weights), device) / PROBE_IMAGES

    def per_iteration() -> float:
        rff = features()
        generator = ConditionalGenerator(shape[0], shape[1], shape[2], num_classes, settings.latent,
                                         settings.width).to(device)
        optimizer = torch.optim.Adam(generator.parameters(), lr=settings.lr)
        labels = balanced_labels(settings.batch_size, num_classes).to(device)
        targets = torch.zeros(num_classes, frequency.features, device=device)

        def steps() -> None:
            for _ in range(PROBE_ITERATIONS):
                _fitting_step(generator, optimizer, labels, targets, rff, device, rng)
        _fitting_step(generator, optimizer, labels, targets, rff, device, rng)
        return timed(steps, device) / PROBE_ITERATIONS

    return {FEATURES_PHASE: per_image, phase: per_iteration}


@torch.no_grad()
def generated_set(generator: ConditionalGenerator, count: int, batch_size: int, device: torch.device,
                  rng: torch.Generator) -> ImageSet:
    """``count`` class-balanced images of ``generator`` (eval mode), on the CPU."""
    labels = balanced_labels(count, generator.num_classes)
    return ImageSet(one_step_images(generator, labels, batch_size, device, rng), labels)
