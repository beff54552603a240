"""Diffusion: DDPM training losses (epsilon or v), samplers with classifier-free guidance, the sampling model."""
from .ddpm import Diffusion

__all__ = ["Diffusion"]
