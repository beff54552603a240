"""DP-SAD (stochastic adversarial distillation): a student diffusion model distilled from a teacher, with a
discriminator, one random time step per example and per-example clipping at the student's output.

Privacy, and where we depart from the paper (Sec. 4.2-4.5):

- **The teacher.** The paper trains it on the private data without protection. Every student step then
  reads the teacher, i.e. a function of the whole private set, so the released student has no DP
  guarantee at all. By default (``teacher.training: dp``) the teacher is trained with DP-SGD, and its
  steps and the student's share one calibrated noise multiplier. ``teacher.training: non-private`` is the
  paper's setting; it runs only with ``--allow-non-private``, its ledger records the teacher's steps as
  non-private, and its privacy.json gives ``dp_guarantee: false`` and no epsilon.
- **The student's gradient (Eq. 16-17).** The paper clips each example's gradient with respect to the
  student's output, backpropagates it and adds the noise in parameter space, calibrated as if the
  parameter gradient were clipped. That bounds nothing: the Jacobian d output / d theta is evaluated at
  the example's own x_t and is unbounded, so one example can still move the sum arbitrarily. (Its
  Lemma 1 also uses sensitivity 2 C sqrt(s) where the Gaussian mechanism's is C.) We keep the output
  clipping (``student.output_clip``) and add DP-SGD's clipping of each example's whole parameter
  gradient to ``student.clip``; the noise sigma x ``student.clip`` is then a subsampled Gaussian
  mechanism per step, recorded in the ledger as stage ``student``.
- **The discriminator.** The paper says it sees only teacher and student outputs, but those outputs are
  computed at x_t made from private images. Here it is trained on x_t made from a pool of the DP
  teacher's own samples, so it never reads private data (post-processing); inside the student's loss
  it is applied to the student's output at private x_t, which the per-example clipping covers. It
  judges the denoised image that a next-step image implies at (x_t, t), not x_{t-1} itself, in which
  teacher and student differ by 0.1 % and it learnt nothing (``distillation.py``).
- **Parameterisation.** The paper's networks output x_{t-1}; ours output v (or epsilon), and the
  student's output is x_{t-1} = the DDPM posterior mean at that prediction (affine in it for a given
  (x_t, t)). Eq. 10's MSE terms, the discriminator and the output clipping all act on that x_{t-1}, as
  in the paper. The student starts from the teacher's weights (``student.init: teacher``; free, as the
  DP teacher is public once trained); the paper does not say how it initialises the student.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass, replace

import torch

from ...config import RunConfig, at_least, not_a_key, one_of, positive, preset_with, section_settings
from ...data import DatasetInfo
from ...errors import ConfigError
from ...privacy import NonPrivateAccess, PlannedStage
from ...training.context import RunContext, weights
from ...training.diffusion import CPU_PRESET, SECTIONS
from ...training.private import DiffusionDpsgdSection, DpsgdSection, MakeBatch
from ...training.probes import Probes
from ...utils.device import memory_limited_by, to_device
from ...utils.images import as_floats, to_uint8
from ..base import CPU_PROTOCOL
from ..templates import DiffusionMethod
from . import DECLARATION
from .distillation import Discriminator, StudentLoss, discriminator_loss

TRAINING = ("dp", "non-private")
INITS = ("teacher", "scratch")
POOL_IMAGES = "teacher_pool.png"
TEACHER_STAGE, STUDENT_STAGE = "teacher", "student"
POOL_PHASE = "teacher pool"  # per image-step of sampling


@dataclass(frozen=True, kw_only=True)
class TeacherSection(DiffusionDpsgdSection):
    """The ``teacher`` section: DP-SGD on the denoising loss (DPDM's defaults, K = 32 draws of t per example), how
    the teacher is trained and its guidance w (Eq. 5)."""

    section: str = not_a_key("teacher")
    training: str = one_of(*TRAINING, default="dp")
    guidance: float = at_least(0, default=1.8)


@dataclass(frozen=True, kw_only=True)
class StudentSection(DpsgdSection):
    """The ``student`` section: DP-SGD settings, the clipping norm at the output, the adversarial term's weight
    and how the student starts.

    Clipping norms in the units of x_{t-1} (output) and of its parameter gradient: measured on Fashion-MNIST (cpu
    model), the MSE terms' output gradients have norm 1e-4 to 2e-4; the parameter gradients have mean norm 0.8e-4
    to 1.8e-4 with the adversarial term (lambda = 1), 3e-5 without it."""

    section: str = not_a_key("student")
    epochs: float = positive(default=50.0)
    clip: float = positive(default=1e-4)
    output_clip: float = positive(default=1e-3)
    adversarial_weight: float = at_least(0, default=1.0)
    lr: float = positive(default=1e-4)
    init: str = one_of(*INITS, default="teacher")
    physical_batch_size: int = positive(default=64)


@dataclass(frozen=True, kw_only=True)
class DiscriminatorSettings:
    """The ``discriminator`` section: width, Adam's learning rate, batch size, and the pool of teacher samples
    (size, sampling steps) it learns from."""

    width: int = positive(default=32)
    lr: float = positive(default=1e-4)
    batch_size: int = positive(default=128)
    pool: int = positive(default=2000)
    pool_steps: int = positive(default=50)


class DPSAD(DiffusionMethod):
    """Teacher (DP-SGD by default) -> pool of teacher samples -> student distilled with DP-SGD and a discriminator."""

    declaration = DECLARATION
    dpsgd_sections = ("teacher", "student")
    probed_keys = ("discriminator",)
    sections = {"model": SECTIONS["model"], "diffusion": SECTIONS["diffusion"], "teacher": TeacherSection,
                "student": StudentSection, "discriminator": DiscriminatorSettings}
    presets = {
        # DPDM's paper preset for the teacher with 100 of its epochs, 50 student epochs; lambda = 1, w = 1.8,
        # learning rates 1e-4 as Sec. 5.1 (the paper's batch 128 and T = 500 have no DP-SGD meaning here).
        "paper": {"privacy": {"accountant": "rdp"}, "teacher": {"epochs": 100.0}},
        # DPDM's cpu preset split between teacher (3 of its 6 epochs) and student (1 epoch) at the same total steps.
        "cpu": preset_with(CPU_PROTOCOL, {
            "model": CPU_PRESET["model"],
            "diffusion": CPU_PRESET["diffusion"],
            "teacher": {"batch_size": 512, "epochs": 3.0, "noise_multiplicity": 1, "lr": 2e-3, "ema": 0.99,
                        "physical_batch_size": 128, "checkpoint_every": 25},
            "student": {"batch_size": 512, "epochs": 1.0, "lr": 5e-4, "ema": 0.99, "physical_batch_size": 128,
                        "checkpoint_every": 25},
            "discriminator": {"lr": 2e-4, "pool": 1000, "pool_steps": 25},
        }),
    }

    def __init__(self, config: RunConfig) -> None:
        super().__init__(config)
        if not self.trainer.unet_settings.trains_all:
            raise ConfigError(f"model.trainable: dp-sad DP-trains its teacher and its student whole, so it takes "
                              f"[all], got {list(self.trainer.unet_settings.trainable)}")
        self.teacher_settings = section_settings(TeacherSection, config, "teacher")
        self.student_settings = section_settings(StudentSection, config, "student")
        self.discriminator_settings = section_settings(DiscriminatorSettings, config, "discriminator")

    def privacy_stages(self, info: DatasetInfo) -> list[PlannedStage]:
        """Teacher and student DP-SGD share one calibrated sigma; a non-private teacher is recorded as such."""
        teacher = self.teacher_settings
        if teacher.training == "non-private":
            first = PlannedStage(TEACHER_STAGE, event=NonPrivateAccess(teacher.schedule(info.num_train).steps))
        else:
            first = teacher.stage(TEACHER_STAGE, info.num_train)
        return [first, self.student_settings.stage(STUDENT_STAGE, info.num_train)]

    def fit(self, context: RunContext) -> None:
        """The teacher's DP-SGD and its sample pool (released in turn, or restored), then the student's."""
        info = context.dataset.info
        self.info, teacher = info, self.trainer.build(info, context.device)
        self.trainer.log_public_start(context)
        teacher.load_state_dict(context.released(TEACHER_STAGE, lambda: self._trained_teacher(context, teacher),
                                                 every_rank=True))
        pool = context.released("teacher-pool", lambda: self._teacher_pool(context, teacher))
        context.save_grid(POOL_IMAGES, pool[0].numpy(), pool[1], info.num_classes)
        self.model = self._distil(context, teacher, pool)

    def _trained_teacher(self, context: RunContext, teacher: torch.nn.Module) -> dict[str, torch.Tensor]:
        """The teacher's weights (its EMA) after its planned DP-SGD steps."""
        settings = self.teacher_settings
        self.trainer.train_private(context, teacher, TEACHER_STAGE, settings,
                                   self.trainer.batch_maker(context, settings.noise_multiplicity))
        return weights(teacher)

    def _teacher_pool(self, context: RunContext, teacher: torch.nn.Module) -> tuple[torch.Tensor, torch.Tensor]:
        """Samples of the trained (DP) teacher: the discriminator's inputs, so it never reads private data."""
        settings, info = self.discriminator_settings, context.dataset.info
        labels = torch.arange(settings.pool) % info.num_classes
        teacher.eval()
        batch_size = self.sampling.batch_size
        with memory_limited_by("sampling.batch_size", batch_size, "sampling the teacher's pool"):
            images = torch.cat([self.trainer.diffusion.sample(teacher, chunk, info.shape, info.num_classes,
                                                              settings.pool_steps, 0.0, context.generator,
                                                              self.trainer.settings.sampler)
                                for chunk in labels.split(batch_size)])
        return torch.from_numpy(to_uint8(images)), labels

    def _distil(self, context: RunContext, teacher: torch.nn.Module, pool: tuple[torch.Tensor, torch.Tensor]
                ) -> torch.nn.Module:
        """The student's DP-SGD steps, each followed by one discriminator step on the teacher's pool."""
        settings, info = self.student_settings, context.dataset.info
        teacher.eval()  # frozen (and in train mode a resumed run differed from an unbroken one by float rounding)
        for param in teacher.parameters():
            param.requires_grad_(False)
        student = self.trainer.build(info, context.device)
        if settings.init == "teacher":
            student.load_state_dict(teacher.state_dict())
        discriminator, optimizer, loss = self._adversary(info.channels, context.device)
        pool_set = (pool[0].float() / 255, pool[1])

        def discriminator_step() -> dict[str, torch.Tensor]:
            value = self._discriminator_step(teacher, student, discriminator, optimizer, pool_set, context.generator,
                                             context.device, info.num_classes)
            context.world.broadcast_module(discriminator)  # rank 0's copy, should rounding make them drift
            return {"d_loss": value}

        self.trainer.train_private(context, student, STUDENT_STAGE, self.student_settings,
                                   self._student_batches(context, teacher), loss, after_step=discriminator_step,
                                   parts={"discriminator": discriminator, "discriminator_optimizer": optimizer})
        return student

    def _adversary(self, channels: int, device: torch.device
                   ) -> tuple[Discriminator, torch.optim.Optimizer, StudentLoss]:
        """A fresh discriminator on ``device``, its Adam, and the student's per-example loss against it."""
        settings = self.discriminator_settings
        discriminator = Discriminator(channels, settings.width, self.trainer.diffusion).to(device)
        optimizer = torch.optim.Adam(discriminator.parameters(), lr=settings.lr, betas=(0.5, 0.999))
        student_settings = self.student_settings
        return discriminator, optimizer, StudentLoss(self.trainer.diffusion, discriminator,
                                                     student_settings.output_clip, student_settings.adversarial_weight)

    def _discriminator_step(self, teacher: torch.nn.Module, student: torch.nn.Module, discriminator: Discriminator,
                            optimizer: torch.optim.Optimizer, pool: tuple[torch.Tensor, torch.Tensor],
                            generator: torch.Generator, device: torch.device, num_classes: int) -> torch.Tensor:
        """One Adam step of the discriminator on a random batch of the teacher's ``pool``; its loss."""
        indices = torch.randint(len(pool[1]), (self.discriminator_settings.batch_size,), generator=generator)
        noisy, times, labels, teacher_next, _ = self._student_inputs(teacher, pool[0][indices], pool[1][indices],
                                                                     generator, device, num_classes)
        with torch.no_grad():
            student_next = self.trainer.diffusion.previous_mean(
                student(noisy, times, class_labels=labels).sample, noisy, times)
        value = discriminator_loss(discriminator, teacher_next, student_next, noisy, times)
        optimizer.zero_grad(set_to_none=True)
        value.backward()
        optimizer.step()
        return value.detach()

    def _student_batches(self, context: RunContext, teacher: torch.nn.Module) -> MakeBatch:
        """``make_batch(indices)`` of the private set: x_t at one random t each, the teacher's output, the target."""
        train, classes = context.dataset.train, context.dataset.info.num_classes

        def make_batch(indices: torch.Tensor) -> tuple[torch.Tensor, ...]:
            return self._student_inputs(teacher, as_floats(train.images[indices]), train.labels[indices],
                                        context.example_generator, context.device, classes)

        return make_batch

    def _student_inputs(self, teacher: torch.nn.Module, images: torch.Tensor, labels: torch.Tensor,
                        generator: torch.Generator, device: torch.device, num_classes: int
                        ) -> tuple[torch.Tensor, ...]:
        """x_t at one random t each (Eq. 15), t, labels, and two next-step images x_{t-1}: the teacher's
        (with guidance, Eq. 5) and the data's (the forward process's posterior mean given x_0)."""
        times = torch.randint(0, self.trainer.diffusion.timesteps, (len(labels),), generator=generator)
        noise = torch.randn(images.shape, generator=generator)
        noisy, target = self.trainer.diffusion.noisy(images, times, noise)
        noisy, times, labels, target = (to_device(t, device) for t in (noisy, times, labels, target))
        with torch.no_grad():
            teacher_out = self.trainer.diffusion.guided(teacher, noisy, times, labels, num_classes,
                                                        self.teacher_settings.guidance).float()
        previous = self.trainer.diffusion.previous_mean
        return noisy, times, labels, previous(teacher_out, noisy, times), previous(target, noisy, times)

    def throughput_probes(self, shape: tuple[int, int, int], num_classes: int, device: torch.device) -> Probes:
        """The teacher's DP-SGD; the student's, with the teacher's guided output in each batch and a discriminator
        step after each step; the teacher's pool at the sampler's rate."""
        probes = super().throughput_probes(shape, num_classes, device)
        teacher = copy.deepcopy(probes.dpsgd[TEACHER_STAGE][0].model).eval().requires_grad_(False)  # frozen
        student_probe = probes.dpsgd[STUDENT_STAGE][0]
        student = student_probe.model
        discriminator, optimizer, loss = self._adversary(shape[0], device)
        generator = torch.Generator().manual_seed(0)
        pool = (torch.rand(self.discriminator_settings.batch_size, *shape, generator=generator),
                torch.arange(self.discriminator_settings.batch_size) % num_classes)

        def make_batch(indices: torch.Tensor) -> tuple[torch.Tensor, ...]:
            return self._student_inputs(teacher, torch.rand(len(indices), *shape, generator=generator),
                                        torch.randint(0, num_classes, (len(indices),), generator=generator),
                                        generator, device, num_classes)

        def after_step() -> None:
            self._discriminator_step(teacher, student, discriminator, optimizer, pool, generator, device, num_classes)

        distilled = replace(student_probe, loss=loss, make_batch=make_batch, batch_loss=None, after_step=after_step)
        assert probes.sampling is not None
        return replace(probes, dpsgd={**probes.dpsgd, STUDENT_STAGE: (distilled, 1)},
                       phases={POOL_PHASE: probes.sampling})

    @classmethod
    def phase_units(cls, config: RunConfig, num_images: float) -> dict[str, float]:
        pool = section_settings(DiscriminatorSettings, config, "discriminator")
        return {POOL_PHASE: pool.pool * pool.pool_steps}
