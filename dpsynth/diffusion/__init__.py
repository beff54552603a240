"""Diffusion: DDPM epsilon-prediction training loss and a DDIM sampler with classifier-free guidance."""
from .ddpm import Diffusion

__all__ = ["Diffusion"]
