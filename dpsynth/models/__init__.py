"""Neural networks: the class-conditional diffusion UNet, the one-step generator and the classifiers."""
from __future__ import annotations

from .classifiers import build_classifier, channels_last, group_norm_resnet
from .unet import build_unet

__all__ = ["build_classifier", "channels_last", "build_unet", "group_norm_resnet"]
