"""PrivImage's semantic histogram: per private class, how often a public classifier names each public class among
its top k for the private images, released with Gaussian noise scaled to its L2 sensitivity sqrt(k)."""
from __future__ import annotations

import math

import torch

from .ledger import PrivacyLedger
from .mechanisms import release_counts
from .randomness import SecretStream


def semantic_counts(top_classes: torch.Tensor, labels: torch.Tensor, weights: torch.Tensor, num_labels: int,
                    num_classes: int) -> torch.Tensor:
    """Per private label and class (float64), the summed ``weights`` of the records (rows of ``top_classes``: k
    distinct classes each, with their ``labels``) of that label that name that class. A record of weight at most 1
    changes k counts of its own label's row by its weight: L2 sensitivity sqrt(k), for one image or, weighted by
    :meth:`~dpsynth.data.ImageSet.unit_weights`, one group of any labels."""
    cells = labels.to(top_classes.dtype)[:, None] * num_classes + top_classes
    repeated = weights.double().repeat_interleave(top_classes.shape[1])
    counts = torch.bincount(cells.flatten(), weights=repeated, minlength=num_labels * num_classes)
    return counts.reshape(num_labels, num_classes)


def semantic_histogram(top_classes: torch.Tensor, labels: torch.Tensor, weights: torch.Tensor, num_labels: int,
                       num_classes: int, noise_multiplier: float, ledger: PrivacyLedger, stage: str,
                       noise: SecretStream) -> torch.Tensor:
    """:func:`semantic_counts` plus Gaussian noise of std noise_multiplier x sqrt(k), their L2 sensitivity;
    recorded before it runs."""
    counts = semantic_counts(top_classes, labels, weights, num_labels, num_classes)
    return release_counts(counts, math.sqrt(top_classes.shape[1]), noise_multiplier, ledger, stage, noise)
