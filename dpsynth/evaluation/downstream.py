"""Utility: train classifiers on a synthetic set, pick an epoch privately on real validation data, test on real data.

Model selection reads the sensitive validation split, so it is a mechanism: Report Noisy Max over the
per-epoch correct counts, recorded in the ledger under the "evaluation" budget. The reported accuracy is
the test accuracy of the epoch the *noisy* selection picked (DPImageBench computes a noisy choice and
then reports the noiseless argmax; we do not). Test accuracy is the measurement, never a selection input.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from kornia.augmentation import RandomCrop
from torch import nn
from tqdm.auto import tqdm

from ..data import ImageSet
from ..models import build_classifier, channels_last
from ..privacy import PrivacyLedger
from ..privacy.dpsgd import EMA
from ..privacy.mechanisms import report_noisy_max
from ..privacy.randomness import SecretStream
from ..utils.images import as_floats

SCHEDULES = ("cosine", "step")
SHIFT = 2  # pixels an augmented training image may move each way


@dataclass(frozen=True)
class TrainingSettings:
    """Epochs, batch size, Adam learning rate and its schedule (``cosine`` decay to 0 per step, or ``step``: x0.2
    every 20 epochs, DPImageBench's) of a downstream classifier; ``ema`` > 0 scores an EMA of the weights;
    ``augment`` shifts each training image by up to :data:`SHIFT` pixels (a random crop of the zero-padded image)."""

    epochs: int
    batch_size: int
    lr: float
    schedule: str = "cosine"
    ema: float = 0.0
    augment: bool = False


def _normalise(images: torch.Tensor) -> torch.Tensor:
    """Images in [-1, 1], channels-last: the layout the classifiers are held in (:func:`channels_last`)."""
    return (as_floats(images) * 2 - 1).contiguous(memory_format=torch.channels_last)


@torch.no_grad()
def correct_predictions(model: nn.Module, images: torch.Tensor, labels: torch.Tensor, device: torch.device,
                        batch_size: int = 1000) -> torch.Tensor:
    """Per image (bool), whether its predicted class is its label."""
    model.eval()
    return torch.cat([model(_normalise(images[start:start + batch_size].to(device))).argmax(dim=1).cpu()
                      == labels[start:start + batch_size] for start in range(0, len(images), batch_size)])


def correct_count(model: nn.Module, images: torch.Tensor, labels: torch.Tensor, device: torch.device,
                  batch_size: int = 1000) -> int:
    """Number of ``images`` whose predicted class is their label."""
    return int(correct_predictions(model, images, labels, device, batch_size).sum())


def correct_units(model: nn.Module, data: ImageSet, device: torch.device) -> float:
    """The correctly classified images of ``data``, each counted with its unit weight: adding a unit (an image, or
    a group of images) raises the count by between 0 and 1, as Report Noisy Max needs."""
    correct = correct_predictions(model, data.images, data.labels, device).double()
    return float((correct * data.unit_weights()).sum())


def train_epochs(model: nn.Module, images: torch.Tensor, targets: torch.Tensor, settings: TrainingSettings,
                 device: torch.device, generator: torch.Generator, after_epoch: Any, desc: str,
                 temperature: float = 1.0) -> None:
    """Adam with cosine decay on (images, targets); ``after_epoch(model)`` is called after every epoch.

    ``targets`` are class indices (cross-entropy) or probability rows at ``temperature`` T: then the loss is
    T^2 KL(targets || softmax(logits / T)), knowledge distillation (Hinton et al.; DP-ImgSyn Eq. 6).
    """
    optimizer = torch.optim.Adam(model.parameters(), lr=settings.lr)
    steps_per_epoch = -(-len(images) // settings.batch_size)
    per_step = settings.schedule == "cosine"
    scheduler = (torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, settings.epochs * steps_per_epoch) if per_step
                 else torch.optim.lr_scheduler.StepLR(optimizer, step_size=20, gamma=0.2))
    ema = EMA(model, settings.ema) if settings.ema else None
    shift = RandomCrop((images.shape[-2], images.shape[-1]), padding=SHIFT) if settings.augment else nn.Identity()
    for _ in tqdm(range(settings.epochs), desc=desc, dynamic_ncols=True):
        model.train()
        for batch in torch.randperm(len(images), generator=generator).split(settings.batch_size):
            logits = model(_normalise(shift(as_floats(images[batch]).to(device))))
            loss = distillation_loss(logits, targets[batch].to(device), temperature)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            if ema is not None:
                ema.update(model)
            if per_step:
                scheduler.step()
        if not per_step:
            scheduler.step()
        _with_average(model, ema, after_epoch)


def _with_average(model: nn.Module, ema: EMA | None, call: Callable[[nn.Module], None]) -> None:
    """``call(model)`` with the EMA weights in ``model`` (its own weights as they were afterwards)."""
    if ema is None:
        call(model)
        return
    own = {name: value.clone() for name, value in model.state_dict().items()}
    ema.copy_to(model)
    call(model)
    model.load_state_dict(own)


def distillation_loss(logits: torch.Tensor, targets: torch.Tensor, temperature: float) -> torch.Tensor:
    """Cross-entropy for class indices; T^2 KL(targets || softmax(logits / T)) for probability rows."""
    if not targets.is_floating_point():
        return F.cross_entropy(logits, targets)
    log_probs = F.log_softmax(logits / temperature, dim=1)
    return F.kl_div(log_probs, targets, reduction="batchmean") * temperature ** 2


def downstream_accuracy(
    name: str,
    synthetic: ImageSet,
    soft_labels: torch.Tensor | None,
    temperature: float,
    validation: ImageSet,
    test: ImageSet,
    num_classes: int,
    settings: TrainingSettings,
    selection_epsilon: float,
    ledger: PrivacyLedger,
    device: torch.device,
    seed: int = 0,
) -> dict[str, Any]:
    """Train classifier ``name`` on the synthetic set (on ``soft_labels`` at ``temperature`` when given); test
    accuracy at the epoch Report Noisy Max picks on the validation split.

    Each epoch's weights are kept (on the CPU) and only the chosen epoch's and the last are tested: the test set
    is a measurement, read twice per classifier instead of once per epoch."""
    torch.manual_seed(seed)
    generator = torch.Generator().manual_seed(seed)
    model = channels_last(build_classifier(name, synthetic.images.shape[1], num_classes).to(device))
    targets = soft_labels if soft_labels is not None else synthetic.labels
    val_correct: list[float] = []
    weights: list[dict[str, torch.Tensor]] = []

    def after_epoch(trained: nn.Module) -> None:
        val_correct.append(correct_units(trained, validation, device))
        weights.append({key: value.detach().to("cpu", copy=True) for key, value in trained.state_dict().items()})

    train_epochs(model, synthetic.images, targets, settings, device, generator, after_epoch, f"classifier {name}",
                 temperature)
    chosen = report_noisy_max(torch.tensor(val_correct), selection_epsilon, ledger, "model-selection",
                              SecretStream.fresh(), budget="evaluation")  # a seeded draw would void its epsilon
    last_epoch = correct_count(model, test.images, test.labels, device) / len(test)
    model.load_state_dict(weights[chosen])
    return {"test_accuracy": correct_count(model, test.images, test.labels, device) / len(test),
            "selected_epoch": chosen + 1, "epochs": settings.epochs, "last_epoch_test_accuracy": last_epoch,
            "selection_epsilon": selection_epsilon, "seed": seed, "trained_on": len(synthetic),
            "soft_labels": soft_labels is not None,
            "distillation_temperature": temperature if soft_labels is not None else None,
            "validation_size": len(validation), "test_size": len(test)}


def seeded_accuracy(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """:func:`downstream_accuracy` over several classifier seeds: the mean test accuracy and its sample standard
    deviation (0 for one seed), the settings they share, each seed's result under ``seeds``."""
    scores = torch.tensor([run["test_accuracy"] for run in runs], dtype=torch.float64)
    shared = {key: value for key, value in runs[0].items()
              if key not in ("test_accuracy", "selected_epoch", "last_epoch_test_accuracy", "seed")}
    return {"test_accuracy": float(scores.mean()),
            "test_accuracy_std": float(scores.std()) if len(runs) > 1 else 0.0,
            **shared, "selection_epsilon": sum(run["selection_epsilon"] for run in runs), "seeds": runs}
