"""What a method lets the planner time (:mod:`dpsynth.autoplan.probe`): its DP-SGD sections, sampling calls and
public training, on random public tensors; and the timing calls a method's own probes use."""
from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import cache
from typing import Any

import torch
from torch import nn

from ..models import build_classifier, channels_last
from ..privacy.dpsgd import ExampleLoss
from ..privacy.per_example import BatchLoss
from ..utils.device import bf16_autocast


@dataclass(frozen=True)
class DpsgdProbe:
    """What one DP-SGD section trains: its model, per-example loss (and batched loss), ``make_batch(indices)``
    giving random public tensors shaped as the section's examples, and what the section runs after each step
    (``after_step``: DP-SGD's ``after_step`` hook, timed with the step)."""

    model: nn.Module
    loss: ExampleLoss
    make_batch: Callable[[torch.Tensor], Sequence[torch.Tensor]]
    physical_batch_size: int
    bf16: bool
    batch_loss: BatchLoss | None = None
    after_step: Callable[[], Any] | None = None


@dataclass(frozen=True)
class Probes:
    """What a method lets the probe time: each DP-SGD section (its probe and rows per example), calls that return
    the seconds per unit of the release's work (a diffusion model's image-step of sampling; what
    :meth:`~dpsynth.methods.base.Method.release_units` counts) and per row of training on public data (None: it has
    none), and per other phase a call that returns the seconds of one unit of its work (an image, an iteration),
    which :meth:`~dpsynth.methods.base.Method.phase_units` counts."""

    dpsgd: dict[str, tuple[DpsgdProbe, int]]
    sampling: Callable[[], float] | None = None
    public: Callable[[], float] | None = None
    phases: dict[str, Callable[[], float]] = field(default_factory=dict)


def timed(call: Callable[[], Any], device: torch.device) -> float:
    """Wall seconds of ``call()``, waiting for the device."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    call()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - start


def forward_cost(model: nn.Module, inputs: Sequence[torch.Tensor], device: torch.device, bf16: bool,
                 **kwargs: Any) -> float:
    """Seconds per row of one inference call of ``model`` on ``inputs`` (timed after a warm-up call)."""
    model = model.to(device).eval()
    moved = [tensor.to(device) for tensor in inputs]
    with torch.no_grad(), bf16_autocast(device, bf16):
        model(*moved, **kwargs)
        return timed(lambda: model(*moved, **kwargs), device) / len(moved[0])


@cache
def classifier_cost(name: str, shape: tuple[int, int, int], num_classes: int, batch_size: int,
                    device: torch.device) -> dict[str, float]:
    """Seconds per image of training (Adam, one batch) and of testing downstream classifier ``name`` (measured
    once per process: it does not depend on the method)."""
    model = channels_last(build_classifier(name, shape[0], num_classes).to(device))  # as the evaluation holds it
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    generator = torch.Generator().manual_seed(0)
    images = (torch.rand(batch_size, *shape, generator=generator) * 2 - 1).to(device)
    images = images.contiguous(memory_format=torch.channels_last)
    labels = torch.randint(0, num_classes, (batch_size,), generator=generator).to(device)

    def step() -> None:
        loss = nn.functional.cross_entropy(model(images), labels)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    step()
    train = timed(step, device) / batch_size
    return {"train": train, "test": forward_cost(model, [images], device, False)}
