"""Utility: train classifiers on a synthetic set, pick an epoch privately on real validation data, test on real data.

Model selection reads the sensitive validation split, so it is a mechanism: Report Noisy Max over the
per-epoch correct counts, recorded in the ledger under the "evaluation" budget. The reported accuracy is
the test accuracy of the epoch the *noisy* selection picked (DPImageBench computes a noisy choice and
then reports the noiseless argmax; we do not). Test accuracy is the measurement, never a selection input.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from tqdm.auto import tqdm

from ..data import ImageSet
from ..privacy import PrivacyLedger
from ..privacy.mechanisms import report_noisy_max
from .classifiers import build_classifier


@dataclass(frozen=True)
class TrainingSettings:
    """Epochs, batch size and Adam learning rate (cosine-decayed) of a downstream classifier."""

    epochs: int
    batch_size: int
    lr: float


def _normalise(images: torch.Tensor) -> torch.Tensor:
    return images * 2 - 1


@torch.no_grad()
def correct_count(model: nn.Module, images: torch.Tensor, labels: torch.Tensor, device: torch.device,
                  batch_size: int = 1000) -> int:
    """Number of ``images`` whose predicted class is their label."""
    model.eval()
    correct = 0
    for start in range(0, len(images), batch_size):
        logits = model(_normalise(images[start:start + batch_size].to(device)))
        correct += int((logits.argmax(dim=1).cpu() == labels[start:start + batch_size]).sum())
    return correct


def train_epochs(model: nn.Module, images: torch.Tensor, targets: torch.Tensor, settings: TrainingSettings,
                 device: torch.device, generator: torch.Generator, after_epoch: Any, desc: str) -> None:
    """Adam with cosine decay on (images, targets); ``targets`` are class indices or probability rows.

    ``after_epoch(model)`` is called at the end of every epoch.
    """
    optimizer = torch.optim.Adam(model.parameters(), lr=settings.lr)
    steps_per_epoch = -(-len(images) // settings.batch_size)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, settings.epochs * steps_per_epoch)
    for _ in tqdm(range(settings.epochs), desc=desc, dynamic_ncols=True):
        model.train()
        for batch in torch.randperm(len(images), generator=generator).split(settings.batch_size):
            logits = model(_normalise(images[batch].to(device)))
            loss = F.cross_entropy(logits, targets[batch].to(device))
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            scheduler.step()
        after_epoch(model)


def downstream_accuracy(
    name: str,
    synthetic: ImageSet,
    soft_labels: torch.Tensor | None,
    validation: ImageSet,
    test: ImageSet,
    num_classes: int,
    settings: TrainingSettings,
    selection_epsilon: float,
    ledger: PrivacyLedger,
    device: torch.device,
    seed: int = 0,
) -> dict[str, Any]:
    """Train classifier ``name`` on the synthetic set; test accuracy at the epoch Report Noisy Max picks."""
    torch.manual_seed(seed)
    generator = torch.Generator().manual_seed(seed)
    model = build_classifier(name, synthetic.images.shape[1], num_classes).to(device)
    targets = soft_labels if soft_labels is not None else synthetic.labels
    val_correct: list[int] = []
    test_accuracy: list[float] = []

    def after_epoch(trained: nn.Module) -> None:
        val_correct.append(correct_count(trained, validation.images, validation.labels, device))
        test_accuracy.append(correct_count(trained, test.images, test.labels, device) / len(test))

    train_epochs(model, synthetic.images, targets, settings, device, generator, after_epoch, f"classifier {name}")
    chosen = report_noisy_max(torch.tensor(val_correct), selection_epsilon, ledger, "model-selection", generator,
                              budget="evaluation")
    return {"test_accuracy": test_accuracy[chosen], "selected_epoch": chosen + 1, "epochs": settings.epochs,
            "last_epoch_test_accuracy": test_accuracy[-1], "selection_epsilon": selection_epsilon,
            "trained_on": len(synthetic), "soft_labels": soft_labels is not None,
            "validation_size": len(validation), "test_size": len(test)}
