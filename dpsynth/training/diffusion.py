"""The diffusion model a method trains with DP-SGD, as one part a method holds: the class-conditional UNet (started
from a public model when ``model.init_from`` names one), its batches with the noise multiplicity K, resumable
DP-SGD phases with EMA, warm-up losses, what the planner times and the trained model as a generator that samples
the release (:class:`~dpsynth.generators.DiffusionGenerator`). DPDM, PDP-Diffusion,
DP-FETA, FETA-Pro, PrivImage and DP-SAD each hold one (:class:`DiffusionTrainer`)."""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any, cast

import numpy as np
import torch

from ..config import RunConfig, SamplingSettings, section_settings
from ..data import DatasetInfo, ImageSet
from ..data.fingerprints import FINGERPRINTS
from ..diffusion import Diffusion
from ..diffusion.ddpm import NoiseLevels, drop_labels
from ..diffusion.inference import sampling_inputs
from ..diffusion.pretrain import init_from_public, model_label, public_fingerprints, read_pretraining
from ..diffusion.settings import DiffusionSettings, UNetSettings
from ..errors import ConfigError, DataError
from ..generators import DiffusionGenerator
from ..hardware import resolve_bf16
from ..models import build_unet
from ..models.unet import train_only
from ..privacy import NonPrivateAccess, SubsampledGaussianMechanism
from ..privacy.dpsgd import EMA, DpsgdSettings, ExampleLoss
from ..utils.device import to_device
from ..utils.images import as_floats
from .context import RunContext
from .private import DiffusionDpsgdSection, DpsgdSection, MakeBatch, PrivateTraining
from .probes import DpsgdProbe, Probes, forward_cost, timed
from .warmup import LossFn, WarmupSettings, diffusion_loss

SAMPLING_PROBE_ROWS = 64  # images of the planner's timed sampling call (its cost per image-step is what it measures)

# The sections of a DP diffusion model (their defaults: DPImageBench's DPDM), and their cpu preset: about 30
# minutes of DP-SGD on a 2-core CPU (see the README's preset table).
SECTIONS: dict[str, type] = {"model": UNetSettings, "diffusion": DiffusionSettings, "dpsgd": DiffusionDpsgdSection}
CPU_PRESET: dict[str, dict[str, Any]] = {
    "model": {"block_channels": [16, 32, 32], "layers_per_block": 1},
    # ln sigma ~ N(0.5, 1.2^2): FID-inf 76 against uniform t's 99 at equal time (docs/benchmarks.md, the levers)
    "diffusion": {"sample_steps": 10, "noise_levels": "log-normal", "noise_level_mean": 0.5},
    "dpsgd": {"batch_size": 512, "epochs": 6.0, "noise_multiplicity": 1, "lr": 2e-3, "ema": 0.99,
              "physical_batch_size": 128, "checkpoint_every": 25},
}

class DiffusionTrainer:
    """The ``model`` and ``diffusion`` sections of ``config`` made into a UNet and its diffusion; ``class_starts``
    are the ``model.class_start`` values the holding method ``method`` implements."""

    def __init__(self, config: RunConfig, class_starts: Sequence[str], method: str) -> None:
        self.unet_settings = section_settings(UNetSettings, config, "model")
        if self.unet_settings.class_start not in class_starts:
            raise ConfigError(f"model.class_start must be one of {', '.join(class_starts)} for {method}, got "
                              f"{self.unet_settings.class_start!r}")
        self.settings = section_settings(DiffusionSettings, config, "diffusion")
        levels = NoiseLevels(self.settings.noise_levels, self.settings.noise_level_mean, self.settings.noise_level_std)
        self.diffusion = Diffusion(self.settings.timesteps, self.settings.beta_schedule, self.settings.prediction,
                                   levels)
        self.sampling = SamplingSettings.of(config)
        self.public_start: dict[str, Any] = {}  # what init_from_public did, for the log

    def public_data(self) -> dict[str, np.ndarray]:
        """The fingerprints of the public model's training images (``model.init_from``), which must come with it."""
        directory = self.unet_settings.init_from
        if not directory:
            return {}
        read_pretraining(directory, "model.init_from")
        prints = public_fingerprints(directory)
        if prints is None:
            raise DataError(f"model.init_from: {directory} holds no {FINGERPRINTS}, so its training images cannot be "
                            "checked to hold none of the private ones; dpsynth pretrain writes one")
        return {model_label("model.init_from", directory): prints}

    def build(self, info: DatasetInfo, device: torch.device) -> torch.nn.Module:
        """The UNet, with the public model's weights when ``model.init_from`` names one (:meth:`log_public_start`
        logs how)."""
        settings = self.unet_settings
        model = build_unet(info.channels, info.height, info.num_classes, list(settings.block_channels),
                           settings.layers_per_block, settings.attention, settings.norm_groups)
        if settings.init_from:
            self.public_start = init_from_public(model, settings.init_from, info.class_names, self.diffusion,
                                                 class_start=settings.class_start)
        return model.to(device)

    def generator(self, model: torch.nn.Module, info: DatasetInfo, method: str) -> DiffusionGenerator:
        """The trained ``model`` as the generator that samples the release of ``info``'s shape and classes."""
        return DiffusionGenerator(model, info.shape, info.class_names, method, self.unet_settings, self.settings)

    def log_public_start(self, context: RunContext) -> None:
        if self.public_start:
            context.log("public model", **self.public_start)

    def fit(self, context: RunContext, stage: str, settings: DiffusionDpsgdSection,
            warm_up: Callable[[torch.nn.Module], None] | None = None,
            latents: ImageSet | None = None) -> torch.nn.Module:
        """The model built, warmed up by ``warm_up`` on rank 0 (once: a resume of stage ``stage`` skips it), then
        trained by stage ``stage``'s DP-SGD (``settings``) on the private training split (or ``latents``, its
        images each mapped alone, in its order), with its EMA weights; only ``model.trainable``'s parameter groups
        are DP-trained, which needs a start (public or warm-up)."""
        groups = self.unet_settings.trainable
        if not self.unet_settings.trains_all and warm_up is None and not self.unet_settings.init_from:
            raise ConfigError(f"model.trainable {list(groups)} DP-trains part of a UNet that starts at random: name "
                              "a public model to start from (model.init_from) or train [all]")
        info = context.dataset.info
        if latents is not None:
            channels, height, width = latents.images.shape[1:]
            info = replace(info, channels=channels, height=height, width=width)
        model = self.build(info, context.device)
        self.log_public_start(context)
        if not context.resuming(stage):  # the warm-up runs once, on rank 0; DP-SGD starts from its model
            context.on_main(lambda: warm_up(model) if warm_up is not None else None)
            context.world.broadcast_module(model)
        if not self.unet_settings.trains_all:
            trained, total = train_only(model, groups)
            context.log("trainable", groups=list(groups), parameters=trained, of=total)
        make_batch = self.batch_maker(context, settings.noise_multiplicity, latents, private=True)
        self.train_private(context, model, stage, settings, make_batch)
        return model

    def train_private(self, context: RunContext, model: torch.nn.Module, stage: str, settings: DpsgdSection,
                      make_batch: MakeBatch, loss: ExampleLoss | None = None, **hooks: Any) -> EMA:
        """Stage ``stage``'s planned DP-SGD steps of ``loss`` (default the diffusion loss) with Adam and EMA, set by
        ``settings``, resumed when the checkpoint is of that stage; ends with the EMA weights. ``hooks``:
        PrivateTraining's ``parts`` and ``after_step``."""
        event = context.planned_event(stage, SubsampledGaussianMechanism, NonPrivateAccess)
        optimizer = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=settings.lr)
        ema = EMA(model, settings.ema)
        if isinstance(event, SubsampledGaussianMechanism):  # the plan's noise, rate and steps, as accounted
            noise, rate, steps = event.noise_multiplier, event.sample_rate, event.steps
        else:  # a non-private stage: no noise, the rate of the configured batch
            rate = settings.schedule(context.dataset.info.num_train).sample_rate
            noise, steps = None, cast(NonPrivateAccess, event).count
        bf16 = resolve_bf16(settings.bf16, context.device, settings.key("bf16")).value
        engine = DpsgdSettings(noise, settings.clip, rate, settings.physical_batch_size, bf16)
        batch_loss = self.diffusion.example_losses if loss is None else None
        training = PrivateTraining(stage=stage, model=model, optimizer=optimizer,
                                   loss=loss or self.diffusion.example_loss, settings=engine, steps=steps,
                                   checkpoint_every=settings.checkpoint_every,
                                   memory_setting=(settings.key("physical_batch_size"), settings.physical_batch_size),
                                   ema=ema, batch_loss=batch_loss, **hooks)
        training.run(context, make_batch)
        ema.copy_to(model)
        return ema

    def batch_maker(self, context: RunContext, k: int, data: ImageSet | None = None,
                    private: bool | None = None) -> MakeBatch:
        """``make_batch(indices)`` of ``data`` (default the private train split): images, labels, times, noise,
        with K = ``k`` draws of t per example.

        Batches of private data (the train split, or ``data`` made from it when ``private``) draw their randomness
        from the rank's example generator, batches of other data from the shared one."""
        train = data if data is not None else context.dataset.train
        device = context.device
        private = data is None if private is None else private
        generator = context.example_generator if private else context.generator
        shape = tuple(train.images.shape[1:])
        null, dropout = context.dataset.info.num_classes, self.settings.label_dropout

        def make_batch(indices: torch.Tensor) -> tuple[torch.Tensor, ...]:
            labels = drop_labels(train.labels[indices], null, dropout, generator)
            times, noise = self.diffusion.training_inputs(len(indices), k, shape, generator)
            return tuple(to_device(t, device) for t in (as_floats(train.images[indices]), labels, times, noise))

        return make_batch

    def warmup_loss(self, context: RunContext, data: ImageSet, k: int, settings: WarmupSettings) -> LossFn:
        """The diffusion loss on a random batch of ``data`` (K = ``k``), RandAugmented when ``settings.augment``."""
        return diffusion_loss(self.diffusion.batch_loss, self.batch_maker(context, k, data), len(data), settings,
                              context.generator)

    def probes(self, sections: Sequence[DpsgdSection], public: bool, shape: tuple[int, int, int], num_classes: int,
               device: torch.device) -> Probes:
        """The UNet's DP-SGD in each of its DP-SGD ``sections``, its sampling calls and (with ``public``) its public
        training, on random tensors."""
        generator = torch.Generator().manual_seed(0)

        def unet() -> torch.nn.Module:
            settings = self.unet_settings
            return build_unet(shape[0], shape[1], num_classes, list(settings.block_channels),
                              settings.layers_per_block, settings.attention, settings.norm_groups).to(device)

        def make_batch(k: int) -> MakeBatch:
            def batch(indices: torch.Tensor) -> tuple[torch.Tensor, ...]:
                times, noise = self.diffusion.training_inputs(len(indices), k, shape, generator)
                images = torch.rand(len(indices), *shape, generator=generator)
                labels = torch.randint(0, num_classes + 1, (len(indices),), generator=generator)
                return tuple(t.to(device) for t in (images, labels, times, noise))
            return batch

        def sampling() -> float:
            rows = min(self.sampling.batch_size, SAMPLING_PROBE_ROWS)
            images, times, labels = (t.to(device) for t in sampling_inputs(rows, shape, self.diffusion.timesteps))
            bf16 = resolve_bf16(self.sampling.bf16, device, "sampling.bf16").value
            return forward_cost(unet(), [images, times], device, bf16, class_labels=labels)

        def public_training() -> float:
            model, rows = unet(), 64
            optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)

            def step() -> None:
                loss = self.diffusion.example_losses(model, *make_batch(1)(torch.arange(rows))).mean()
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                optimizer.step()
            step()
            return timed(step, device) / rows

        probes = {}
        for settings in sections:
            bf16 = resolve_bf16(settings.bf16, device, settings.key("bf16")).value
            # no K (DP-SAD's student): one draw
            k = settings.noise_multiplicity if isinstance(settings, DiffusionDpsgdSection) else 1
            probes[settings.section] = (DpsgdProbe(unet(), self.diffusion.example_loss, make_batch(k),
                                          settings.physical_batch_size, bf16, self.diffusion.example_losses), k)
        return Probes(probes, sampling, public_training if public else None)
