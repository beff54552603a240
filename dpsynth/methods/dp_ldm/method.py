"""DP-LDM (Lyu et al. 2023): DP-SGD on the latents of an autoencoder trained on public data, decoded at release.

The autoencoder (``autoencoder.path``, or the default one trained once per side on images installed packages ship)
maps each private image alone to a latent image; the UNet trains on those with DPDM's DP-SGD (all of it, or only
``model.trainable``'s groups of a public latent model given by ``model.init_from``, as the paper trains the
attention layers); the release samples latents and decodes them. The autoencoder never sees a private image in
training and is fingerprinted in privacy.json like every public set a run reads."""
from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch

from ...config import RunConfig, RunSettings, positive, section_settings
from ...data import DatasetInfo, ImageSet
from ...diffusion.pretrain import read_pretraining
from ...errors import ConfigError
from ...generators import Generator, LatentDiffusionGenerator
from ...models.autoencoder import (
    AutoencoderShape,
    SavedAutoencoder,
    build_autoencoder,
    default_shape,
    latent_shape,
    load_autoencoder,
    working_side,
)
from ...training.autoencoder import AutoencoderTraining, default_autoencoder
from ...training.context import RunContext
from ...training.probes import Probes, timed
from ...utils.device import pick_device
from ..dpdm.method import DPDM, DPSGD_STAGE
from . import DECLARATION


@dataclass(frozen=True, kw_only=True)
class AutoencoderSettings:
    """The ``autoencoder`` section: the folder of a public autoencoder (``dpsynth pretrain --autoencoder`` writes
    one; ``default``: trained once per side and channels on images installed packages ship, with ``iterations``
    Adam steps) and the images it encodes at a time."""

    path: str = "default"
    iterations: int = positive(default=AutoencoderTraining.iterations)
    encode_batch: int = positive(default=256)


ENCODING_PHASE = "encoding"  # the planner's phase: each private training image encoded once
LATENTS_OF = "latents_of_autoencoder"  # a public latent model's record: the SHA-256 of the autoencoder it read


class DPLDM(DPDM):
    """DPDM's DP-SGD (its stage and presets) on the latent images of a public autoencoder, decoded at release."""

    declaration = DECLARATION
    sections = {**DPDM.sections, "autoencoder": AutoencoderSettings}
    # DPDM's presets: its UNet and DP-SGD, on 4 x 8 x 8 (28-32 px) to 4 x 16 x 16 (64-128 px) latents
    pixel_regime = False  # DP-SGD on latents: the recorded outcomes (pixels) do not bracket it

    def __init__(self, config: RunConfig) -> None:
        super().__init__(config)
        self.autoencoder_settings = section_settings(AutoencoderSettings, config, "autoencoder")
        self.saved: SavedAutoencoder | None = None

    def autoencoder(self, info: DatasetInfo, device: torch.device) -> SavedAutoencoder:
        """The public autoencoder for ``info``'s images (:func:`public_autoencoder`), read once."""
        if self.saved is None:
            self.saved = public_autoencoder(self.autoencoder_settings, info, device)
        return self.saved

    @classmethod
    def ready_public_parts(cls, config: RunConfig, info: DatasetInfo, device: torch.device) -> list[str]:
        started = time.perf_counter()
        saved = public_autoencoder(section_settings(AutoencoderSettings, config, "autoencoder"), info, device)
        return [f"autoencoder.path {saved.name!r} ready in {time.perf_counter() - started:.0f} s (public images only)"]

    def pretraining_data(self, public: ImageSet, info: DatasetInfo, device: torch.device
                         ) -> tuple[ImageSet, dict[str, Any]]:
        """The latents of the public images: a public latent model to start from (``model.init_from``)."""
        saved = self.autoencoder(info, device)
        latents = saved.encode(public.images, device, self.autoencoder_settings.encode_batch)
        return ImageSet(latents, public.labels, public.groups), {LATENTS_OF: saved.weights_sha256}

    def public_data(self, info: DatasetInfo) -> dict[str, np.ndarray]:
        saved = self.autoencoder(info, pick_device(RunSettings.of(self.config).device))
        start = self.trainer.unet_settings.init_from
        if start and read_pretraining(start, "model.init_from").get(LATENTS_OF) != saved.weights_sha256:
            raise ConfigError(f"model.init_from: {start} was not trained on the latents of this run's autoencoder "
                              f"({saved.name}); train one with dpsynth pretrain --for dp-ldm (and the same "
                              "autoencoder.path)")
        return {**super().public_data(info), f"autoencoder.path {saved.name!r}": saved.fingerprints()}

    def report_sections(self, info: DatasetInfo) -> dict[str, Any]:
        saved = self.autoencoder(info, torch.device("cpu"))
        return {"latent_space": {
            "autoencoder": saved.name, "autoencoder_sha256": saved.weights_sha256,
            "trained_on": saved.record.get("trained_on"), "public_images": saved.record.get("images"),
            "private_images_seen": 0, "latent_shape": list(saved.latent_shape()),
            "encoding": "each private image alone, to its posterior mean: one record moves its own latents only",
            "composition": "the encoding is a per-record map before DP-SGD and the decoding post-processing of its "
                           "output: no further epsilon"}}

    def fit(self, context: RunContext) -> None:
        """The private training split encoded image by image, then DPDM's DP-SGD on the latents."""
        self.info = info = context.dataset.info
        saved = self.autoencoder(info, context.device)
        train = context.dataset.train
        latents = ImageSet(saved.encode(train.images, context.device, self.autoencoder_settings.encode_batch),
                           train.labels, train.groups)
        context.log("latents", autoencoder=saved.name, shape=list(latents.images.shape[1:]))
        self.model = self.trainer.fit(context, DPSGD_STAGE, self.dpsgd_settings, latents=latents)

    def trained_generator(self) -> Generator:
        if self.model is None or self.info is None or self.saved is None:
            raise RuntimeError("the release needs a fitted model: call fit() first")
        latent_info = _latent_info(self.info, self.saved.latent_shape())
        return LatentDiffusionGenerator(self.trainer.generator(self.model, latent_info, self.declaration.name),
                                        self.saved, self.info.shape)

    @classmethod
    def model_shape(cls, config: RunConfig, shape: tuple[int, int, int]) -> tuple[int, int, int]:
        """The latent shape the autoencoder makes of ``shape`` (:func:`autoencoder_shape`)."""
        return latent_shape(shape[0], shape[1], autoencoder_shape(config, shape[1]))

    def throughput_probes(self, shape: tuple[int, int, int], num_classes: int, device: torch.device) -> Probes:
        """The UNet's probes at the latent shape (:meth:`model_shape`); a unit of the release's work (an image-step
        of sampling) carries its share of decoding the image (one decode per ``diffusion.sample_steps``), and
        encoding the private images is a phase of its own, by the image."""
        probes = self.trainer.probes([self.dpsgd_settings], bool(self.public_sections),
                                     self.model_shape(self.config, shape), num_classes, device)
        sample, steps = probes.sampling, self.trainer.settings.sample_steps
        encoding = {ENCODING_PHASE: lambda: coding_cost(self.config, shape, device, decode=False)}
        if sample is None:
            return replace(probes, phases={**probes.phases, **encoding})
        return replace(probes, phases={**probes.phases, **encoding},
                       sampling=lambda: sample() + coding_cost(self.config, shape, device, decode=True) / steps)

    @classmethod
    def phase_units(cls, config: RunConfig, num_images: float) -> dict[str, float]:
        return {ENCODING_PHASE: num_images}


def public_autoencoder(settings: AutoencoderSettings, info: DatasetInfo, device: torch.device) -> SavedAutoencoder:
    """The public autoencoder ``settings`` name for ``info``'s images (the default one built once into the cache);
    ConfigError when a given one is for another side or channels."""
    if settings.path == "default":
        saved = default_autoencoder(info.height, info.channels, device,
                                    training=AutoencoderTraining(iterations=settings.iterations))
    else:
        saved = load_autoencoder(settings.path)
    if (saved.side, saved.channels) != (info.height, info.channels) or info.height != info.width:
        raise ConfigError(f"autoencoder.path: {saved.folder} encodes {saved.channels} x {saved.side} x {saved.side} "
                          f"images, but training reads {' x '.join(map(str, info.shape))}; write one for that shape "
                          f"with dpsynth pretrain --autoencoder --set dataset.resolution={info.height}")
    return saved


def autoencoder_shape(config: RunConfig, side: int) -> AutoencoderShape:
    """The shape of ``config``'s autoencoder for images of ``side`` px: the default's, or the saved one's."""
    path = section_settings(AutoencoderSettings, config, "autoencoder").path
    return default_shape(side) if path == "default" else load_autoencoder(path).shape


def coding_cost(config: RunConfig, shape: tuple[int, int, int], device: torch.device, decode: bool,
                images: int = 64) -> float:
    """Seconds per image of encoding images of ``shape`` with ``config``'s autoencoder shape (or of decoding their
    latents), timed on an untrained model of that shape after a warm-up call: the cost depends on the shape only.
    A call of ``images`` at a time, as a run's chunks go (on a CPU, 8 at a time cost 0.4x as much an image as 64 at
    128 px: a smaller probe underprices the run's chunks)."""
    ae_shape = autoencoder_shape(config, shape[1])
    model = build_autoencoder(shape[0], ae_shape).to(device).eval()
    generator = torch.Generator().manual_seed(0)  # public random tensors
    inputs = (torch.randn(images, *latent_shape(*shape[:2], ae_shape), generator=generator) if decode
              else torch.rand(images, shape[0], *(2 * [working_side(shape[1], ae_shape)]), generator=generator)
              ).to(device)
    call = model.decode if decode else model.encode
    with torch.no_grad():
        call(inputs[:1])
        return timed(lambda: call(inputs), device) / images


def _latent_info(info: DatasetInfo, shape: tuple[int, int, int]) -> DatasetInfo:
    """``info`` with the latent images' shape."""
    return replace(info, channels=shape[0], height=shape[1], width=shape[2])

