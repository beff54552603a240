"""Neural networks: the class-conditional diffusion UNet (classifiers join with the evaluation)."""
from .unet import build_unet

__all__ = ["build_unet"]
