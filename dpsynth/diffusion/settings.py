"""The settings of pre-training on public data (:func:`dpsynth.diffusion.pretrain.pretrain`), apart from the
training code so the command line reads their defaults without importing torch."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..config import RunConfig, SamplingSettings, at_least, one_of, positive, section_settings
from ..errors import ConfigError

PREDICTIONS = ("epsilon", "v")
SAMPLER_NAMES = ("dpm-solver++", "ddim", "unipc")
CLASS_STARTS = ("shared", "spread", "matched")
NOISE_LEVELS = ("uniform", "log-normal")
TRAINABLE_GROUPS = ("all", "norms", "biases", "attention", "class_embedding", "time_embedding")
# A smoke run's UNet and sampler (a method's declared smoke): the smallest that runs every part.
SMOKE_UNET = ("model.block_channels=[8, 16]", "model.norm_groups=4", "diffusion.sample_steps=2")


@dataclass(frozen=True, kw_only=True)
class UNetSettings:
    """The ``model`` section: the UNet's channels per resolution, layers per block, attention, GroupNorm groups,
    a public model directory to start from (``dpsynth pretrain --for METHOD`` writes one), where its private
    class rows start when the public classes differ (:func:`~dpsynth.diffusion.pretrain.init_from_public`): the
    null row (shared), public class rows far apart (spread) or, for PrivImage, matched by its semantic
    histogram; and which parameter groups DP-SGD trains (the rest keep their start). Defaults: DPImageBench's
    DPDM."""

    block_channels: tuple[int, ...] = positive(default=(32, 64, 64))
    layers_per_block: int = positive(default=2)
    attention: bool = True
    norm_groups: int = positive(default=8)
    init_from: str | None = None
    class_start: str = one_of(*CLASS_STARTS, default="spread")
    trainable: tuple[str, ...] = ("all",)

    def __post_init__(self) -> None:
        unknown = [group for group in self.trainable if group not in TRAINABLE_GROUPS]
        if unknown or not self.trainable or ("all" in self.trainable and len(self.trainable) > 1):
            raise ConfigError(f"model.trainable must be [all] or a list of {', '.join(TRAINABLE_GROUPS[1:])}, got "
                              f"{list(self.trainable)}")

    @property
    def trains_all(self) -> bool:
        return self.trainable == ("all",)


@dataclass(frozen=True, kw_only=True)
class DiffusionSettings:
    """The ``diffusion`` section: the noise schedule and what the network predicts, where training draws its
    noise levels (uniform in t, or log-normal in sigma with a mean and std of ln sigma), label dropout (for
    guidance), and how the release is sampled (sampler, steps, guidance weight and where on the trajectory it
    acts)."""

    timesteps: int = positive(default=1000)
    beta_schedule: str = "linear"
    prediction: str = one_of(*PREDICTIONS, default="v")
    noise_levels: str = one_of(*NOISE_LEVELS, default="uniform")
    noise_level_mean: float = -1.2
    noise_level_std: float = positive(default=1.2)
    label_dropout: float = at_least(0, default=0.1)
    sampler: str = one_of(*SAMPLER_NAMES, default="dpm-solver++")
    sample_steps: int = positive(default=25)
    guidance: float = at_least(0, default=0.0)
    guidance_interval: tuple[float, ...] = (0.0, 1.0)

    def __post_init__(self) -> None:
        low, high = (self.guidance_interval + (-1.0, -1.0))[:2]
        if len(self.guidance_interval) != 2 or not 0 <= low <= high <= 1:
            raise ConfigError(f"diffusion.guidance_interval must be [low, high] with 0 <= low <= high <= 1 (shares "
                              f"of the noise schedule's T), got {list(self.guidance_interval)}")


@dataclass(frozen=True)
class PretrainSettings:
    """Iterations of Adam at a batch size and learning rate, how often to save; the UNet (``model.*`` keys of a
    method) and the diffusion it learns; class-conditional (label dropout for guidance) or not."""

    iterations: int = 4000
    batch_size: int = 64
    lr: float = 1e-3
    block_channels: tuple[int, ...] = (32, 64, 64)
    checkpoint_every: int = 500
    layers_per_block: int = 1
    attention: bool = True
    norm_groups: int = 8
    conditional: bool = False
    label_dropout: float = 0.1
    timesteps: int = 1000
    beta_schedule: str = "linear"
    prediction: str = "epsilon"

    def __post_init__(self) -> None:
        for name in ("iterations", "batch_size", "checkpoint_every"):
            if getattr(self, name) < 1:
                raise ConfigError(f"pretrain {name} must be >= 1, got {getattr(self, name)}")
        if not self.lr > 0:
            raise ConfigError(f"pretrain lr must be positive, got {self.lr}")

    @classmethod
    def for_method(cls, config: RunConfig, **training: Any) -> PretrainSettings:
        """Settings whose UNet and diffusion are those of a method's resolved ``config`` (its ``model`` and
        ``diffusion`` sections), class-conditional, so a run of that method can start from the model."""
        model = section_settings(UNetSettings, config, "model")
        diffusion = section_settings(DiffusionSettings, config, "diffusion")
        return cls(**training, block_channels=model.block_channels, layers_per_block=model.layers_per_block,
                   attention=model.attention, norm_groups=model.norm_groups, conditional=True,
                   label_dropout=diffusion.label_dropout, timesteps=diffusion.timesteps,
                   beta_schedule=diffusion.beta_schedule, prediction=diffusion.prediction)


def sample_steps(config: RunConfig) -> int:
    """The sampler's steps per image of a config with a ``diffusion`` section; 0 without one."""
    return section_settings(DiffusionSettings, config, "diffusion").sample_steps if "diffusion" in config else 0


def sampling_units(config: RunConfig) -> float:
    """A diffusion model's release work: images x sampling steps (x 2 under guidance); none without ``diffusion``."""
    guided = "diffusion" in config and section_settings(DiffusionSettings, config, "diffusion").guidance > 0
    return SamplingSettings.of(config).num_samples * sample_steps(config) * (2 if guided else 1)
