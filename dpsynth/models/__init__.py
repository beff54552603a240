"""Neural networks: the class-conditional diffusion UNet, the one-step generator and the classifiers."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .classifiers import build_classifier, channels_last, group_norm_resnet

if TYPE_CHECKING:
    from .unet import build_unet

__all__ = ["build_classifier", "channels_last", "build_unet", "group_norm_resnet"]


def __getattr__(name: str) -> Any:
    """``build_unet`` on first use: the UNet is diffusers', which takes seconds to import, and a run of a method
    without a diffusion model, or an evaluation, needs none of it."""
    if name == "build_unet":
        from .unet import build_unet

        return build_unet
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
