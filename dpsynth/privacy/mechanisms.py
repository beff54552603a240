"""Noise-adding mechanisms on private data; each records itself in the ledger before its output is used.

Every draw (Poisson samples and noise) comes from a :class:`~dpsynth.privacy.randomness.SecretStream`.
"""
from __future__ import annotations

import torch

from ..errors import PrivacyError
from ..utils.device import to_device
from .events import GaussianMechanism, ReportNoisyMax, SubsampledGaussianMechanism
from .ledger import PrivacyLedger
from .randomness import SecretStream


def poisson_sample(num_records: int, sample_rate: float, noise: SecretStream) -> torch.Tensor:
    """Indices of a Poisson sample: each record is included independently with probability ``sample_rate``
    (float64 uniforms: the inclusion probability is the recorded rate, not its float32 rounding)."""
    return torch.nonzero(noise.uniform(num_records) < sample_rate).flatten()


def clip_rows(records: torch.Tensor, clip: float) -> torch.Tensor:
    """Each record (first dimension) scaled down to L2 norm at most ``clip``."""
    if not clip > 0:
        raise PrivacyError(f"clipping norm must be positive, got {clip}")
    flat = records.flatten(1)
    norms = flat.norm(dim=1, keepdim=True)
    return (flat * (clip / norms.clamp_min(clip))).reshape(records.shape)


def gaussian_noise(shape: torch.Size, std: float, noise: SecretStream, like: torch.Tensor) -> torch.Tensor:
    """N(0, std^2) noise of ``shape`` from the secret stream, in ``like``'s dtype and on its device (copied without
    blocking it)."""
    return to_device((noise.normal(shape) * std).to(like.dtype), like.device)


def release_gaussian(
    value: torch.Tensor,
    l2_sensitivity: float,
    noise_multiplier: float,
    ledger: PrivacyLedger,
    stage: str,
    noise: SecretStream,
) -> torch.Tensor:
    """``value`` plus Gaussian noise of std noise_multiplier x l2_sensitivity (recorded in ``ledger``)."""
    ledger.record(stage, GaussianMechanism(noise_multiplier))
    return value + gaussian_noise(value.shape, noise_multiplier * l2_sensitivity, noise, value)


def release_counts(counts: torch.Tensor, l2_sensitivity: float, noise_multiplier: float, ledger: PrivacyLedger,
                   stage: str, noise: SecretStream) -> torch.Tensor:
    """Counts released with Gaussian noise (:func:`release_gaussian`), rounded to whole numbers before anything uses
    or stores them: an exact float64 sum of a count and a normal lies on a lattice that can show which neighbour's
    count it came from (Mironov 2012); the rounded value, post-processing, shows nothing of the kind."""
    return release_gaussian(counts, l2_sensitivity, noise_multiplier, ledger, stage, noise).round()


def noisy_count(count: float, std: float, noise: SecretStream) -> int:
    """``count`` plus N(0, std^2) from the secret stream, rounded to a whole number (see :func:`release_counts`);
    the caller records the Gaussian mechanism."""
    return round(count + float(noise.normal(())) * std)


def release_subsampled_mean(
    records: torch.Tensor,
    sample_rate: float,
    clip: float,
    noise_multiplier: float,
    ledger: PrivacyLedger,
    stage: str,
    noise: SecretStream,
    public_size: int | None = None,
) -> torch.Tensor:
    """Noisy mean of a Poisson sample of ``records``, each clipped to L2 norm ``clip``.

    The sum of clipped records has add / remove sensitivity ``clip``; noise of std sigma x clip is added
    to it, then it is divided by the *expected* sample size q N, N the public size (default the number of
    ``records``, when that is public), so post-processing.
    """
    ledger.record(stage, SubsampledGaussianMechanism(noise_multiplier, sample_rate, 1))
    chosen = clip_rows(records[poisson_sample(records.shape[0], sample_rate, noise)], clip)
    total = chosen.sum(dim=0) + gaussian_noise(records.shape[1:], noise_multiplier * clip, noise, records)
    return total / (sample_rate * (public_size or records.shape[0]))


def report_noisy_max(
    counts: torch.Tensor,
    epsilon: float,
    ledger: PrivacyLedger,
    stage: str,
    noise: SecretStream,
    budget: str = "synthesis",
) -> int:
    """Index of the largest of ``counts`` + Laplace(1 / epsilon) noise: epsilon-DP for monotone counts.

    ``counts`` must be monotone sensitivity-1 queries (adding a record raises each by between 0 and 1, e.g.
    the number of validation images each candidate classifies correctly, or with groups each image counted
    1 / its group's images). The noisy values are not returned.
    """
    if not epsilon > 0:
        raise PrivacyError(f"Report Noisy Max needs a positive epsilon, got {epsilon}")
    ledger.record(stage, ReportNoisyMax(1.0 / epsilon), budget)
    exponentials = noise.exponential((2, *counts.shape))
    laplace = (exponentials[0] - exponentials[1]) / epsilon  # a difference of Exp(1)s is Laplace(1)
    return int(torch.argmax(counts.double().cpu() + laplace))
