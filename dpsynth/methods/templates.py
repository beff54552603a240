"""The templates methods derive from, beside the interface (:mod:`.base`): a diffusion model trained with DP-SGD."""
from __future__ import annotations

from typing import ClassVar

import numpy as np
import torch

from ..config import RunConfig
from ..data import DatasetInfo
from ..generators import Generator
from ..training.diffusion import DiffusionTrainer
from ..training.probes import Probes
from .base import Method, Release


class DiffusionMethod(Method):
    """A method whose release is a diffusion model trained with DP-SGD: it holds a
    :class:`~dpsynth.training.diffusion.DiffusionTrainer` (``trainer``: the UNet, its batches, DP-SGD phases and
    sampling) and, once fitted, the model; its ``fit`` says what runs before, between and around the trainer's
    phases. ``class_starts`` are the ``model.class_start`` values it implements."""

    class_starts: ClassVar[tuple[str, ...]] = ("shared", "spread")
    no_generator = None

    def __init__(self, config: RunConfig) -> None:
        super().__init__(config)
        self.trainer = DiffusionTrainer(config, self.class_starts, self.declaration.name)
        self.model: torch.nn.Module | None = None
        self.info: DatasetInfo | None = None

    def starts_from_public_model(self) -> bool:
        """Whether its diffusion model starts from one pre-trained on public images (``model.init_from``)."""
        return bool(self.trainer.unet_settings.init_from)

    def public_data(self, info: DatasetInfo) -> dict[str, np.ndarray]:
        return self.trainer.public_data()

    def throughput_probes(self, shape: tuple[int, int, int], num_classes: int, device: torch.device) -> Probes:
        sections = [self.settings(self.config, section) for section in self.dpsgd_sections]
        return self.trainer.probes(sections, bool(self.public_sections), shape, num_classes, device)

    def trained_generator(self) -> Generator:
        if self.model is None or self.info is None:
            raise RuntimeError("the release needs a fitted model: call fit() first")
        return self.trainer.generator(self.model, self.info, self.declaration.name)

    def generate(self, num_samples: int, generator: torch.Generator) -> Release:
        samples = self.trained_generator().sample(num_samples, generator=generator, settings=self.sampling)
        return Release(samples.images, samples.labels, sampling=samples.sampling)
