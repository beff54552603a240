"""DP nearest-neighbour histogram (PE, Alg. 2): private samples vote for their nearest synthetic sample.

Each private sample adds 1 to exactly one bin, so the vote vector has L2 sensitivity 1 under add / remove;
in conditional PE the classes' histograms, side by side, are still one sensitivity-1 vector (a record
votes only in its own class), so one Gaussian mechanism per iteration covers every class (App. D). With
groups, each image votes with weight 1 / (its group's images): a group adds at most 1 to the votes of all
classes together, so the same mechanism bounds it.
"""
from __future__ import annotations

import torch

from .ledger import PrivacyLedger
from .mechanisms import release_counts
from .randomness import SecretStream


def nearest_neighbour_votes(private: torch.Tensor, synthetic: torch.Tensor, weights: torch.Tensor, chunk: int = 4096,
                            device: torch.device | None = None) -> torch.Tensor:
    """Per synthetic row, the summed ``weights`` of the ``private`` rows that have it as their nearest (L2)
    neighbour (float64, on the CPU).

    Distances are computed on ``device`` (default: where ``synthetic`` is) ``chunk`` private rows at a time, so
    60k x 60k fits in memory; ties go to the lowest index.
    """
    if private.dim() != 2 or synthetic.dim() != 2 or private.shape[1] != synthetic.shape[1]:
        raise ValueError(f"embeddings must be N x d and M x d with the same d, got {tuple(private.shape)} "
                          f"and {tuple(synthetic.shape)}")
    device = device or synthetic.device
    votes = torch.zeros(len(synthetic), dtype=torch.float64, device=device)
    synthetic = synthetic.to(device, torch.float64)
    for start in range(0, len(private), chunk):
        nearest = torch.cdist(private[start:start + chunk].to(device, torch.float64), synthetic).argmin(dim=1)
        votes += torch.bincount(nearest, weights=weights[start:start + chunk].to(device, torch.float64),
                                minlength=len(synthetic))
    return votes.cpu()


def dp_histograms(votes: list[torch.Tensor], noise_multiplier: float, threshold: float, ledger: PrivacyLedger,
                  stage: str, noise: SecretStream) -> list[torch.Tensor]:
    """Every class's votes plus N(0, sigma^2) per bin, then max(count - threshold, 0); recorded once, first."""
    if threshold < 0:
        raise ValueError(f"the threshold must be >= 0, got {threshold}")
    noisy = release_counts(torch.cat(votes), 1.0, noise_multiplier, ledger, stage, noise)
    return list((noisy - threshold).clamp_min(0).split([len(v) for v in votes]))
