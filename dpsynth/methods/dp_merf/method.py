"""DP-MERF (Harder et al. 2021): one release of noisy per-class mean random Fourier features, then a one-step
generator fitted to them; its images are the release.

The features and the generator are shared with FETA-Pro (:mod:`dpsynth.privacy.fourier_features`,
:mod:`dpsynth.training.feature_generator`). The release is one Gaussian mechanism on the C x (D + 1) matrix whose
row c holds class c's feature sum and size: adding or removing an image of class c changes row c by (phi(x), 1), of
L2 norm sqrt(2) since ||phi(x)|| = 1, and no other row (with groups, each image weighted 1 / its group's images: a
group moves the matrix by at most sqrt(2) too). Its noise is calibrated to spend the whole budget. Each class's mean
is its noisy sum over its noisy size; the paper divides by the public N instead, which weights classes by their
(private) shares, while the generator draws classes evenly.
"""
from __future__ import annotations

import torch

from ...config import RunConfig, section_settings
from ...data import DatasetInfo
from ...generators import Generator, OneStepArchitecture, OneStepGenerator
from ...models.generator import ConditionalGenerator
from ...privacy import GaussianMechanism, PlannedStage
from ...privacy.fourier_features import FrequencySettings, RandomFourierFeatures, released_class_means
from ...training.context import RunContext, weights
from ...training.feature_generator import (
    FEATURES_PHASE,
    GeneratorSettings,
    fit_generator,
    fitting_probes,
    generated_set,
)
from ...training.probes import Probes
from ..base import CPU_PROTOCOL, Method, Release
from . import DECLARATION

MEANS_STAGE = "rff-means"
PREVIEW = "generator_samples.png"
GENERATOR_PHASE = "generator"  # per iteration


class DPMERF(Method):
    """Noisy per-class mean random Fourier features (one Gaussian release), a generator matching them."""

    declaration = DECLARATION
    sized_phase = (GENERATOR_PHASE, "generator.iterations_per_epoch")
    probed_keys = ("frequency", "generator")
    sections = {"frequency": FrequencySettings, "generator": GeneratorSettings}
    no_generator = None
    presets = {
        # DPImageBench's DP-MERF (F-MNIST / MNIST): 10,000 features at bandwidth 105, 5 epochs of batch 100,
        # Adam 0.01 decayed by 0.9 per epoch; accounted with RDP as it reports.
        "paper": {"privacy": {"accountant": "rdp"}},
        # The same training (146 s per generator epoch on 2 AVX2 cores, about 60 s on 2 AVX-512 cores: 12 and 5
        # minutes) and 5,000 released images, as the other cpu presets; the bandwidth scaled with the image's values
        # (105 at 28 x 28 grey; on scans-64, CNN 17.9 % against 11.2 % unscaled).
        "cpu": {**CPU_PROTOCOL, "frequency": {"bandwidth_scaling": "values"}},
    }

    def __init__(self, config: RunConfig) -> None:
        super().__init__(config)
        self.frequency_settings = section_settings(FrequencySettings, config, "frequency")
        self.generator_settings = section_settings(GeneratorSettings, config, "generator")
        self.generator: ConditionalGenerator | None = None
        self.info: DatasetInfo | None = None

    def privacy_stages(self, info: DatasetInfo) -> list[PlannedStage]:
        return [PlannedStage(MEANS_STAGE, calibrated=GaussianMechanism)]

    def throughput_probes(self, shape: tuple[int, int, int], num_classes: int, device: torch.device) -> Probes:
        return Probes({}, phases=fitting_probes(self.generator_settings, self.frequency_settings, shape, num_classes,
                                                device, GENERATOR_PHASE))

    @classmethod
    def phase_units(cls, config: RunConfig, num_images: float) -> dict[str, float]:
        generator = section_settings(GeneratorSettings, config, "generator")
        return {FEATURES_PHASE: num_images, GENERATOR_PHASE: generator.epochs * generator.iterations_per_epoch}

    def fit(self, context: RunContext) -> None:
        """Release the means and fit the generator on rank 0 (each released in turn, or restored), then save a
        preview."""
        info = context.dataset.info
        rff = self.frequency_settings.features_of(info)
        event = context.planned_event(MEANS_STAGE, GaussianMechanism)
        means = context.released(MEANS_STAGE, lambda: released_class_means(
            context.dataset.train, info.num_classes, rff, event.noise_multiplier, context.ledger, MEANS_STAGE,
            context.noise))
        generator = self.generator_settings.build(info).to(context.device)
        generator.load_state_dict(context.released("generator", lambda: self._fitted(context, generator, rff, means)))
        self.generator, self.info = generator, info
        if context.world.is_main:
            preview = generated_set(generator, 10 * info.num_classes, self.generator_settings.batch_size,
                                    context.device, torch.Generator().manual_seed(0))
            context.save_grid(PREVIEW, preview.images, preview.labels, info.num_classes)

    def _fitted(self, context: RunContext, generator: ConditionalGenerator, rff: RandomFourierFeatures,
                means: torch.Tensor) -> dict[str, torch.Tensor]:
        """The weights of ``generator`` fitted to the released ``means`` (post-processing)."""
        losses = fit_generator(generator, means.to(context.device), rff, self.generator_settings, context.device,
                               context.generator, GENERATOR_PHASE)
        context.log("generator", loss_per_epoch=losses)
        return weights(generator)

    def trained_generator(self) -> Generator:
        if self.generator is None or self.info is None:
            raise RuntimeError("the release needs a fitted generator: call fit() first")
        settings = self.generator_settings
        return OneStepGenerator(self.generator, self.info.shape, self.info.class_names, self.declaration.name,
                                OneStepArchitecture(latent=settings.latent, width=settings.width))

    def generate(self, num_samples: int, generator: torch.Generator) -> Release:
        samples = self.trained_generator().sample(num_samples, generator=generator, settings=self.sampling)
        return Release(samples.images, samples.labels)
