"""The latent space of latent DP diffusion (DP-LDM): a diffusers ``AutoencoderKL`` trained on PUBLIC images only
(:mod:`dpsynth.training.autoencoder` trains it), which maps each image alone to a small latent image and back.

The encoder is a per-image map (convolutions, GroupNorm and attention within one image; the posterior's mean, no
sampling), so a private image moves its own latent and no other: DP-SGD's per-example clipping on the latents
bounds each person's influence exactly as on the pixels. Latents are held as "latent images" in [0, 1] (the mean,
standardised per channel by the public latents' statistics and scaled so all but a thousandth of them lie in
[-1, 1], clamped there, then mapped as pixels are), so a diffusion model trains and samples them as it does images.

Images whose side is not a multiple of :func:`working_side`'s step are padded (edge pixels repeated) before
encoding and cropped after decoding. A saved autoencoder is a folder: ``autoencoder.safetensors`` (the weights,
whose SHA-256 names it in a release), ``autoencoder.json`` (its shape, latent scale, and on which public images it
was trained) and ``fingerprints.npy`` (those images' fingerprints, so a run checks that none of them is private).
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from diffusers import AutoencoderKL
from safetensors.torch import load_file, save_file
from torch.nn import functional

from ..data.fingerprints import FINGERPRINTS, load_fingerprints
from ..errors import ConfigError, DataError
from ..utils.images import as_floats
from ..utils.io import sha256

WEIGHTS, CARD = "autoencoder.safetensors", "autoencoder.json"
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
class SavedAutoencoder:
    """A saved autoencoder: the model, its folder, its record (``side``, ``channels``, ``latent_scale``, what it
    was trained on) and the SHA-256 of its weights."""

    model: AutoencoderKL
    folder: Path
    record: dict[str, Any]
    weights_sha256: str

    @property
    def name(self) -> str:
        return str(self.record.get("name") or self.folder.name)

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

    def fingerprints(self) -> np.ndarray:
        """The fingerprints of the public images it was trained on (DataError when the folder lacks them)."""
        prints = load_fingerprints(self.folder, self.record.get("fingerprints"))
        if prints is None:
            raise DataError(f"{self.folder}: no {FINGERPRINTS}: nothing shows that the autoencoder's training images "
                            "are not private ones; write it again with dpsynth pretrain --autoencoder")
        return prints

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


def save_autoencoder(model: AutoencoderKL, shape: AutoencoderShape, out: Path, record: dict[str, Any]) -> None:
    """Write ``model`` and ``record`` (how and on what it was trained, its side, channels and latent scale) into
    the folder ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    save_file({name: tensor.detach().cpu().contiguous() for name, tensor in model.state_dict().items()},
              str(out / WEIGHTS))
    (out / CARD).write_text(json.dumps({"shape": asdict(shape), **record}, indent=1) + "\n")


def load_autoencoder(folder: str | Path, setting: str = "autoencoder.path") -> SavedAutoencoder:
    """The autoencoder saved in ``folder``; ConfigError naming ``setting`` when the folder holds none."""
    folder = Path(folder).expanduser()
    if not (folder / WEIGHTS).is_file() or not (folder / CARD).is_file():
        raise ConfigError(f"{setting}: {folder} holds no autoencoder (expected {WEIGHTS} and {CARD}); write one with "
                          "dpsynth pretrain --autoencoder --dataset PUBLIC --out DIR")
    try:
        record = json.loads((folder / CARD).read_text())
        model = build_autoencoder(int(record["channels"]), shape_of(record))
        model.load_state_dict(load_file(str(folder / WEIGHTS)))
        float(record["latent_scale"]), int(record["side"])
        if not len(record["latent_mean"]) == len(record["latent_std"]) == shape_of(record).latent_channels:
            raise ValueError("latent_mean and latent_std need one value per latent channel")
    except (OSError, ValueError, KeyError, TypeError, RuntimeError) as exc:
        raise ConfigError(f"{setting}: {folder / CARD} or {WEIGHTS} is damaged ({exc})") from None
    return SavedAutoencoder(model.eval(), folder, record, sha256(folder / WEIGHTS))
