"""DP batch statistics of a GroupNorm network: the per-channel mean and variance of every GroupNorm layer's
input over the private set, as BatchNorm would have kept them (DP-ImgSyn Sec. 4.1, made sound).

Each example x gives one vector u(x): for every GroupNorm layer l, the per-channel spatial mean m_l(x) and
mean of squares q_l(x) of the layer's input. Each block (m_l or q_l) is multiplied by a fixed scale s,
1 / (sqrt(number of blocks) x its mean norm over the public starting images), so that every block weighs
alike and the whole vector has norm about 1: unscaled, the inputs of the pre-activation ResNet's deep
layers (norms in the hundreds) swamped the rest. The scaled u(x) is clipped to L2 norm at most C and the
clipped vectors are summed (with groups, each weighted 1 / its group's images, so a group moves the sum by at
most C too). The scales are computed from public data and the DP teacher only, so they are
constants of the mechanism: adding or removing one example still moves the sum by at most C in L2 norm, and
the sum plus N(0, (sigma C)^2 I) is one Gaussian mechanism with sensitivity C. Dividing by the public size N
and by the scales gives the mean of m and of q, and var_l = mean(q_l) - mean(m_l)^2. The synthetic batch
statistics of alignment go through the same scaling and clipping, so both sides estimate the same
quantity, and Eq. 1's distance is taken in the scaled units.
"""
from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import nn

from .ledger import PrivacyLedger
from .mechanisms import clip_rows, release_gaussian
from .randomness import SecretStream


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


def _block_sizes(widths: list[int]) -> list[int]:
    """The sizes of u(x)'s blocks m_1, q_1, m_2, q_2, ..."""
    return [w for width in widths for w in (width, width)]


@dataclass(frozen=True)
class MomentScaling:
    """The per-coordinate scale of u(x) (constant within each block) and the clipping norm C of the scaled u(x)."""

    scale: torch.Tensor
    clip: float

    def clipped(self, moments: torch.Tensor) -> torch.Tensor:
        """Each row of ``moments`` (B x D) scaled, then clipped to L2 norm at most C."""
        return clip_rows(moments * self.scale.to(moments), self.clip)

    def statistics(self, mean: torch.Tensor, widths: list[int]) -> BatchStatistics:
        """The statistics of a mean of clipped scaled moment vectors."""
        raw = (mean / self.scale.to(mean)).split(_block_sizes(widths))
        scales = self.scale.to(mean).split(_block_sizes(widths))
        means, squares = raw[0::2], raw[1::2]
        variances = [(q - m.pow(2)).clamp_min(0) for m, q in zip(means, squares, strict=True)]
        return BatchStatistics(list(means), variances, list(scales[0::2]), list(scales[1::2]))


@torch.no_grad()
def public_scaling(model: nn.Module, images: torch.Tensor, clip: float | None, batch_size: int,
                   device: torch.device) -> MomentScaling:
    """The block scales from ``images`` (public), and C = ``clip`` or, for None, 1.5 x the largest scaled norm
    over ``images``: no private data is read, so choosing either this way is free."""
    model.eval()
    sizes = _block_sizes(layer_widths(model))

    def moments() -> Iterator[torch.Tensor]:
        return (example_moments(model, chunk.to(device))[1].double().cpu() for chunk in images.split(batch_size))

    block_norms = (torch.stack([b.norm(dim=1) for b in chunk.split(sizes, dim=1)], dim=1) for chunk in moments())
    mean_norms = torch.cat(list(block_norms)).mean(dim=0)
    scale = torch.repeat_interleave(1 / mean_norms.clamp_min(1e-12), torch.tensor(sizes)) / len(sizes) ** 0.5
    if clip is None:
        clip = 1.5 * max(float((chunk * scale).norm(dim=1).max()) for chunk in moments())
    return MomentScaling(scale.float(), clip)


@dataclass(frozen=True)
class BatchStatistics:
    """Per-layer channel means and variances, with the scales of their moments for Eq. 1's distance."""

    means: list[torch.Tensor]
    variances: list[torch.Tensor]
    mean_scales: list[torch.Tensor]
    square_scales: list[torch.Tensor]

    def distance(self, other: BatchStatistics) -> torch.Tensor:
        """Eq. 1 in the scaled units: sum over layers of ||s_m (mu_l - mu'_l)||^2 + ||s_q (var_l - var'_l)||^2."""
        pairs = zip(self.means + self.variances, other.means + other.variances, self.mean_scales + self.square_scales,
                    strict=True)
        return torch.stack([((a - b) * scale).pow(2).sum() for a, b, scale in pairs]).sum()

    def state_dict(self) -> dict[str, list[torch.Tensor]]:
        return {"means": self.means, "variances": self.variances, "mean_scales": self.mean_scales,
                "square_scales": self.square_scales}


def batch_statistics(model: nn.Module, inputs: torch.Tensor, scaling: MomentScaling) -> BatchStatistics:
    """The statistics of a (synthetic) batch, scaled and clipped as the private ones are; differentiable in
    ``inputs``."""
    _, moments = example_moments(model, inputs)
    return scaling.statistics(scaling.clipped(moments).mean(dim=0), layer_widths(model))


@torch.no_grad()
def clipped_moment_sum(model: nn.Module, images: torch.Tensor, weights: torch.Tensor, scaling: MomentScaling,
                       batch_size: int, device: torch.device) -> torch.Tensor:
    """Sum over ``images`` (normalised teacher inputs) of their scaled moment vectors, each clipped to norm C and
    times its weight (a unit's weights sum to 1: :meth:`~dpsynth.data.ImageSet.unit_weights`)."""
    model.eval()
    total = torch.zeros(2 * sum(layer_widths(model)), dtype=torch.float64, device=device)
    for chunk, chunk_weights in zip(images.split(batch_size), weights.split(batch_size), strict=True):
        _, moments = example_moments(model, chunk.to(device))
        total += (scaling.clipped(moments.double()) * chunk_weights.to(device, torch.float64)[:, None]).sum(dim=0)
    return total


def private_statistics(model: nn.Module, images: torch.Tensor, weights: torch.Tensor, scaling: MomentScaling,
                       noise_multiplier: float, batch_size: int, device: torch.device, ledger: PrivacyLedger,
                       stage: str, noise: SecretStream, public_size: int | None = None) -> BatchStatistics:
    """The private set's statistics: clipped scaled moment sum, weighted, + N(0, (sigma C)^2), divided by the public
    size N in units (default the number of ``images``, when that is public)."""
    total = clipped_moment_sum(model, images, weights, scaling, batch_size, device)
    noisy = release_gaussian(total, scaling.clip, noise_multiplier, ledger, stage, noise)
    return scaling.statistics((noisy / (public_size or len(images))).float(), layer_widths(model))
