"""Public-image alignment (DP-ImgSyn Alg. 1): images optimised against a frozen DP teacher and DP statistics.

No private data is read here: the teacher and the statistics are already DP, so this is post-processing.
Images live in the teacher's input space [-1, 1] and are projected back onto it after every Adam step.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from tqdm.auto import tqdm

from ...config import at_least, one_of, positive
from ...errors import ConfigError
from ...privacy.batch_statistics import BatchStatistics, MomentScaling, batch_statistics

INITS = ("public", "noise")


@dataclass(frozen=True, kw_only=True)
class AlignmentSettings:
    """The ``alignment`` section: k ``iterations`` of Adam (lr, betas) per batch of ``batch_size`` images on Eq. 5
    with weights alpha, starting from a public set's images (``public``, ``public_data_dir``) or low-pass noise
    (``init``); the soft labels' ``temperature``. Natural-image starts by default: the paper's best public sets
    are natural images."""

    public: str = "photo-patches"
    public_data_dir: str | None = None
    init: str = one_of(*INITS, default="public")
    iterations: int = positive(default=10)
    lr: float = positive(default=0.1)
    betas: tuple[float, ...] = (0.5, 0.99)
    batch_size: int = positive(default=80)
    # alpha_f in the scaled units of statistics.py: 1000 balances the feature term against the cross-entropy as
    # Table 7's 10 does in BatchNorm units (one epsilon = 10 teacher, one CNN x 3 seeds: mnist-5k at alpha_f
    # 10 / 1000 27 / 41 %, photo-patches 50 / 55 %).
    alpha_feature: float = at_least(0, default=1000.0)
    alpha_class: float = at_least(0, default=1.0)
    alpha_tv: float = at_least(0, default=2.5e-5)
    alpha_l2: float = at_least(0, default=3e-8)
    temperature: float = positive(default=100.0)

    def __post_init__(self) -> None:
        if len(self.betas) != 2 or not all(0 <= beta < 1 for beta in self.betas):
            raise ConfigError(f"alignment.betas must be [beta1, beta2] in [0, 1), got {list(self.betas)}")


def total_variation(images: torch.Tensor) -> torch.Tensor:
    """Eq. 3 per image, averaged over the batch: sum over pixels of the norm of the forward differences."""
    dx = images[..., :-1, 1:] - images[..., :-1, :-1]
    dy = images[..., 1:, :-1] - images[..., :-1, :-1]
    return (dx.pow(2) + dy.pow(2) + 1e-12).sqrt().flatten(1).sum(1).mean()


def alignment_loss(teacher: nn.Module, images: torch.Tensor, targets: torch.Tensor, private: BatchStatistics,
                   scaling: MomentScaling, settings: AlignmentSettings) -> dict[str, torch.Tensor]:
    """Eq. 5 and its terms for a batch of teacher inputs."""
    feature = batch_statistics(teacher, images, scaling).distance(private)
    classification = F.cross_entropy(teacher(images), targets)
    tv, l2 = total_variation(images), images.pow(2).flatten(1).sum(1).mean()
    total = (settings.alpha_feature * feature + settings.alpha_class * classification + settings.alpha_tv * tv
             + settings.alpha_l2 * l2)
    return {"total": total, "feature": feature, "classification": classification, "tv": tv}


def uniform_targets(count: int, num_classes: int) -> torch.Tensor:
    """Target labels cycling through the classes (App. A.1.3): independent of any data."""
    return torch.arange(count) % num_classes


def align_batch(teacher: nn.Module, start: torch.Tensor, targets: torch.Tensor, private: BatchStatistics,
                scaling: MomentScaling, settings: AlignmentSettings) -> tuple[torch.Tensor, dict[str, float]]:
    """Alg. 1 on one batch of teacher inputs (teacher frozen): the aligned batch, and its loss terms before
    and after alignment."""
    teacher.eval()
    images = start.clone().requires_grad_(True)
    optimizer = torch.optim.Adam([images], lr=settings.lr, betas=(settings.betas[0], settings.betas[1]))
    for _ in range(settings.iterations):
        loss = alignment_loss(teacher, images, targets, private, scaling, settings)["total"]
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        with torch.no_grad():
            images.clamp_(-1, 1)
    with torch.no_grad():
        before = alignment_loss(teacher, start, targets, private, scaling, settings)
        after = alignment_loss(teacher, images, targets, private, scaling, settings)
    return images.detach(), {**{f"start_{k}": float(v) for k, v in before.items()},
                             **{f"aligned_{k}": float(v) for k, v in after.items()}}


def align_images(teacher: nn.Module, starts: torch.Tensor, targets: torch.Tensor, private: BatchStatistics,
                 scaling: MomentScaling, settings: AlignmentSettings,
                 device: torch.device) -> tuple[torch.Tensor, dict[str, float]]:
    """Alg. 1 batch by batch on ``starts`` (images in [0, 1]) with the teacher frozen: the aligned images in
    [0, 1] (on the CPU) and each loss term before and after alignment, averaged over the batches."""
    for param in teacher.parameters():
        param.requires_grad_(False)
    aligned, losses = [], []
    batches = list(zip(starts.split(settings.batch_size), targets.split(settings.batch_size), strict=True))
    for chunk, chunk_targets in tqdm(batches, desc="alignment", dynamic_ncols=True):
        images, batch_losses = align_batch(teacher, (chunk * 2 - 1).to(device), chunk_targets.to(device), private,
                                           scaling, settings)
        aligned.append((images.cpu() + 1) / 2)
        losses.append(batch_losses)
    return torch.cat(aligned), {key: sum(b[key] for b in losses) / len(losses) for key in losses[0]}
