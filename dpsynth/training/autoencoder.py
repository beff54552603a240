"""Training the latent space of DP-LDM (:class:`~dpsynth.models.autoencoder.SavedAutoencoder`) on PUBLIC images
only: Adam on the L1 reconstruction error plus a small KL term (as Rombach et al. 2022's KL-regularised
autoencoders, without their perceptual and adversarial losses). Nothing private is read, so the autoencoder, and
the encoding and decoding it does, cost no epsilon.

``default_autoencoder`` builds the default one from images that installed packages ship (the upscaler's: characters
drawn in the installed fonts and crops of scikit-learn's two photographs), once per side, channels and recipe, into
a cache folder.
"""
from __future__ import annotations

import hashlib
import json
import time
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from torch.nn import functional
from tqdm.auto import tqdm

from ..data import ImageSet, load_dataset
from ..models.autoencoder import (
    AutoencoderShape,
    SavedAutoencoder,
    build_autoencoder,
    default_shape,
    load_autoencoder,
    padded,
    working_side,
)
from ..models.saved import fresh_folder, save_model
from ..utils.images import as_floats
from .upscaler import DEFAULT_SOURCES

DEFAULT_CACHE = "~/.cache/dpsynth/autoencoders"
LATENT_QUANTILE = 0.999  # the latent scale maps this quantile of the standardised |latent| on public images to 1
LATENT_MAP = "standardised per channel"  # how latents become latent images (part of the default's recipe)


@dataclass(frozen=True)
class AutoencoderTraining:
    """Adam steps, their batch, learning rate, the weight of the KL term, and the side of the random square crops
    it trains on (whole images when they are no larger): the autoencoder is convolutional, so one trained on crops
    encodes whole images, at a quarter of the cost a step for crops of half the side."""

    iterations: int = 600
    batch_size: int = 32
    lr: float = 1e-3
    kl_weight: float = 1e-6
    crop: int = 64


def train_autoencoder(public: list[ImageSet], out: str | Path, training: AutoencoderTraining,
                      shape: AutoencoderShape, device: torch.device, name: str, described: str,
                      seed: int = 0) -> SavedAutoencoder:
    """Train an autoencoder on the ``public`` image sets (all of one shape), save it in ``out`` with the
    fingerprints of every training image and its latent scale, and load it back."""
    out = fresh_folder(out)
    images = torch.cat([as_floats(part.images) for part in public])
    channels, side = images.shape[1], images.shape[-1]
    work = working_side(side, shape)
    crop = min(work, -(-training.crop // shape.factor) * shape.factor)
    generator = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    model = build_autoencoder(channels, shape).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=training.lr)
    started, loss = time.perf_counter(), torch.zeros(())
    for _ in tqdm(range(training.iterations), desc="autoencoder", dynamic_ncols=True):
        batch = _crops(padded(images[torch.randint(len(images), (training.batch_size,), generator=generator)], work),
                       crop, generator)
        posterior = model.encode(batch.to(device) * 2 - 1).latent_dist
        rebuilt = model.decode(posterior.sample()).sample
        loss = functional.l1_loss(rebuilt, batch.to(device) * 2 - 1) + training.kl_weight * posterior.kl().mean()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    model.eval()
    save_model(SavedAutoencoder, model.cpu(), shape, {
        "name": name, "side": side, "channels": channels, **_latent_map(model, images, work),
        "trained_on": described, "images": len(images), "training": asdict(training),
        "final_loss": round(loss.item(), 5), "seconds": round(time.perf_counter() - started, 1),
        "private_images": 0}, [part.images for part in public], out)
    return load_autoencoder(out)


def _crops(images: torch.Tensor, side: int, generator: torch.Generator) -> torch.Tensor:
    """A random ``side`` x ``side`` crop of each image (the images themselves when they are that size)."""
    room = images.shape[-1] - side + 1
    if room == 1:
        return images
    corners = torch.randint(room, (len(images), 2), generator=generator).tolist()
    return torch.stack([image[:, top:top + side, left:left + side]
                        for image, (top, left) in zip(images, corners, strict=True)])


@torch.no_grad()
def _latent_map(model: torch.nn.Module, images: torch.Tensor, work: int, rows: int = 2048) -> dict[str, Any]:
    """On (up to ``rows`` of) the public images, each latent channel's mean and standard deviation, and 1 over the
    :data:`LATENT_QUANTILE` of the standardised latents' magnitude (:meth:`SavedAutoencoder.latent_map`)."""
    chosen = images[torch.randperm(len(images), generator=torch.Generator().manual_seed(0))[:rows]]
    latents = torch.cat([model.cpu().encode(padded(part, work) * 2 - 1).latent_dist.mean  # type: ignore[operator]
                         for part in chosen.split(256)])  # (a diffusers AutoencoderKL)
    mean, std = latents.mean((0, 2, 3), keepdim=True), latents.std((0, 2, 3), keepdim=True).clamp(min=1e-6)
    magnitude = ((latents - mean) / std).abs().flatten()[:2 ** 24]
    return {"latent_mean": [round(value, 6) for value in mean.flatten().tolist()],
            "latent_std": [round(value, 6) for value in std.flatten().tolist()],
            "latent_scale": round(1.0 / float(torch.quantile(magnitude, LATENT_QUANTILE)), 6)}


def default_autoencoder(side: int, channels: int, device: torch.device, cache_dir: str = DEFAULT_CACHE,
                        training: AutoencoderTraining = AutoencoderTraining()) -> SavedAutoencoder:
    """The default autoencoder for images of ``channels`` x ``side`` x ``side``, trained once on
    :data:`~dpsynth.training.upscaler.DEFAULT_SOURCES` into ``cache_dir``."""
    shape = default_shape(side)
    recipe = json.dumps([side, channels, DEFAULT_SOURCES, asdict(training), asdict(shape), LATENT_MAP],
                        sort_keys=True)
    name = f"dpsynth-default-{channels}x{side}px-{hashlib.sha256(recipe.encode()).hexdigest()[:10]}"
    folder = Path(cache_dir).expanduser() / name
    if folder.is_dir():
        return load_autoencoder(folder)
    with warnings.catch_warnings():  # a part of a published set: its size steers nothing here
        warnings.simplefilter("ignore")
        public = [load_dataset(source, resolution=side, channels=channels, num_images=count).train
                  for source, count in DEFAULT_SOURCES]
    described = ("characters drawn in the installed fonts (dataset glyphs) and crops of scikit-learn's two sample "
                 "photographs (dataset photo-patches)")
    return train_autoencoder(public, folder, training, shape, device, name, described)
