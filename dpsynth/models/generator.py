"""A small class-conditional one-step generator (DCGAN-style): noise and label in, image in [0, 1] out."""
from __future__ import annotations

import torch
from torch import nn

from ..errors import ConfigError


class ConditionalGenerator(nn.Module):
    """z and a label embedding -> a (H/4 x W/4) feature map -> two x2 upsampling convolutions -> sigmoid."""

    def __init__(self, channels: int, height: int, width: int, num_classes: int, latent: int = 60,
                 width_base: int = 64) -> None:
        super().__init__()
        if height % 4 or width % 4:
            raise ConfigError(f"the auxiliary generator needs image sides divisible by 4, got {height} x {width}")
        self.latent, self.num_classes = latent, num_classes
        self.start = (2 * width_base, height // 4, width // 4)
        self.embed = nn.Embedding(num_classes, latent)
        self.project = nn.Sequential(nn.Linear(2 * latent, 2 * width_base * (height // 4) * (width // 4)),
                                     nn.BatchNorm1d(2 * width_base * (height // 4) * (width // 4)), nn.ReLU())
        self.body = nn.Sequential(
            nn.Upsample(scale_factor=2), nn.Conv2d(2 * width_base, width_base, 3, padding=1),
            nn.BatchNorm2d(width_base), nn.ReLU(),
            nn.Upsample(scale_factor=2), nn.Conv2d(width_base, width_base // 2, 3, padding=1),
            nn.BatchNorm2d(width_base // 2), nn.ReLU(),
            nn.Conv2d(width_base // 2, channels, 3, padding=1), nn.Sigmoid(),
        )

    def forward(self, z: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        hidden = self.project(torch.cat([z, self.embed(labels)], dim=1))
        return self.body(hidden.view(-1, *self.start))
