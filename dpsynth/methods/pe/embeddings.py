"""Embeddings in which PE measures nearest neighbours: the FID Inception network, or raw pixels."""
from __future__ import annotations

from typing import Protocol

import torch

from ...evaluation.inception import InceptionFeatures, chosen_path
from ...hardware import AUTO
from ...utils.images import to_uint8

EMBEDDINGS = ("pixels", "inception")


class Embedding(Protocol):
    """Maps N images in [0, 1] (N x C x H x W) to N x d float features."""

    name: str

    def __call__(self, images: torch.Tensor) -> torch.Tensor: ...


class PixelEmbedding:
    """The flattened pixels: cheap, and enough for small grey images such as MNIST."""

    name = "pixels"

    def __call__(self, images: torch.Tensor) -> torch.Tensor:
        return images.flatten(1).float()


class InceptionEmbedding:
    """The 2048-d pool features of the TF-FID InceptionV3 that evaluation uses (the paper's choice), run as
    ``evaluation.fast_inception: auto`` runs it."""

    name = "inception"

    def __init__(self, device: torch.device) -> None:
        self.network = InceptionFeatures(device, chosen_path(AUTO)[0])

    def __call__(self, images: torch.Tensor) -> torch.Tensor:
        return torch.from_numpy(self.network(to_uint8(images)))


def build_embedding(name: str, device: torch.device) -> Embedding:
    """The embedding called ``name`` (one of :data:`EMBEDDINGS`)."""
    if name == "pixels":
        return PixelEmbedding()
    if name == "inception":
        return InceptionEmbedding(device)
    raise ValueError(f"unknown embedding {name!r}; embeddings: {', '.join(EMBEDDINGS)}")
