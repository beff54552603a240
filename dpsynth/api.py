"""The Python API: resolve a method's config, load its dataset, plan its privacy budget."""
from __future__ import annotations

import warnings
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch

from .config import Config, build_config, choice_setting, flat_keys, parse_overrides
from .data import Dataset, DatasetInfo, get_source, load_dataset
from .errors import ConfigError, DpsynthError, PrivacyWarning
from .hardware import AUTO, check_threads, hardware_choices
from .methods import get_method
from .privacy import (
    ACCOUNTANTS,
    Accountant,
    Event,
    budget_report,
    default_delta,
    non_private_stages,
    plan_budget,
)
from .privacy.accountant import check_delta, check_epsilon


def resolve_config(
    method: str,
    *,
    dataset: str | None = None,
    epsilon: float | None = None,
    preset: str | None = None,
    data_dir: str | None = None,
    overrides: Iterable[str] = (),
) -> Config:
    """The fully resolved config of ``method``: defaults, preset, then the given values and ``key=value``s."""
    method_cls = get_method(method)
    preset_name, preset_values = method_cls.preset(preset)
    direct = [("dataset.name", dataset), ("dataset.data_dir", data_dir), ("privacy.epsilon", epsilon)]
    pairs = [(key, value) for key, value in direct if value is not None] + parse_overrides(overrides)
    config = {"method": method, "preset": preset_name,
              **build_config(method_cls.sections, preset_values, preset_name, pairs)}
    validate_config(config)
    return config


def validate_config(config: Config) -> None:
    """ConfigError / PrivacyError for values no run can use."""
    privacy = config["privacy"]
    if isinstance(privacy["epsilon"], bool) or not isinstance(privacy["epsilon"], (int, float)):
        raise ConfigError(f"privacy.epsilon must be a number, got {privacy['epsilon']!r}")
    check_epsilon(privacy["epsilon"])
    if privacy["delta"] is not None:
        check_delta(privacy["delta"])
    choice_setting(config, "privacy", "accountant", ACCOUNTANTS)
    get_source(config["dataset"]["name"])
    hardware_choices(config, torch.device("cpu"))  # ConfigError for a bf16 setting other than auto / true / false
    check_threads(config["run"].get("threads", AUTO))


# Keys whose default (None: off) keeps the behaviour of runs configured before they existed.
KEYS_ADDED_LATER = ("dataset.num_images", "model.init_from")


def check_stored_config(config: Config, source: str) -> None:
    """ConfigError naming ``source`` unless ``config`` (a run's config.yaml) names a known method and preset and
    holds every key of their defaults with usable values (``evaluation.*`` and :data:`KEYS_ADDED_LATER` excepted:
    runs made before such a key existed are read with its default)."""
    try:
        defaults = resolve_config(str(config.get("method")), preset=config.get("preset"))
        stored = set(flat_keys(config))
        missing = [key for key in flat_keys(defaults) if key not in stored and not key.startswith("evaluation.")
                   and key not in KEYS_ADDED_LATER]
        if missing:
            raise ConfigError(f"missing {', '.join(missing[:3])}{' and more' if len(missing) > 3 else ''}: "
                              "not a config dpsynth wrote for this method")
        validate_config(config)
    except DpsynthError as exc:
        raise ConfigError(f"{source}: {exc}") from None


def dataset_from_config(config: Config) -> Dataset:
    """Load and split the dataset that ``config['dataset']`` describes."""
    settings = config["dataset"]
    return load_dataset(
        settings["name"], settings["data_dir"], val_size=settings["val_size"], test_size=settings["test_size"],
        split_seed=settings["split_seed"], resolution=settings["resolution"], channels=settings["channels"],
        num_classes=settings.get("num_classes"), num_images=settings.get("num_images"),
    )


def resolve_delta(config: Config, num_train: int) -> float:
    """privacy.delta, or 1 / (N ln N) when unset; warns when delta >= 1 / N."""
    delta = config["privacy"]["delta"]
    delta = default_delta(num_train) if delta is None else float(delta)
    if delta >= 1.0 / num_train:
        warnings.warn(f"delta = {delta:.3g} is not below 1/N = {1.0 / num_train:.3g} (N = {num_train}): "
                      "a mechanism could then release a whole record with probability delta",
                      PrivacyWarning, stacklevel=2)
    return delta


@dataclass(frozen=True)
class BudgetPlan:
    """A run's accountant, delta, target epsilon and each stage's events (calibrated noise filled in)."""

    accountant: Accountant
    delta: float
    target: float
    stages: dict[str, list[Event]]


def plan_budget_for(config: Config, info: DatasetInfo) -> BudgetPlan:
    """Calibrate the method's stages so the whole run on ``info``'s training split meets the target."""
    method = get_method(config["method"])(config)
    delta = resolve_delta(config, info.num_train)
    accountant = Accountant(config["privacy"]["accountant"])
    target = float(config["privacy"]["epsilon"])
    stages = plan_budget(method.privacy_stages(info), target, delta, accountant)
    check_non_private(config, stages)
    return BudgetPlan(accountant, delta, target, stages)


def check_non_private(config: Config, stages: dict[str, list[Event]]) -> None:
    """ConfigError for stages that use the data without noise unless ``run.allow_non_private``; else a warning."""
    unprotected = non_private_stages(stages)
    if not unprotected:
        return
    what = (f"stage(s) {', '.join(unprotected)} of {config['method']} use the private data without noise, so "
            "the release has NO differential-privacy guarantee and no epsilon")
    if not config["run"]["allow_non_private"]:
        raise ConfigError(f"{what}; pass --allow-non-private (run.allow_non_private=true) to run it anyway")
    warnings.warn(what, PrivacyWarning, stacklevel=2)


def plan_privacy(config: Config, info: DatasetInfo) -> dict[str, Any]:
    """The run's privacy plan: each stage's noise (one calibrated) and share of the target epsilon."""
    plan = plan_budget_for(config, info)
    report = budget_report(plan.stages, plan.accountant, plan.delta)
    return {"target_epsilon": plan.target, "dataset_size": info.num_train, **report}
