"""Neural networks: the class-conditional diffusion UNet, the one-step generator and the classifiers."""
from .classifiers import build_classifier, group_norm_resnet
from .unet import build_unet

__all__ = ["build_classifier", "build_unet", "group_norm_resnet"]
