"""Synthesis methods: one module each, found by name. A method's module is imported when the method is first
looked up, so the command line parses its arguments without importing torch."""
from __future__ import annotations

import importlib
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING

from ..errors import ConfigError

if TYPE_CHECKING:
    from .base import Method

# Each method's name and the module of this package that defines and registers it.
MODULES = {"dpdm": "dpdm", "dp-feta": "dp_feta", "dp-imgsyn": "dp_imgsyn", "feta-pro": "feta_pro",
           "dp-merf": "dp_merf", "dp-sad": "dp_sad", "pdp-diffusion": "pdp_diffusion", "pe": "pe",
           "privimage": "privimage"}


class MethodRegistry(Mapping[str, "type[Method]"]):
    """The methods by name (in :data:`MODULES`' order); looking one up imports its module."""

    def __getitem__(self, name: str) -> type[Method]:
        if name not in MODULES:
            raise KeyError(name)
        importlib.import_module(f"{__name__}.{MODULES[name]}")
        from .base import REGISTERED

        return REGISTERED[name]

    def __iter__(self) -> Iterator[str]:
        return iter(MODULES)

    def __len__(self) -> int:
        return len(MODULES)


METHODS = MethodRegistry()


def get_method(name: str) -> type[Method]:
    """The method ``name``; ConfigError listing the known ones otherwise."""
    if name not in MODULES:
        raise ConfigError(f"unknown method {name!r}; known methods: {', '.join(sorted(MODULES))}")
    return METHODS[name]


__all__ = ["METHODS", "MODULES", "MethodRegistry", "get_method"]
