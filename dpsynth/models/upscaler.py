"""A super-resolution model that lifts images made at a small side to a larger one: bicubic interpolation plus a
small convolutional correction learnt on PUBLIC images only (:mod:`dpsynth.training.upscaler` trains it).

It works on one channel at a time (an RGB image is lifted channel by channel), so one model serves grey and
colour releases, and at any ratio of sides (the correction runs at the target side). A saved model is a folder
(:mod:`dpsynth.models.saved`: ``upscaler.safetensors``, ``upscaler.json``, ``fingerprints.npy``).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import torch
from torch import nn
from torch.nn import functional

from .saved import SavedModel, read_model


@dataclass(frozen=True)
class UpscalerShape:
    """The correction network: ``depth`` 3 x 3 convolutions of ``width`` channels."""

    width: int = 16
    depth: int = 3


class Upscaler(nn.Module):
    """Images N x C x h x w in [0, 1] to N x C x side x side: bicubic, plus a learnt residual, clamped to [0, 1]."""

    def __init__(self, shape: UpscalerShape = UpscalerShape()) -> None:
        super().__init__()
        self.shape = shape
        layers: list[nn.Module] = []
        channels = 1
        for _ in range(shape.depth - 1):
            layers += [nn.Conv2d(channels, shape.width, 3, padding=1), nn.SiLU()]
            channels = shape.width
        last = nn.Conv2d(channels, 1, 3, padding=1)
        nn.init.zeros_(last.weight)
        nn.init.zeros_(last.bias)  # type: ignore[arg-type]  # (it has one) starts as plain bicubic interpolation
        layers.append(last)
        self.body = nn.Sequential(*layers)

    def forward(self, images: torch.Tensor, side: int) -> torch.Tensor:
        count, channels, height, width = images.shape
        single = images.reshape(count * channels, 1, height, width)
        base = functional.interpolate(single, size=(side, side), mode="bicubic", align_corners=False)
        return (base + self.body(base)).clamp(0, 1).reshape(count, channels, side, side)


@dataclass(frozen=True)
class SavedUpscaler(SavedModel):
    """A saved upscaler (:class:`~dpsynth.models.saved.SavedModel`)."""

    kind: ClassVar[str] = "upscaler"
    command: ClassVar[str] = "dpsynth pretrain --upscaler"

    @torch.no_grad()
    def lift(self, images: torch.Tensor, side: int, device: torch.device, chunk: int = 256) -> torch.Tensor:
        """``images`` in [0, 1] lifted to ``side`` x ``side``, ``chunk`` at a time on ``device`` (returned on the
        CPU)."""
        model = self.model.to(device)
        return torch.cat([model(part.float().to(device), side).cpu() for part in images.split(chunk)])


def load_upscaler(folder: str | Path, setting: str = "release.upscaler") -> SavedUpscaler:
    """The upscaler saved in ``folder``; ConfigError naming ``setting`` when the folder holds none."""
    return SavedUpscaler(*read_model(SavedUpscaler, folder, setting,
                                     lambda record: Upscaler(UpscalerShape(**record["shape"]))))
