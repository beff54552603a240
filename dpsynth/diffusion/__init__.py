"""Diffusion: DDPM training losses (epsilon or v), samplers with classifier-free guidance, the sampling model."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .ddpm import Diffusion

__all__ = ["Diffusion"]


def __getattr__(name: str) -> Any:
    """``Diffusion`` on first use: it imports torch, which the command line's parser does without."""
    if name == "Diffusion":
        from .ddpm import Diffusion

        return Diffusion
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
