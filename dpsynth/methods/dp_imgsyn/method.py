"""DP-ImgSyn (Soufleri et al.): public images aligned to a DP teacher's DP batch statistics, released with the
teacher's soft labels; a non-generative method.

1. Teacher: a GroupNorm ResNet trained with DP-SGD on the private train split (stage ``teacher``).
2. Statistics: every GroupNorm layer's per-channel input mean and variance over the private set, one
   Gaussian mechanism on clipped per-example moments (stage ``statistics``, see ``statistics.py``).
3. Alignment (Alg. 1): public images (or low-pass noise) with uniform target labels are optimised on the
   feature, classification, total-variation and L2 losses, the teacher frozen (post-processing).
4. Release: the aligned images, quantised to 8 bits, with the teacher's soft labels on exactly those images
   at temperature T (stored with them); the hard labels are the teacher's argmax.
The DP-SGD noise is calibrated so that both stages together meet the target epsilon.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import kornia
import numpy as np
import torch
import torch.nn.functional as F

from ...config import DatasetSettings, RunConfig, SamplingSettings, at_least, positive, preset_with, section_settings
from ...data import DatasetInfo
from ...data.fingerprints import fingerprints
from ...errors import ConfigError
from ...evaluation.downstream import correct_count
from ...models import group_norm_resnet
from ...privacy import GaussianMechanism, PlannedStage, SubsampledGaussianMechanism
from ...privacy.batch_statistics import (
    BatchStatistics,
    MomentScaling,
    batch_statistics,
    clipped_moment_sum,
    private_statistics,
    public_scaling,
)
from ...privacy.dpsgd import DpsgdSettings
from ...training.context import RunContext, weights
from ...training.private import PrivateTraining, dpsgd_schedule
from ...training.probes import DpsgdProbe, Probes, timed
from ...utils.device import memory_limited_by, to_device
from ...utils.images import as_floats, to_uint8
from ..base import CPU_PROTOCOL, Method, Release
from . import DECLARATION
from .alignment import AlignmentSettings, align_batch, align_images, uniform_targets

ALIGNMENT_GRID = "alignment.png"
TEACHER_STAGE, STATISTICS_STAGE = "teacher", "statistics"
PROBE_IMAGES = 32  # random images a phase's probe times


@dataclass(frozen=True, kw_only=True)
class TeacherSettings:
    """The ``teacher`` section: the GroupNorm ResNet (blocks and widths per stage, groups) and its DP-SGD (SGD
    with momentum; expected batch, epochs, clipping norm, examples per pass, checkpoint interval)."""

    blocks: tuple[int, ...] = positive(default=(2, 2, 2, 2))
    widths: tuple[int, ...] = positive(default=(64, 128, 256, 512))
    groups: int = positive(default=32)
    batch_size: int = positive(default=128)
    epochs: float = positive(default=20.0)
    lr: float = positive(default=0.01)
    momentum: float = at_least(0, default=0.9)
    clip: float = positive(default=1.2)
    physical_batch_size: int = positive(default=64)
    checkpoint_every: int = positive(default=50)


@dataclass(frozen=True, kw_only=True)
class StatisticsSettings:
    """The ``statistics`` section: the noise multiplier, the clipping norm of the scaled moments (a number, or
    ``auto``: from the starting images) and the batch size they are computed in."""

    noise_multiplier: float = positive(default=30.0)
    clip: float | str = "auto"
    batch_size: int = positive(default=256)

    def __post_init__(self) -> None:
        if isinstance(self.clip, str) and self.clip != "auto" or not isinstance(self.clip, str) and self.clip <= 0:
            raise ConfigError(f"statistics.clip must be a number above 0 or auto, got {self.clip!r}")


class DPImgSyn(Method):
    """DP teacher + DP GroupNorm statistics; public images aligned to them and released with soft labels."""

    declaration = DECLARATION
    dpsgd_sections = ("teacher",)
    probed_keys = ("alignment.iterations",)  # the probes time fixed batches of random images
    releases_soft_labels = True
    no_generator = ("trains no generator: its release is public images aligned to the DP teacher's statistics, and "
                    "its DP model is a classifier")
    sections = {"teacher": TeacherSettings, "statistics": StatisticsSettings, "alignment": AlignmentSettings}
    presets = {
        # App. A.1 for Fashion-MNIST at epsilon = 10 (Table 5, 7): ResNet-18 with GroupNorm, 20 epochs of
        # batch 128, lr 0.01, C = 1.2; k = 10 alignment iterations, T = 100; as many images as private ones.
        # Its students train for 200 epochs (App. A.1.4): the evaluation's distillation schedule.
        "paper": {"sampling": {"num_samples": 60000}, "evaluation": {"soft_label_epochs": 200}},
        # Sized for a 2-core CPU: a ResNet-10-style teacher (one block per stage, widths 16..128, 0.3M
        # parameters, ~4x faster per example than widths 32..256) and a few epochs of large-batch DP-SGD; students
        # distilled for 30 epochs at temperature 4 (ε = 10, 5,000 images, one CNN: 10 epochs at T = 100 23 %,
        # 30 epochs 40 %; 30 epochs at T = 1 / 4 / 10: 44 / 68 / 66 %, measured).
        "cpu": preset_with(CPU_PROTOCOL, {
            "teacher": {"blocks": [1, 1, 1, 1], "widths": [16, 32, 64, 128], "groups": 8, "batch_size": 512,
                        "epochs": 4.0, "lr": 0.5},
            "evaluation": {"soft_label_epochs": 30, "distillation_temperature": 4}}),
    }

    def __init__(self, config: RunConfig) -> None:
        super().__init__(config)
        self.teacher_settings = section_settings(TeacherSettings, config, "teacher")
        self.statistics_settings = section_settings(StatisticsSettings, config, "statistics")
        self.alignment_settings = section_settings(AlignmentSettings, config, "alignment")
        self.release: Release | None = None

    def privacy_stages(self, info: DatasetInfo) -> list[PlannedStage]:
        alignment = self.alignment_settings
        if alignment.init == "public" and alignment.public == info.name and \
                alignment.public_data_dir == DatasetSettings.of(self.config).data_dir:
            raise ConfigError(f"alignment.public: {info.name!r} is the private dataset itself; choose a public "
                              "one (e.g. mnist-5k for a Fashion-MNIST private set) or alignment.init=noise")
        teacher = self.teacher_settings
        schedule = dpsgd_schedule(TEACHER_STAGE, teacher.batch_size, teacher.epochs, info.num_train)
        return [PlannedStage(TEACHER_STAGE, calibrated=schedule.event),
                PlannedStage(STATISTICS_STAGE, GaussianMechanism(self.statistics_settings.noise_multiplier))]

    def class_balance(self) -> str:
        return ("images aligned to the same number of target labels per class; each released hard label is the DP "
                "teacher's most likely class for its image (post-processing), so the counts per class may differ")

    def soft_label_temperature(self) -> float:
        return self.alignment_settings.temperature

    def fit(self, context: RunContext) -> None:
        """The DP teacher and the DP statistics (released in turn, or restored), then the aligned release."""
        public = self._public_images(context.dataset.info) if self.alignment_settings.init == "public" else None
        teacher = self._build_teacher(context.dataset.info.shape, context.dataset.info.num_classes).to(context.device)
        teacher.load_state_dict(context.released(TEACHER_STAGE, lambda: self._trained_teacher(context, teacher),
                                                 every_rank=True))
        released = context.released(STATISTICS_STAGE, lambda: self._released_statistics(context, teacher, public))
        context.log("statistics", clip=released["clip"], teacher_test_accuracy=released["teacher_accuracy"])
        context.report_metric("teacher_test_accuracy", released["teacher_accuracy"])
        statistics = BatchStatistics(**released["statistics"])
        scaling = MomentScaling(released["scale"], released["clip"])
        self.release = context.on_main(lambda: self._aligned_release(context, teacher, statistics, scaling, public))

    def _released_statistics(self, context: RunContext, teacher: torch.nn.Module,
                             public: torch.Tensor | None) -> dict[str, Any]:
        """The trained teacher's test accuracy, moment scaling (from public data) and DP statistics."""
        info, device = context.dataset.info, context.device
        accuracy = correct_count(teacher, context.dataset.test.images, context.dataset.test.labels,
                                 device) / len(context.dataset.test)
        scaling = self._moment_scaling(teacher, public, info.shape, device)
        event = context.planned_event(STATISTICS_STAGE, GaussianMechanism)
        batch_size = self.statistics_settings.batch_size
        with memory_limited_by("statistics.batch_size", batch_size, "computing the DP batch statistics"):
            train = context.dataset.train
            inputs = _teacher_inputs(as_floats(train.images))
            statistics = private_statistics(teacher, inputs, train.unit_weights(), scaling, event.noise_multiplier,
                                            batch_size, device, context.ledger, STATISTICS_STAGE, context.noise,
                                            info.num_train)
        return {"statistics": statistics.state_dict(), "scale": scaling.scale, "clip": scaling.clip,
                "teacher_accuracy": accuracy}

    def _build_teacher(self, shape: tuple[int, int, int], num_classes: int) -> torch.nn.Module:
        settings = self.teacher_settings
        return group_norm_resnet(shape[0], num_classes, list(settings.blocks), list(settings.widths), settings.groups)

    def _trained_teacher(self, context: RunContext, teacher: torch.nn.Module) -> dict[str, torch.Tensor]:
        """The teacher's weights after its planned DP-SGD steps on cross-entropy (SGD with momentum)."""
        settings, train = self.teacher_settings, context.dataset.train
        event = context.planned_event(TEACHER_STAGE, SubsampledGaussianMechanism)
        optimizer = torch.optim.SGD(teacher.parameters(), lr=settings.lr, momentum=settings.momentum)

        def make_batch(indices: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            return (to_device(_teacher_inputs(as_floats(train.images[indices])), context.device),
                    to_device(train.labels[indices], context.device))

        teacher.train()
        engine = DpsgdSettings(event.noise_multiplier, settings.clip, event.sample_rate, settings.physical_batch_size)
        PrivateTraining(stage=TEACHER_STAGE, model=teacher, optimizer=optimizer, loss=_example_loss, settings=engine,
                        steps=event.steps, checkpoint_every=settings.checkpoint_every,
                        memory_setting=("teacher.physical_batch_size", settings.physical_batch_size)
                        ).run(context, make_batch)
        return weights(teacher)

    def throughput_probes(self, shape: tuple[int, int, int], num_classes: int, device: torch.device) -> Probes:
        """On random tensors: the teacher's DP-SGD, the statistics' moments per private image and an alignment
        iteration per released image (the release's unit, :meth:`release_units`)."""
        settings, generator = self.teacher_settings, torch.Generator().manual_seed(0)
        teacher = self._build_teacher(shape, num_classes).to(device).train()
        frozen = self._build_teacher(shape, num_classes).to(device).eval().requires_grad_(False)

        def make_batch(indices: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            images = torch.rand(len(indices), *shape, generator=generator) * 2 - 1
            return images.to(device), torch.randint(0, num_classes, (len(indices),), generator=generator).to(device)

        images = _teacher_inputs(self._noise_images(PROBE_IMAGES, shape, generator))
        scaling = public_scaling(frozen, images, 1.0, PROBE_IMAGES, device)

        def statistics() -> float:
            weights = torch.ones(PROBE_IMAGES)
            return timed(lambda: clipped_moment_sum(frozen, images, weights, scaling, PROBE_IMAGES, device),
                         device) / PROBE_IMAGES

        def alignment() -> float:
            with torch.no_grad():
                target = batch_statistics(frozen, images.to(device), scaling)
            targets = uniform_targets(PROBE_IMAGES, num_classes).to(device)
            aligned = self.alignment_settings
            seconds = timed(lambda: align_batch(frozen, images.to(device), targets, target, scaling, aligned), device)
            return seconds / (PROBE_IMAGES * aligned.iterations)

        teacher_probe = DpsgdProbe(teacher, _example_loss, make_batch, settings.physical_batch_size, False)
        return Probes({"teacher": (teacher_probe, 1)}, sampling=alignment, phases={STATISTICS_STAGE: statistics})

    @classmethod
    def phase_units(cls, config: RunConfig, num_images: float) -> dict[str, float]:
        return {STATISTICS_STAGE: num_images}

    @classmethod
    def release_units(cls, config: RunConfig) -> float:
        """Image-iterations of alignment."""
        alignment = section_settings(AlignmentSettings, config, "alignment")
        return SamplingSettings.of(config).num_samples * alignment.iterations

    def public_data(self, info: DatasetInfo) -> dict[str, np.ndarray]:
        if self.alignment_settings.init != "public":
            return {}
        return {f"alignment.public {self.alignment_settings.public!r}": fingerprints(self._public_images(info))}

    def _public_images(self, info: DatasetInfo) -> torch.Tensor:
        """Every image of the public dataset, converted to the private images' size and channels."""
        settings = self.alignment_settings
        return self.public_set(settings.public, settings.public_data_dir, info)[0].images

    def _moment_scaling(self, teacher: torch.nn.Module, public: torch.Tensor | None, shape: tuple[int, ...],
                        device: torch.device) -> MomentScaling:
        """The moment blocks' scales from the starting images (public, or 1,000 noise images) and
        ``statistics.clip`` ("auto": 1.5 x the largest scaled norm over those images)."""
        clip = None if isinstance(self.statistics_settings.clip, str) else self.statistics_settings.clip
        starts = public if public is not None else self._noise_images(1000, shape, torch.Generator().manual_seed(0))
        return public_scaling(teacher, _teacher_inputs(starts), clip, self.statistics_settings.batch_size, device)

    @staticmethod
    def _noise_images(count: int, shape: tuple[int, ...], generator: torch.Generator) -> torch.Tensor:
        """Gaussian noise low-pass filtered (App. A.6), as images in [0, 1]."""
        noise = kornia.filters.gaussian_blur2d(torch.randn((count, *shape), generator=generator), (5, 5), (1.5, 1.5))
        return (noise / noise.std() * 0.25 + 0.5).clamp(0, 1)

    def _starting_images(self, count: int, public: torch.Tensor | None, shape: tuple[int, ...],
                         generator: torch.Generator) -> torch.Tensor:
        """``count`` public images in random order (each reused in turn when count exceeds the public set)."""
        if public is None:
            return self._noise_images(count, shape, generator)
        order = torch.cat([torch.randperm(len(public), generator=generator)
                           for _ in range(-(-count // len(public)))])[:count]
        return public[order]

    def _aligned_release(self, context: RunContext, teacher: torch.nn.Module, statistics: BatchStatistics,
                         scaling: MomentScaling, public: torch.Tensor | None) -> Release:
        """Alg. 1 batch by batch on ``sampling.num_samples`` images, then the teacher's soft labels."""
        settings = self.alignment_settings
        count, num_classes = self.sampling.num_samples, context.dataset.info.num_classes
        starts = self._starting_images(count, public, context.dataset.info.shape, context.generator)
        targets = torch.cat([uniform_targets(len(chunk), num_classes) for chunk in starts.split(settings.batch_size)])
        aligned, losses = align_images(teacher, starts, targets, statistics, scaling, settings, context.device)
        context.log("alignment", iterations=settings.iterations, **losses)
        images = torch.from_numpy(to_uint8(aligned)).float() / 255  # exactly what is released
        soft = self._soft_labels(teacher, images, context.device)
        self._save_alignment_grid(context, starts, images, targets, num_classes)
        return Release(images, soft.argmax(dim=1), soft)

    @torch.no_grad()
    def _soft_labels(self, teacher: torch.nn.Module, images: torch.Tensor, device: torch.device) -> torch.Tensor:
        temperature = self.alignment_settings.temperature
        logits = torch.cat([teacher(_teacher_inputs(chunk).to(device)).cpu() for chunk in images.split(500)])
        return F.softmax(logits.double() / temperature, dim=1).float()

    @staticmethod
    def _save_alignment_grid(context: RunContext, starts: torch.Tensor, aligned: torch.Tensor, targets: torch.Tensor,
                             num_classes: int, per_class: int = 8) -> None:
        """Row 2c: public starting images given target class c; row 2c + 1: the same images aligned."""
        rows = torch.cat([2 * targets, 2 * targets + 1])
        context.save_grid(ALIGNMENT_GRID, torch.cat([starts, aligned]), rows, 2 * num_classes, per_class)

    def generate(self, num_samples: int, generator: torch.Generator) -> Release:
        """The first ``num_samples`` aligned images (``sampling.num_samples`` were aligned in fit)."""
        if self.release is None:
            raise RuntimeError("generate() needs fit() first")
        aligned, soft = self.release, self.release.soft_labels
        if num_samples > len(aligned.labels):
            raise ConfigError(f"sampling.num_samples: {len(aligned.labels)} images were aligned, {num_samples} asked")
        assert soft is not None
        return Release(aligned.images[:num_samples], aligned.labels[:num_samples], soft[:num_samples])


def _teacher_inputs(images: torch.Tensor) -> torch.Tensor:
    """Images in [0, 1] to the teacher's input range [-1, 1] (as the evaluation's classifiers)."""
    return images * 2 - 1


def _example_loss(model: Any, image: torch.Tensor, label: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(model(image[None]), label[None])
