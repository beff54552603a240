"""A rehearsal at zero epsilon: the plan a run of the private data would follow, run on a PUBLIC stand-in of the
same shape and size, cheaper by the scaling of Sander et al. 2023 ("TAN without a burn"): every DP-SGD stage keeps
its steps and its noise per example sigma / B at a batch ``shrink`` times smaller (sigma / shrink at B / shrink),
which costs about 1 / shrink of its time and, by their measurements, learns about as the full batch does; its
release is ``shrink`` times smaller and its evaluation cut as a derived plan first cuts it. Where the private data
has several images a person (``privacy.max_images_per_group`` declared), the plan prices a step by the person as
the run's would, though the stand-in has one image each.

Nothing private is read: the shape and size of the private data must be declared (public), the plan is derived from
them, and the run reads the stand-in only. Nothing is spent: the run enters no holder's ledger, and its release,
report and privacy.json say that they are a stand-in's (``rehearsal.json`` in its directory); a rehearsal does not
resume (it is run again).
"""
from __future__ import annotations

import copy
import warnings
from dataclasses import replace
from typing import Any

from .api import dataset_from_config, plan_budget_for
from .autoplan.rules import EVALUATION_CUTS
from .config import (
    Config,
    DatasetSettings,
    PlanSettings,
    PrivacySettings,
    RunConfig,
    RunSettings,
    get_value,
    method_name,
    set_value,
)
from .data import Dataset
from .distributed import World
from .errors import ConfigError, DataError
from .methods import create_method, get_method, run_config_of
from .pipeline import Run
from .planning import BudgetPlan, planned_config, training_dataset, with_public_size
from .privacy import Accountant, PlannedStage, SubsampledGaussianMechanism
from .privacy.events import Event
from .runs import REHEARSAL, RunDirectory, run_name
from .utils.device import pick_device
from .utils.io import atomic_write_json
from .utils.messages import tell

DEFAULT_STAND_IN = "glyphs"  # labelled public data of any size, shape and class count, installed with the fonts
DEFAULT_SHRINK = 4
REHEARSAL_IMAGES = 5000  # a rehearsal releases 1 / shrink of the plan's images, at most this many, at least
REHEARSAL_LEAST = 1000  # this many (or the plan's own, where smaller): its sampling and evaluation shrink with it
STAND_IN_ACCOUNTANT = "rdp"  # the stand-in's own epsilon (only reported): RDP computes it at any sigma; the plan
# rehearsed is calibrated by the run's own accountant


def declared_shape(config: Config) -> tuple[int, int, int]:
    """The private data's channels, side and size as the user declared them (public); ConfigError naming the keys
    otherwise: a rehearsal reads no private image, so nothing of their shape or size may come from them."""
    settings, privacy = DatasetSettings.of(config), PrivacySettings.of(config)
    missing = [f"{key}=..." for key, value in (("dataset.channels", settings.channels),
                                               ("dataset.resolution", settings.resolution),
                                               ("privacy.dataset_size", privacy.dataset_size))
               if not isinstance(value, int)]
    if missing:
        raise ConfigError("a rehearsal reads no private image, so the private data's shape and size must be declared "
                          f"(public): --set {' --set '.join(missing)} (the size counts the whole set, as a run's "
                          "declared size does)")
    return int(settings.channels), int(settings.resolution), int(privacy.dataset_size)


def stand_in_config(config: Config, stand_in: str, data_dir: str | None, classes: int | None) -> Config:
    """``config`` with the stand-in as its dataset, at the declared shape and size, entered in no holder's ledger;
    titled as a rehearsal."""
    channels, side, size = declared_shape(config)
    private = DatasetSettings.of(config)
    changed = copy.deepcopy(config)
    dataset = changed["dataset"]
    dataset.update({"name": stand_in, "data_dir": data_dir, "num_images": size, "resolution": side,
                    "channels": channels, "num_classes": classes or private.num_classes,
                    "title": f"Rehearsal on {stand_in} (a public stand-in for {private.title or private.name})",
                    "description": "a rehearsal at zero epsilon: the plan of a private run, on public images of "
                                   "the same shape and size", "owner": None})
    return changed


def priced_as_private(stand_in: Dataset, config: Config) -> Dataset:
    """``stand_in`` (one image a unit) as the plan prices the private data: by the person, at
    ``privacy.max_images_per_group`` images each, where the user declared that cap (the private data has several
    images a person), so the rehearsal plans the steps the run would plan."""
    if "privacy.max_images_per_group" not in PlanSettings.of(config).user_keys:
        return stand_in
    info = stand_in.info  # each image its own group: the same N, priced by the person
    return replace(stand_in, info=replace(info, group_counts=dict(info.split_sizes), group_source="the declared cap"))


def rehearsal_release(planned: int, shrink: int) -> int:
    """The images a rehearsal releases of a plan that releases ``planned``: 1 / ``shrink`` of them, within
    [:data:`REHEARSAL_LEAST`, :data:`REHEARSAL_IMAGES`] (the plan's own where it releases fewer)."""
    return min(planned, max(REHEARSAL_LEAST, min(planned // shrink, REHEARSAL_IMAGES)))


def shrunk_config(config: Config, shrink: int) -> Config:
    """``config`` with each DP-SGD section's batch ``shrink`` times smaller and its epochs likewise (the same
    steps), its own epsilon accounted by :data:`STAND_IN_ACCOUNTANT`, its release ``shrink`` times smaller
    (:func:`rehearsal_release`) and its evaluation cut as a derived plan first cuts it (one classifier seed, 1,000
    Inception images a side); ConfigError when a batch would fall below 2."""
    changed = copy.deepcopy(config)
    set_value(changed, "privacy.accountant", STAND_IN_ACCOUNTANT, "rehearsal")  # the stand-in's own epsilon
    released = rehearsal_release(get_value(config, "sampling.num_samples"), shrink)
    cuts = {"sampling.num_samples": released, **EVALUATION_CUTS[0], **EVALUATION_CUTS[1]}
    for key, value in cuts.items():
        if get_value(changed, key) > value:
            set_value(changed, key, value, "rehearsal")
    for section in get_method(method_name(config)).dpsgd_sections:
        batch, epochs = get_value(config, f"{section}.batch_size"), get_value(config, f"{section}.epochs")
        if batch // shrink < 2:
            raise ConfigError(f"--shrink {shrink}: {section}.batch_size {batch} would fall below 2; shrink less")
        set_value(changed, f"{section}.batch_size", batch // shrink, "rehearsal")
        set_value(changed, f"{section}.epochs", epochs * (batch // shrink) / batch, "rehearsal")
    return changed


def shrunk_budget(config: RunConfig, dataset: Dataset, real: BudgetPlan, shrink: int) -> BudgetPlan:
    """The plan of the shrunk ``config``: each calibrated DP-SGD stage at the real plan's sigma / ``shrink`` (its
    steps checked unchanged), the other stages as planned; its target the epsilon it spends on the stand-in."""
    info = dataset.info
    stages: list[PlannedStage] = create_method(config).privacy_stages(info)
    events: dict[str, list[Event]] = {name: list(planned) for name, planned in real.stages.items()}
    for stage in stages:
        if stage.calibrated is None:
            continue
        (event,) = real.stages[stage.name]
        if not isinstance(event, SubsampledGaussianMechanism):  # no batch to shrink: as planned
            continue
        shrunk = stage.calibrated(event.noise_multiplier / shrink)
        if not isinstance(shrunk, SubsampledGaussianMechanism) or shrunk.steps != event.steps:
            raise ConfigError(f"stage {stage.name}: at a batch {shrink} times smaller it would take another number "
                              f"of steps than the plan's {event.steps}; choose another --shrink")
        events[stage.name] = [shrunk]
    accountant = Accountant(STAND_IN_ACCOUNTANT)
    spent = accountant.epsilon([event for planned in events.values() for event in planned], real.delta)
    return replace(real, accountant=accountant, target=spent, stages=events)


def describe(real: BudgetPlan, rehearsal: BudgetPlan, rehearsed: RunConfig, stand_in: str, private: str,
             shrink: int) -> dict[str, Any]:
    """What rehearsal.json says: whose plan on what, each DP-SGD stage as planned and as rehearsed, and the
    release and evaluation of the rehearsal."""
    def stages(plan: BudgetPlan) -> dict[str, dict[str, float]]:
        return {name: {"noise_multiplier": event.noise_multiplier, "sample_rate": event.sample_rate,
                       "expected_batch": event.sample_rate * plan.size, "steps": event.steps,
                       "sigma_over_batch": event.noise_multiplier / (event.sample_rate * plan.size)}
                for name, (event, *_) in plan.stages.items() if isinstance(event, SubsampledGaussianMechanism)}
    return {"stand_in": stand_in, "private_data": private, "shrink": shrink, "private_images_read": 0,
            "holder_ledger": "not entered: a rehearsal spends nothing", "planned": stages(real),
            "rehearsed": stages(rehearsal),
            "release_and_evaluation": {key: get_value(rehearsed, key) for key in
                                       ("sampling.num_samples", *EVALUATION_CUTS[0], *EVALUATION_CUTS[1])},
            "note": "a public stand-in's outcome under the private run's plan: a forecast, nothing private measured"}


def rehearse(config: Config, stand_in: str = DEFAULT_STAND_IN, data_dir: str | None = None,
             shrink: int = DEFAULT_SHRINK, classes: int | None = None) -> RunDirectory:
    """Run ``config``'s plan on the public ``stand_in`` (a dataset name, read from ``data_dir`` when given) at the
    declared shape and size, each DP-SGD stage ``shrink`` times cheaper; the run directory it released into. Its
    evaluation is the one it planned: a run's is restored or cut to its budget's time, a rehearsal's budget is the
    run's."""
    if shrink < 1:
        raise ConfigError(f"--shrink must be a whole number of at least 1, got {shrink}")
    private = DatasetSettings.of(config).name
    public = stand_in_config(config, stand_in, data_dir, classes)
    device = pick_device(RunSettings.of(public).device)
    with warnings.catch_warnings():  # a public set: its size steers nothing private
        warnings.simplefilter("ignore")
        full = dataset_from_config(public)
    channels, _, size = declared_shape(config)
    held = sum(full.info.split_sizes.values())
    if held < size:
        raise DataError(f"stand-in {stand_in}: {held:,} images, fewer than the {size:,} the private set is declared "
                        "to hold; name a larger public set (--stand-in, --stand-in-dir)")
    if full.info.channels != channels:
        raise DataError(f"stand-in {stand_in}: images of {full.info.channels} channel(s), but the private set is "
                        f"declared with dataset.channels={channels}; name a public set that reads at "
                        f"{channels} (--stand-in, --stand-in-dir)")
    planned, _ = planned_config(run_config_of(public), priced_as_private(full, config), device)
    dataset = training_dataset(planned, with_public_size(planned, full))
    real = plan_budget_for(planned, dataset.info)
    rehearsed = run_config_of(shrunk_config(planned.to_dict(), shrink))
    budget = shrunk_budget(rehearsed, dataset, real, shrink)
    run = RunDirectory.create(rehearsed, name=f"rehearsal-{run_name(rehearsed)}")
    atomic_write_json(run.file(REHEARSAL), describe(real, budget, rehearsed, stand_in, private, shrink))
    tell("rehearsal directory", f"rehearsal directory: {run.path}\nrehearsing the plan of a {private} run on "
         f"{len(full.train):,} public {stand_in} images, each DP-SGD stage at a batch {shrink} times smaller (same "
         "steps and sigma/B): nothing private is read, nothing is spent", path=str(run.path))
    return Run(rehearsed, dataset, create_method(rehearsed), World(), budget, directory=run).execute()

