"""Non-private warm-up phases of a diffusion model on public images or on images released from private data
(post-processing: no privacy cost), shared by DP-FETA, FETA-Pro and PrivImage."""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from kornia.augmentation.auto import RandAugment
from kornia.augmentation.auto.rand_augment.rand_augment import default_policy
from tqdm.auto import tqdm

from ..config import positive
from .context import RunContext
from .private import MakeBatch

LossFn = Callable[[torch.nn.Module, int], torch.Tensor]
BatchLoss = Callable[..., torch.Tensor]
# kornia's RandAugment operations without "invert": 14, as DP-FETA's bag (inverted garments or digits
# are not images of the data).
AUGMENTATIONS = [subpolicy for subpolicy in default_policy if subpolicy[0][0] != "invert"]


@dataclass(frozen=True, kw_only=True)
class WarmupSettings:
    """A warm-up section: ``iterations`` Adam steps at ``lr`` on batches of ``batch_size``, RandAugmented
    (``augment_ops`` operations of ``augment_magnitude``) when ``augment``, checkpointed every
    ``checkpoint_every``. Defaults: DP-FETA's warm-up on its central images."""

    iterations: int = positive(default=2000)
    batch_size: int = positive(default=64)
    lr: float = positive(default=1e-4)
    checkpoint_every: int = positive(default=500)
    augment: bool = True
    augment_ops: int = positive(default=2)
    augment_magnitude: int = positive(default=10)


def augmented(augment: RandAugment, images: torch.Tensor) -> torch.Tensor:
    """``images`` through ``augment``; grey images go through as RGB (the colour op needs three channels)."""
    if images.shape[1] != 1:
        return augment(images)
    return augment(images.expand(-1, 3, -1, -1))[:, :1]


def diffusion_loss(batch_loss: BatchLoss, make_batch: MakeBatch, count: int, settings: WarmupSettings,
                   generator: torch.Generator) -> LossFn:
    """``loss(model, batch_size)``: ``batch_loss`` on a random batch of the ``count`` examples ``make_batch``
    indexes (images first), RandAugmented when ``settings.augment``."""
    augment = RandAugment(settings.augment_ops, settings.augment_magnitude, policy=AUGMENTATIONS)

    def loss(model: torch.nn.Module, batch_size: int) -> torch.Tensor:
        images, *rest = make_batch(torch.randint(count, (batch_size,), generator=generator))
        return batch_loss(model, augmented(augment, images) if settings.augment else images, *rest)

    return loss


@dataclass(frozen=True)
class Warmup:
    """Warm-up phases trained in the order of ``phases``, each checkpointed under its name: a resume skips
    those before the checkpoint's phase and continues that one from its step."""

    phases: Sequence[str]

    def train(self, context: RunContext, model: torch.nn.Module, phase: str, settings: WarmupSettings,
              loss_fn: LossFn) -> None:
        """Non-private Adam on ``loss_fn`` for ``settings.iterations`` steps, unless the run resumes a later
        phase."""
        state = context.state
        if state is not None and state.phase in self.phases \
                and self.phases.index(state.phase) > self.phases.index(phase):
            return
        optimizer = torch.optim.Adam(model.parameters(), lr=settings.lr)
        resumed = context.resume(phase, model=model, optimizer=optimizer)
        start = resumed.step if resumed is not None else 0
        model.train()
        for step in tqdm(range(start, settings.iterations), desc=phase, initial=start, total=settings.iterations,
                         dynamic_ncols=True):
            loss = loss_fn(model, settings.batch_size)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            done = step + 1
            if done % settings.checkpoint_every == 0 or done == settings.iterations:
                context.checkpoint(phase, done, model=model, optimizer=optimizer)
                context.log("warm-up", phase=phase, step=done, loss=float(loss.detach()))
