"""Class-conditional UNet on diffusers' UNet2DModel, with a null class for classifier-free guidance."""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import torch

from ..errors import ConfigError

if TYPE_CHECKING:  # diffusers is imported when a UNet is built: a run without one starts seconds sooner
    from diffusers import UNet2DModel


class SiLU(torch.nn.Module):
    """``x * sigmoid(x)``: the values of ``nn.SiLU``, but a per-example backward under vmap that is 1.2-1.8x
    faster on CPU (the batched ``silu_backward`` is slow; ``benchmarks/dpsgd_throughput.py``)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.sigmoid(x)


def use_vmap_friendly_silu(model: torch.nn.Module) -> None:
    """Replace every ``nn.SiLU`` in ``model`` with :class:`SiLU` (no parameters change)."""
    for module in list(model.modules()):
        for name, child in module.named_children():
            if type(child) is torch.nn.SiLU:
                setattr(module, name, SiLU())


# The parameter groups ``model.trainable`` may name, each a test on a parameter's name in the diffusers UNet.
PARAMETER_GROUPS: dict[str, Callable[[str], bool]] = {
    "all": lambda name: True,
    "norms": lambda name: "norm" in name.rsplit(".", 2)[-2],
    "biases": lambda name: name.endswith(".bias"),
    "attention": lambda name: ".attentions." in name,
    "class_embedding": lambda name: name.startswith("class_embedding."),
    "time_embedding": lambda name: name.startswith("time_embedding.") or ".time_emb_proj." in name,
}


def train_only(model: torch.nn.Module, groups: Sequence[str]) -> tuple[int, int]:
    """Freeze every parameter of ``model`` outside the :data:`PARAMETER_GROUPS` named in ``groups``; returns the
    numbers of parameters left trainable and in all."""
    tests = [PARAMETER_GROUPS[group] for group in groups]
    trained = total = 0
    for name, param in model.named_parameters():
        param.requires_grad_(any(test(name) for test in tests))
        trained += param.numel() if param.requires_grad else 0
        total += param.numel()
    return trained, total


def build_unet(in_channels: int, resolution: int, num_classes: int | None, block_channels: Sequence[int],
               layers_per_block: int = 1, attention: bool = True, norm_groups: int = 8) -> UNet2DModel:
    """A UNet whose last (lowest-resolution) level has self-attention when ``attention``.

    Label ``num_classes`` is the null class (unconditional) used by classifier-free guidance; ``num_classes``
    None builds an unconditional UNet (no class embedding, as public foundation models are). The classic
    ``AttnProcessor`` is set because the default SDPA one falls back to a per-example loop under vmap, and
    :class:`SiLU` replaces ``nn.SiLU`` for the same reason (a slow batched backward).
    """
    levels = len(block_channels)
    if resolution % 2 ** (levels - 1):
        raise ConfigError(f"model.block_channels: {levels} levels need a resolution divisible by "
                          f"{2 ** (levels - 1)}, got {resolution}")
    if any(c % norm_groups for c in block_channels):
        raise ConfigError(f"model.block_channels {list(block_channels)} must be multiples of model.norm_groups "
                          f"({norm_groups})")
    down = ["DownBlock2D"] * levels
    up = ["UpBlock2D"] * levels
    if attention:
        down[-1], up[0] = "AttnDownBlock2D", "AttnUpBlock2D"
    from diffusers import UNet2DModel
    from diffusers.models.attention_processor import Attention, AttnProcessor

    model = UNet2DModel(
        sample_size=resolution, in_channels=in_channels, out_channels=in_channels,
        block_out_channels=tuple(block_channels), down_block_types=tuple(down), up_block_types=tuple(up),
        layers_per_block=layers_per_block, norm_num_groups=norm_groups,
        num_class_embeds=None if num_classes is None else num_classes + 1,
        attention_head_dim=block_channels[-1],
    )
    for module in model.modules():
        if isinstance(module, Attention):
            module.set_processor(AttnProcessor())
    use_vmap_friendly_silu(model)
    return model
