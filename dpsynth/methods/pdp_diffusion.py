"""PDP-Diffusion (Ghalebikesabi et al. 2023): DPDM's DP-SGD fine-tuning a diffusion model pre-trained on public
data (``dpsynth pretrain --for pdp-diffusion``); the pre-training reads no private data and costs no epsilon."""
from __future__ import annotations

from typing import ClassVar

from ..config import Config
from ..data import DatasetInfo
from ..errors import ConfigError
from ..privacy import PlannedStage
from ..training.context import RunContext
from ..training.private import DiffusionDpsgdSection
from .base import DiffusionMethod, Paper, register
from .dpdm import DPDM, DPSGD_STAGE


@register
class PDPDiffusion(DiffusionMethod):
    """DPDM's DP-SGD started from a public model: ``model.init_from`` is required."""

    needs_public_model = True

    name = "pdp-diffusion"
    description = "DP-SGD fine-tuning of a diffusion model pre-trained on public data"
    paper = Paper("Sahra Ghalebikesabi, Leonard Berrada, Sven Gowal, Ira Ktena, Robert Stanforth, Jamie Hayes, "
                  "Soham De, Samuel L. Smith, Olivia Wiles, Borja Balle",
                  "Differentially Private Diffusion Models Generate Useful Synthetic Images", "Preprint", 2023,
                  "https://arxiv.org/abs/2302.13861")
    dpsgd_sections: ClassVar[tuple[str, ...]] = DPDM.dpsgd_sections
    smoke = DPDM.smoke
    sections = DPDM.sections
    # DPImageBench runs PDP-Diffusion with DPDM's DP-SGD settings after pre-training on ImageNet-32 (160 epochs,
    # batch 1024, Adam 3e-4: `dpsynth pretrain --for pdp-diffusion --preset paper --iterations ...`).
    presets = DPDM.presets

    def __init__(self, config: Config) -> None:
        super().__init__(config)
        self.dpsgd_settings = DiffusionDpsgdSection.of(config, "dpsgd")

    def privacy_stages(self, info: DatasetInfo) -> list[PlannedStage]:
        if not self.trainer.unet_settings.init_from:
            raise ConfigError(f"{self.name} fine-tunes a model pre-trained on public data: give it with --init-from "
                              f"DIR (model.init_from), written by dpsynth pretrain --for {self.name} --dataset PUBLIC")
        return [self.dpsgd_settings.stage(DPSGD_STAGE, info.num_train)]

    def fit(self, context: RunContext) -> None:
        """DPDM's DP-SGD from the public model."""
        self.info = context.dataset.info
        self.model = self.trainer.fit(context, DPSGD_STAGE, self.dpsgd_settings)
