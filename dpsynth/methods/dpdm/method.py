"""DPDM (Dockhorn et al. 2023): a diffusion model trained with DP-SGD; DP-FETA without its warm-up."""
from __future__ import annotations

from collections.abc import Callable
from typing import ClassVar

from torch import nn

from ...config import RunConfig, preset_with, section_settings
from ...data import DatasetInfo
from ...privacy import PlannedStage
from ...training.context import RunContext
from ...training.diffusion import CPU_PRESET, SECTIONS
from ...training.private import DiffusionDpsgdSection
from ..base import CPU_PROTOCOL
from ..templates import DiffusionMethod
from . import DECLARATION

DPSGD_STAGE = "dp-sgd"
# DPImageBench's DPDM settings, accounted with RDP as the paper reports; meant for a GPU.
PAPER_PRESET = {"privacy": {"accountant": "rdp"}}


class DPDM(DiffusionMethod):
    """DP-SGD on a class-conditional diffusion UNet, with noise multiplicity K (K draws of t per example); the template
    of the methods that warm it up first (:meth:`stages_before_dpsgd`, :meth:`warm_up`)."""

    declaration = DECLARATION
    dpsgd_sections: ClassVar[tuple[str, ...]] = ("dpsgd",)
    sections = SECTIONS
    # paper: DPImageBench's; cpu: sized for ~30 minutes of DP-SGD on a 2-core CPU (see the README's preset table).
    presets = {"paper": PAPER_PRESET, "cpu": preset_with(CPU_PROTOCOL, CPU_PRESET)}

    def __init__(self, config: RunConfig) -> None:
        super().__init__(config)
        self.dpsgd_settings = section_settings(DiffusionDpsgdSection, config, "dpsgd")

    def stages_before_dpsgd(self, info: DatasetInfo) -> list[PlannedStage]:
        """The mechanisms a variant releases before DP-SGD, for its warm-up: none for DPDM."""
        return []

    def privacy_stages(self, info: DatasetInfo) -> list[PlannedStage]:
        return [*self.stages_before_dpsgd(info), self.dpsgd_settings.stage(DPSGD_STAGE, info.num_train)]

    def warm_up(self, context: RunContext) -> Callable[[nn.Module], None] | None:
        """What a variant does to the model before DP-SGD, once (a resume of DP-SGD skips it): none for DPDM."""
        return None

    def fit(self, context: RunContext) -> None:
        """The warm-up (a variant's), then DP-SGD from the (public, warmed-up or fresh) model; its checkpoints carry
        the stage, so a resume continues it."""
        self.info = context.dataset.info
        self.model = self.trainer.fit(context, DPSGD_STAGE, self.dpsgd_settings, self.warm_up(context))
