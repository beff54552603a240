"""The interface every synthesis method implements, and the registry that finds them by name."""
from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, ClassVar

from ..config import Config
from ..data import DatasetInfo
from ..errors import ConfigError
from ..privacy import PlannedStage


class Method(ABC):
    """A DP image-synthesis method: its config sections, presets and privacy stages.

    Subclasses set ``name``, ``description``, ``sections`` (their config sections with defaults) and
    ``presets`` (nested overrides of any config key), and register with :func:`register`.
    """

    name: ClassVar[str]
    description: ClassVar[str]
    sections: ClassVar[dict[str, dict[str, Any]]]
    presets: ClassVar[dict[str, dict[str, Any]]]
    default_preset: ClassVar[str] = "cpu"

    def __init__(self, config: Config) -> None:
        self.config = config

    @classmethod
    def preset(cls, name: str | None) -> tuple[str, dict[str, Any]]:
        """The preset called ``name`` (the default one for None); ConfigError listing the known ones."""
        name = name or cls.default_preset
        if name not in cls.presets:
            raise ConfigError(f"method {cls.name!r} has no preset {name!r}; presets: {', '.join(cls.presets)}")
        return name, cls.presets[name]

    @abstractmethod
    def privacy_stages(self, info: DatasetInfo) -> list[PlannedStage]:
        """The mechanisms a run on ``info``'s training split will apply, in order; one may be calibrated."""


METHODS: dict[str, type[Method]] = {}


def register(cls: type[Method]) -> type[Method]:
    """Class decorator adding a method to the registry under its ``name``."""
    METHODS[cls.name] = cls
    return cls


def get_method(name: str) -> type[Method]:
    """The registered method ``name``; ConfigError listing the known ones otherwise."""
    if name not in METHODS:
        raise ConfigError(f"unknown method {name!r}; known methods: {', '.join(sorted(METHODS))}")
    return METHODS[name]
