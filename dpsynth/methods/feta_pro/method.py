"""FETA-Pro (Li et al.): spatial (central images) -> frequency (random Fourier features) -> DP-SGD curriculum.

Three mechanisms share one budget: DP-FETA's central images, the noisy per-class mean random Fourier
features, and DP-SGD, whose noise is calibrated last. An auxiliary one-step generator is fitted to the
noisy features (no private data) and its images warm up the diffusion model after the central images.
``curriculum.order`` selects the paper's RQ2 variants.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace

import torch

from ...config import PrivacySettings, RunConfig, one_of, positive, preset_with, section_settings
from ...data import DatasetInfo, ImageSet
from ...generators import balanced_labels
from ...privacy import PlannedStage
from ...privacy.fourier_features import FrequencyQuery, FrequencySettings, RandomFourierFeatures, noisy_class_means
from ...training.context import RunContext
from ...training.feature_generator import (
    FEATURES_PHASE,
    GeneratorSettings,
    feature_matching_loss,
    fit_generator,
    fitting_probes,
    generated_set,
)
from ...training.probes import Probes
from ...training.warmup import LossFn, Warmup, WarmupSettings
from ...utils.images import to_uint8
from ..dp_feta.method import DPFETA, CentralSettings, central_stage, released_central_images
from ..dpdm.method import DPDM
from . import DECLARATION

AUXILIARY_IMAGES = "auxiliary_images.png"
AUXILIARY_PHASE = "auxiliary generator"  # per iteration
FREQUENCY_STAGE = "frequency-features"
# Phases of each curriculum order; "no-auxiliary" fits the diffusion model's own samples to the features.
ORDERS = {
    "spatial-frequency": ["warmup-spatial", "warmup-frequency"],
    "frequency-spatial": ["warmup-frequency", "warmup-spatial"],
    "simultaneous": ["warmup-joint"],
    "frequency": ["warmup-frequency"],
    "no-auxiliary": ["warmup-spatial", "warmup-frequency"],
}
# DPImageBench's noise multipliers at epsilon = 1 and 10 (central images, frequency features); a noise
# multiplier of None (the default) interpolates them log-log in the run's epsilon:
# sigma(eps) = sigma_1 * eps ** -log10(sigma_1 / sigma_10).
AUTO_NOISE = {"central": (20.0, 5.0), "frequency": (26.6, 7.4)}


def auto_noise(section: str, epsilon: float) -> float:
    """The default noise multiplier of ``section`` at a total budget of ``epsilon``."""
    at_1, at_10 = AUTO_NOISE[section]
    return at_1 * epsilon ** -math.log10(at_1 / at_10)


@dataclass(frozen=True, kw_only=True)
class NoisyCentralSettings(CentralSettings):
    """DP-FETA's ``central`` section, its noise multiplier DPImageBench's for the run's epsilon by default."""

    noise_multiplier: float | None = positive(default=None)


@dataclass(frozen=True, kw_only=True)
class NoisyFrequencySettings(FrequencySettings):
    """The ``frequency`` section: DP-MERF's features, the noise multipliers of their class sums (None: DPImageBench's
    for the run's epsilon) and of the class sizes."""

    noise_multiplier: float | None = positive(default=None)
    count_noise: float = positive(default=100.0)


@dataclass(frozen=True, kw_only=True)
class AuxiliaryGeneratorSettings(GeneratorSettings):
    """The ``generator`` section: DP-MERF's generator, and the auxiliary images it makes."""

    images: int = positive(default=60000)


@dataclass(frozen=True, kw_only=True)
class FrequencyWarmupSettings(WarmupSettings):
    """The ``frequency_warmup`` section: a warm-up on the auxiliary images, and the sampling steps of
    FETA-Pro-No-Auxiliary's differentiable samples."""

    iterations: int = positive(default=2344)
    batch_size: int = positive(default=256)
    lr: float = positive(default=3e-4)
    augment: bool = False
    sample_steps: int = positive(default=4)


@dataclass(frozen=True, kw_only=True)
class CurriculumSettings:
    """The ``curriculum`` section: the order of the warm-ups (the paper's RQ2 variants)."""

    order: str = one_of(*ORDERS, default="spatial-frequency")


class FETAPro(DPDM):
    """Central images and auxiliary-generator images warm up the diffusion model before DP-SGD."""

    declaration = DECLARATION
    public_sections = ("warmup", "frequency_warmup")
    probed_keys = ("frequency", "generator")
    sections = {**DPFETA.sections, "central": NoisyCentralSettings, "frequency": NoisyFrequencySettings,
                "generator": AuxiliaryGeneratorSettings, "frequency_warmup": FrequencyWarmupSettings,
                "curriculum": CurriculumSettings}
    presets = {
        # Table 9 (F-MNIST / MNIST): 50 central images, spatial warm-up 1000 x 50, frequency warm-up
        # 10 epochs of 60k generated images at batch 256; DP-SGD as DPDM's paper preset.
        "paper": preset_with(DPFETA.presets["paper"], {"warmup": {"iterations": 1000, "batch_size": 50}}),
        # DP-FETA's cpu preset with part of the DP-SGD time given to the frequency stage (see the README).
        "cpu": preset_with(DPFETA.presets["cpu"], {
            "dpsgd": {"epochs": 4.25},
            "warmup": {"iterations": 500},
            "generator": {"epochs": 3, "iterations_per_epoch": 200, "images": 10000},
            "frequency_warmup": {"iterations": 1000, "batch_size": 64, "lr": 1e-3, "checkpoint_every": 250},
        }),
    }

    def __init__(self, config: RunConfig) -> None:
        super().__init__(config)
        self.central_settings = section_settings(NoisyCentralSettings, config, "central")
        self.warmup_settings = section_settings(WarmupSettings, config, "warmup")
        self.frequency_settings = section_settings(NoisyFrequencySettings, config, "frequency")
        self.generator_settings = section_settings(AuxiliaryGeneratorSettings, config, "generator")
        self.frequency_warmup_settings = section_settings(FrequencyWarmupSettings, config, "frequency_warmup")
        self.order = section_settings(CurriculumSettings, config, "curriculum").order

    def throughput_probes(self, shape: tuple[int, int, int], num_classes: int, device: torch.device) -> Probes:
        phases = fitting_probes(self.generator_settings, self.frequency_settings, shape, num_classes, device,
                                AUXILIARY_PHASE)
        return replace(super().throughput_probes(shape, num_classes, device), phases=phases)

    @classmethod
    def phase_units(cls, config: RunConfig, num_images: float) -> dict[str, float]:
        generator = section_settings(AuxiliaryGeneratorSettings, config, "generator")
        fitted = section_settings(CurriculumSettings, config, "curriculum").order != "no-auxiliary"
        return {FEATURES_PHASE: num_images,
                AUXILIARY_PHASE: generator.epochs * generator.iterations_per_epoch if fitted else 0}

    def _noise(self, section: str, value: float | None) -> float:
        """``value``, or for None DPImageBench's noise multiplier of ``section`` at the run's epsilon."""
        return auto_noise(section, PrivacySettings.of(self.config).epsilon) if value is None else value

    def _uses_central(self) -> bool:
        return self.order != "frequency" and self.central_settings.count > 0

    def _central_noise(self) -> float:
        return self._noise("central", self.central_settings.noise_multiplier)

    def _frequency_query(self) -> FrequencyQuery:
        settings = self.frequency_settings
        return FrequencyQuery(self._noise("frequency", settings.noise_multiplier), settings.count_noise)

    def stages_before_dpsgd(self, info: DatasetInfo) -> list[PlannedStage]:
        """The central images (unless the curriculum skips them), then the frequency features."""
        central = [central_stage(self.central_settings, info, self._central_noise())]
        frequency = PlannedStage(FREQUENCY_STAGE, self._frequency_query().events(info.num_classes,
                                                                                  info.unit == "group"))
        return (central if self._uses_central() else []) + [frequency]

    def warmup_phases(self) -> list[str]:
        return ORDERS[self.order] if self._uses_central() else ["warmup-frequency"]

    def warm_up(self, context: RunContext) -> Callable[[torch.nn.Module], None]:
        """The curriculum's warm-ups."""
        return lambda model: self._warm_up(context, model)

    def _warm_up(self, context: RunContext, model: torch.nn.Module) -> None:
        """Release the central images and the frequency features, fit the auxiliary generator, warm up."""
        rff = self.frequency_settings.features_of(context.dataset.info)
        central = (released_central_images(context, self.central_settings, self._central_noise())
                   if self._uses_central() else None)
        targets = context.released(FREQUENCY_STAGE, lambda: noisy_class_means(
            context.dataset.train, context.dataset.info.num_classes, rff, self._frequency_query(), context.ledger,
            FREQUENCY_STAGE, context.noise))
        auxiliary = self._auxiliary_images(context, rff, targets) if self.order != "no-auxiliary" else None
        spatial, frequency = self.warmup_settings, self.frequency_warmup_settings
        losses: dict[str, LossFn] = {}
        if central is not None:
            losses["warmup-spatial"] = self._warmup_loss(context, central, spatial)
        if auxiliary is not None:
            losses["warmup-frequency"] = self._warmup_loss(context, auxiliary, frequency)
        else:
            losses["warmup-frequency"] = self._sample_matching_loss(context, rff, targets)
        warmup = Warmup(self.warmup_phases())
        for phase in self.warmup_phases():
            if phase == "warmup-joint":
                joint = replace(frequency, iterations=spatial.iterations + frequency.iterations)
                warmup.train(context, model, phase, joint, self._joint_loss(context, losses, spatial, frequency))
            else:
                settings = spatial if phase == "warmup-spatial" else frequency
                warmup.train(context, model, phase, settings, losses[phase])

    def _warmup_loss(self, context: RunContext, data: ImageSet, settings: WarmupSettings) -> LossFn:
        return self.trainer.warmup_loss(context, data, self.dpsgd_settings.noise_multiplicity, settings)

    def _auxiliary_images(self, context: RunContext, rff: RandomFourierFeatures, targets: torch.Tensor) -> ImageSet:
        """Images of the auxiliary generator fitted to ``targets`` (post-processing: released with them)."""
        info = context.dataset.info
        images, labels = context.released("auxiliary-images", lambda: self._generated(context, rff, targets))
        context.save_grid(AUXILIARY_IMAGES, images.numpy(), labels, info.num_classes)
        return ImageSet(images.float() / 255, labels)

    def _generated(self, context: RunContext, rff: RandomFourierFeatures, targets: torch.Tensor
                   ) -> tuple[torch.Tensor, torch.Tensor]:
        """The auxiliary generator fitted to ``targets`` and its images, as uint8, with their labels."""
        settings = self.generator_settings
        generator = settings.build(context.dataset.info).to(context.device)
        losses = fit_generator(generator, targets.to(context.device), rff, settings, context.device,
                               context.generator, AUXILIARY_PHASE)
        context.log("auxiliary-generator", loss_per_epoch=losses)
        images = generated_set(generator, settings.images, settings.batch_size, context.device,
                               context.generator)
        return torch.from_numpy(to_uint8(images.images)), images.labels

    def _sample_matching_loss(self, context: RunContext, rff: RandomFourierFeatures, targets: torch.Tensor
                              ) -> LossFn:
        """FETA-Pro-No-Auxiliary: the feature-matching loss of the diffusion model's own (differentiable) samples."""
        info, steps = context.dataset.info, self.frequency_warmup_settings.sample_steps

        def loss(model: torch.nn.Module, batch_size: int) -> torch.Tensor:
            labels = balanced_labels(batch_size, info.num_classes)
            images = self.trainer.diffusion.ddim(model, labels, info.shape, info.num_classes, steps,
                                         generator=context.generator)
            return feature_matching_loss(images, labels.to(images.device), targets, rff)

        return loss

    @staticmethod
    def _joint_loss(context: RunContext, losses: dict[str, LossFn], spatial: WarmupSettings,
                    frequency: WarmupSettings) -> LossFn:
        """Simultaneous: each step is a spatial step with probability I_s / (I_s + I_f), else a frequency step."""
        share = spatial.iterations / (spatial.iterations + frequency.iterations)

        def loss(model: torch.nn.Module, batch_size: int) -> torch.Tensor:
            if float(torch.rand((), generator=context.generator)) < share:
                return losses["warmup-spatial"](model, spatial.batch_size)
            return losses["warmup-frequency"](model, frequency.batch_size)

        return loss
