"""DP batch statistics of a GroupNorm network: the per-channel mean and variance of every GroupNorm layer's
input over the private set, as BatchNorm would have kept them (DP-ImgSyn Sec. 4.1, made sound).

Each example x gives one vector u(x): for every GroupNorm layer l, the per-channel spatial mean m_l(x) and
mean of squares q_l(x) of the layer's input. u(x) is scaled to L2 norm at most C and the clipped vectors
are summed. Adding or removing one example moves that sum by at most C in L2 norm, so the sum plus
N(0, (sigma C)^2 I) is one Gaussian mechanism with sensitivity C; dividing by the public size N gives the
mean of m and of q, and var_l = mean(q_l) - mean(m_l)^2. The synthetic batch statistics of alignment go
through the same clipping, so both sides estimate the same quantity.
"""
from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import nn

from ...privacy import PrivacyLedger
from ...privacy.mechanisms import clip_rows, release_gaussian
from ...privacy.randomness import SecretStream


@contextmanager
def norm_inputs(model: nn.Module) -> Iterator[list[torch.Tensor]]:
    """Within the block, the input of every GroupNorm layer of ``model`` is appended to the yielded list."""
    captured: list[torch.Tensor] = []
    layers = [m for m in model.modules() if isinstance(m, nn.GroupNorm)]
    handles = [layer.register_forward_pre_hook(lambda _, args: captured.append(args[0])) for layer in layers]
    try:
        yield captured
    finally:
        for handle in handles:
            handle.remove()


def example_moments(model: nn.Module, inputs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``model``'s logits and each example's moment vector u(x) = [m_1, q_1, m_2, q_2, ...] (B x D)."""
    with norm_inputs(model) as captured:
        logits = model(inputs)
    moments = [torch.cat([h.mean(dim=(2, 3)), h.pow(2).mean(dim=(2, 3))], dim=1) for h in captured]
    return logits, torch.cat(moments, dim=1)


def layer_widths(model: nn.Module) -> list[int]:
    """The number of channels of each GroupNorm layer, in forward order."""
    return [m.num_channels for m in model.modules() if isinstance(m, nn.GroupNorm)]


@dataclass(frozen=True)
class BatchStatistics:
    """Per-layer channel means and variances, from the mean of clipped moment vectors."""

    means: list[torch.Tensor]
    variances: list[torch.Tensor]

    @classmethod
    def from_mean_moments(cls, mean: torch.Tensor, widths: list[int]) -> BatchStatistics:
        parts = mean.split([2 * w for w in widths])
        means = [part[:w] for part, w in zip(parts, widths, strict=True)]
        variances = [(part[w:] - part[:w].pow(2)).clamp_min(0) for part, w in zip(parts, widths, strict=True)]
        return cls(means, variances)

    def distance(self, other: BatchStatistics) -> torch.Tensor:
        """Eq. 1: sum over layers of ||mu_l - mu'_l||^2 + ||var_l - var'_l||^2."""
        terms = [(a - b).pow(2).sum() for a, b in zip(self.means + self.variances, other.means + other.variances,
                                                      strict=True)]
        return torch.stack(terms).sum()

    def state_dict(self) -> dict[str, list[torch.Tensor]]:
        return {"means": self.means, "variances": self.variances}


def batch_statistics(model: nn.Module, inputs: torch.Tensor, clip: float) -> BatchStatistics:
    """The statistics of a (synthetic) batch, clipped as the private ones are; differentiable in ``inputs``."""
    _, moments = example_moments(model, inputs)
    return BatchStatistics.from_mean_moments(clip_rows(moments, clip).mean(dim=0), layer_widths(model))


@torch.no_grad()
def clipped_moment_sum(model: nn.Module, images: torch.Tensor, clip: float, batch_size: int,
                       device: torch.device) -> torch.Tensor:
    """Sum over ``images`` (normalised teacher inputs) of their moment vectors, each clipped to norm ``clip``."""
    model.eval()
    total = torch.zeros(2 * sum(layer_widths(model)), dtype=torch.float64, device=device)
    for chunk in images.split(batch_size):
        _, moments = example_moments(model, chunk.to(device))
        total += clip_rows(moments.double(), clip).sum(dim=0)
    return total


def private_statistics(model: nn.Module, images: torch.Tensor, clip: float, noise_multiplier: float,
                       batch_size: int, device: torch.device, ledger: PrivacyLedger, stage: str,
                       noise: SecretStream) -> BatchStatistics:
    """The private set's statistics: clipped moment sum + N(0, (sigma C)^2), divided by the public size N."""
    total = clipped_moment_sum(model, images, clip, batch_size, device)
    noisy = release_gaussian(total, clip, noise_multiplier, ledger, stage, noise)
    return BatchStatistics.from_mean_moments((noisy / len(images)).float(), layer_widths(model))


@torch.no_grad()
def largest_moment_norm(model: nn.Module, images: torch.Tensor, batch_size: int, device: torch.device) -> float:
    """The largest moment-vector norm over ``images`` (public data: sets the clipping norm for free)."""
    model.eval()
    return max(float(example_moments(model, chunk.to(device))[1].norm(dim=1).max())
               for chunk in images.split(batch_size))
