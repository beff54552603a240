"""The Python API's façade: resolve a method's config, load its dataset, preview what a run would spend, read a
release. How a run is planned is :mod:`dpsynth.planning`'s."""
from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import TensorDataset

from .autoplan.plan import auto_preset
from .autoplan.recipes import Recommendation
from .autoplan.regime import Assessment
from .autoplan.rules import AUTO_PRESET, parse_duration
from .config import (
    RECORDS,
    SCHEMA,
    Config,
    DatasetSettings,
    PlanSettings,
    PrivacySettings,
    ReleaseSettings,
    RunConfig,
    RunSettings,
    build_config,
    check_known_keys,
    method_name,
    parse_overrides,
    preset_name,
    schema_of,
    with_defaults,
)
from .data import Dataset, DatasetInfo, get_source, load_dataset
from .diffusion.settings import sample_steps
from .errors import ConfigError, DpsynthError
from .generators import Generator, read_generator
from .hardware import check_threads, hardware_choices
from .methods import create_method, get_method, run_config_of
from .planning import (
    BudgetPlan,
    method_budget,
    planned_config,
    recommended_recipe,
    training_regime,
    with_public_size,
)
from .privacy import budget_report
from .privacy.accountant import check_delta, check_epsilon
from .privacy.dataset_facts import SHAPE
from .runs import MODEL_CARD, RELEASE
from .utils.device import pick_device


def resolve_config(
    method: str,
    *,
    dataset: str | None = None,
    epsilon: float | None = None,
    preset: str | None = None,
    data_dir: str | None = None,
    overrides: Iterable[str] = (),
    values: Iterable[tuple[str, Any]] = (),
) -> Config:
    """The fully resolved config of ``method``: defaults, preset, then the given values, the ``key=value`` strings
    of ``overrides`` and the (key, value) pairs of ``values``."""
    method_cls = get_method(method)
    direct = [("dataset.name", dataset), ("dataset.data_dir", data_dir), ("privacy.epsilon", epsilon)]
    pairs = [(key, value) for key, value in direct if value is not None] + parse_overrides(overrides) + list(values)
    device = dict(pairs).get("run.device", "auto")
    chosen = preset or method_cls.default_preset
    preset_values = (auto_preset(method_cls, pick_device(device) if isinstance(device, str) else torch.device("cpu"))
                     if chosen == AUTO_PRESET else method_cls.fixed_preset(chosen))
    pairs.append(("plan.user_keys", sorted({key for key, _ in pairs})))
    config = {"schema": SCHEMA, "method": method, "preset": chosen,
              **build_config(method_cls.sections, preset_values, chosen, pairs)}
    validate_config(config)
    return config


def validate_config(config: Mapping[str, Any]) -> None:
    """ConfigError / PrivacyError for values no run can use: the schema, the method, a key nothing reads, every
    key's type and rule (each section read through its settings class, the shared ones and the method's), then what
    only the layers above the config know."""
    if schema_of(config) != SCHEMA:
        raise ConfigError(f"schema must be {SCHEMA} (a config resolve_config made, or load_config read: it migrates "
                          f"older files), got {schema_of(config)!r}")
    method = get_method(method_name(config))
    check_known_keys(config, method.section_kinds(), "")
    typed = method.run_config(config)
    for section in method.section_kinds():
        typed.section(section)  # every key's type and rule, each section read once
    for record in RECORDS.values():  # a run's records of what it drew and what its plan found, likewise
        typed.read(record, record.section)
    privacy, run = PrivacySettings.of(config), RunSettings.of(config)
    if privacy.epsilon == math.inf and not run.allow_non_private:
        raise ConfigError("privacy.epsilon inf trains without noise, so the release has NO differential-privacy "
                          "guarantee; pass --allow-non-private (run.allow_non_private=true) to run it anyway")
    if privacy.epsilon != math.inf:
        check_epsilon(privacy.epsilon)
    if privacy.delta is not None:
        check_delta(privacy.delta)
    parse_duration(PlanSettings.of(config).time_budget)
    if run.time_limit is not None:
        parse_duration(run.time_limit, "run.time_limit")
    get_source(DatasetSettings.of(config).name)
    hardware_choices(typed, torch.device("cpu"), sample_steps(typed))  # ConfigError for a bf16 setting not auto,
    # true or false
    check_threads(run.threads)
    refusal = method.no_generator
    if ReleaseSettings.of(config).model and refusal:
        raise ConfigError(f"release.model: {method_name(config)} {refusal}")


def stored_config(config: Config, source: str) -> Config:
    """``config`` (a run's config.yaml, as :func:`~dpsynth.config.migrate` made it) with every key of its method's
    sections that it lacks at the key's default (keys added since it was written), in place; ConfigError naming
    ``source`` unless it names a known method and preset and its values are usable."""
    try:
        method = get_method(method_name(config))
        if preset_name(config) != AUTO_PRESET:
            method.fixed_preset(preset_name(config))
        with_defaults(config, method.defaults())
        validate_config(config)
    except DpsynthError as exc:
        raise ConfigError(f"{source}: {exc}") from None
    return config


def dataset_from_config(config: Mapping[str, Any]) -> Dataset:
    """Load and split the dataset that ``config``'s ``dataset`` section describes, at the shape a run drew for it
    (:func:`with_noisy_shape`) where it drew one, its public size set by :func:`with_public_size`."""
    config = RunConfig.shared(config)
    settings, drawn = DatasetSettings.of(config), config.drawn
    resolution, channels = (settings.resolution, settings.channels) if drawn.shape is None else drawn.shape[::-1]
    window = settings.window if isinstance(settings.window, str) else (settings.window[0], settings.window[1])
    shares = None if drawn.window is None else (drawn.window[0], drawn.window[1])
    dataset = load_dataset(
        settings.name, settings.data_dir, val_size=settings.val_size, test_size=settings.test_size,
        split_seed=settings.split_seed, resolution=resolution, channels=channels, num_classes=settings.num_classes,
        num_images=settings.num_images, window=window, window_shares=shares, cache_dir=settings.cache_dir,
    )
    if drawn.shape is not None:
        decision = f"{channels} x {resolution} x {resolution} by a DP vote of the images (stage {SHAPE.stage})"
        dataset = replace(dataset, info=replace(dataset.info, shape_decision=decision))
    return with_public_size(config, dataset)


def plan_budget_for(config: Mapping[str, Any], info: DatasetInfo) -> BudgetPlan:
    """Calibrate the stages of ``config``'s method so the whole run on ``info``'s training split meets the
    target (:func:`~dpsynth.planning.method_budget` of the method built from it)."""
    return method_budget(create_method(config), info)


def plan_privacy(config: Mapping[str, Any], info: DatasetInfo, plan: BudgetPlan | None = None) -> dict[str, Any]:
    """The run's privacy plan (``plan``, else calibrated now): each stage's noise (one calibrated) and share of the
    target epsilon."""
    plan = plan or plan_budget_for(config, info)
    report = budget_report(plan.stages, plan.accountant, plan.delta)
    return {"target_epsilon": plan.target, "dataset_size": info.num_train, "dataset_size_rule": info.size_rule,
            **report}


@dataclass(frozen=True)
class PrivacyPreview:
    """What a run of a configuration would spend and how it is judged, before anything runs (``dpsynth privacy``):
    its config with the plan applied, the data's facts, the calibrated budget and its report, the recorded
    outcomes' verdict on each DP-SGD step (``regime``) and the measured recipe for data of its shape and size. Made
    at the data's exact size where that is private: for the data holder's eyes, never released (a run plans
    again at its noisy size)."""

    config: RunConfig
    info: DatasetInfo
    budget: BudgetPlan
    report: dict[str, Any]
    regime: list[Assessment]
    recommendation: Recommendation | None

    @property
    def refused(self) -> bool:
        """Whether ``dpsynth run`` refuses this plan (its DP-SGD where every recorded run learned nothing, and no
        ``plan.force``)."""
        return any(item.verdict == "fails" for item in self.regime) and not PlanSettings.of(self.config).force

    def to_dict(self) -> dict[str, Any]:
        """The preview as ``dpsynth privacy --json`` prints it."""
        derived = {**asdict(PlanSettings.of(self.config)), **asdict(self.config.derived)} \
            if preset_name(self.config) == AUTO_PRESET else None
        regime = [{"stage": item.plan.stage, "noise_per_example": item.plan.noise_per_example,
                   "steps": item.plan.steps, "verdict": item.verdict,
                   "nearest": [outcome.to_dict() for outcome in item.nearest]} for item in self.regime]
        found = self.recommendation
        recommended = None if found is None else {
            "method": found.chosen and found.chosen.method,
            "learned_nothing": found.chosen is not None and found.chosen.learned_nothing,
            "measured": [recipe.to_dict() for recipe in found.considered]}
        return {**self.report, "derived": derived, "training_regime": regime, "recommendation": recommended}


def privacy_preview(config: Mapping[str, Any]) -> PrivacyPreview:
    """The :class:`PrivacyPreview` of a run of ``config``: its data loaded and the plan derived (nothing drawn,
    nothing written), its method built and its budget calibrated."""
    planned, dataset = planned_config(run_config_of(config), dataset_from_config(config),
                                      pick_device(RunSettings.of(config).device))
    method = create_method(planned)
    budget = method_budget(method, dataset.info)
    return PrivacyPreview(planned, dataset.info, budget, plan_privacy(planned, dataset.info, budget),
                          training_regime(method, dataset.info, budget), recommended_recipe(planned, dataset.info))


def synthetic_dataset(path: str | Path) -> TensorDataset:
    """A released ``synthetic.npz`` as a PyTorch dataset of (image, label) pairs, images float C x H x W in
    [0, 1] and labels int64, or (image, label, soft label) when the release has soft labels; DataError naming the
    file when it is not a release."""
    from .evaluation.release import read_release  # the evaluation's imports are heavy; only this call needs them

    release = read_release(path)
    images = release.image_set()
    soft = release.soft_label_tensor()
    return TensorDataset(images.images, images.labels, *([] if soft is None else [soft]))


def load_generator(release_dir: str | Path, device: str = "auto") -> Generator:
    """The generator a release holds (a run with ``release.model: true`` writes it), on ``device`` (auto: CUDA when
    present), with the release's privacy report as ``.privacy``; a run directory stands for its ``release/``
    folder. Its ``sample(n, labels=None)`` draws images in [0, 1] and their labels, reading no private data: any
    number of them keeps the release's (epsilon, delta). DpsynthError when the folder holds no model or its files
    are not those its privacy.json lists."""
    path = Path(release_dir)
    if not (path / Path(MODEL_CARD).name).is_file() and (path / MODEL_CARD).is_file():
        path = path / RELEASE
    return read_generator(path, pick_device(device))

