"""The settings of pre-training on public data (:func:`dpsynth.diffusion.pretrain.pretrain`), apart from the
training code so the command line reads their defaults without importing torch."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..errors import ConfigError


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
    def for_method(cls, config: dict[str, Any], **training: Any) -> PretrainSettings:
        """Settings whose UNet and diffusion are those of a method's resolved ``config`` (its ``model`` and
        ``diffusion`` sections), class-conditional, so a run of that method can start from the model."""
        model, diffusion = config["model"], config["diffusion"]
        return cls(**training, block_channels=tuple(model["block_channels"]),
                   layers_per_block=model["layers_per_block"], attention=model["attention"],
                   norm_groups=model["norm_groups"], conditional=True, label_dropout=diffusion["label_dropout"],
                   timesteps=diffusion["timesteps"], beta_schedule=diffusion["beta_schedule"],
                   prediction=diffusion["prediction"])
