"""Classifiers: the evaluation's downstream nets (a small CNN, ResNets, Wide ResNets) and DP-ImgSyn's
GroupNorm ResNet teacher.

DPImageBench trains WRN-40-4, ResNet and ResNeXt; on a CPU the evaluation's defaults are smaller members
of the same families (``resnet`` is ResNet-20-style, ``wrn`` is WRN-16-2), deeper or wider ones by name.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence

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


Norm = Callable[[int], nn.Module]


class BasicBlock(nn.Module):
    """Pre-activation residual block: (norm, ReLU, conv 3x3) twice, projection shortcut when the shape changes."""

    def __init__(self, inputs: int, outputs: int, stride: int, norm: Norm = nn.BatchNorm2d) -> None:
        super().__init__()
        self.body = nn.Sequential(
            norm(inputs), nn.ReLU(), nn.Conv2d(inputs, outputs, 3, stride, 1, bias=False),
            norm(outputs), nn.ReLU(), nn.Conv2d(outputs, outputs, 3, 1, 1, bias=False),
        )
        needs_projection = stride != 1 or inputs != outputs
        self.shortcut = nn.Conv2d(inputs, outputs, 1, stride, bias=False) if needs_projection else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x) + self.shortcut(x)


def residual_net(channels: int, num_classes: int, blocks: Sequence[int], widths: Sequence[int], stem: int = 16,
                 norm: Norm = nn.BatchNorm2d) -> nn.Module:
    """A 3x3 stem conv, stages of ``blocks[i]`` residual blocks of ``widths[i]`` channels (stride 2 from the
    second stage on), then norm, ReLU, global pooling and a linear head."""
    layers: list[nn.Module] = [nn.Conv2d(channels, stem, 3, 1, 1, bias=False)]
    inputs = stem
    for stage, (count, width) in enumerate(zip(blocks, widths, strict=True)):
        for block in range(count):
            layers.append(BasicBlock(inputs, width, 2 if stage and not block else 1, norm))
            inputs = width
    layers += [norm(inputs), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(inputs, num_classes)]
    return nn.Sequential(*layers)


def resnet(depth: int) -> Callable[[int, int], nn.Module]:
    """ResNet-``depth`` for small images (He et al. 2016, CIFAR variant): depth = 6n + 2."""
    return lambda channels, classes: residual_net(channels, classes, [(depth - 2) // 6] * 3, (16, 32, 64))


def wide_resnet(depth: int, width: int) -> Callable[[int, int], nn.Module]:
    """WRN-``depth``-``width`` (Zagoruyko & Komodakis 2016): depth = 6n + 4, widths 16k, 32k, 64k."""
    return lambda channels, classes: residual_net(channels, classes, [(depth - 4) // 6] * 3,
                                                  (16 * width, 32 * width, 64 * width))


def group_norm_resnet(channels: int, num_classes: int, blocks: Sequence[int], widths: Sequence[int],
                      groups: int) -> nn.Module:
    """A ResNet with GroupNorm instead of BatchNorm, so that per-example gradients (DP-SGD) are defined.
    ResNet-18: blocks (2, 2, 2, 2), widths (64, 128, 256, 512)."""
    for width in widths:
        if width % groups:
            raise ConfigError(f"teacher.widths: every width must be divisible by teacher.groups = {groups}, "
                              f"got {list(widths)}")
    return residual_net(channels, num_classes, blocks, widths, stem=widths[0],
                        norm=lambda width: nn.GroupNorm(groups, width))


CLASSIFIERS: dict[str, Callable[[int, int], nn.Module]] = {
    "cnn": small_cnn,
    "resnet": resnet(20),
    "resnet56": resnet(56),
    "resnet164": resnet(164),  # DPImageBench's ResNet (basic blocks)
    "wrn": wide_resnet(16, 2),
    "wrn-40-4": wide_resnet(40, 4),
    "wrn-28-10": wide_resnet(28, 10),  # DPImageBench's WRN (without its dropout)
}


def channels_last(model: nn.Module) -> nn.Module:
    """``model`` with its convolution weights channels-last, the layout oneDNN's CPU convolutions run fastest: a
    downstream CNN seed trained in 0.69x the time on an AMD EPYC Zen 4 (2 cores, 2026-12-06), its test accuracy
    within 0.1 points (the same arithmetic in another order). Feed it channels-last images too."""
    return model.to(memory_format=torch.channels_last)  # type: ignore[call-overload]  # (stubs lack the keyword)


def build_classifier(name: str, channels: int, num_classes: int) -> nn.Module:
    """The classifier called ``name``; ConfigError naming the choices otherwise."""
    if name not in CLASSIFIERS:
        raise ConfigError(f"evaluation.classifiers: unknown classifier {name!r}; choose from {', '.join(CLASSIFIERS)}")
    return CLASSIFIERS[name](channels, num_classes)
