"""The latent space of latent DP diffusion (DP-LDM): a diffusers ``AutoencoderKL`` trained on PUBLIC images only
(:mod:`dpsynth.training.autoencoder` trains it), which maps each image alone to a small latent image and back.

The encoder is a per-image map (convolutions, GroupNorm and attention within one image; the posterior's mean, no
sampling), so a private image moves its own latent and no other: DP-SGD's per-example clipping on the latents
bounds each person's influence exactly as on the pixels. Latents are held as "latent images" in [0, 1] (the mean,
standardised per channel by the public latents' statistics and scaled so all but a thousandth of them lie in
[-1, 1], clamped there, then mapped as pixels are), so a diffusion model trains and samples them as it does images.

Images whose side is not a multiple of :func:`working_side`'s step are padded (edge pixels repeated) before
encoding and cropped after decoding. A saved autoencoder is a folder (:mod:`dpsynth.models.saved`:
``autoencoder.safetensors``, ``autoencoder.json`` with its shape and latent map, ``fingerprints.npy``).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import torch
from torch.nn import functional

from ..errors import ConfigError
from ..utils.images import as_floats
from .saved import SavedModel, read_model

if TYPE_CHECKING:  # diffusers is imported when an autoencoder is built
    from diffusers import AutoencoderKL

LATENT_MULTIPLE = 4  # the latent side is a multiple of 4, so a 3-level UNet halves it twice


@dataclass(frozen=True)
class AutoencoderShape:
    """An ``AutoencoderKL``: latent channels, channels per level (each level past the first halves the side),
    ResNet layers per level and GroupNorm groups."""

    latent_channels: int = 4
    block_channels: tuple[int, ...] = (32, 64, 64)
    layers_per_block: int = 1
    norm_groups: int = 16

    @property
    def factor(self) -> int:
        """How many times smaller the latent's side is than the (padded) image's."""
        return 2 ** (len(self.block_channels) - 1)


def default_shape(side: int) -> AutoencoderShape:
    """The default autoencoder for images of ``side`` px: latents 4 times smaller up to 64 px, 8 times above (a
    cheap first level there, which holds most of the cost)."""
    return AutoencoderShape() if side <= 64 else AutoencoderShape(block_channels=(16, 32, 64, 64))


def working_side(side: int, shape: AutoencoderShape) -> int:
    """The side images are padded to: the next multiple of the factor times :data:`LATENT_MULTIPLE`."""
    step = shape.factor * LATENT_MULTIPLE
    return -(-side // step) * step


def latent_shape(channels: int, side: int, shape: AutoencoderShape) -> tuple[int, int, int]:
    """The latent image of an image ``channels`` x ``side`` x ``side``: (latent channels, s, s)."""
    del channels  # the latent's channels do not depend on the image's
    latent_side = working_side(side, shape) // shape.factor
    return (shape.latent_channels, latent_side, latent_side)


def build_autoencoder(channels: int, shape: AutoencoderShape) -> AutoencoderKL:
    """A fresh ``AutoencoderKL`` for images of ``channels`` channels."""
    if any(width % shape.norm_groups for width in shape.block_channels):
        raise ConfigError(f"autoencoder block_channels {list(shape.block_channels)} must be multiples of its "
                          f"norm_groups ({shape.norm_groups})")
    levels = len(shape.block_channels)
    from diffusers import AutoencoderKL

    return AutoencoderKL(in_channels=channels, out_channels=channels, latent_channels=shape.latent_channels,
                         down_block_types=("DownEncoderBlock2D",) * levels,
                         up_block_types=("UpDecoderBlock2D",) * levels,
                         block_out_channels=tuple(shape.block_channels), layers_per_block=shape.layers_per_block,
                         norm_num_groups=shape.norm_groups)


def padded(images: torch.Tensor, side: int) -> torch.Tensor:
    """``images`` (N x C x h x w) padded on the right and bottom to ``side`` by repeating their edge pixels."""
    extra = side - images.shape[-1]
    return images if extra == 0 else functional.pad(images, (0, extra, 0, extra), mode="replicate")


@dataclass(frozen=True)
class SavedAutoencoder(SavedModel):
    """A saved autoencoder (:class:`~dpsynth.models.saved.SavedModel`) whose record holds its ``side``,
    ``channels`` and latent map."""

    model: AutoencoderKL
    kind: ClassVar[str] = "autoencoder"
    command: ClassVar[str] = "dpsynth pretrain --autoencoder"

    @property
    def shape(self) -> AutoencoderShape:
        return shape_of(self.record)

    @property
    def side(self) -> int:
        return int(self.record["side"])

    @property
    def channels(self) -> int:
        return int(self.record["channels"])

    def latent_shape(self) -> tuple[int, int, int]:
        return latent_shape(self.channels, self.side, self.shape)

    def latent_map(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor, float]:
        """Each latent channel's mean and standard deviation on the public images (1 x C x 1 x 1), and the scale
        that then maps all but a thousandth of the public latents into [-1, 1]."""
        mean, std = (torch.tensor(self.record[key], device=device).view(1, -1, 1, 1)
                     for key in ("latent_mean", "latent_std"))
        return mean, std, float(self.record["latent_scale"])

    @torch.no_grad()
    def encode(self, images: torch.Tensor, device: torch.device, chunk: int = 256) -> torch.Tensor:
        """Latent images in [0, 1] (float32, on the CPU) of ``images`` (uint8 as loaded, or floats in [0, 1]), each
        encoded alone: its posterior mean, standardised per channel and scaled (:meth:`latent_map`), clamped to
        [-1, 1], mapped as pixels are."""
        model, side = self.model.to(device).eval(), working_side(self.side, self.shape)
        mean, std, scale = self.latent_map(device)
        parts = [model.encode(padded(as_floats(part).to(device), side) * 2 - 1).latent_dist.mean.sub(mean).div(std)
                 .mul(scale).clamp(-1, 1).add(1).div(2).cpu() for part in images.split(chunk)]
        return torch.cat(parts)

    @torch.no_grad()
    def decode(self, latents: torch.Tensor, device: torch.device, chunk: int = 256) -> torch.Tensor:
        """Images in [0, 1] (on the CPU, cropped to the autoencoder's side) of latent images in [0, 1]."""
        model, side = self.model.to(device).eval(), self.side
        mean, std, scale = self.latent_map(device)
        parts = [model.decode(part.float().to(device).mul(2).sub(1).div(scale).mul(std).add(mean)).sample
                 [..., :side, :side].add(1).div(2).clamp(0, 1).cpu() for part in latents.split(chunk)]
        return torch.cat(parts)


def shape_of(record: dict[str, Any]) -> AutoencoderShape:
    """The :class:`AutoencoderShape` a card's ``shape`` holds."""
    values = dict(record["shape"])
    values["block_channels"] = tuple(values["block_channels"])
    return AutoencoderShape(**values)


def load_autoencoder(folder: str | Path, setting: str = "autoencoder.path") -> SavedAutoencoder:
    """The autoencoder saved in ``folder``; ConfigError naming ``setting`` when the folder holds none."""
    return SavedAutoencoder(*read_model(SavedAutoencoder, folder, setting, _built))


def _built(record: dict[str, Any]) -> AutoencoderKL:
    """A fresh autoencoder of the card's shape; ValueError when the card's latent map does not fit it."""
    shape = shape_of(record)
    float(record["latent_scale"]), int(record["side"])
    if not len(record["latent_mean"]) == len(record["latent_std"]) == shape.latent_channels:
        raise ValueError("latent_mean and latent_std need one value per latent channel")
    return build_autoencoder(int(record["channels"]), shape)
