"""Synthesis methods: one module each, registered by name."""
from . import dp_feta, dp_imgsyn, dp_sad, dpdm, feta_pro, pe  # noqa: F401  (registers the methods)
from .base import METHODS, Method, get_method, register

__all__ = ["METHODS", "Method", "get_method", "register"]
