"""Planning a run: the dataset's public size, the privacy budget calibrated over the method's stages and the
dataset's facts, the recorded outcomes' verdict on its DP-SGD, the derived plan and its training side, the
release's upscaler, and the holder's ledger of every release from the same data."""
from __future__ import annotations

import time
import warnings
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from .autoplan.recipes import HOLDER_SIDE, Recommendation, recommend
from .autoplan.regime import VERDICT_ORDER, Assessment, PlannedTraining, Start, Verdict, assess
from .autoplan.rules import AUTO_PRESET, parse_duration
from .config import (
    DatasetSettings,
    DerivedPlan,
    PlanSettings,
    PrivacySettings,
    ReleaseSettings,
    RunConfig,
    RunSettings,
    method_name,
    preset_name,
    with_decisions,
    with_drawn,
    with_record,
)
from .data import Dataset, DatasetInfo
from .data.registry import train_size
from .errors import ConfigError, PrivacyWarning
from .methods import create_method, get_method
from .methods.base import Method
from .models.upscaler import SavedUpscaler, load_upscaler
from .privacy import (
    Accountant,
    Event,
    PlannedStage,
    SubsampledGaussianMechanism,
    default_delta,
    non_private_stages,
    plan_budget,
)
from .privacy.dataset_facts import (
    IMAGES_PER_GROUP,
    SHAPE,
    SIZE,
    draws_noisy_shape,
    draws_noisy_size,
    held_out_of,
    noisy_images_per_group,
    noisy_total,
)
from .privacy.releases import HeldRelease, HolderLedger, Total, total
from .training.upscaler import default_upscaler


def with_public_size(config: RunConfig, dataset: Dataset) -> Dataset:
    """``dataset`` with the public size of its training split under ``privacy.dataset_size``: ``auto``, the
    published size of a standard set, else a noisy count; ``noisy``, a noisy count always (once a run drew it:
    ``drawn.dataset_size``; until then the size stays private); a number, the declared size of the whole
    set, from which the training split's follows as the split rules take it."""
    privacy, info = PrivacySettings.of(config), dataset.info
    rule = privacy.dataset_size
    if rule == "auto" and info.size_rule == "published":
        return dataset
    total, how = (rule, "declared") if isinstance(rule, int) else (config.drawn.dataset_size, "noisy")
    if total is None:
        return replace(dataset, info=replace(info, public_train=None, size_rule="private"))
    size = train_size(int(total), *held_out_of(config), info.official_test,
                      f"{info.name} (privacy.dataset_size {how}: {total})")
    return replace(dataset, info=replace(info, public_train=size, size_rule=how))


def with_noisy_size(config: RunConfig, dataset: Dataset) -> RunConfig:
    """``config`` with a noisy count of ``dataset``'s size drawn (``drawn.dataset_size``; the run records
    :data:`~dpsynth.privacy.dataset_facts.SIZE`) where its size is not public and none was drawn yet."""
    if with_public_size(config, dataset).info.size_rule != "private":
        return config
    return with_drawn(config, dataset_size=noisy_total(dataset, config))


def draws_images_per_group(config: RunConfig, info: DatasetInfo) -> bool:
    """Whether a run of ``config`` on ``info`` prices a person's DP-SGD step by a noisy mean of their images: a
    derived plan on data with groups whose cap (``privacy.max_images_per_group``) the user left at its default."""
    return (preset_name(config) == AUTO_PRESET and info.unit == "group"
            and "privacy.max_images_per_group" not in PlanSettings.of(config).user_keys)


def resolve_delta(config: RunConfig, num_train: int) -> float:
    """privacy.delta, or 1 / (N ln N) when unset; warns when delta >= 1 / N."""
    delta = PrivacySettings.of(config).delta
    delta = default_delta(num_train) if delta is None else delta
    if delta >= 1.0 / num_train:
        warnings.warn(f"delta = {delta:.3g} is not below 1/N = {1.0 / num_train:.3g} (N = {num_train}): "
                      "a mechanism could then release a whole record with probability delta",
                      PrivacyWarning, stacklevel=2)
    return delta


@dataclass(frozen=True)
class BudgetPlan:
    """A run's accountant, delta, target epsilon and each stage's events (calibrated noise filled in), planned
    for a training split of ``size`` records."""

    accountant: Accountant
    delta: float
    target: float
    stages: dict[str, list[Event]]
    size: int


# The sources that read a holder's own files: their releases are counted by where the data lives, every other
# source's by its name (the same standard set wherever its files are).
HOLDER_SOURCES = ("folder", "npz")


def data_key(config: RunConfig) -> str:
    """The data set a run releases from, as the holder's ledger counts it: a folder's or file's full path
    (``folder:/data/scans``), else the standard set's name."""
    settings = DatasetSettings.of(config)
    if settings.name == "memory" and settings.data_dir:
        return settings.data_dir  # memory:<SHA-256 of the arrays>
    if settings.name in HOLDER_SOURCES and settings.data_dir:
        return f"{settings.name}:{Path(settings.data_dir).expanduser().resolve()}"
    return settings.name


def holder_ledger(config: RunConfig) -> HolderLedger:
    """The holder's ledger ``privacy.holder_ledger`` names, else the user's (:mod:`dpsynth.privacy.releases`)."""
    path = PrivacySettings.of(config).holder_ledger
    return HolderLedger(Path(path).expanduser() if path else None)


def planned_release(config: RunConfig, info: DatasetInfo, budget: BudgetPlan, run: str) -> HeldRelease:
    """The holder's ledger entry of a run of ``config`` at its plan, before any mechanism ran."""
    unit = DatasetSettings.of(config).unit_name or ("person" if info.unit == "group" else "image")
    return HeldRelease(data_key(config), run, method_name(config), unit, time.strftime("%Y-%m-%d", time.gmtime()),
                       "running", budget.delta, budget.accountant.kind, budget.stages)


def with_earlier_releases(config: RunConfig, info: DatasetInfo, budget: BudgetPlan, run: str = "") -> Total:
    """The ε of every release counted from this data (but the run ``run``) and a run of ``config`` at its plan, all
    together."""
    earlier = holder_ledger(config).counted(data_key(config), without=run)
    return total([*earlier, planned_release(config, info, budget, run)], budget.accountant.kind)


def check_total_epsilon(config: RunConfig, info: DatasetInfo, budget: BudgetPlan, run: str) -> None:
    """ConfigError when the run ``run`` at its plan would take every release counted from this data over
    ``privacy.total_epsilon`` (the holder's cap) together."""
    cap = PrivacySettings.of(config).total_epsilon
    if cap is None:
        return
    found = with_earlier_releases(config, info, budget, run)
    earlier = found.releases[:-1]
    if found.epsilon is None or found.epsilon > cap * (1 + 1e-9):
        spent = "no DP guarantee" if found.epsilon is None else f"ε = {found.epsilon:.4f}"
        raise ConfigError(f"privacy.total_epsilon = {cap:g}: this run at ε = {budget.target:g} and the "
                          f"{len(earlier)} earlier release(s) from {data_key(config)} would spend {spent} together "
                          f"(δ = {found.delta:.3g}); nothing was run. `dpsynth budget` lists them; mark one never "
                          "shared (`dpsynth budget --not-shared RUN`), lower privacy.epsilon, or raise the cap")


def method_budget(method: Method, info: DatasetInfo) -> BudgetPlan:
    """Calibrate ``method``'s stages so the whole run on ``info``'s training split meets its config's target."""
    config = method.config
    delta = resolve_delta(config, info.num_train)
    privacy = PrivacySettings.of(config)
    accountant, target = Accountant(privacy.accountant), privacy.epsilon
    stages = plan_budget(dataset_stages(config, info) + method.privacy_stages(info), target, delta, accountant)
    check_non_private(config, stages)
    return BudgetPlan(accountant, delta, target, stages, info.num_train)


def dataset_stages(config: RunConfig, info: DatasetInfo) -> list[PlannedStage]:
    """The mechanisms a run of ``config`` on ``info`` releases facts of its dataset with, before the method's:
    the shape a DP vote decides, the noisy size, and with groups under a derived plan the noisy mean of a
    person's images."""
    drawn = ((SHAPE, draws_noisy_shape(config)), (SIZE, draws_noisy_size(info)),
             (IMAGES_PER_GROUP, draws_images_per_group(config, info)))
    return [fact.planned() for fact, draws in drawn if draws]


# The DP-SGD stage whose training the recorded outcomes measure (a diffusion model's: autoplan.regime).
TRAINING_STAGE = "dp-sgd"


def training_regime(method: Method, info: DatasetInfo, budget: BudgetPlan) -> list[Assessment]:
    """The recorded outcomes' verdict on each calibrated DP-SGD step of ``method``'s stage :data:`TRAINING_STAGE`
    (:mod:`dpsynth.autoplan.regime`): sigma, the expected batch q x N, the steps and the side, all public."""
    if not method.pixel_regime:
        return []
    start: Start = "public model" if method.starts_from_public_model() else "random"
    return [assess(PlannedTraining(TRAINING_STAGE, event.noise_multiplier, event.sample_rate * info.num_train,
                                   event.steps, info.height, start))
            for event in budget.stages.get(TRAINING_STAGE, []) if isinstance(event, SubsampledGaussianMechanism)]


def recommended_recipe(config: RunConfig, info: DatasetInfo) -> Recommendation | None:
    """The measured recipe for data of ``info``'s N (as planning uses it), side and channels at ``config``'s epsilon
    and time budget (:mod:`dpsynth.autoplan.recipes`); None for data under :data:`HOLDER_SIDE` px, which the recipes
    do not cover."""
    side = info.release_side or info.height
    if side < HOLDER_SIDE:
        return None
    budget = parse_duration(PlanSettings.of(config).time_budget) / 60
    return recommend(info.num_train, side, info.channels, PrivacySettings.of(config).epsilon, budget)


def check_training_regime(config: RunConfig, assessments: list[Assessment]) -> None:
    """ConfigError, with what would do, when the recorded outcomes say the plan's DP-SGD will not learn, unless
    ``plan.force`` is set."""
    failing = [assessment for assessment in assessments if assessment.verdict == "fails"]
    if not failing or PlanSettings.of(config).force:
        return
    facts = "\n".join(line for assessment in failing for line in assessment.lines())
    raise ConfigError(
        f"{facts}\nnothing was spent: this plan's DP-SGD is where every recorded run learned nothing. What would "
        "do: a longer --time-budget (more steps, larger batches), a smaller training side lifted back by a public "
        "upscaler (--set dataset.train_resolution=32), a "
        "method that releases a few noisy statistics (dp-merf; dp-feta's central images; pe), a model pre-trained "
        "on public images (pdp-diffusion), or a GPU; --set plan.force=true runs it anyway (the datasheet says so)")


def check_non_private(config: RunConfig, stages: dict[str, list[Event]]) -> None:
    """ConfigError for stages that use the data without noise unless ``run.allow_non_private``; else a warning."""
    unprotected = non_private_stages(stages)
    if not unprotected:
        return
    what = (f"stage(s) {', '.join(unprotected)} of {method_name(config)} use the private data without noise, so "
            "the release has NO differential-privacy guarantee and no epsilon")
    if not RunSettings.of(config).allow_non_private:
        raise ConfigError(f"{what}; pass --allow-non-private (run.allow_non_private=true) to run it anyway")
    warnings.warn(what, PrivacyWarning, stacklevel=2)


def planned_config(config: RunConfig, dataset: Dataset, device: torch.device, draw_size: bool = False
                   ) -> tuple[RunConfig, Dataset]:
    """The config a run of ``config`` on ``dataset`` uses, and the dataset as training reads it (its planning size,
    at the training side :func:`training_dataset` gives): for preset ``auto`` the plan derived on ``device``
    (:mod:`dpsynth.autoplan`), its training side chosen by :func:`with_training_side`; a fixed preset checked to
    fit the data.

    A plan (derived, or a fixed preset's check) reads N, so where the size is private it follows the noisy count,
    which ``draw_size`` (a run) draws now, before the plan (``drawn.dataset_size``; the run records its
    mechanism); without it (a plan shown to the data holder) the exact size is used, as
    :func:`~dpsynth.api.plan_privacy` uses it."""
    from .autoplan.plan import derive_config

    began = time.perf_counter()
    if draw_size:
        config = with_noisy_size(config, dataset)
    dataset = with_public_size(config, dataset)
    if draw_size and draws_images_per_group(config, dataset.info) and \
            config.drawn.images_per_group is None:
        config = with_drawn(config, images_per_group=noisy_images_per_group(dataset, config))
    config = with_training_side(config, dataset.info, device)
    info = training_info(config, dataset.info)
    if draw_size and info.release_side is not None and preset_name(config) == AUTO_PRESET:
        started = time.perf_counter()  # a run trains the default upscaler once per side, within its budget
        upscaler = release_upscaler(config, info, device)
        assert upscaler is not None  # the release side is above the training side
        config = with_decisions(config, [f"release.upscaler {upscaler.name!r} ready in "
                                         f"{time.perf_counter() - started:.0f} s (public images only)"])
    if draw_size:  # a run's public parts, trained once into a cache (by rank 0, before any other rank reads them)
        ready = get_method(method_name(config)).ready_public_parts(config, info, device)
        if ready and preset_name(config) == AUTO_PRESET:  # within the derived plan's budget
            config = with_decisions(config, ready)
    # the budget covers the whole command: what the side search and the public parts took is spent already
    return derive_config(config, info, device, spent=time.perf_counter() - began), training_dataset(config, dataset)


# The sides a derived plan may train at below the data's (then lifted by the release's upscaler).
TRAINING_SIDES = (28, 32, 64)


def training_info(config: RunConfig, info: DatasetInfo) -> DatasetInfo:
    """``info`` as training reads the data: at ``dataset.train_resolution`` where that is below its side (ConfigError
    where it is above)."""
    side = DatasetSettings.of(config).train_resolution
    if not isinstance(side, int) or side == info.height:
        return info
    if side > info.height:
        raise ConfigError(f"dataset.train_resolution {side}: above the data's side, {info.height} px; training reads "
                          "the images at their side or smaller")
    return replace(info, height=side, width=side, release_side=info.height)


def training_dataset(config: RunConfig, dataset: Dataset) -> Dataset:
    """``dataset`` as training reads it (:func:`training_info`): its images shrunk by area averaging where
    ``dataset.train_resolution`` is below their side."""
    side = training_info(config, dataset.info).height
    return dataset if side == dataset.info.height else dataset.at_side(side)


def with_training_side(config: RunConfig, info: DatasetInfo, device: torch.device) -> RunConfig:
    """``config`` with ``dataset.train_resolution`` chosen, for a derived plan that left it auto on data at least
    twice the smallest of :data:`TRAINING_SIDES`: from the smallest side up (each at most half the data's), then the
    data's side, the plan at each side is judged by the recorded outcomes (:func:`training_regime`); the largest
    side at which it is expected to learn, else the smallest side. Every side's verdict is recorded in the plan's
    decisions. Unchanged for a method whose training the records do not measure (PE, DP-MERF, DP-SAD, ...)."""
    from .autoplan.plan import derive_config

    kept = PlanSettings.of(config).user_keys
    smaller = [side for side in TRAINING_SIDES if 2 * side <= info.height]  # a lift of less than 2x buys little
    method = get_method(method_name(config))  # a diffusion model's DP-SGD on pixels (TRAINING_STAGE), as recorded
    recorded = "dpsgd" in method.dpsgd_sections and method.pixel_regime
    if preset_name(config) != AUTO_PRESET or "dataset.train_resolution" in kept or not smaller or not recorded:
        return config
    tried: list[tuple[int, Verdict, RunConfig]] = []
    for side in [*smaller, info.height]:
        trial = config.replaced({"dataset": {"train_resolution": side}}, "the derived plan")
        at_side = training_info(trial, info)
        planned = derive_config(trial, at_side, device)
        built = create_method(planned)
        regime = training_regime(built, at_side, method_budget(built, at_side))
        verdict = max((item.verdict for item in regime), key=VERDICT_ORDER.index)
        tried.append((side, verdict, trial))
        if verdict != "learns":
            break
    learned = [choice for choice in tried if choice[1] == "learns"]
    side, _, chosen = learned[-1] if learned else tried[0]
    words = ", ".join(f"{tried_side} px {tried_verdict}" for tried_side, tried_verdict, _ in tried)
    lift = f", the release lifted to {info.height} px by release.upscaler" if side < info.height else ""
    return with_record(chosen, DerivedPlan,
                       decisions=[f"training side {side} px of the data's {info.height} ({words}){lift}"])


def release_upscaler(config: RunConfig, info: DatasetInfo, device: torch.device) -> SavedUpscaler | None:
    """The model that lifts the release from the training side to ``info.release_side`` (None when training reads
    the data at its side): ``release.upscaler``'s folder, or the default one (trained once per side on images
    that installed packages ship); ConfigError when it lifts to another side."""
    if info.release_side is None:
        return None
    setting = ReleaseSettings.of(config).upscaler
    saved = default_upscaler(info.release_side, device) if setting == "default" else load_upscaler(setting)
    if saved.record.get("side") != info.release_side:
        raise ConfigError(f"release.upscaler: {saved.folder} lifts images to {saved.record.get('side')} px, but the "
                          f"release is at the data's {info.release_side} px; write one for that side with dpsynth "
                          f"pretrain --upscaler --set dataset.resolution={info.release_side}")
    return saved


def format_derived_plan(config: RunConfig) -> str:
    """The derived plan in words: its budget, base preset, decisions and the expected minutes of each phase."""
    plan, found = PlanSettings.of(config), config.derived
    expected, probe, decisions = found.expected_seconds or {}, found.probe or {}, found.decisions or ()
    lines = [f"derived plan (--preset auto, from the {found.base} preset) for a time budget of "
             f"{plan.time_budget} on {probe.get('device')}:"]
    lines += [f"  {decision}" for decision in decisions]
    lines.append("  expected wall time: " + ", ".join(f"{phase} {seconds / 60:.1f} min" for phase, seconds
                                                     in expected.items() if phase != "total")
                 + f"; total {expected['total'] / 60:.1f} min")
    return "\n".join(lines)
