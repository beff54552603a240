"""A resumable DP-SGD phase: engine steps, EMA, progress with epsilon, checkpoints that carry the phase."""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from ..config import Config, positive_setting
from ..errors import ConfigError, PrivacyError
from ..privacy import DpsgdSchedule
from ..privacy.dpsgd import DPSGD, EMA, DpsgdSettings, ExampleLoss
from ..privacy.per_example import BatchLoss
from ..utils.device import memory_limited_by
from .base import RunContext

MakeBatch = Callable[[torch.Tensor], Sequence[torch.Tensor]]


def dpsgd_schedule(config: Config, section: str, num_train: int) -> DpsgdSchedule:
    """The DP-SGD schedule of config section ``section`` (batch_size, epochs); ConfigError naming the key for a
    bad one or a clipping norm that is not positive."""
    positive_setting(config, section, "clip")
    try:
        return DpsgdSchedule(config[section]["batch_size"], config[section]["epochs"], num_train)
    except PrivacyError as exc:
        raise ConfigError(f"{section}.{exc}") from None


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
        engine = DPSGD(self.model, self.optimizer, self.loss, settings=self.settings,
                       num_records=len(context.dataset.train), ledger=context.ledger, stage=self.stage,
                       noise=context.noise, world=context.world, generator=context.generator,
                       example_generator=context.example_generator, batch_loss=self.batch_loss,
                       public_size=context.dataset.info.num_train)
        progress = context.progress(self.steps, self.stage, initial=step)
        first = step
        while step < self.steps:
            with memory_limited_by(*self.memory_setting, f"taking DP-SGD steps of {self.stage}"):
                stats = engine.step(make_batch)
            if step == first:  # the engine chose its per-example gradients at this step
                context.log(f"{self.stage} engine", **(engine.engine or {}))
            context.adjust_threads()
            if self.ema is not None:
                self.ema.update(self.model)
            if self.after_step is not None:
                stats.update(self.after_step())
            step += 1
            progress.update(stats)
            if step % self.checkpoint_every == 0 or step == self.steps:
                context.checkpoint(self.stage, step, **parts)
                context.log(self.stage, step=step, **{name: float(value) for name, value in stats.items()})
        progress.close()
