"""Canary audits of every mechanism the methods run on private data (the harness: :mod:`dpsynth.audit.harness`).

Each design runs the method's own function (the one a real run calls, ledger included) on a small dataset D
or on D plus one canary chosen to move the output as far as the mechanism allows, and scores the output
along the canary's direction. Where the output passes through a lossy step (an argmax, a ratio, a clamp)
the score cannot see everything the canary changed, so the bound is looser; docs/privacy.md says by how much.
``broken-gaussian-sum`` (noise divided by the batch size a second time) and ``broken-group-step`` (a group's
images clipped one by one) are deliberately wrong copies, kept to show that the audit catches such bugs.
"""
from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch
from torch import nn

from ..data import ImageSet
from ..data.folder import shape_votes
from ..data.sources import AUTO
from ..diffusion.ddpm import Diffusion, NoiseLevels
from ..models.classifiers import group_norm_resnet
from ..privacy import GaussianMechanism, PrivacyLedger
from ..privacy.batch_statistics import MomentScaling, example_moments, private_statistics
from ..privacy.central_images import CentralQuery, central_images
from ..privacy.dpsgd import DPSGD, DpsgdSettings, Groups
from ..privacy.fourier_features import FrequencyQuery, RandomFourierFeatures, noisy_class_means, released_class_means
from ..privacy.mechanisms import clip_rows, gaussian_noise, noisy_count, report_noisy_max
from ..privacy.nearest_neighbours import dp_histograms, nearest_neighbour_votes
from ..privacy.randomness import SecretStream
from ..privacy.semantic_histogram import semantic_histogram
from .harness import Trial

SIGMA, STAGE, RECORDS = 1.0, "audit", 100
SIDE = 8  # images are 1 x 8 x 8
COUNT_NOISE = 20.0  # the class-size releases' noise: a small share of the claim


def _images(value: float, count: int) -> torch.Tensor:
    return torch.full((count, 1, SIDE, SIDE), value)


def _checkerboard() -> torch.Tensor:
    rows, columns = torch.meshgrid(torch.arange(SIDE), torch.arange(SIDE), indexing="ij")
    return ((rows + columns) % 2).float().reshape(1, 1, SIDE, SIDE)


def _labelled(images: torch.Tensor) -> ImageSet:
    return ImageSet(images, torch.zeros(len(images), dtype=torch.long))


def _copies(canary: torch.Tensor, doubled: bool) -> torch.Tensor:
    """The canary's rows, twice over when ``doubled``: WRONG ON PURPOSE, one person's record counted as two (twice
    the sensitivity the ledger claims), the error an audit sized by power must catch."""
    return torch.cat([canary, canary]) if doubled else canary


def dpsgd_step(doubled: bool = False, trainable_only: bool = False) -> Trial:
    """One step of the DP-SGD engine (q = 1) on a linear model whose per-example gradient is the example:
    D is zero gradients, the canary's gradient is twice the clipping norm along one axis (white box: the
    score is the update along that axis, times qN). ``trainable_only``: a second, frozen weight reads a copy of
    the example too, as ``model.trainable`` freezes part of a UNet (the clip and the noise cover only what
    trains); ``doubled``: :func:`_copies`."""
    dimension, clip = 16, 1.0
    canary = torch.zeros(1, dimension)
    canary[0, 0] = 2 * clip

    def trial(with_canary: bool, ledger: PrivacyLedger, noise: SecretStream) -> float:
        data = torch.zeros(RECORDS, dimension)
        if with_canary:
            data = torch.cat([data, _copies(canary, doubled)])
        first, second = nn.Linear(dimension, 1, bias=False), nn.Linear(1, 1, bias=False)
        nn.init.zeros_(first.weight)
        nn.init.ones_(second.weight)
        second.weight.requires_grad_(False)
        model: nn.Module = nn.Sequential(first, second) if trainable_only else first
        engine = DPSGD(model, torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=1.0),
                       lambda forward, x: forward(x.unsqueeze(0)).sum(), settings=DpsgdSettings(SIGMA, clip, 1.0, 64),
                       num_records=len(data), ledger=ledger, stage=STAGE, noise=noise)
        engine.step(lambda indices: (data[indices],))
        return -float(first.weight.detach()[0, 0]) * len(data)

    return trial


def dpsgd_trainable_step() -> Trial:
    """The DP-SGD step of :func:`dpsgd_step` on a model with a frozen part (``model.trainable``)."""
    return dpsgd_step(trainable_only=True)


class _PixelBias(nn.Module):
    """A denoiser that predicts one learned value per pixel whatever its input: its per-example gradient under the
    v-prediction loss is the image's, weighted by the draws' noise levels."""

    def __init__(self) -> None:
        super().__init__()
        self.bias = nn.Parameter(torch.zeros(1, 1, SIDE, SIDE))

    def forward(self, noisy: torch.Tensor, times: torch.Tensor, class_labels: torch.Tensor | None = None
                ) -> SimpleNamespace:
        return SimpleNamespace(sample=self.bias.expand_as(noisy))


def diffusion_step(doubled: bool = False) -> Trial:
    """One DP-SGD step (q = 1) of the diffusion loss the runs train, with log-normal noise levels and K = 2 draws
    per example, batched as a run batches it, on a denoiser of one value per pixel (v-prediction, so the clean
    image enters each example's gradient; levels around sigma = e^1.5, where the clean image dominates the target):
    D is 4 grey images, whose gradients are the draws' noise, the canary a checkerboard whose gradient along itself
    exceeds the clipping norm several times; the score is the update along the checkerboard. The levels and draws
    are public randomness: the bound must stay below the claim whatever they are. ``doubled``: :func:`_copies`."""
    clip, records, draws = 0.01, 4, 2
    diffusion = Diffusion(1000, prediction="v", levels=NoiseLevels("log-normal", 1.5, 0.5))
    canary = _checkerboard()  # pixels 0 and 1: x0 of -1 and +1
    direction = (canary * 2 - 1) / (canary * 2 - 1).norm()
    generator = torch.Generator().manual_seed(0)

    def trial(with_canary: bool, ledger: PrivacyLedger, noise: SecretStream) -> float:
        images = _images(0.5, records)
        if with_canary:
            images = torch.cat([images, _copies(canary, doubled)])
        model = _PixelBias()
        engine = DPSGD(model, torch.optim.SGD(model.parameters(), lr=1.0), diffusion.example_loss,
                       settings=DpsgdSettings(SIGMA, clip, 1.0, 64), num_records=len(images), ledger=ledger,
                       stage=STAGE, noise=noise, batch_loss=diffusion.example_losses)
        engine.step(lambda indices: (images[indices], torch.zeros(len(indices), dtype=torch.long),
                                     *diffusion.training_inputs(len(indices), draws, images.shape[1:], generator)))
        return -float((model.bias.detach() * direction).sum()) * len(images)

    return trial


def shape_vote() -> Trial:
    """The DP vote on a folder's shape and channels (both auto, 8-bit images: two vote vectors), as a run draws it:
    D is RECORDS grey images of 30 px, the canary a coloured image of 70 px, which moves each vector by one; the
    score is the noisy weight of 64 px plus that of colour. A run records the vote as a Gaussian mechanism of its
    noise multiplier over the votes' sensitivity; so does the trial."""
    from PIL import Image

    folder = Path(tempfile.mkdtemp(prefix="dpsynth-audit-shape-"))
    for index in range(RECORDS + 1):
        side, coloured = (70, True) if index == RECORDS else (30, False)
        pixels = np.zeros((side, side, 3), np.uint8)
        pixels[..., 0] = 200 if coloured else 0
        (folder / "a").mkdir(exist_ok=True)
        Image.fromarray(pixels).save(folder / "a" / f"{index}.png")
    files = sorted((folder / "a").iterdir(), key=lambda path: int(path.stem))
    votes = {canary: shape_votes(files if canary else files[:RECORDS], None, AUTO, AUTO, False)
             for canary in (False, True)}
    shutil.rmtree(folder)

    def trial(with_canary: bool, ledger: PrivacyLedger, noise: SecretStream) -> float:
        exact = votes[with_canary]
        ledger.record(STAGE, GaussianMechanism(SIGMA))
        noisy = exact.noisy(lambda count: SIGMA * exact.sensitivity * noise.normal(count).numpy())
        return float(noisy.by_side[exact.sides.index(64)] + noisy.by_colour[1])

    return trial


def noisy_count_release() -> Trial:
    """The noisy count of a private set's size (groups or images), as a run draws it: D has RECORDS records, the
    canary one more; the score is the rounded noisy count."""

    def trial(with_canary: bool, ledger: PrivacyLedger, noise: SecretStream) -> float:
        ledger.record(STAGE, GaussianMechanism(SIGMA))
        return float(noisy_count(RECORDS + int(with_canary), SIGMA, noise))

    return trial


def dpsgd_group_step(clip_groups: bool = True) -> Trial:
    """One DP-SGD step over groups (q = 1) on the linear model of :func:`dpsgd_step`: D is groups of zero
    gradients, the canary a whole group of two images, each with gradient twice the clipping norm along one
    axis (one person's several images: their mean, clipped, is what the group may move). ``clip_groups`` False is
    WRONG ON PURPOSE (``broken-group-step``): the engine is not told the groups, so each image is clipped alone
    and the canary moves the sum by twice the clipping norm, while the ledger records the step over groups."""
    dimension, clip, images = 16, 1.0, 2
    canary = torch.zeros(images, dimension)
    canary[:, 0] = 2 * clip

    def trial(with_canary: bool, ledger: PrivacyLedger, noise: SecretStream) -> float:
        data = torch.zeros(2 * RECORDS, dimension)
        groups = torch.arange(2 * RECORDS) // 2  # RECORDS groups of two images
        if with_canary:
            data, groups = torch.cat([data, canary]), torch.cat([groups, torch.full((images,), RECORDS)])
        units = Groups.of(groups, cap=images) if clip_groups else None
        records = len(data) if units is None else len(units)
        model = nn.Linear(dimension, 1, bias=False)
        nn.init.zeros_(model.weight)
        engine = DPSGD(model, torch.optim.SGD(model.parameters(), lr=1.0),
                       lambda forward, x: forward(x.unsqueeze(0)).sum(), settings=DpsgdSettings(SIGMA, clip, 1.0, 64),
                       num_records=records, ledger=ledger, stage=STAGE, noise=noise, groups=units)
        engine.step(lambda indices: (data[indices],))
        return -float(model.weight.detach()[0, 0]) * records

    return trial


def broken_group_step() -> Trial:
    """The group step with each image clipped alone (:func:`dpsgd_group_step`): caught by the audit."""
    return dpsgd_group_step(clip_groups=False)


def mean_images() -> Trial:
    """DP-FETA's noisy mean image (q = 1, one class): D is grey images, the canary a checkerboard at the
    clipping norm; the score is the output's checkerboard contrast (blind to the canary's mean brightness,
    which the division by the noisy class size confounds: 1/sqrt(2) of the canary's shift)."""
    canary = _checkerboard()
    query = CentralQuery("mean", 1, 1.0, SIGMA, float(canary.norm()), 2, COUNT_NOISE)
    contrast = canary * 2 - 1

    def trial(with_canary: bool, ledger: PrivacyLedger, noise: SecretStream) -> float:
        images = torch.cat([_images(0.5, RECORDS), canary]) if with_canary else _images(0.5, RECORDS)
        released = central_images(_labelled(images), 1, query, ledger, STAGE, noise).images[0]
        return float((released * contrast).sum()) * RECORDS

    return trial


def mode_images() -> Trial:
    """DP-FETA's noisy mode image (q = 1, 2 bins): D is empty, the canary has every pixel in the upper bin;
    the score is the number of output pixels in that bin (an argmax per pixel: about 0.56 of the shift)."""
    query = CentralQuery("mode", 1, 1.0, SIGMA, 1.0, 2, COUNT_NOISE)
    canary = _images(0.9, 1)

    def trial(with_canary: bool, ledger: PrivacyLedger, noise: SecretStream) -> float:
        images = canary if with_canary else _images(0.9, 0)
        released = central_images(_labelled(images), 1, query, ledger, STAGE, noise).images[0]
        return float((released > 0.5).sum())

    return trial


def _feature_trial(release: Callable[[ImageSet, RandomFourierFeatures, PrivacyLedger, SecretStream], torch.Tensor]
                   ) -> Trial:
    """Noisy mean random Fourier features of one class, ``release(data, rff, ledger, noise)``: D is grey images,
    the canary a checkerboard; the score is the noisy mean along the canary's features orthogonal to grey's."""
    rff = RandomFourierFeatures(SIDE * SIDE, 512, 1.0, seed=0)
    canary = _checkerboard()
    grey, direction = rff(_images(0.5, 1))[0], rff(canary)[0]
    direction = direction - (direction @ grey) * grey
    direction = direction / direction.norm()

    def trial(with_canary: bool, ledger: PrivacyLedger, noise: SecretStream) -> float:
        images = torch.cat([_images(0.5, RECORDS), canary]) if with_canary else _images(0.5, RECORDS)
        return float(release(_labelled(images), rff, ledger, noise)[0] @ direction) * RECORDS

    return trial


def frequency_features() -> Trial:
    """FETA-Pro's noisy mean random Fourier features (the checkerboard's features are nearly orthogonal to grey's)."""
    query = FrequencyQuery(SIGMA, COUNT_NOISE)
    return _feature_trial(lambda data, rff, ledger, noise: noisy_class_means(data, 1, rff, query, ledger, STAGE,
                                                                             noise))


def merf_features() -> Trial:
    """DP-MERF's noisy class means: as ``frequency-features``, but the size shares the mechanism (the score sees
    the features' part of the sqrt(2) sensitivity only, so the bound is looser)."""
    return _feature_trial(lambda data, rff, ledger, noise: released_class_means(data, 1, rff, SIGMA, ledger, STAGE,
                                                                                noise))


def semantic_histogram_counts() -> Trial:
    """PrivImage's histogram of top-3 public classes (every record of one private class): D's records name
    classes 3-5, the canary 0-2; the score is the noisy count of classes 0-2 together."""
    top_k, canary = 3, torch.tensor([[0, 1, 2]])
    records = torch.tensor([[3, 4, 5]]).repeat(RECORDS, 1)

    def trial(with_canary: bool, ledger: PrivacyLedger, noise: SecretStream) -> float:
        top = torch.cat([records, canary]) if with_canary else records
        labels = torch.zeros(len(top), dtype=torch.long)
        counts = semantic_histogram(top, labels, torch.ones(len(top)), 1, 2 * top_k, SIGMA, ledger, STAGE, noise)
        return float(counts[0, :top_k].sum())

    return trial


def pe_histogram() -> Trial:
    """PE's nearest-neighbour vote histogram (threshold 0): D's samples all vote for synthetic sample 1,
    the canary for sample 0; the score is sample 0's noisy count."""
    synthetic = torch.tensor([[0.0, 0.0], [10.0, 0.0]])
    private = synthetic[1].repeat(RECORDS, 1)

    def trial(with_canary: bool, ledger: PrivacyLedger, noise: SecretStream) -> float:
        embeddings = torch.cat([private, synthetic[:1]]) if with_canary else private
        votes = nearest_neighbour_votes(embeddings, synthetic, torch.ones(len(embeddings)))
        return float(dp_histograms([votes], SIGMA, 0.0, ledger, STAGE, noise)[0][0])

    return trial


def pe_group_histogram() -> Trial:
    """PE's vote histogram over groups: D is groups of two samples voting for synthetic sample 1, the canary a
    whole group of four samples voting for sample 0 (each with weight 1/4); the score is sample 0's noisy count."""
    synthetic = torch.tensor([[0.0, 0.0], [10.0, 0.0]])
    private = ImageSet(synthetic[1].repeat(2 * RECORDS, 1), torch.zeros(2 * RECORDS, dtype=torch.long),
                       torch.arange(2 * RECORDS) // 2)
    canary = ImageSet(synthetic[:1].repeat(4, 1), torch.zeros(4, dtype=torch.long), torch.full((4,), RECORDS))

    def trial(with_canary: bool, ledger: PrivacyLedger, noise: SecretStream) -> float:
        data = private.joined(canary) if with_canary else private
        votes = nearest_neighbour_votes(data.images, synthetic, data.unit_weights())
        return float(dp_histograms([votes], SIGMA, 0.0, ledger, STAGE, noise)[0][0])

    return trial


def groupnorm_statistics() -> Trial:
    """DP-ImgSyn's GroupNorm statistics of a small GroupNorm ResNet: D is random images, the canary an image
    whose moment vector exceeds the clipping norm; the score is the noisy moment sum, rebuilt from the
    released means and variances, along the canary's clipped moments."""
    torch.manual_seed(0)
    model = group_norm_resnet(1, 2, (1,), (8,), 2)
    images = torch.rand(20, 1, SIDE, SIDE, generator=torch.Generator().manual_seed(1)) * 2 - 1
    canary = torch.ones(1, 1, SIDE, SIDE)
    with torch.no_grad():
        moments = example_moments(model, canary)[1][0]
    unscaled = MomentScaling(torch.ones_like(moments), float(moments.norm()) / 2)
    direction = moments / moments.norm()

    def trial(with_canary: bool, ledger: PrivacyLedger, noise: SecretStream) -> float:
        data = torch.cat([images, canary]) if with_canary else images
        statistics = private_statistics(model, data, torch.ones(len(data)), unscaled, SIGMA, 64, torch.device("cpu"),
                                        ledger, STAGE, noise)
        parts = [torch.cat([mean, variance + mean.pow(2)])
                 for mean, variance in zip(statistics.means, statistics.variances, strict=True)]
        return float(torch.cat(parts).double() @ direction.double()) * len(data)

    return trial


def report_noisy_max_selection() -> Trial:
    """Report Noisy Max (epsilon = 1) over 100 tied candidates; the canary adds 1 to candidate 0's count;
    the score is whether candidate 0 was selected."""
    candidates = 100

    def trial(with_canary: bool, ledger: PrivacyLedger, noise: SecretStream) -> float:
        counts = torch.zeros(candidates)
        counts[0] += float(with_canary)
        return float(report_noisy_max(counts, 1.0, ledger, STAGE, noise) == 0)

    return trial


def broken_gaussian_sum(values: torch.Tensor, clip: float, noise_multiplier: float, ledger: PrivacyLedger,
                        noise: SecretStream) -> torch.Tensor:
    """WRONG ON PURPOSE: the sum of clipped rows with the noise divided by the number of rows (the bug of
    treating a sum as a mean), while the ledger records the intended Gaussian mechanism."""
    ledger.record(STAGE, GaussianMechanism(noise_multiplier))
    total = clip_rows(values, clip).sum(dim=0)
    return total + gaussian_noise(total.shape, noise_multiplier * clip / len(values), noise, total)


def broken_sum() -> Trial:
    """The broken copy, audited like the DP-SGD step: zero rows, a canary at the clipping norm."""
    canary = torch.tensor([[1.0, 0.0]])

    def trial(with_canary: bool, ledger: PrivacyLedger, noise: SecretStream) -> float:
        rows = torch.cat([torch.zeros(RECORDS, 2), canary]) if with_canary else torch.zeros(RECORDS, 2)
        return float(broken_gaussian_sum(rows, 1.0, SIGMA, ledger, noise)[0])

    return trial


AUDITS: dict[str, Callable[[], Trial]] = {
    "dp-sgd-step": dpsgd_step,
    "dp-sgd-trainable-step": dpsgd_trainable_step,
    "dp-sgd-diffusion-step": diffusion_step,
    "shape-vote": shape_vote,
    "noisy-count": noisy_count_release,
    "dp-sgd-group-step": dpsgd_group_step,
    "mean-images": mean_images,
    "mode-images": mode_images,
    "frequency-features": frequency_features,
    "merf-features": merf_features,
    "semantic-histogram": semantic_histogram_counts,
    "pe-histogram": pe_histogram,
    "pe-group-histogram": pe_group_histogram,
    "groupnorm-statistics": groupnorm_statistics,
    "report-noisy-max": report_noisy_max_selection,
    "broken-gaussian-sum": broken_sum,
    "broken-group-step": broken_group_step,
}
# Deliberately wrong copies, kept to show that an audit catches such bugs: `dpsynth audit all` leaves them out.
BROKEN = ("broken-gaussian-sum", "broken-group-step")
