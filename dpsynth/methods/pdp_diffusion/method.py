"""PDP-Diffusion (Ghalebikesabi et al. 2023): DPDM's DP-SGD fine-tuning a diffusion model pre-trained on public
data (``dpsynth pretrain --for pdp-diffusion``); the pre-training reads no private data and costs no epsilon."""
from __future__ import annotations

from ...data import DatasetInfo
from ...errors import ConfigError
from ...privacy import PlannedStage
from ..dpdm.method import DPDM
from . import DECLARATION


class PDPDiffusion(DPDM):
    """DPDM (its sections, presets and DP-SGD) started from a public model: ``model.init_from`` is required.
    DPImageBench runs it with DPDM's DP-SGD settings after pre-training on ImageNet-32 (160 epochs, batch 1024, Adam
    3e-4: ``dpsynth pretrain --for pdp-diffusion --preset paper --iterations ...``)."""

    needs_public_model = True

    declaration = DECLARATION

    def privacy_stages(self, info: DatasetInfo) -> list[PlannedStage]:
        if not self.trainer.unet_settings.init_from:
            name = self.declaration.name
            raise ConfigError(f"{name} fine-tunes a model pre-trained on public data: give it with --init-from DIR "
                              f"(model.init_from), written by dpsynth pretrain --for {name} --dataset PUBLIC")
        return super().privacy_stages(info)
