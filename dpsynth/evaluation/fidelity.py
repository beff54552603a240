"""Fidelity metrics on Inception features: FID, unbiased KID, and k-NN precision / recall."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ..errors import DpsynthError


@dataclass(frozen=True)
class Moments:
    """Mean and covariance of a feature set, and its size."""

    mean: np.ndarray
    cov: np.ndarray
    count: int

    @classmethod
    def of(cls, features: np.ndarray) -> Moments:
        if len(features) < 2:
            raise DpsynthError(f"FID needs at least 2 images per set, got {len(features)}")
        features = features.astype(np.float64)
        return cls(features.mean(axis=0), np.cov(features, rowvar=False), len(features))


def _sqrt_psd(matrix: np.ndarray) -> np.ndarray:
    values, vectors = np.linalg.eigh(matrix)
    return (vectors * np.sqrt(values.clip(min=0))) @ vectors.T


def fid(a: Moments, b: Moments) -> float:
    """Fréchet distance between Gaussians fitted to two feature sets (Heusel et al. 2017).

    tr sqrt(S_a S_b) = tr sqrt(S_a^1/2 S_b S_a^1/2), a symmetric PSD matrix: two symmetric eigendecompositions
    instead of a general matrix square root (scipy's ``sqrtm``, 10-50x slower at 2048 dimensions).
    """
    root = _sqrt_psd(a.cov)
    middle = np.linalg.eigvalsh(root @ b.cov @ root)
    diff = a.mean - b.mean
    return float(diff @ diff + np.trace(a.cov) + np.trace(b.cov) - 2 * np.sqrt(middle.clip(min=0)).sum())


def feature_fid(x: np.ndarray, y: np.ndarray) -> float:
    """:func:`fid` of two feature sets. With at most half as many images as dimensions it takes a cheaper, equal
    route: the nonzero eigenvalues of S_x S_y are those of C C^T with C = X_c Y_c^T / sqrt((n_x - 1)(n_y - 1))
    (X_c, Y_c the centred features), so tr sqrt(S_x S_y) is the sum of C's singular values (n_x x n_y, not two
    eigendecompositions of d x d)."""
    if 2 * min(len(x), len(y)) > x.shape[1]:
        return fid(Moments.of(x), Moments.of(y))
    a, b = Moments.of(x), Moments.of(y)  # the size checks; their covariances are not used
    x_centred, y_centred = x.astype(np.float64) - a.mean, y.astype(np.float64) - b.mean
    cross = x_centred @ y_centred.T / np.sqrt((a.count - 1) * (b.count - 1))
    traces = (x_centred ** 2).sum() / (a.count - 1) + (y_centred ** 2).sum() / (b.count - 1)
    diff = a.mean - b.mean
    return float(diff @ diff + traces - 2 * np.linalg.svd(cross, compute_uv=False).sum())


def fid_infinity(x: np.ndarray, y: np.ndarray, points: int = 5, seed: int = 0) -> float:
    """FID extrapolated to infinitely many images (Chong & Forsyth 2020): FID is biased upward by about c / N,
    so fit FID against 1 / N over equal-sized random subsets of N/4 .. N images and take the intercept."""
    count = min(len(x), len(y))
    if count < 8:
        raise DpsynthError(f"FID-infinity needs at least 8 images per set, got {len(x)} and {len(y)}")
    rng = np.random.default_rng(seed)
    sizes = np.linspace(count // 4, count, points).astype(int)
    values = [feature_fid(x[rng.choice(len(x), n, replace=False)], y[rng.choice(len(y), n, replace=False)])
              for n in sizes]
    slope, intercept = np.polyfit(1.0 / sizes, values, 1)
    return float(intercept)


def kid(x: np.ndarray, y: np.ndarray, subsets: int = 100, subset_size: int = 1000,
        seed: int = 0) -> tuple[float, float]:
    """Unbiased KID (Bińkowski et al. 2018): MMD^2 with the cubic polynomial kernel, mean and std over subsets."""
    size = min(subset_size, len(x), len(y))
    if size < 2:
        raise DpsynthError(f"KID needs at least 2 images per set, got {len(x)} and {len(y)}")
    rng = np.random.default_rng(seed)
    x, y, dim = x.astype(np.float64), y.astype(np.float64), x.shape[1]
    values = []
    for _ in range(subsets):
        a = x[rng.choice(len(x), size, replace=False)]
        b = y[rng.choice(len(y), size, replace=False)]
        kaa, kbb, kab = ((p @ q.T / dim + 1) ** 3 for p, q in ((a, a), (b, b), (a, b)))
        within = (kaa.sum() - np.trace(kaa) + kbb.sum() - np.trace(kbb)) / (size * (size - 1))
        values.append(within - 2 * kab.mean())
    return float(np.mean(values)), float(np.std(values))


def _knn_radii(features: torch.Tensor, k: int, chunk: int = 1024) -> torch.Tensor:
    """Distance from each point to its k-th nearest other point of the same set."""
    # k + 1: the point itself is at distance 0
    return torch.cat([torch.cdist(features[i:i + chunk], features).kthvalue(k + 1, dim=1).values
                      for i in range(0, len(features), chunk)])


def _coverage(points: torch.Tensor, centres: torch.Tensor, radii: torch.Tensor, chunk: int = 1024) -> float:
    """Fraction of ``points`` inside at least one ball (centre, radius)."""
    inside = [(torch.cdist(points[i:i + chunk], centres) <= radii).any(dim=1) for i in range(0, len(points), chunk)]
    return float(torch.cat(inside).float().mean())


def precision_recall(real: np.ndarray, synthetic: np.ndarray, k: int = 4) -> tuple[float, float]:
    """Improved precision and recall (Kynkäänniemi et al. 2019) with k-NN balls in feature space."""
    if min(len(real), len(synthetic)) <= k:
        raise DpsynthError(f"precision/recall with k = {k} needs more than {k} images per set, "
                           f"got {len(real)} real and {len(synthetic)} synthetic")
    r, s = torch.as_tensor(real, dtype=torch.float64), torch.as_tensor(synthetic, dtype=torch.float64)
    precision = _coverage(s, r, _knn_radii(r, k))
    recall = _coverage(r, s, _knn_radii(s, k))
    return precision, recall
