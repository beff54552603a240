"""Synthesis methods: one module each, registered by name."""
from . import dpdm  # noqa: F401  (registers the method)
from .base import METHODS, Method, get_method, register

__all__ = ["METHODS", "Method", "get_method", "register"]
