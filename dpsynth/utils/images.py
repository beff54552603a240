"""Image helpers: quantisation and sample grids with one row per class."""
from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image

from .io import atomic_write


def to_uint8(images: torch.Tensor) -> np.ndarray:
    """Float images in [0, 1] (N x C x H x W) to uint8 0..255, rounding to the nearest level; uint8 ones as they
    are."""
    if images.dtype == torch.uint8:
        return images.cpu().numpy()
    return images.detach().float().clamp(0, 1).mul(255).round().to(torch.uint8).cpu().numpy()


def as_floats(images: torch.Tensor) -> torch.Tensor:
    """Images as float32 in [0, 1]: uint8 ones (as loaded data is held) divided by 255, float ones as they are."""
    return images.float().div_(255.0) if images.dtype == torch.uint8 else images


def class_grid(images: np.ndarray, labels: np.ndarray, num_classes: int, per_class: int = 10,
               pad: int = 2) -> np.ndarray:
    """A H x W x C uint8 mosaic: row k holds the first ``per_class`` images of class k (blank if fewer)."""
    _, channels, height, width = images.shape
    grid = np.full((num_classes * (height + pad) + pad, per_class * (width + pad) + pad, channels), 255, np.uint8)
    for label in range(num_classes):
        for col, index in enumerate(np.flatnonzero(labels == label)[:per_class]):
            top, left = pad + label * (height + pad), pad + col * (width + pad)
            grid[top:top + height, left:left + width] = images[index].transpose(1, 2, 0)
    return grid


def png_bytes(array: np.ndarray, min_size: int = 256) -> bytes:
    """A H x W x C uint8 array as PNG, enlarged by an integer factor (nearest) to >= ``min_size`` px."""
    image = Image.fromarray(array[..., 0] if array.shape[2] == 1 else array)
    factor = max(1, -(-min_size // max(image.size)))
    buffer = io.BytesIO()
    image.resize((image.width * factor, image.height * factor), Image.Resampling.NEAREST).save(buffer, format="PNG")
    return buffer.getvalue()


def save_png(array: np.ndarray, path: str | Path, min_size: int = 256) -> None:
    """Save a H x W x C uint8 array as PNG, enlarged as :func:`png_bytes` does."""
    data = png_bytes(array, min_size)
    atomic_write(path, lambda handle: handle.write(data))


def convert_images(images: torch.Tensor, channels: int, size: int | tuple[int, int]) -> torch.Tensor:
    """``images`` with ``channels`` channels (grey <-> RGB) at ``size``, bilinear with antialiasing."""
    if images.shape[1] != channels:
        images = images.mean(dim=1, keepdim=True) if channels == 1 else images.expand(-1, channels, -1, -1)
    target = (size, size) if isinstance(size, int) else size
    if tuple(images.shape[-2:]) != target:
        images = F.interpolate(images, size=target, mode="bilinear", align_corners=False, antialias=True)
    return images
