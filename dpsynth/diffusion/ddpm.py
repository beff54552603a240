"""DDPM epsilon-prediction loss with noise multiplicity, and DDIM sampling with classifier-free guidance.

We use DDPM's epsilon-prediction objective (Ho et al.) with diffusers' schedulers rather than DPDM's EDM
preconditioning: one well-kept scheduler serves training, DDIM sampling and SDEdit variation (PE).
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from diffusers import DDIMScheduler, DDPMScheduler
from torch import nn

ModelFn = Callable[..., Any]


class Diffusion:
    """The forward process and the samplers of a DDPM with ``timesteps`` steps."""

    def __init__(self, timesteps: int = 1000, beta_schedule: str = "linear") -> None:
        self.train_scheduler = DDPMScheduler(num_train_timesteps=timesteps, beta_schedule=beta_schedule)
        self.timesteps = timesteps
        self.alphas_cumprod = self.train_scheduler.alphas_cumprod.float()

    def training_inputs(self, n: int, k: int, shape: tuple[int, ...], generator: torch.Generator
                        ) -> tuple[torch.Tensor, torch.Tensor]:
        """Per example, K diffusion times and K Gaussian noises (noise multiplicity)."""
        times = torch.randint(0, self.timesteps, (n, k), generator=generator)
        return times, torch.randn((n, k, *shape), generator=generator)

    def example_loss(self, model_fn: ModelFn, image: torch.Tensor, label: torch.Tensor,
                     times: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
        """Epsilon-prediction MSE of ONE image in [0, 1], averaged over its K (time, noise) draws."""
        x0 = image * 2 - 1
        abar = self.alphas_cumprod.to(image.device)[times].view(-1, *([1] * image.dim()))
        noisy = abar.sqrt() * x0 + (1 - abar).sqrt() * noise
        labels = label.expand(times.shape[0])
        predicted = model_fn(noisy, times, class_labels=labels).sample
        return (predicted - noise).pow(2).mean()

    @torch.no_grad()
    def sample(self, model: nn.Module, labels: torch.Tensor, shape: tuple[int, ...], null_label: int,
               steps: int = 50, guidance: float = 0.0, generator: torch.Generator | None = None) -> torch.Tensor:
        """DDIM samples (eta = 0) for ``labels``, in [0, 1]; guidance w gives eps_u + (1 + w)(eps_c - eps_u)."""
        device = next(model.parameters()).device
        scheduler = DDIMScheduler.from_config(self.train_scheduler.config)
        scheduler.set_timesteps(steps)
        x = torch.randn((len(labels), *shape), generator=generator).to(device)
        labels = labels.to(device)
        for t in scheduler.timesteps:
            time = t.expand(len(labels)).to(device)
            if guidance:
                both = model(torch.cat([x, x]), torch.cat([time, time]),
                             class_labels=torch.cat([labels, torch.full_like(labels, null_label)])).sample
                conditional, unconditional = both.chunk(2)
                eps = unconditional + (1 + guidance) * (conditional - unconditional)
            else:
                eps = model(x, time, class_labels=labels).sample
            x = scheduler.step(eps, t, x).prev_sample
        return ((x + 1) / 2).clamp(0, 1).cpu()
