"""Non-private pre-training of an unconditional diffusion model on PUBLIC data, saved in diffusers format.

The directory it writes (``model_index.json``, ``unet/``, ``scheduler/``) is what ``DDPMPipeline.save_pretrained``
writes, so PE's diffusion API loads it exactly as it loads a model downloaded elsewhere. The model is saved
every ``checkpoint_every`` iterations (atomically: written beside, then renamed), so an interrupted run
leaves the last saved model.
"""
from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from diffusers import DDPMPipeline, UNet2DModel
from tqdm.auto import tqdm

from ..data import ImageSet
from ..data.fingerprints import FINGERPRINTS, fingerprints
from ..errors import ConfigError
from ..models import build_unet
from ..utils.device import to_device
from .ddpm import Diffusion

TRAINING_STATE = "pretraining.json"


@dataclass(frozen=True)
class PretrainSettings:
    """Iterations of Adam at a batch size and learning rate; the UNet's widths; how often to save."""

    iterations: int = 4000
    batch_size: int = 64
    lr: float = 1e-3
    block_channels: tuple[int, ...] = (32, 64, 64)
    checkpoint_every: int = 500

    def __post_init__(self) -> None:
        for name in ("iterations", "batch_size", "checkpoint_every"):
            if getattr(self, name) < 1:
                raise ConfigError(f"pretrain {name} must be >= 1, got {getattr(self, name)}")
        if not self.lr > 0:
            raise ConfigError(f"pretrain lr must be positive, got {self.lr}")


def pretrain(data: ImageSet, out: str | Path, settings: PretrainSettings, device: torch.device, seed: int = 0
             ) -> Path:
    """Train an unconditional epsilon-prediction DDPM on ``data`` (public images) and save it in ``out``."""
    out = Path(out)
    if out.exists() and any(out.iterdir()):
        raise ConfigError(f"--out {out}: the directory exists and is not empty; choose a new one")
    _, channels, height, width = data.images.shape
    if height != width:
        raise ConfigError(f"pretrain needs square images, got {height} x {width}")
    torch.manual_seed(seed)
    generator = torch.Generator().manual_seed(seed)
    diffusion = Diffusion(prediction="epsilon")
    model = build_unet(channels, height, None, settings.block_channels).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=settings.lr)
    prints = fingerprints(data.images)
    model.train()
    for step in tqdm(range(1, settings.iterations + 1), desc="pretrain", dynamic_ncols=True):
        index = torch.randint(len(data), (settings.batch_size,), generator=generator)
        times, noise = diffusion.training_inputs(settings.batch_size, 1, (channels, height, width), generator)
        images, times, noise = (to_device(t, device) for t in (data.images[index], times, noise))
        loss = diffusion.batch_loss(model, images, None, times, noise)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if step % settings.checkpoint_every == 0 or step == settings.iterations:
            save_diffusers(model, diffusion, out, {"step": step, "loss": loss.item()}, prints)
    return out


def save_diffusers(model: UNet2DModel, diffusion: Diffusion, out: Path, state: dict[str, float],
                   training_fingerprints: np.ndarray) -> None:
    """Write ``model`` and the DDPM scheduler as a DDPMPipeline directory, with the fingerprints of its
    training images (so a run can check they are not its private data), replacing ``out`` atomically."""
    partial = out.with_name(out.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    DDPMPipeline(unet=model, scheduler=diffusion.train_scheduler).save_pretrained(partial)
    (partial / TRAINING_STATE).write_text(json.dumps(state))
    np.save(partial / FINGERPRINTS, training_fingerprints)
    shutil.rmtree(out, ignore_errors=True)
    partial.rename(out)
