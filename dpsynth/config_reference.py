"""The configuration reference as Markdown tables, generated from the defaults in the code (the docs' build
inserts them; see ``scripts/mkdocs_hooks.py``)."""
from __future__ import annotations

from typing import Any

import yaml

from .config import BASE_CONFIG, flat_keys, get_value, has_key
from .errors import ConfigError
from .methods import METHODS


def _shown(value: Any) -> str:
    """A value as YAML in one line, in code style, with table pipes escaped."""
    text = yaml.safe_dump(value, default_flow_style=True, width=1000).strip().removesuffix("...").strip()
    return f"`{text}`".replace("|", "\\|")


def _preset_value(presets: dict[str, Any], preset: str, key: str) -> str:
    try:
        return _shown(get_value(presets[preset], key))
    except (KeyError, TypeError):
        return ""


def config_reference() -> str:
    """Every table: the shared keys, then each method's, under a heading each."""
    parts = ["## Shared by every method", config_table("shared")]
    for name in METHODS:
        parts += [f"## {name}", config_table(name)]
    return "\n\n".join(parts)


def config_table(name: str) -> str:
    """``reference``: :func:`config_reference`; ``shared``: every shared key and its default; a method's name:
    every key of its sections and every shared key its presets change, with the default and each preset's value
    where the preset sets one."""
    if name == "reference":
        return config_reference()
    if name == "shared":
        rows = [f"| `{key}` | {_shown(get_value(BASE_CONFIG, key))} |" for key in flat_keys(BASE_CONFIG)]
        return "\n".join(["| key | default |", "| --- | --- |", *rows])
    if name not in METHODS:
        raise ConfigError(f"config table: unknown method {name!r}; known: reference, shared, "
                          f"{', '.join(sorted(METHODS))}")
    method = METHODS[name]
    presets = list(method.presets)
    defaults = method.defaults()
    keys = flat_keys(defaults)
    keys += [key for preset in presets for key in flat_keys(method.presets[preset])
             if key not in keys and key.split(".")[0] in BASE_CONFIG]
    rows = []
    for key in dict.fromkeys(keys):
        default = get_value(defaults if has_key(defaults, key) else BASE_CONFIG, key)
        cells = [_preset_value(method.presets, preset, key) for preset in presets]
        rows.append(f"| `{key}` | {_shown(default)} | " + " | ".join(cells) + " |")
    header = "| key | default | " + " | ".join(f"`{preset}` preset" + (" (the default)"
                                                                    if preset == method.default_preset else "")
                                            for preset in presets) + " |"
    return "\n".join([header, "| --- " * (2 + len(presets)) + "|", *rows])
