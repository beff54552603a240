"""DDPM loss (epsilon- or v-prediction) with noise multiplicity, and sampling with classifier-free guidance.

We use DDPM objectives with diffusers' schedulers rather than DPDM's EDM preconditioning: one well-kept
scheduler serves training, DDIM sampling and SDEdit variation (PE). v-prediction (Salimans & Ho 2022) is
close to EDM's preconditioning: at high noise the network predicts the clean image, so an imprecise
(DP-noised) network yields blurry images rather than amplified noise.

Releases are sampled with DPM-Solver++ (Lu et al. 2022, second-order multistep; diffusers'
``DPMSolverMultistepScheduler``) by default: at 10 steps it matches DDIM at 25 in FID and KID (README, speed
table). DDIM and UniPC stay selectable (``diffusion.sampler``); the differentiable path (:meth:`Diffusion.ddim`,
FETA-Pro's and PE's) is DDIM.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from .settings import NOISE_LEVELS

if TYPE_CHECKING:  # diffusers is imported where a model or scheduler is made: the command line starts faster without it
    from diffusers.schedulers.scheduling_utils import SchedulerMixin

ModelFn = Callable[..., Any]
Interval = Sequence[float]
FULL_TRAJECTORY = (0.0, 1.0)
PREDICTIONS = {"epsilon": "epsilon", "v": "v_prediction"}
SAMPLERS = {"dpm-solver++": "DPMSolverMultistepScheduler", "ddim": "DDIMScheduler", "unipc": "UniPCMultistepScheduler"}


def drop_labels(labels: torch.Tensor, null: int, dropout: float, generator: torch.Generator) -> torch.Tensor:
    """A copy of ``labels`` with a random ``dropout`` share set to the null class ``null`` (classifier-free
    guidance learns the unconditional model from those)."""
    labels = labels.clone()
    labels[torch.rand(len(labels), generator=generator) < dropout] = null
    return labels


@dataclass(frozen=True)
class NoiseLevels:
    """Where training spends its draws of the diffusion time t: ``uniform`` over the T steps (DDPM), or
    ``log-normal`` in the noise level sigma_t = sqrt((1 - abar_t) / abar_t), ln sigma ~ N(``mean``, ``std``^2) as
    in EDM (Karras et al. 2022: mean -1.2, std 1.2), each draw taken to the first step whose sigma_t reaches it."""

    kind: str = "uniform"
    mean: float = -1.2
    std: float = 1.2

    def __post_init__(self) -> None:
        if self.kind not in NOISE_LEVELS:
            raise ValueError(f"noise levels must be one of {', '.join(NOISE_LEVELS)}, got {self.kind!r}")


class Diffusion:
    """The forward process and the samplers of a DDPM with ``timesteps`` steps; training draws its times as
    ``levels`` says."""

    def __init__(self, timesteps: int = 1000, beta_schedule: str = "linear", prediction: str = "epsilon",
                 levels: NoiseLevels = NoiseLevels()) -> None:
        if prediction not in PREDICTIONS:
            raise ValueError(f"prediction must be one of {', '.join(PREDICTIONS)}, got {prediction!r}")
        from diffusers import DDPMScheduler

        self.train_scheduler = DDPMScheduler(num_train_timesteps=timesteps, beta_schedule=beta_schedule,
                                             prediction_type=PREDICTIONS[prediction])
        self.timesteps, self.beta_schedule, self.prediction = timesteps, beta_schedule, prediction
        self.alphas_cumprod = self.train_scheduler.alphas_cumprod.float()
        self.levels = levels
        self.log_sigmas = (0.5 * ((1 - self.alphas_cumprod) / self.alphas_cumprod).log()).contiguous()

    def training_inputs(self, n: int, k: int, shape: tuple[int, ...], generator: torch.Generator
                        ) -> tuple[torch.Tensor, torch.Tensor]:
        """Per example, K diffusion times (drawn as :class:`NoiseLevels` says) and K Gaussian noises (noise
        multiplicity)."""
        if self.levels.kind == "uniform":
            times = torch.randint(0, self.timesteps, (n, k), generator=generator)
        else:
            log_sigma = self.levels.mean + self.levels.std * torch.randn((n, k), generator=generator)
            times = torch.searchsorted(self.log_sigmas, log_sigma).clamp(max=self.timesteps - 1)
        return times, torch.randn((n, k, *shape), generator=generator)

    def example_loss(self, model_fn: ModelFn, image: torch.Tensor, label: torch.Tensor | None,
                     times: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
        """Prediction MSE of ONE image in [0, 1] over its K (time, noise) draws; label None: unconditional."""
        return self.example_losses(model_fn, image[None], None if label is None else label[None], times[None],
                                   noise[None])[0]

    def batch_loss(self, model_fn: ModelFn, images: torch.Tensor, labels: torch.Tensor | None, times: torch.Tensor,
                   noise: torch.Tensor) -> torch.Tensor:
        """Mean loss of a batch (n images, n x K times and noises), for non-private training."""
        return self.example_losses(model_fn, images, labels, times, noise).mean()

    def example_losses(self, model_fn: ModelFn, images: torch.Tensor, labels: torch.Tensor | None,
                       times: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
        """:meth:`example_loss` of each of n images, from one batched pass over its n x K rows (rows of an image
        adjacent): DP-SGD's batched per-example gradients (:mod:`dpsynth.privacy.per_example`)."""
        n, k = times.shape
        x0 = images.repeat_interleave(k, 0) * 2 - 1
        flat_noise = noise.flatten(0, 1)
        abar = self._at(self.alphas_cumprod, times.flatten(), x0)
        noisy = abar.sqrt() * x0 + (1 - abar).sqrt() * flat_noise
        rows = None if labels is None else labels.repeat_interleave(k)
        predicted = model_fn(noisy, times.flatten(), class_labels=rows).sample
        target = flat_noise if self.prediction == "epsilon" else abar.sqrt() * flat_noise - (1 - abar).sqrt() * x0
        return (predicted.float() - target).pow(2).flatten(1).mean(1).view(n, k).mean(1)

    def noisy(self, images: torch.Tensor, times: torch.Tensor, noise: torch.Tensor
              ) -> tuple[torch.Tensor, torch.Tensor]:
        """x_t of a batch of images in [0, 1] (one time and noise each), and the prediction target there."""
        x0 = images * 2 - 1
        abar = self._at(self.alphas_cumprod, times, x0)
        target = noise if self.prediction == "epsilon" else abar.sqrt() * noise - (1 - abar).sqrt() * x0
        return abar.sqrt() * x0 + (1 - abar).sqrt() * noise, target

    def previous_mean(self, output: torch.Tensor, noisy: torch.Tensor, times: torch.Tensor) -> torch.Tensor:
        """x_{t-1}: the mean of the reverse step from x_t = ``noisy`` given the network's ``output`` there.

        The DDPM posterior mean of q(x_{t-1} | x_t, x_0) at the predicted x_0 (x_0 itself at t = 0): an
        affine, invertible map of the output for a given (x_t, t), so a model that predicts noise or v
        predicts the next-step image (DP-SAD's parameterisation) and vice versa.
        """
        clean_weight, noisy_weight = self.posterior_weights(times, noisy)
        return clean_weight * self.predicted_clean(output, noisy, times) + noisy_weight * noisy

    def predicted_clean(self, output: torch.Tensor, noisy: torch.Tensor, times: torch.Tensor) -> torch.Tensor:
        """The denoised image x_0 in [-1, 1] that the network's ``output`` at (x_t = ``noisy``, t) predicts."""
        abar = self._at(self.alphas_cumprod, times, noisy)
        if self.prediction == "epsilon":
            return (noisy - (1 - abar).sqrt() * output) / abar.sqrt()
        return abar.sqrt() * noisy - (1 - abar).sqrt() * output

    def clean_from_previous(self, previous: torch.Tensor, noisy: torch.Tensor, times: torch.Tensor) -> torch.Tensor:
        """The denoised image x_0 that a next-step image x_{t-1} implies at (x_t, t): :meth:`previous_mean` inverted."""
        clean_weight, noisy_weight = self.posterior_weights(times, noisy)
        return (previous - noisy_weight * noisy) / clean_weight

    def posterior_weights(self, times: torch.Tensor, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(a_t, b_t) of the posterior mean x_{t-1} = a_t x_0 + b_t x_t, shaped to broadcast over ``like``."""
        abar = self._at(self.alphas_cumprod, times, like)
        previous = torch.cat([torch.ones(1), self.alphas_cumprod[:-1]])
        abar_prev = self._at(previous, times, like)
        beta = 1 - abar / abar_prev
        return abar_prev.sqrt() * beta / (1 - abar), (1 - beta).sqrt() * (1 - abar_prev) / (1 - abar)

    @staticmethod
    def _at(schedule: torch.Tensor, times: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
        """``schedule[times]`` shaped to broadcast over ``like``'s image dimensions."""
        return schedule.to(like.device)[times].view(-1, *([1] * (like.dim() - 1))).to(like.dtype)

    @staticmethod
    def guided(model: ModelFn, x: torch.Tensor, times: torch.Tensor, labels: torch.Tensor, null_label: int,
               guidance: float) -> torch.Tensor:
        """The network's output with classifier-free guidance w: out_u + (1 + w)(out_c - out_u) (w = 0: out_c)."""
        if not guidance:
            return model(x, times, class_labels=labels).sample
        both = model(torch.cat([x, x]), torch.cat([times, times]),
                     class_labels=torch.cat([labels, torch.full_like(labels, null_label)])).sample
        conditional, unconditional = both.chunk(2)
        return unconditional + (1 + guidance) * (conditional - unconditional)

    @torch.no_grad()
    def sample(self, model: ModelFn, labels: torch.Tensor, shape: tuple[int, ...], null_label: int, steps: int = 50,
               guidance: float = 0.0, generator: torch.Generator | None = None, sampler: str = "dpm-solver++",
               device: torch.device | None = None, guidance_interval: Interval = FULL_TRAJECTORY) -> torch.Tensor:
        """Samples for ``labels`` in [0, 1] (on the CPU) after ``steps`` deterministic steps of ``sampler``.

        ``model`` may be any callable with the UNet's signature (a compiled UNet) when ``device`` says where it
        runs (default: the device of the module's parameters). Guidance acts at the steps whose t / T lies in
        ``guidance_interval`` (Kynkäänniemi et al. 2024: guidance at high noise costs diversity)."""
        scheduler = self.scheduler(sampler, steps)
        return self.denoise(model, labels, shape, null_label, scheduler, guidance, generator, device,
                            guidance_interval).cpu()

    def ddim(self, model: nn.Module, labels: torch.Tensor, shape: tuple[int, ...], null_label: int,
             steps: int, guidance: float = 0.0, generator: torch.Generator | None = None) -> torch.Tensor:
        """DDIM samples (eta = 0), differentiable (under autograd when enabled) and on the model's device."""
        return self.denoise(model, labels, shape, null_label, self.scheduler("ddim", steps), guidance, generator)

    def scheduler(self, sampler: str, steps: int) -> SchedulerMixin:
        """A fresh ``sampler`` scheduler on this model's noise schedule, set to ``steps`` steps."""
        if sampler not in SAMPLERS:
            raise ValueError(f"sampler must be one of {', '.join(SAMPLERS)}, got {sampler!r}")
        import diffusers

        scheduler = getattr(diffusers, SAMPLERS[sampler]).from_config(self.train_scheduler.config)
        scheduler.set_timesteps(steps)
        return scheduler

    def denoise(self, model: ModelFn, labels: torch.Tensor, shape: tuple[int, ...], null_label: int,
                scheduler: SchedulerMixin, guidance: float = 0.0, generator: torch.Generator | None = None,
                device: torch.device | None = None, guidance_interval: Interval = FULL_TRAJECTORY) -> torch.Tensor:
        """Images in [0, 1] for ``labels`` from Gaussian noise (drawn from ``generator``) by ``scheduler``'s steps,
        guided where t / T lies in ``guidance_interval``."""
        if device is None:
            if not isinstance(model, nn.Module):
                raise TypeError("denoise needs `device` for a model that is not an nn.Module")
            device = next(model.parameters()).device
        x = torch.randn((len(labels), *shape), generator=generator).to(device)
        labels = labels.to(device)
        low, high = check_interval(guidance_interval)
        for t in scheduler.timesteps:
            weight = guidance if low <= int(t) / self.timesteps <= high else 0.0
            out = self.guided(model, x, t.expand(len(labels)).to(device), labels, null_label, weight)
            x = scheduler.step(out.float(), t, x).prev_sample
        return ((x + 1) / 2).clamp(0, 1)


def check_interval(interval: Interval) -> tuple[float, float]:
    """A guidance interval as (low, high) with 0 <= low <= high <= 1; ValueError otherwise."""
    values = tuple(interval) if isinstance(interval, (list, tuple)) else ()
    if len(values) != 2 or not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values) \
            or not 0 <= values[0] <= values[1] <= 1:
        raise ValueError(f"a guidance interval must be [low, high] with 0 <= low <= high <= 1 (shares of the noise "
                         f"schedule's T), got {interval!r}")
    return float(values[0]), float(values[1])
