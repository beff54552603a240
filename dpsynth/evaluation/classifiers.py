"""Downstream classifiers (the field's utility test): a small CNN, a ResNet and a Wide ResNet.

DPImageBench trains WRN-40-4, ResNet and ResNeXt; on a CPU the defaults here are smaller members of
the same families (``resnet`` is ResNet-20-style, ``wrn`` is WRN-16-2), deeper or wider ones by name.
"""
from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from ..errors import ConfigError


def small_cnn(channels: int, num_classes: int) -> nn.Module:
    """Two conv-BN-ReLU-pool blocks and a two-layer head with dropout (DPDM's downstream CNN, plus BN)."""
    return nn.Sequential(
        nn.Conv2d(channels, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(2),
        nn.AdaptiveAvgPool2d(7), nn.Flatten(), nn.Dropout(0.25), nn.Linear(64 * 49, 128), nn.ReLU(),
        nn.Linear(128, num_classes),
    )


class BasicBlock(nn.Module):
    """Pre-activation residual block: (BN, ReLU, conv 3x3) twice, projection shortcut when the shape changes."""

    def __init__(self, inputs: int, outputs: int, stride: int) -> None:
        super().__init__()
        self.body = nn.Sequential(
            nn.BatchNorm2d(inputs), nn.ReLU(), nn.Conv2d(inputs, outputs, 3, stride, 1, bias=False),
            nn.BatchNorm2d(outputs), nn.ReLU(), nn.Conv2d(outputs, outputs, 3, 1, 1, bias=False),
        )
        needs_projection = stride != 1 or inputs != outputs
        self.shortcut = nn.Conv2d(inputs, outputs, 1, stride, bias=False) if needs_projection else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x) + self.shortcut(x)


def residual_net(channels: int, num_classes: int, blocks_per_stage: int, widths: tuple[int, int, int]) -> nn.Module:
    """Three stages of residual blocks (strides 1, 2, 2), global pooling and a linear head."""
    layers: list[nn.Module] = [nn.Conv2d(channels, 16, 3, 1, 1, bias=False)]
    inputs = 16
    for stage, width in enumerate(widths):
        for block in range(blocks_per_stage):
            layers.append(BasicBlock(inputs, width, 2 if stage and not block else 1))
            inputs = width
    layers += [nn.BatchNorm2d(inputs), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(inputs, num_classes)]
    return nn.Sequential(*layers)


def resnet(depth: int) -> Callable[[int, int], nn.Module]:
    """ResNet-``depth`` for small images (He et al. 2016, CIFAR variant): depth = 6n + 2."""
    return lambda channels, classes: residual_net(channels, classes, (depth - 2) // 6, (16, 32, 64))


def wide_resnet(depth: int, width: int) -> Callable[[int, int], nn.Module]:
    """WRN-``depth``-``width`` (Zagoruyko & Komodakis 2016): depth = 6n + 4, widths 16k, 32k, 64k."""
    return lambda channels, classes: residual_net(channels, classes, (depth - 4) // 6,
                                                  (16 * width, 32 * width, 64 * width))


CLASSIFIERS: dict[str, Callable[[int, int], nn.Module]] = {
    "cnn": small_cnn,
    "resnet": resnet(20),
    "resnet56": resnet(56),
    "wrn": wide_resnet(16, 2),
    "wrn-40-4": wide_resnet(40, 4),
}


def build_classifier(name: str, channels: int, num_classes: int) -> nn.Module:
    """The classifier called ``name``; ConfigError naming the choices otherwise."""
    if name not in CLASSIFIERS:
        raise ConfigError(f"evaluation.classifiers: unknown classifier {name!r}; choose from {', '.join(CLASSIFIERS)}")
    return CLASSIFIERS[name](channels, num_classes)
