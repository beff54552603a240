"""DP-SAD's pieces: the discriminator, the student's per-example loss (Eq. 10, 7, 17) and the discriminator step."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ...diffusion import Diffusion
from ...privacy.dpsgd import clip_gradient

TEACHER, STUDENT = 0, 1  # the discriminator's classes: labels [1, 0] and [0, 1] of Sec. 4.3


class Discriminator(nn.Module):
    """Teacher-or-student classifier of a next-step image x_{t-1} at (x_t, t).

    It judges the denoised image x_0 = (x_{t-1} - b_t x_t) / a_t that x_{t-1} implies, told t as an extra
    channel. Shown x_{t-1} itself it learnt nothing: a_t < 0.01 for most t, so the teacher's and the
    student's x_{t-1} at the same x_t differ by 0.1 % (median) and its loss stayed at ln 2 (README). x_0
    carries the same information, undiluted.
    """

    def __init__(self, channels: int, width: int, diffusion: Diffusion) -> None:
        super().__init__()
        self.diffusion = diffusion
        self.net = nn.Sequential(
            nn.Conv2d(channels + 1, width, 4, 2, 1), nn.LeakyReLU(0.2),
            nn.Conv2d(width, 2 * width, 4, 2, 1), nn.LeakyReLU(0.2),
            nn.Conv2d(2 * width, 2 * width, 3, 1, 1), nn.LeakyReLU(0.2),
            nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(2 * width, 2),
        )

    def forward(self, previous: torch.Tensor, noisy: torch.Tensor, times: torch.Tensor) -> torch.Tensor:
        """Logits of (teacher, student) for each next-step image."""
        clean = self.diffusion.clean_from_previous(previous, noisy, times)
        plane = (times.to(clean.dtype) / self.diffusion.timesteps).view(-1, 1, 1, 1).expand(-1, 1, *clean.shape[2:])
        return self.net(torch.cat([clean, plane], dim=1))


@dataclass(frozen=True)
class StudentLoss:
    """One example's loss of the student at x_t, as DP-SGD's per-example loss.

    The student's output is the next-step image x_{t-1} (the posterior mean at its prediction): Eq. 10's
    MSE to the teacher's x_{t-1} and to the data's forward-process x_{t-1}, plus weight x Eq. 7's
    adversarial term log(1 - D_teacher) of the denoised image x_0 that the output implies. Both MSEs equal
    a_t^2 times the MSE of the implied x_0, so the adversarial term carries that weight a_t^2 too: the
    balance of the three is then the same at every t. The gradient with respect to the output is clipped
    to ``output_clip`` (Eq. 17) before it is backpropagated into the parameters.
    """

    diffusion: Diffusion
    discriminator: Discriminator
    output_clip: float
    adversarial_weight: float

    def __call__(self, model_fn: Callable[..., Any], noisy: torch.Tensor, time: torch.Tensor,
                 label: torch.Tensor, teacher_next: torch.Tensor, data_next: torch.Tensor) -> torch.Tensor:
        noisy, time = noisy.unsqueeze(0), time.unsqueeze(0)
        out = self.diffusion.previous_mean(model_fn(noisy, time, class_labels=label.unsqueeze(0)).sample, noisy, time)
        out = clip_gradient(out, self.output_clip)
        distillation = (out - teacher_next).pow(2).mean() + (out - data_next).pow(2).mean()
        if not self.adversarial_weight:
            return distillation
        clean_weight = self.diffusion.posterior_weights(time, out)[0].view(())
        adversarial = F.log_softmax(self.discriminator(out, noisy, time), dim=-1)[0, STUDENT]
        return distillation + self.adversarial_weight * clean_weight.square() * adversarial


def discriminator_loss(discriminator: Discriminator, teacher_next: torch.Tensor, student_next: torch.Tensor,
                       noisy: torch.Tensor, times: torch.Tensor) -> torch.Tensor:
    """Cross-entropy of telling the teacher's next-step images at ``noisy`` (class [1, 0]) from the student's."""
    both = (torch.cat([teacher_next, student_next]), torch.cat([noisy, noisy]), torch.cat([times, times]))
    logits = discriminator(*both)
    classes = torch.cat([torch.full_like(times, TEACHER), torch.full_like(times, STUDENT)])
    return F.cross_entropy(logits, classes)
