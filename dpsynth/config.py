"""Run configuration: shared defaults, a method's sections and presets, then ``--set key=value`` overrides."""
from __future__ import annotations

import copy
import difflib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import MISSING, field, fields
from types import UnionType
from typing import Any, TypeVar, Union, get_args, get_origin, get_type_hints

import yaml

from .errors import ConfigError

Config = dict[str, Any]

BASE_CONFIG: Config = {
    "dataset": {
        "name": "fashion-mnist",
        "data_dir": None,
        "val_size": None,
        "test_size": None,
        "split_seed": 0,
        "resolution": "auto",  # a folder's follow its images; generated sets (glyphs, photo-patches) are 32 x 32 RGB
        "channels": "auto",
        "num_classes": None,
        "num_images": None,
    },
    # max_images_per_group: with groups (one person's images), the most of a group's images a DP-SGD step reads
    # (the group's mean gradient is clipped, so the bound holds for any number; this caps the work).
    # noisy_dataset_size and noisy_shape ([channels, side]) are written by a run, never by the user (RUN_WRITTEN).
    "privacy": {"epsilon": 10.0, "delta": None, "accountant": "pld", "dataset_size": "auto",
                "noisy_dataset_size": None, "noisy_shape": None, "max_images_per_group": 16},
    # --preset auto: the time budget of the whole run; what the user set (kept), the base preset, the probe's
    # measurements, the decisions and the expected seconds of each phase (written by dpsynth.autoplan).
    "plan": {"time_budget": "30m", "user_keys": [], "base": None, "probe": None, "decisions": None,
             "expected_seconds": None},
    "run": {"out_dir": "runs", "seed": None, "device": "auto", "threads": "auto", "allow_non_private": False},
    "sampling": {"num_samples": 60000, "batch_size": 500, "bf16": "auto", "compile": "auto"},
    "evaluation": {
        "enabled": True,
        "protocol": "dpsynth",
        "num_synthetic": 2000,
        "num_real": 2000,
        "real_split": "train",
        "fast_inception": "auto",
        "inception_batch_size": 50,
        "kid_subsets": 100,
        "kid_subset_size": 1000,
        "pr_k": 4,
        "classifiers": ["cnn", "resnet"],
        "classifier_epochs": 10,
        "soft_label_epochs": None,
        "distillation_temperature": None,
        "classifier_seeds": 3,
        "classifier_batch_size": 128,
        "classifier_lr": 3e-3,
        "classifier_schedule": "cosine",
        "classifier_ema": 0.0,
        "classifier_augment": False,
        "selection_epsilon": 1.0,
        "nearest_neighbours": 10,
        "cache_dir": None,
        "seed": 0,
    },
}


# Keys only a run writes: what its DP mechanisms drew, recorded in its ledger. A value set by hand would be published
# under a DP label without the noise behind it, so --set, presets and a fresh run refuse them.
RUN_WRITTEN = {
    "privacy.noisy_dataset_size": "the noisy count of the training set's size; to publish the size without "
                                  "noise, declare it: privacy.dataset_size=N",
    "privacy.noisy_shape": "the shape a DP vote of a folder's images decided; to choose it without noise, declare "
                           "it: dataset.resolution=R and dataset.channels=C",
}


def check_not_run_written(keys: Iterable[str], source: str) -> None:
    """ConfigError naming ``source`` when ``keys`` hold a key only a run writes (:data:`RUN_WRITTEN`)."""
    for key in keys:
        if key in RUN_WRITTEN:
            raise ConfigError(f"{source} {key}: only a run writes this key ({RUN_WRITTEN[key]})")


def flat_keys(config: Mapping[str, Any], prefix: str = "") -> list[str]:
    """Dotted names of every leaf, e.g. ``privacy.epsilon``."""
    keys = []
    for key, value in config.items():
        name = f"{prefix}{key}"
        keys += flat_keys(value, f"{name}.") if isinstance(value, Mapping) else [name]
    return keys


def _unknown_key(key: str, config: Mapping[str, Any], source: str) -> ConfigError:
    known = flat_keys(config)
    close = difflib.get_close_matches(key, known, n=3)
    hint = f"did you mean {', '.join(close)}?" if close else f"known keys: {', '.join(known)}"
    return ConfigError(f"{source}: unknown config key {key!r}; {hint}")


def _check_type(key: str, old: Any, new: Any, source: str) -> Any:
    if old is None or new is None or old == "auto":  # an "auto" key takes its own values, checked where used
        return new
    if isinstance(old, bool) or isinstance(new, bool):
        ok = isinstance(old, bool) and isinstance(new, bool)
    elif isinstance(old, float):
        ok = isinstance(new, (int, float))
        new = float(new) if ok else new
    else:
        ok = isinstance(new, type(old))
    if not ok:
        raise ConfigError(f"{source}: {key} expects a value of type {type(old).__name__}, got {new!r}")
    return new


def get_value(config: Mapping[str, Any], key: str) -> Any:
    """The value at dotted ``key`` (KeyError or TypeError where the path does not exist)."""
    node: Any = config
    for part in key.split("."):
        node = node[part]
    return node


def set_value(config: Config, key: str, value: Any, source: str = "--set") -> None:
    """Set dotted ``key`` to ``value``; the key must exist and the type must match its default."""
    *parents, leaf = key.split(".")
    node: Any = config
    for part in parents:
        if not isinstance(node, dict) or not isinstance(node.get(part), dict):
            raise _unknown_key(key, config, source)
        node = node[part]
    if leaf not in node or isinstance(node[leaf], dict):
        raise _unknown_key(key, config, source)
    node[leaf] = _check_type(key, node[leaf], value, source)


def merge(config: Config, update: Mapping[str, Any], source: str) -> None:
    """Apply a nested ``update`` (a preset) whose keys must all exist in ``config``."""
    for key in flat_keys(update):
        set_value(config, key, get_value(update, key), source)


def parse_overrides(items: Iterable[str]) -> list[tuple[str, Any]]:
    """``key=value`` strings to (key, value), values read as YAML scalars (``1e-3``, ``true``, ``null``)."""
    pairs = []
    for item in items:
        key, sep, text = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--set expects key=value, got {item!r}")
        try:
            value = yaml.safe_load(text) if text.strip() else None
        except yaml.YAMLError as exc:
            raise ConfigError(f"--set {item!r}: cannot read the value ({exc})") from None
        pairs.append((key.strip(), _number_or_self(value)))
    return pairs


def _number_or_self(value: Any) -> Any:
    """YAML 1.1 reads ``1e-3`` as a string; read it as the number it is."""
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            pass
    return value


def build_config(
    method_sections: Mapping[str, Any],
    preset: Mapping[str, Any],
    preset_name: str,
    overrides: Iterable[tuple[str, Any]] = (),
) -> Config:
    """Base config plus the method's sections, then its preset, then the overrides, in that order."""
    config = copy.deepcopy(BASE_CONFIG)
    for section, values in method_sections.items():
        if section in config:
            raise ConfigError(f"method section {section!r} clashes with a shared section")
        config[section] = copy.deepcopy(dict(values))
    check_not_run_written(flat_keys(preset), f"preset {preset_name!r}:")
    merge(config, preset, f"preset {preset_name!r}")
    for key, value in overrides:
        check_not_run_written([key], "--set")
        set_value(config, key, value)
    return config


def dump_config(config: Config) -> str:
    """The config as YAML, keys in their defined order."""
    return yaml.safe_dump(config, sort_keys=False)


def load_config(text: str, source: str) -> Config:
    """Read a YAML config written by :func:`dump_config`."""
    try:
        config = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{source}: not valid YAML ({exc})") from None
    if not isinstance(config, dict):
        raise ConfigError(f"{source}: expected a mapping of config sections")
    return config


def choice_setting(config: Config, section: str, key: str, choices: Sequence[str]) -> str:
    """``config[section][key]``; ConfigError naming the key and the choices unless it is one of ``choices``."""
    value = config[section][key]
    if value not in choices:
        raise ConfigError(f"{section}.{key} must be one of {', '.join(choices)}, got {value!r}")
    return value


S = TypeVar("S")


def positive(**kwargs: Any) -> Any:
    """A settings field (:func:`section_settings`) that must be a positive number."""
    return field(metadata={"low": 0, "strict": True}, **kwargs)


def at_least(low: float, **kwargs: Any) -> Any:
    """A settings field (:func:`section_settings`) that must be a number of at least ``low``."""
    return field(metadata={"low": low}, **kwargs)


def one_of(*choices: str, **kwargs: Any) -> Any:
    """A settings field (:func:`section_settings`) that must be one of ``choices``."""
    return field(metadata={"choices": choices}, **kwargs)


def section_settings(kind: type[S], config: Config, section: str) -> S:
    """Config section ``section`` as the frozen dataclass ``kind``, whose fields name the keys it reads.

    Every value is checked against its field's type (``int``: a whole number; ``float``: any number; ``bool``;
    ``str``; unions such as ``float | None``; ``tuple[X, ...]``: a list of X) and its :func:`positive`,
    :func:`at_least` or :func:`one_of` rule; a key the section lacks takes the field's default. ConfigError
    naming ``section.key`` and what it must be otherwise.
    """
    values, hints = config.get(section) or {}, get_type_hints(kind)
    settings = {}
    for spec in fields(kind):  # type: ignore[arg-type]
        key = f"{section}.{spec.name}"
        if spec.name in values:
            settings[spec.name] = _checked(key, values[spec.name], hints[spec.name], spec.metadata)
        elif spec.default is MISSING and spec.default_factory is MISSING:
            raise ConfigError(f"{key} is missing from the config")
    return kind(**settings)


_KINDS = {bool: "true or false", int: "a whole number", float: "a number", str: "a string"}


def _checked(key: str, value: Any, kind: Any, rules: Mapping[str, Any]) -> Any:
    """``value`` as type ``kind`` (lists become tuples, whole numbers floats where a float is expected);
    ConfigError naming ``key`` when it is not one or breaks ``rules``."""
    kinds = [arg for arg in get_args(kind) if arg is not type(None)] if get_origin(kind) in (Union, UnionType) \
        else [kind]
    if value is None and len(kinds) < len(get_args(kind)):
        return None
    for option in kinds:
        if get_origin(option) is tuple and isinstance(value, (list, tuple)):
            return tuple(_checked(f"{key}[{i}]", item, get_args(option)[0], rules) for i, item in enumerate(value))
        if option is bool and isinstance(value, bool) or option is str and isinstance(value, str):
            return _within(key, value, rules)
        if option in (int, float) and isinstance(value, (int, float)) and not isinstance(value, bool) \
                and (option is float or isinstance(value, int)):
            return _within(key, option(value), rules, _KINDS[option])
    expected = " or ".join("a list" if get_origin(option) is tuple else _KINDS[option] for option in kinds)
    raise ConfigError(f"{key} must be {expected}{' or null' if len(kinds) < len(get_args(kind)) else ''}, "
                      f"got {value!r}")


def _within(key: str, value: Any, rules: Mapping[str, Any], kind: str = "") -> Any:
    """``value``; ConfigError naming ``key`` when it lies below the rule's bound or outside its choices."""
    if "choices" in rules and value not in rules["choices"]:
        raise ConfigError(f"{key} must be one of {', '.join(map(str, rules['choices']))}, got {value!r}")
    low = rules.get("low")
    if low is not None and (value <= low if rules.get("strict") else value < low):
        bound = f"above {low}" if rules.get("strict") else f"of at least {low}"
        raise ConfigError(f"{key} must be {kind} {bound}, got {value!r}")
    return value


def preset_with(base: Mapping[str, Mapping[str, Any]], extra: Mapping[str, Mapping[str, Any]]) -> Config:
    """A preset built on ``base``: a copy with each section of ``extra`` updated into it."""
    merged = {section: dict(copy.deepcopy(values)) for section, values in base.items()}
    for section, values in extra.items():
        merged.setdefault(section, {}).update(copy.deepcopy(values))
    return merged
