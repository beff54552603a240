"""A method in one file, as docs/development.md ("Adding a method") builds it: each class's mean image, released
once with Gaussian noise, is every image of that class the method generates.

Each image is clipped to L2 norm ``means.clip`` and weighted 1 / its group's images (one for an image without
groups); row c of the released matrix holds class c's weighted sum of clipped images and its weighted count. One
record moves the matrix by at most sqrt(clip^2 + 1) in L2, the sensitivity the Gaussian noise is scaled to.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from dpsynth.config import Config, positive, section_settings
from dpsynth.data import DatasetInfo
from dpsynth.methods.base import CPU_PROTOCOL, Method, Release, register
from dpsynth.methods.declaration import Declaration, Paper
from dpsynth.privacy import GaussianMechanism, PlannedStage
from dpsynth.privacy.mechanisms import clip_rows, release_gaussian
from dpsynth.training.context import RunContext

STAGE = "class-means"


@dataclass(frozen=True, kw_only=True)
class MeansSettings:
    """The ``means`` section: the L2 norm each image is clipped to."""

    clip: float = positive(default=4.0)


@register
class NoisyClassMeans(Method):
    """Per class, the noisy mean of the clipped images (one Gaussian release)."""

    declaration = Declaration(
        name="toy-means",
        description="each class's noisy mean image (a toy: the smallest method that runs end to end)",
        paper=Paper("The dpsynth developers", "Adding a method", "dpsynth documentation", 2026,
                    "https://example.org/dpsynth/development/"),
        implementation=f"{__name__}:NoisyClassMeans",
        shortcuts={"--clip": ("means.clip", "toy-means: the L2 norm each image is clipped to", None)})
    sections = {"means": MeansSettings}
    presets = {"cpu": CPU_PROTOCOL}
    default_preset = "cpu"

    def __init__(self, config: Config) -> None:
        super().__init__(config)
        self.settings = section_settings(MeansSettings, config, "means")
        self.means: torch.Tensor | None = None

    def privacy_stages(self, info: DatasetInfo) -> list[PlannedStage]:
        return [PlannedStage(STAGE, calibrated=GaussianMechanism)]

    def fit(self, context: RunContext) -> None:
        event = context.planned_event(STAGE, GaussianMechanism)
        self.means = context.released(STAGE, lambda: self._noisy_means(context, event.noise_multiplier))

    def _noisy_means(self, context: RunContext, noise_multiplier: float) -> torch.Tensor:
        train, info = context.dataset.train, context.dataset.info
        clip = self.settings.clip
        weights = train.unit_weights().double()
        rows = torch.cat([clip_rows(train.images.flatten(1).double(), clip), torch.ones(len(train), 1)], dim=1)
        sums = torch.zeros(info.num_classes, rows.shape[1], dtype=torch.float64)
        sums.index_add_(0, train.labels, rows * weights[:, None])
        noisy = release_gaussian(sums, math.sqrt(clip**2 + 1), noise_multiplier, context.ledger, STAGE, context.noise)
        means = noisy[:, :-1] / noisy[:, -1:].clamp_min(1.0)
        return means.float().reshape(info.num_classes, *info.shape).clamp(0, 1)

    def generate(self, num_samples: int, generator: torch.Generator) -> Release:
        if self.means is None:
            raise RuntimeError("generate() needs the released means: call fit() first")
        labels = torch.arange(num_samples) % len(self.means)
        return Release(self.means[labels], labels)
