"""The facts of a private dataset a run releases before any method's mechanism, each by a Gaussian mechanism of its
own, drawn from a secret stream of its own: the shape a DP vote of a folder's images decides, the noisy size of a
set whose size is not public, and (with groups under a derived plan) the noisy mean of a person's images that
prices a step. A drawn value is written to the run's record of them (``drawn``, in config.yaml) before the run's ledger
exists, and :func:`record_drawn` records each planned fact's mechanism in the ledger before the run's first
checkpoint, so no released number depends on a fact the ledger lacks."""
from __future__ import annotations

import warnings
from collections.abc import Container
from dataclasses import dataclass

import torch

from ..config import DatasetSettings, PrivacySettings, RunConfig, RunSettings, with_drawn
from ..data import Dataset, DatasetInfo, get_source
from ..data.registry import SplitSize, dataset_shape_votes, held_out, train_size
from ..errors import DataError, PrivacyWarning
from ..hardware import AUTO
from .events import GaussianMechanism
from .ledger import PrivacyLedger
from .mechanisms import noisy_count
from .planning import PlannedStage
from .randomness import SecretStream, stream_key


@dataclass(frozen=True)
class DatasetFact:
    """One fact's stage in the ledger and its Gaussian noise, in multiples of its sensitivity."""

    stage: str
    noise: float

    def mechanism(self) -> GaussianMechanism:
        return GaussianMechanism(self.noise)

    def planned(self) -> PlannedStage:
        return PlannedStage(self.stage, event=self.mechanism())


# A folder's shape where a setting is auto: its images' votes plus Gaussian noise, 25 times their sensitivity.
SHAPE = DatasetFact("dataset-shape", 25.0)
SHAPE_TRUSTED = 8  # below this many SHAPE.noise of noisy votes in all, a run warns that noise decided the shape
# The training set's size when it is not public: its count plus N(0, 50^2), rounded.
SIZE = DatasetFact("dataset-size", 50.0)
# With groups and a derived plan that prices a step: the training split's images, each person's capped at
# privacy.max_images_per_group, plus N(0, (50 x the cap)^2), over the public N.
IMAGES_PER_GROUP = DatasetFact("images-per-group", 50.0)
FACTS = (SHAPE, SIZE, IMAGES_PER_GROUP)


def record_drawn(ledger: PrivacyLedger, planned: Container[str]) -> None:
    """Record in ``ledger`` the mechanism of each fact the run's ``planned`` stages hold and the ledger lacks (a
    resumed run's ledger has them already)."""
    for fact in FACTS:
        if fact.stage in planned and fact.stage not in ledger.stages():
            ledger.record(fact.stage, fact.mechanism())


def draws_noisy_shape(config: RunConfig) -> bool:
    """Whether a run of ``config`` decides its dataset's shape by a DP vote of the images: a folder (a source whose
    images choose) with ``dataset.resolution`` or ``dataset.channels`` left auto."""
    settings = DatasetSettings.of(config)
    return get_source(settings.name).shape_votes is not None and AUTO in (settings.resolution, settings.channels)


def with_noisy_shape(config: RunConfig) -> RunConfig:
    """``config`` with the shape its run reads the dataset at, where a DP vote decides it and none was drawn yet:
    the images' votes (:class:`~dpsynth.data.folder.ShapeVotes`; with ``dataset.window`` auto, on the 16-bit window
    too) plus Gaussian noise, SHAPE.noise times their L2 sensitivity (the square root of the number of vote
    vectors), from a stream of its own, decided as the exact votes would be and kept as ``drawn.shape``
    ([channels, side]) and ``drawn.window`` (the run records :data:`SHAPE`)."""
    if not draws_noisy_shape(config) or config.drawn.shape is not None:
        return config
    settings = DatasetSettings.of(config)
    votes = dataset_shape_votes(settings.name, settings.data_dir, settings.resolution, settings.channels,
                                vote_window=settings.window == "auto")
    assert votes is not None  # draws_noisy_shape: the source votes and a setting is auto
    noise = SecretStream(stream_key(RunSettings.of(config).seed, SHAPE.stage))
    std = SHAPE.noise * votes.sensitivity
    noisy = votes.noisy(lambda count: std * noise.normal(count).numpy())
    side, channels = noisy.decide()
    if noisy.total() < SHAPE_TRUSTED * SHAPE.noise:  # post-processing of the noisy votes, like the decision
        warnings.warn(f"{settings.name}: the DP vote on the images' shape chose {channels} x {side} x {side}, but "
                      "so few images vote that the noise decides more than they do; declare the shape instead "
                      "(dataset.resolution=R, dataset.channels=C: no epsilon spent)", stacklevel=2)
    window = noisy.window()
    return with_drawn(config, shape=[channels, side], window=None if window is None else list(window))


def held_out_of(config: RunConfig) -> tuple[SplitSize, SplitSize]:
    """The validation and test sizes of ``config``'s dataset (:func:`~dpsynth.data.registry.held_out`)."""
    settings = DatasetSettings.of(config)
    return held_out(settings.name, settings.val_size, settings.test_size)


def draws_noisy_size(info: DatasetInfo) -> bool:
    """Whether a run on ``info`` releases its size as a noisy count (drawn already, or still to draw)."""
    return info.size_rule in ("noisy", "private")


LEAST_TRAIN = 2  # training units a noisy count is raised to at least


def noisy_total(dataset: Dataset, config: RunConfig) -> int:
    """The number of units (images, or groups) of ``dataset`` (all splits but an official test part) plus
    N(0, SIZE.noise^2), rounded, from a stream of its own (the run records :data:`SIZE`), raised to the
    least total that leaves ``config``'s splits the training units δ needs: a clamp, post-processing, where a refusal
    and a fresh draw would make the published count depend on the exact one (a warning says to declare the size)."""
    info = dataset.info
    exact = sum(size for split, size in info.unit_counts.items() if split != "test" or not info.official_test)
    noisy = noisy_count(exact, SIZE.noise, SecretStream(stream_key(RunSettings.of(config).seed, SIZE.stage)))
    least = least_total(*held_out_of(config), info.official_test)
    if noisy < least:
        warnings.warn(f"{info.name}: the noisy count of the data's size came out at {noisy}, below the {least} its "
                      f"splits need, and was raised to {least}: the data is too small for a count with noise of std "
                      f"{SIZE.noise:g}; declare its size instead (privacy.dataset_size=N, no epsilon spent)",
                      PrivacyWarning, stacklevel=2)
    return max(noisy, least)


def noisy_images_per_group(dataset: Dataset, config: RunConfig) -> float:
    """The mean number of images a DP-SGD step reads of a person: the training split's images, each person's capped
    at ``privacy.max_images_per_group``, plus N(0, (IMAGES_PER_GROUP.noise x cap)^2) from a stream of its own (the
    run records :data:`IMAGES_PER_GROUP`), over the public N; within [1, cap] (post-processing), to 2 decimals."""
    cap = PrivacySettings.of(config).max_images_per_group
    groups = dataset.train.groups
    assert groups is not None  # draws_images_per_group: the data has groups
    capped = torch.bincount(torch.unique(groups, return_inverse=True)[1]).clamp(max=cap).sum()
    noise = SecretStream(stream_key(RunSettings.of(config).seed, IMAGES_PER_GROUP.stage))
    noisy = noisy_count(float(capped), IMAGES_PER_GROUP.noise * cap, noise)
    return round(min(max(noisy / dataset.info.num_train, 1.0), float(cap)), 2)


def least_total(val_size: SplitSize, test_size: SplitSize, official_test: bool) -> int:
    """The smallest number of units that the validation and test sizes leave :data:`LEAST_TRAIN` training units (the
    fewest the default δ = 1 / (N ln N) takes)."""
    total = LEAST_TRAIN
    while True:
        try:
            if train_size(total, val_size, test_size, official_test, "") >= LEAST_TRAIN:
                return total
        except DataError:
            pass
        total += 1
