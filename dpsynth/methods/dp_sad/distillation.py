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
    """Teacher-or-student classifier of a next-step image x_{t-1}, told the time t as an extra channel."""

    def __init__(self, channels: int, width: int, timesteps: int) -> None:
        super().__init__()
        self.timesteps = timesteps
        self.net = nn.Sequential(
            nn.Conv2d(channels + 1, width, 4, 2, 1), nn.LeakyReLU(0.2),
            nn.Conv2d(width, 2 * width, 4, 2, 1), nn.LeakyReLU(0.2),
            nn.Conv2d(2 * width, 2 * width, 3, 1, 1), nn.LeakyReLU(0.2),
            nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(2 * width, 2),
        )

    def forward(self, images: torch.Tensor, times: torch.Tensor) -> torch.Tensor:
        """Logits of (teacher, student) for each image."""
        plane = (times.to(images.dtype) / self.timesteps).view(-1, 1, 1, 1).expand(-1, 1, *images.shape[2:])
        return self.net(torch.cat([images, plane], dim=1))


@dataclass(frozen=True)
class StudentLoss:
    """One example's loss of the student at x_t, as DP-SGD's per-example loss.

    The student's output is the next-step image x_{t-1} (the posterior mean at its prediction): Eq. 10's
    MSE to the teacher's x_{t-1} and to the data's forward-process x_{t-1}, plus weight x Eq. 7's
    adversarial term log(1 - D_teacher(x_{t-1})). The gradient with respect to that output is clipped
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
        logits = self.discriminator(out, time)
        return distillation + self.adversarial_weight * F.log_softmax(logits, dim=-1)[0, STUDENT]


def discriminator_loss(discriminator: Discriminator, teacher_next: torch.Tensor, student_next: torch.Tensor,
                       times: torch.Tensor) -> torch.Tensor:
    """Cross-entropy of telling the teacher's next-step images (class [1, 0]) from the student's ([0, 1])."""
    logits = discriminator(torch.cat([teacher_next, student_next]), torch.cat([times, times]))
    classes = torch.cat([torch.full_like(times, TEACHER), torch.full_like(times, STUDENT)])
    return F.cross_entropy(logits, classes)
