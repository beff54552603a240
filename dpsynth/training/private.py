"""A resumable DP-SGD phase: engine steps, EMA, progress with epsilon, checkpoints that carry the phase."""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from ..config import at_least, not_a_key, positive
from ..errors import ConfigError, PrivacyError
from ..privacy import DpsgdSchedule, PlannedStage
from ..privacy.dpsgd import DPSGD, EMA, DpsgdSettings, ExampleLoss, Groups
from ..privacy.per_example import BatchLoss
from ..utils.device import memory_limited_by
from .context import RunContext

MakeBatch = Callable[[torch.Tensor], Sequence[torch.Tensor]]


def dpsgd_schedule(section: str, batch_size: int, epochs: float, num_train: int) -> DpsgdSchedule:
    """Poisson sampling of ``batch_size`` of ``num_train`` for ``epochs``; ConfigError naming the key of config
    section ``section`` that does not fit."""
    try:
        return DpsgdSchedule(batch_size, epochs, num_train)
    except PrivacyError as exc:
        raise ConfigError(f"{section}.{exc}") from None


@dataclass(frozen=True, kw_only=True)
class DpsgdSection:
    """A DP-SGD config section (``dpsgd``; DP-SAD's ``teacher`` and ``student``): expected batch, epochs,
    clipping norm, Adam's learning rate, EMA decay, the chunk of examples per pass, how often to checkpoint and
    bf16 autocast (true, false or auto). Defaults: DPImageBench's DPDM."""

    section: str = not_a_key("dpsgd")  # the section's name, for messages
    batch_size: int = positive(default=4096)
    epochs: float = positive(default=150.0)
    clip: float = positive(default=1.0)
    lr: float = positive(default=3e-4)
    ema: float = at_least(0, default=0.999)
    # K = 32 rows each: 16 examples take ~8 GiB (28 x 28) / ~10 GiB (32 x 32) on a GPU (estimated), within a 24 GB
    # card; on 80 GB, 64 (benchmarks/gpu_memory.py, README "GPUs").
    physical_batch_size: int = positive(default=16)
    checkpoint_every: int = positive(default=50)
    bf16: bool | str = "auto"  # bf16 autocast where the hardware computes bf16 natively (dpsynth.hardware)

    def schedule(self, num_train: int) -> DpsgdSchedule:
        return dpsgd_schedule(self.section, self.batch_size, self.epochs, num_train)

    def stage(self, name: str, num_train: int) -> PlannedStage:
        """Stage ``name``: this section's DP-SGD, its noise calibrated (none at an infinite target epsilon)."""
        return PlannedStage(name, calibrated=self.schedule(num_train).event, noise_free=True)

    def key(self, name: str) -> str:
        """The dotted config key of field ``name``, for messages."""
        return f"{self.section}.{name}"


@dataclass(frozen=True, kw_only=True)
class DiffusionDpsgdSection(DpsgdSection):
    """The DP-SGD section of a diffusion model's denoising loss: with the noise multiplicity K, the draws of the
    time t (and noise) each example's loss averages over before its gradient is clipped."""

    noise_multiplicity: int = positive(default=32)


@dataclass(kw_only=True)
class PrivateTraining:
    """``steps`` DP-SGD steps of ``model``, recorded in the ledger and checkpointed as phase ``stage``.

    ``parts`` are checkpointed and resumed with the model, optimiser and EMA (e.g. a discriminator and its
    optimiser); ``after_step`` runs after each private step (e.g. a discriminator update on non-private inputs)
    and returns metrics to show. ``batch_loss``, the per-example losses of a batch in one pass, lets the engine
    use batched per-example gradients. ``memory_setting`` (key and value) is what an out-of-memory error tells
    the user to lower.
    """

    stage: str
    model: nn.Module
    optimizer: torch.optim.Optimizer
    loss: ExampleLoss
    settings: DpsgdSettings
    steps: int
    checkpoint_every: int
    memory_setting: tuple[str, object]
    ema: EMA | None = None
    parts: dict[str, Any] = field(default_factory=dict)
    after_step: Callable[[], dict[str, torch.Tensor]] | None = None
    batch_loss: BatchLoss | None = None

    def run(self, context: RunContext, make_batch: MakeBatch) -> None:
        """Train from the checkpoint being resumed when it was saved in this phase, else from the start."""
        parts = {"model": self.model, "optimizer": self.optimizer, **self.parts}
        if self.ema is not None:
            parts["ema"] = self.ema
        resumed = context.resume(self.stage, **parts)
        step = resumed.step if resumed is not None else 0
        train = context.dataset.train
        groups = Groups.of(train.groups, context.group_cap) if train.groups is not None else None
        engine = DPSGD(self.model, self.optimizer, self.loss, settings=self.settings,
                       num_records=len(groups) if groups is not None else len(train), ledger=context.ledger,
                       stage=self.stage, groups=groups,
                       noise=context.noise, world=context.world, generator=context.generator,
                       example_generator=context.example_generator, batch_loss=self.batch_loss,
                       public_size=context.dataset.info.num_train)
        progress = context.progress(self.steps, self.stage, initial=step)
        first = step
        while step < self.steps:
            if context.out_of_time(self.stage):
                context.checkpoint(self.stage, step, **parts)
                context.stop_early(self.stage, step, self.steps)
                break
            with memory_limited_by(*self.memory_setting, f"taking DP-SGD steps of {self.stage}"):
                stats = engine.step(make_batch)
            if step == first:  # the engine chose its per-example gradients at this step
                context.log(f"{self.stage} engine", **(engine.engine or {}))
            context.adjust_threads()
            if self.ema is not None:
                self.ema.update(self.model)
            if self.after_step is not None:  # its losses, detached: they are shown and logged, not differentiated
                stats.update({name: value.detach() for name, value in self.after_step().items()})
            step += 1
            progress.update(stats)
            if step % self.checkpoint_every == 0 or step == self.steps:
                context.checkpoint(self.stage, step, **parts)
                context.log(self.stage, step=step, **{name: float(value) for name, value in stats.items()})
        progress.close()
