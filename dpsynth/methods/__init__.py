"""Synthesis methods, found by name without a hand-kept list.

A method is one module (or package) of this package named after it (``dp-feta`` in ``dp_feta``), or a module
another package names under the ``dpsynth.methods`` entry-point group, or a class registered with
:func:`~dpsynth.methods.base.register` by code already imported. Its module is imported when the method is first
looked up, so the command line lists the methods and parses its arguments without importing torch.
"""
from __future__ import annotations

import ast
import importlib
import importlib.util
import pkgutil
from collections.abc import Iterator, Mapping
from functools import cache
from importlib.metadata import entry_points
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..config import RunConfig, method_name
from ..errors import ConfigError

if TYPE_CHECKING:
    from .base import Method

# The modules here that are no method: the interface every method implements and the templates some derive from.
INTERFACES = ("base", "templates")
ENTRY_POINTS = "dpsynth.methods"  # the entry-point group of methods other packages provide: name = module

# The methods registered so far, by name (filled by base.register as their modules are imported).
REGISTERED: dict[str, type[Method]] = {}


@cache
def _modules() -> dict[str, str]:
    """Each findable method's name and the module that defines it: this package's, then the entry points'."""
    found = {info.name.replace("_", "-"): f"{__name__}.{info.name}" for info in pkgutil.iter_modules(__path__)
             if info.name not in INTERFACES}
    found.update({point.name: point.value for point in entry_points(group=ENTRY_POINTS)})
    return dict(sorted(found.items()))


class MethodRegistry(Mapping[str, "type[Method]"]):
    """The methods by name (sorted; then any registered from elsewhere); looking one up imports its module."""

    def __getitem__(self, name: str) -> type[Method]:
        if name not in REGISTERED and name in _modules():
            importlib.import_module(_modules()[name])
            if name not in REGISTERED:
                raise ConfigError(f"module {_modules()[name]} registers no method named {name!r} (a method's class "
                                  "carries @register and its name)")
        return REGISTERED[name]

    def __iter__(self) -> Iterator[str]:
        return iter([*_modules(), *(name for name in REGISTERED if name not in _modules())])

    def __len__(self) -> int:
        return len(list(iter(self)))


METHODS = MethodRegistry()


# A command-line option that stands for a config key: the key, its help and its metavar (None: the option's name).
Shortcut = tuple[str, str, "str | None"]


def shortcuts() -> dict[str, Shortcut]:
    """Every findable method's ``Method.shortcuts`` (option -> key, help, metavar), read from the source of its
    module and of the classes it derives from in this package, so the command line lists them without importing
    torch; a method registered by imported code adds its class's own."""
    classes = {node.name: node for path in _sources() for node in ast.parse(path.read_text()).body
               if isinstance(node, ast.ClassDef)}
    found: dict[str, Shortcut] = {}
    for node in classes.values():
        if any(isinstance(d, ast.Name) and d.id == "register" for d in node.decorator_list):
            found.update(_declared(node, classes))
    for cls in REGISTERED.values():
        found.update(cls.shortcuts)
    return found


def _sources() -> list[Path]:
    """The source files of this package's methods and their interface, and of the entry points' modules."""
    here = Path(__file__).parent
    paths = [*here.glob("*.py"), *here.glob("*/__init__.py")]
    for point in entry_points(group=ENTRY_POINTS):
        spec = importlib.util.find_spec(point.value)
        if spec is not None and spec.origin:
            paths.append(Path(spec.origin))
    return paths


def _declared(node: ast.ClassDef, classes: dict[str, ast.ClassDef]) -> dict[str, Shortcut]:
    """The ``shortcuts`` class attribute of ``node``, else of the first of its bases that declares one."""
    for statement in node.body:
        targets = [statement.target] if isinstance(statement, ast.AnnAssign) else (
            statement.targets if isinstance(statement, ast.Assign) else [])
        value = getattr(statement, "value", None)
        if value is not None and any(isinstance(t, ast.Name) and t.id == "shortcuts" for t in targets):
            return dict(ast.literal_eval(value))
    for base in node.bases:
        if isinstance(base, ast.Name) and base.id in classes:
            return _declared(classes[base.id], classes)
    return {}


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


__all__ = ["METHODS", "REGISTERED", "MethodRegistry", "Shortcut", "create_method", "get_method", "run_config_of",
           "shortcuts"]
