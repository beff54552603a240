"""Synthesis methods: one module each, registered by name."""
from . import (  # noqa: F401  (registers the methods)
    dp_feta,
    dp_imgsyn,
    dp_merf,
    dp_sad,
    dpdm,
    feta_pro,
    pdp_diffusion,
    pe,
    privimage,
)
from .base import METHODS, Method, get_method, register

__all__ = ["METHODS", "Method", "get_method", "register"]
