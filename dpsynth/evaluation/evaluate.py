"""Evaluate a synthetic release: fidelity (FID, KID, precision / recall), utility (downstream accuracy), pictures.

Every number here compares the release with real data, so ``metrics.json`` and the pictures are
diagnostics for the data holder, not releasable artefacts. Only model selection on the validation split
is charged to the privacy ledger (the "evaluation" budget), because it picks which accuracy is reported.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..config import EvaluationSection, section_settings
from ..data import Dataset
from ..errors import ConfigError
from ..hardware import resolve_fast_inception
from ..models.classifiers import build_classifier
from ..privacy import Accountant, PrivacyLedger, ledger_report
from ..utils.device import memory_limited_by
from ..utils.images import class_grid, save_png, to_uint8
from ..utils.io import atomic_write_json
from .cache import FeatureCache
from .downstream import SCHEDULES, TrainingSettings, downstream_accuracy, seeded_accuracy
from .fidelity import feature_fid, fid_infinity, kid, precision_recall
from .inception import InceptionFeatures, chosen_path
from .plots import nearest_real, save_log_curves, save_nearest_neighbours
from .release import Release

METRICS, NEIGHBOURS, CURVES, SAMPLES = "metrics.json", "nearest_neighbours.png", "training_curves.png", "samples.png"
NOTE = ("FID, KID, precision/recall and test accuracy compare the release with real data: diagnostics for the "
        "data holder, not part of the release. Only model selection on the validation split is DP-accounted.")


# DPImageBench's protocol (Chen et al. 2025, as its code and Microsoft's pe library run it): classifiers trained
# on 60,000 synthetic images for 50 epochs (Adam 0.01, batch 256, step decay x0.2 every 20 epochs, EMA 0.9999),
# scored with the EMA weights; FID of the synthetic images against the whole training split. We keep our
# noisy epoch selection on the validation split; its WRN-28-10 has dropout 0.3, ours none; it also trains a
# ResNeXt, which we do not have. Meant for a GPU: on a 2-core CPU one WRN-28-10 epoch on 60,000 images takes hours.
PROTOCOLS: dict[str, dict[str, Any]] = {
    "dpsynth": {},
    "dpimagebench": {"num_synthetic": 60000, "num_real": 60000, "real_split": "train",
                     "classifiers": ("wrn-28-10", "resnet164"), "classifier_epochs": 50, "classifier_batch_size": 256,
                     "classifier_lr": 0.01, "classifier_schedule": "step", "classifier_ema": 0.9999},
}
DPIMAGEBENCH_TRAIN_IMAGES = 60000


@dataclass(frozen=True, kw_only=True)
class EvaluationSettings(EvaluationSection):
    """The ``evaluation`` section (:class:`~dpsynth.config.EvaluationSection`, its keys and defaults) as the
    evaluation runs it: a ``protocol`` other than ``dpsynth`` fixes the keys it names (:data:`PROTOCOLS`), whatever
    the section says, and the rules that need the evaluation's tables are checked too."""

    @classmethod
    def of(cls, config: Mapping[str, Any]) -> EvaluationSettings:
        """The ``evaluation`` section of a run's ``config``, checked."""
        return cls.from_config(asdict(EvaluationSection.of(config)))

    @classmethod
    def from_config(cls, section: Mapping[str, Any]) -> EvaluationSettings:
        """The settings of an ``evaluation`` section; ConfigError naming a key whose value it cannot use."""
        protocol = section.get("protocol", "dpsynth")
        if protocol not in PROTOCOLS:
            raise ConfigError(f"evaluation.protocol must be one of {', '.join(PROTOCOLS)}, got {protocol!r}")
        settings = section_settings(cls, {"evaluation": {**section, **PROTOCOLS[protocol]}}, "evaluation")
        settings.check()
        return settings

    def check(self) -> None:
        """ConfigError naming the key that breaks a rule of the evaluation's own."""
        if self.classifiers and not self.selection_epsilon > 0:
            raise ConfigError(f"evaluation.selection_epsilon must be positive, got {self.selection_epsilon}")
        for name in self.classifiers:
            build_classifier(name, 1, 2)  # ConfigError for an unknown name
        if self.classifier_schedule not in SCHEDULES:
            raise ConfigError(f"evaluation.classifier_schedule must be one of {', '.join(SCHEDULES)}, "
                              f"got {self.classifier_schedule!r}")
        if not self.classifier_ema < 1:
            raise ConfigError(f"evaluation.classifier_ema must be in [0, 1) (0: no EMA), got {self.classifier_ema}")
        resolve_fast_inception(self.fast_inception)  # auto, true or false

    def training(self, soft_labels: bool) -> TrainingSettings:
        """How each downstream classifier is trained: by distillation on a release with ``soft_labels`` for
        ``soft_label_epochs`` when set (DP-ImgSyn's students train longer), else for ``classifier_epochs``."""
        distilled = self.soft_label_epochs if soft_labels else None
        epochs = self.classifier_epochs if distilled is None else distilled
        return TrainingSettings(epochs, self.classifier_batch_size, self.classifier_lr, self.classifier_schedule,
                                self.classifier_ema, self.classifier_augment)


def _first(count: int, total: int, seed: int) -> np.ndarray:
    """``count`` indices of ``total``, a seeded random choice (all when count >= total)."""
    return np.sort(np.random.default_rng(seed).permutation(total)[:count])


def evaluate_release(
    release: Release,
    dataset: Dataset,
    settings: EvaluationSettings,
    ledger: PrivacyLedger,
    accountant: Accountant,
    delta: float,
    out_dir: str | Path,
    device: torch.device,
    log_path: str | Path | None = None,
    method_metrics: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Compute every metric, write ``metrics.json`` and the pictures into ``out_dir``, return the metrics
    (with ``method_metrics``, the method's own measurements, under "method")."""
    out = Path(out_dir)
    if settings.protocol == "dpimagebench" and len(release) < DPIMAGEBENCH_TRAIN_IMAGES:
        raise ConfigError(f"evaluation.protocol dpimagebench trains its classifiers on {DPIMAGEBENCH_TRAIN_IMAGES:,} "
                          f"synthetic images, but the release has {len(release):,}: release "
                          f"{DPIMAGEBENCH_TRAIN_IMAGES} (sampling.num_samples={DPIMAGEBENCH_TRAIN_IMAGES})")
    synthetic_index = _first(settings.num_synthetic, len(release), settings.seed + 1)
    with memory_limited_by("evaluation.inception_batch_size", settings.inception_batch_size,
                           "computing Inception features", "dpsynth evaluate RUN_DIR"):
        extractor = inception_extractor(settings, device)
        real_images, real = real_features(dataset, settings, extractor)
        synthetic = extractor(release.images[synthetic_index], "Inception (synthetic)")
    metrics: dict[str, Any] = {
        "note": NOTE,
        "protocol": settings.protocol,
        "images": {"synthetic": len(synthetic), "real": len(real), "real_split": settings.real_split,
                   "inception": extractor.preprocessing, "inception_path": extractor.path},
        **fidelity_metrics(synthetic, real, settings),
    }
    metrics["accuracy"] = _accuracies(release, dataset, settings, ledger, device)
    if settings.classifiers:
        metrics["evaluation_privacy"] = ledger_report(ledger, accountant, delta).get("evaluation")
    if method_metrics:
        metrics["method"] = dict(method_metrics)
    _pictures(release, synthetic_index, synthetic, real_images, real, dataset, settings, out, log_path)
    atomic_write_json(out / METRICS, metrics)
    return metrics


def inception_extractor(settings: EvaluationSettings, device: torch.device) -> InceptionFeatures:
    """The Inception network on ``device``, run as ``evaluation.fast_inception`` resolves."""
    path, _ = chosen_path(settings.fast_inception)
    return InceptionFeatures(device, path, settings.inception_batch_size)


def real_features(dataset: Dataset, settings: EvaluationSettings, extractor: InceptionFeatures
                  ) -> tuple[np.ndarray, np.ndarray]:
    """The real images FID compares with (``num_real`` of ``real_split``, uint8) and their cached features."""
    real_set = dataset.split(settings.real_split)
    real_images = to_uint8(real_set.images[torch.from_numpy(_first(settings.num_real, len(real_set), settings.seed))])
    cache = FeatureCache(settings.cache_dir)
    return real_images, cache.get(real_images, extractor.preprocessing,
                                  lambda images: extractor(images, "Inception (real)"))


def fidelity_metrics(synthetic: np.ndarray, real: np.ndarray, settings: EvaluationSettings) -> dict[str, Any]:
    """FID, FID-infinity, KID and precision / recall of synthetic against real Inception features."""
    kid_mean, kid_std = kid(synthetic, real, settings.kid_subsets, settings.kid_subset_size, settings.seed)
    precision, recall = precision_recall(real, synthetic, settings.pr_k)
    return {"fid": feature_fid(synthetic, real),
            "fid_infinity": fid_infinity(synthetic, real, seed=settings.seed),
            "kid": {"mean": kid_mean, "std": kid_std, "subsets": settings.kid_subsets,
                    "subset_size": min(settings.kid_subset_size, len(synthetic), len(real))},
            "precision": precision, "recall": recall, "pr_k": settings.pr_k}


def _accuracies(release: Release, dataset: Dataset, settings: EvaluationSettings, ledger: PrivacyLedger,
                device: torch.device) -> dict[str, Any]:
    """Each classifier's accuracy over ``classifier_seeds`` seeds; the selection budget is split evenly over all."""
    temperature = settings.distillation_temperature or release.soft_label_temperature
    soft_labels = release.soft_label_tensor(temperature)
    training = settings.training(soft_labels is not None)
    seeds = range(settings.seed, settings.seed + settings.classifier_seeds)
    share = settings.selection_epsilon / max(1, len(settings.classifiers) * len(seeds))
    synthetic = release.image_set()
    return {name: seeded_accuracy([downstream_accuracy(name, synthetic, soft_labels, temperature,
                                                       dataset.val, dataset.test,
                                                       dataset.info.num_classes, training, share, ledger, device,
                                                       seed) for seed in seeds])
            for name in settings.classifiers}


def _pictures(release: Release, synthetic_index: np.ndarray, synthetic: np.ndarray, real_images: np.ndarray,
              real: np.ndarray, dataset: Dataset, settings: EvaluationSettings, out: Path,
              log_path: str | Path | None) -> None:
    save_png(class_grid(release.images, release.labels, dataset.info.num_classes), out / SAMPLES)
    labels = release.labels[synthetic_index]
    shown = [int(np.flatnonzero(labels == c)[0]) for c in range(dataset.info.num_classes) if (labels == c).any()]
    shown = shown[:settings.nearest_neighbours]
    nearest, _ = nearest_real(synthetic[shown].astype(np.float64), real.astype(np.float64))
    save_nearest_neighbours(release.images[synthetic_index[shown]], real_images[nearest], out / NEIGHBOURS)
    if log_path is not None and Path(log_path).is_file():
        save_log_curves(log_path, out / CURVES)
