"""Synthesis methods, found by name without a hand-kept list.

A method is a package of this package whose ``__init__`` declares it (``DECLARATION``, a
:class:`~dpsynth.methods.declaration.Declaration` that imports no torch) and whose declared class runs it, or a
module another package names under the ``dpsynth.methods`` entry-point group that declares one the same way, or a
class registered with :func:`~dpsynth.methods.base.register` by code already imported. The command line lists the
methods and their options from the declarations; a method's class is imported when it is first looked up.
"""
from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Iterator, Mapping
from functools import cache
from importlib.metadata import entry_points
from typing import TYPE_CHECKING, Any

from ..config import RunConfig, method_name
from ..errors import ConfigError
from .declaration import Declaration, Shortcut

if TYPE_CHECKING:
    from .base import Method

ENTRY_POINTS = "dpsynth.methods"  # the entry-point group of methods other packages provide: a declaring module each

# The methods registered by code already imported, by name (base.register fills it).
REGISTERED: dict[str, type[Method]] = {}


@cache
def declarations() -> dict[str, Declaration]:
    """Each findable method's declaration by name: this package's (each sub-package's ``DECLARATION``), then the
    entry points' modules'."""
    modules = [f"{__name__}.{info.name}" for info in pkgutil.iter_modules(__path__) if info.ispkg]
    modules += [point.value for point in entry_points(group=ENTRY_POINTS)]
    found = sorted(map(_declared, modules), key=lambda declaration: declaration.name)
    return {declaration.name: declaration for declaration in found}


def _declared(module: str) -> Declaration:
    """The ``DECLARATION`` of ``module``; ConfigError naming it where it has none."""
    declaration = getattr(importlib.import_module(module), "DECLARATION", None)
    if not isinstance(declaration, Declaration):
        raise ConfigError(f"module {module} declares no method: a method's package sets DECLARATION = "
                          "Declaration(...) (dpsynth.methods.declaration)")
    return declaration


class MethodRegistry(Mapping[str, "type[Method]"]):
    """The methods by name (the declared, sorted; then any registered by imported code); looking one up imports its
    class (:attr:`Declaration.implementation`)."""

    def __getitem__(self, name: str) -> type[Method]:
        if name in REGISTERED or name not in declarations():
            return REGISTERED[name]
        declaration = declarations()[name]
        module, _, class_name = declaration.implementation.partition(":")
        found = getattr(importlib.import_module(module), class_name, None)
        if getattr(found, "declaration", None) is not declaration:
            raise ConfigError(f"{declaration.implementation}: no method class whose declaration is {name!r}'s (the "
                              "class sets declaration = its package's DECLARATION)")
        return found  # type: ignore[return-value]

    def __contains__(self, name: object) -> bool:
        return name in REGISTERED or name in declarations()

    def __iter__(self) -> Iterator[str]:
        return iter([*declarations(), *(name for name in REGISTERED if name not in declarations())])

    def __len__(self) -> int:
        return len(list(iter(self)))


METHODS = MethodRegistry()


def shortcuts() -> dict[str, Shortcut]:
    """Every findable method's command-line options for its keys (option -> key, help, metavar), from the
    declarations, without importing torch."""
    found: dict[str, Shortcut] = {}
    for declaration in [*declarations().values(), *(cls.declaration for cls in REGISTERED.values())]:
        found.update(declaration.shortcuts)
    return found


def get_method(name: str) -> type[Method]:
    """The method ``name``; ConfigError listing the known ones otherwise."""
    if name not in METHODS:
        raise ConfigError(f"unknown method {name!r}; known methods: {', '.join(sorted(METHODS))}")
    return METHODS[name]


def run_config_of(config: Mapping[str, Any]) -> RunConfig:
    """``config`` as the :class:`~dpsynth.config.RunConfig` of the method it names (itself when it is one): where a
    configuration from a file, ``resolve_config`` or ``--set`` enters the layers below the command line."""
    return get_method(method_name(config)).run_config(config)


def create_method(config: Mapping[str, Any]) -> Method:
    """The method ``config`` names, built from it (as its :class:`~dpsynth.config.RunConfig`): a run builds it once,
    after its plan, and keeps it."""
    return get_method(method_name(config))(run_config_of(config))


__all__ = ["METHODS", "REGISTERED", "Declaration", "MethodRegistry", "Shortcut", "create_method", "declarations",
           "get_method", "run_config_of", "shortcuts"]
