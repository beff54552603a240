"""DP-FETA (Li et al.): DP central images warm up the diffusion model, then DP-SGD fine-tunes it.

With ``central.count = 0`` there is no warm-up and DP-FETA is DPDM. Stage I queries noisy mean or mode
images per class (parallel composition over images; over groups, one mechanism for all classes) with fixed
noise; the DP-SGD noise of stage II is calibrated afterwards so the whole run meets the target epsilon (the
paper's three-step procedure).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

import torch

from ...config import RunConfig, at_least, one_of, positive, preset_with, section_settings
from ...data import DatasetInfo, ImageSet
from ...errors import ConfigError
from ...privacy import PlannedStage
from ...privacy.central_images import KINDS, CentralQuery, central_images
from ...training.context import RunContext
from ...training.warmup import Warmup, WarmupSettings
from ..dpdm.method import DPDM
from . import DECLARATION

CENTRAL_IMAGES = "central_images.png"
CENTRAL_STAGE = "central-images"


@dataclass(frozen=True, kw_only=True)
class CentralSettings:
    """The ``central`` section: ``count`` mean or mode images per class (0: none, DPDM), each from a Poisson
    batch of expected ``batch_size``; see :class:`~dpsynth.privacy.central_images.CentralQuery` for the rest. A
    noise multiplier of None is the method's default for the run's epsilon (FETA-Pro)."""

    kind: str = one_of(*KINDS, default="mean")
    count: int = at_least(0, default=5)
    batch_size: int = positive(default=6000)
    noise_multiplier: float | None = positive(default=5.0)
    clip: float = positive(default=28.0)
    bins: int = at_least(2, default=2)
    count_noise: float = positive(default=100.0)
    downsample: int = positive(default=2)
    denoise: bool = True

    def query(self, num_train: int, noise: float) -> CentralQuery:
        return CentralQuery(self.kind, self.count, self.batch_size / num_train, noise, self.clip, self.bins,
                            self.count_noise, self.downsample, self.denoise)


def central_stage(settings: CentralSettings, info: DatasetInfo, noise: float) -> PlannedStage:
    """The central images' mechanisms on ``info``'s training split at noise multiplier ``noise``."""
    return PlannedStage(CENTRAL_STAGE, settings.query(info.num_train, noise).events(info.num_classes,
                                                                                    info.unit == "group"))


def released_central_images(context: RunContext, settings: CentralSettings, noise: float) -> ImageSet:
    """The central images, released (their mechanisms recorded first) or restored; their grid saved."""
    info = context.dataset.info
    central = ImageSet(*context.released(CENTRAL_STAGE, lambda: _tensors(central_images(
        context.dataset.train, info.num_classes, settings.query(info.num_train, noise), context.ledger,
        CENTRAL_STAGE, context.noise))))
    context.save_grid(CENTRAL_IMAGES, central.images, central.labels, info.num_classes, min(10, settings.count))
    return central


class DPFETA(DPDM):
    """Central images (mean or mode) and an augmented non-private warm-up before DPDM's DP-SGD."""

    declaration = DECLARATION
    public_sections: ClassVar[tuple[str, ...]] = ("warmup",)
    sections = {**DPDM.sections, "central": CentralSettings, "warmup": WarmupSettings}
    presets = {
        # Tables VII-VIII for MNIST / F-MNIST; DP-SGD as DPDM's paper preset.
        "paper": DPDM.presets["paper"],
        # DPDM's cpu preset, with part of its DP-SGD time given to the warm-up (see the README).
        "cpu": preset_with(DPDM.presets["cpu"], {
            "dpsgd": {"epochs": 5.0},
            "warmup": {"iterations": 1000, "lr": 1e-3, "checkpoint_every": 250},
        }),
    }

    def __init__(self, config: RunConfig) -> None:
        super().__init__(config)
        self.central_settings = section_settings(CentralSettings, config, "central")
        self.warmup_settings = section_settings(WarmupSettings, config, "warmup")

    def _central_noise(self) -> float:
        noise = self.central_settings.noise_multiplier
        if noise is None:
            raise ConfigError(f"central.noise_multiplier must be a number above 0 ({self.declaration.name} has no "
                              "automatic value), got None")
        return noise

    def stages_before_dpsgd(self, info: DatasetInfo) -> list[PlannedStage]:
        central = [central_stage(self.central_settings, info, self._central_noise())]
        return central if self.central_settings.count > 0 else []

    def warm_up(self, context: RunContext) -> Callable[[torch.nn.Module], None]:
        """The central images and the warm-up on them."""
        return lambda model: self._warm_up(context, model)

    def _warm_up(self, context: RunContext, model: torch.nn.Module) -> None:
        """Release the central images (or restore them), save their grid, then warm up on them."""
        if self.central_settings.count == 0:
            return
        central = released_central_images(context, self.central_settings, self._central_noise())
        settings = self.warmup_settings
        loss = self.trainer.warmup_loss(context, central, self.dpsgd_settings.noise_multiplicity, settings)
        Warmup(["warmup"]).train(context, model, "warmup", settings, loss)


def _tensors(images: ImageSet) -> tuple[torch.Tensor, torch.Tensor]:
    """An image set as the tensors a checkpoint holds."""
    return images.images, images.labels
