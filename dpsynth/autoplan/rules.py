"""The rules of a derived plan (``--preset auto``): how long each phase of a run takes on this device, and the
batch size, steps, noise multiplicity and release size that fit a time budget.

DP-SGD. The signal-to-noise ratio of a DP-SGD run, sqrt(steps) x batch / sigma, is nearly the same for every batch
once the calibrated sigma is about 1 or more (at epsilon = 10 and 55,000 images it still grows with the batch; at
1,437 it is flat from batch 64 on). So the plan spends the time on steps first, up to
:data:`STEP_TARGET` (Fashion-MNIST's measured `cpu` operating point: 644 steps of 512), then on the batch, up to the
base preset's batch and a sample rate of :data:`MAX_SAMPLE_RATE`, then (where the base preset has one, on a GPU)
on the noise multiplicity. Once batch and K reach the base preset's, the steps stop at the base preset's own
steps at this N (at least :data:`STEP_TARGET`): more steps at the same epsilon raise sigma and, measured on
Fashion-MNIST, lost accuracy, so the rest of the budget is left unspent.

Training comes first. A plan never has fewer than :data:`MIN_STEPS` DP-SGD steps, whatever N (on a small set
that is many epochs: at batch 16 of 240 people, 13 epochs), of at least :data:`MIN_BATCH` units: the training
floor. Release and evaluation get at most :data:`EVALUATION_SHARE` of the budget and never the floor's time: the
largest of :data:`RELEASE_SIZES` whose evaluation fits, else the smallest with the evaluation cut
(:data:`EVALUATION_CUTS`: one classifier seed, then 1,000 Inception images a side, then the minimum evaluation: 250
a side and 3 classifier epochs), then smaller releases (:data:`SMALL_RELEASES`) with the minimum evaluation. Only
where even that leaves no room for the floor does the plan drop the evaluation, saying what the minimum would have
cost and the budget that keeps it; where the smallest release alone leaves no room, the plan is refused with the
smallest budget that holds both.
"""
from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from ..config import RunConfig, SamplingSettings
from ..diffusion.settings import sampling_units
from ..errors import ConfigError
from ..evaluation import EvaluationSettings
from ..hardware import compiled_sampling, sampling_rows
from ..training.private import dpsgd_schedule
from .probe import StepCost, Throughput

AUTO_PRESET = "auto"
STEP_TARGET, MIN_STEPS, MAX_STEPS = 600, 200, 10_000
MIN_STEPS_FROM = 500  # images from which MIN_STEPS holds
MAX_SAMPLE_RATE = 0.25
MIN_BATCH = 16
EVALUATION_SHARE = 0.4
RELEASE_SIZES = (20_000, 10_000, 5_000)
SMALL_RELEASES = (2_000, 1_000)  # with the minimum evaluation, where 5,000 images with it do not fit
# What a plan short of time cuts from the evaluation, in turn (each on top of the ones before; a key the user set
# stays as set), down to the minimum evaluation a plan keeps: the holder always learns what the release is worth.
EVALUATION_CUTS: tuple[dict[str, Any], ...] = (
    {"evaluation.classifier_seeds": 1},
    {"evaluation.num_synthetic": 1000, "evaluation.num_real": 1000},
    {"evaluation.num_synthetic": 250, "evaluation.num_real": 250, "evaluation.classifier_epochs": 3},
)
MIN_SIZED_SHARE = 0.1  # of the base preset's iterations of a sized phase (DP-MERF's generator): its floor
STARTUP_SECONDS = 20.0  # imports, loading the data, checkpoints and the release's files
EVALUATION_FIXED_SECONDS = 20.0  # FID, FID-infinity, KID, precision / recall and the pictures, past the features

_DURATION = re.compile(r"^\s*(?:(\d+(?:\.\d+)?)\s*h)?\s*(?:(\d+(?:\.\d+)?)\s*m(?:in)?)?\s*(?:(\d+(?:\.\d+)?)\s*s)?\s*$")


def parse_duration(text: str | float | int, key: str = "plan.time_budget") -> float:
    """Seconds of ``45m``, ``1h30m``, ``90s``, ``2h`` (a bare number: minutes); ConfigError naming ``key``."""
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        seconds = 60.0 * float(text)
    else:
        match = _DURATION.match(str(text))
        if not match or not any(match.groups()):
            raise ConfigError(f"{key} must be a duration such as 45m, 1h30m or 900s, got {text!r}")
        hours, minutes, secs = (float(part) if part else 0.0 for part in match.groups())
        seconds = 3600 * hours + 60 * minutes + secs
    if not seconds > 0:
        raise ConfigError(f"{key} must be a positive duration, got {text!r}")
    return seconds


@dataclass(frozen=True)
class PlanInputs:
    """What a plan may depend on, all public: the training split's planning size N (public or a noisy count), the
    image shape, the number of classes, the validation and test sizes the evaluation reads (estimated from N
    where the sizes are not published) and the device; with groups, the images a step reads of a group at
    most."""

    num_train: int
    shape: tuple[int, int, int]
    num_classes: int
    num_val: int
    num_test: int
    device: str
    images_per_unit: float = 1  # with groups, the images a step reads of one: a noisy mean, or the cap
    release_side: int | None = None  # where training reads the images smaller: the side the release is evaluated at

    @property
    def evaluation_shape(self) -> tuple[int, int, int]:
        """The shape the evaluation's classifiers read: the release's."""
        side = self.release_side or self.shape[1]
        return (self.shape[0], side, side)

    def cost(self, throughput: Throughput, section: str) -> StepCost:
        """The step cost of ``section`` per unit (image or group) of a batch."""
        cost = throughput.dpsgd[section]
        return StepCost(cost.fixed, cost.per_row * self.images_per_unit)


@dataclass(frozen=True)
class DpsgdSize:
    """A DP-SGD plan: expected batch, noise multiplicity K and steps."""

    batch_size: int
    noise_multiplicity: int
    steps: int


def floor_power_of_two(value: float) -> int:
    return 2 ** int(math.floor(math.log2(value))) if value >= 1 else 1


def floor_batch(value: float) -> int:
    """``value`` rounded down to a multiple of :data:`MIN_BATCH` (below it, to a power of two): fine enough that
    a budget just short of :data:`STEP_TARGET` steps at the base batch does not halve the batch."""
    return MIN_BATCH * int(value // MIN_BATCH) if value >= MIN_BATCH else floor_power_of_two(value)


def size_dpsgd(seconds: float, cost: StepCost, num_train: int, batch_cap: int, multiplicity_cap: int,
               fixed_batch: bool = False, step_cap: int = MAX_STEPS) -> DpsgdSize:
    """Batch, K and steps for ``seconds`` of DP-SGD at ``cost`` (the module docstring's order); with
    ``fixed_batch``, the batch is ``batch_cap`` and only the steps follow the time. At the full ``batch_cap``
    and ``multiplicity_cap`` the steps stop at ``step_cap`` (the base preset's)."""
    if fixed_batch:
        steps = int(seconds / cost.seconds(batch_cap * multiplicity_cap))
        return DpsgdSize(batch_cap, multiplicity_cap, _with_floor(steps, num_train))
    largest = max(1, min(batch_cap, floor_power_of_two(num_train * MAX_SAMPLE_RATE)))
    chosen: DpsgdSize | None = None
    multiplicity = 1
    while multiplicity <= multiplicity_cap:
        per_step = seconds / STEP_TARGET
        batch = floor_batch(max((per_step - cost.fixed) / (cost.per_row * multiplicity), 1.0))
        batch = min(max(batch, min(MIN_BATCH, largest)), largest)
        steps = int(seconds / cost.seconds(batch * multiplicity))
        if chosen is None or steps >= STEP_TARGET and batch == largest:  # K grows only beside a full batch
            chosen = DpsgdSize(batch, multiplicity, steps)
        if batch < largest or steps < STEP_TARGET:
            break
        multiplicity *= 2
    assert chosen is not None
    steps = chosen.steps
    if chosen.batch_size == batch_cap and chosen.noise_multiplicity == multiplicity_cap:
        steps = min(steps, step_cap)
    return DpsgdSize(chosen.batch_size, chosen.noise_multiplicity, _with_floor(steps, num_train))


def _with_floor(steps: int, num_train: int) -> int:
    """``steps`` within [:data:`MIN_STEPS`, :data:`MAX_STEPS`] (``num_train`` does not lower the floor)."""
    return min(max(steps, MIN_STEPS), MAX_STEPS)


class DpsgdSizes(Protocol):
    """What a plan reads of a DP-SGD section's settings (a method's own class for it)."""

    batch_size: int
    epochs: float
    physical_batch_size: int


def multiplicity(settings: DpsgdSizes) -> int:
    """The noise multiplicity K of a DP-SGD section (the rows each example adds to a batch): 1 without one."""
    return getattr(settings, "noise_multiplicity", 1)


def dpsgd_steps(settings: DpsgdSizes, num_train: int) -> int:
    """int(epochs / q) steps of a DP-SGD section, as :class:`~dpsynth.privacy.DpsgdSchedule` counts them."""
    rate = min(settings.batch_size, num_train) / num_train
    return max(1, int(settings.epochs / rate))


def dpsgd_seconds(settings: DpsgdSizes, section: str, inputs: PlanInputs, throughput: Throughput) -> float:
    rows = settings.batch_size * multiplicity(settings)
    return dpsgd_steps(settings, inputs.num_train) * inputs.cost(throughput, section).seconds(rows)


def sampling_seconds(config: RunConfig, method: MethodShape, throughput: Throughput, compiled: bool, side: int
                     ) -> float:
    """Seconds to make the release: its units of work (``method.release_units``) at the probed (eager) rate, or
    where ``compiled``, at the share of it measured at ``side`` px in the release's chunks after the compilation
    (:func:`~dpsynth.hardware.compiled_sampling`)."""
    seconds = method.release_units(config) * throughput.sample_per_image_step
    if not (compiled and seconds):
        return seconds
    measured = compiled_sampling(side, sampling_rows(config))
    return measured.share * seconds + measured.compile_seconds


def evaluation_seconds(config: RunConfig, inputs: PlanInputs, throughput: Throughput, soft_labels: bool) -> float:
    """Seconds of the evaluation: Inception features of both image sets, each classifier's seeds (every epoch
    trains on the release and tests the validation split; the chosen and the last epoch test the test split) and
    the fixed part."""
    evaluation = EvaluationSettings.of(config)  # as the evaluation will run: its protocol applied
    if not evaluation.enabled:
        return 0.0
    split = {"train": inputs.num_train, "val": inputs.num_val, "test": inputs.num_test}[evaluation.real_split]
    released = SamplingSettings.of(config).num_samples
    images = min(evaluation.num_synthetic, released) + min(evaluation.num_real, split)
    seconds = throughput.inception_per_image * images
    epochs = evaluation.training(soft_labels).epochs
    for name in evaluation.classifiers:
        cost = throughput.classifiers[name]
        one = epochs * (released * cost["train"] + inputs.num_val * cost["test"]) + 2 * inputs.num_test * cost["test"]
        seconds += evaluation.classifier_seeds * one
    return seconds + EVALUATION_FIXED_SECONDS


def public_seconds(config: RunConfig, method: MethodShape, throughput: Throughput) -> float:
    """Seconds of training on public data (``iterations`` x ``batch_size`` rows of each public section)."""
    sections = [config.section(name) for name in method.public_sections]
    return sum(values.iterations * values.batch_size * throughput.public_per_row for values in sections)


def _no_phases(config: RunConfig, num_images: float) -> dict[str, float]:
    return {}


@dataclass(frozen=True)
class MethodShape:
    """What the plan needs of a method: its DP-SGD sections, its public training sections, whether it releases
    soft labels, the units of work of the phases the probe times by the unit (``phase_units(config,
    num_images)``), the one of those whose iterations the plan sizes (phase, key) and the units of its release's
    work (``release_units(config)``, priced at the probe's sampling rate). Its sections are read from the
    :class:`~dpsynth.config.RunConfig` a plan is given."""

    dpsgd_sections: tuple[str, ...]
    public_sections: tuple[str, ...]
    soft_labels: bool
    phase_units: Callable[[RunConfig, float], dict[str, float]] = _no_phases
    sized_phase: tuple[str, str] | None = None
    release_units: Callable[[RunConfig], float] = sampling_units


def phase_seconds(config: RunConfig, method: MethodShape, inputs: PlanInputs, throughput: Throughput
                  ) -> dict[str, float]:
    """Seconds of each phase the probe times by the unit: its units in ``config`` x its seconds per unit."""
    units = method.phase_units(config, inputs.num_train * inputs.images_per_unit)
    return {phase: count * throughput.phases[phase] for phase, count in units.items() if count}


def sized_phase(config: RunConfig, method: MethodShape, inputs: PlanInputs, throughput: Throughput, seconds: float,
                kept: Sequence[str]) -> tuple[dict[str, dict[str, Any]], list[str]]:
    """The override of the sized phase's key (iterations per epoch) that fits its time into ``seconds``: the base
    preset's iterations at most, :data:`MIN_SIZED_SHARE` of them at least (the training floor); the decision."""
    assert method.sized_phase is not None
    phase, key = method.sized_phase
    section, name = key.split(".")
    base = getattr(config.section(section), name)
    if key in kept:
        return {}, [f"{phase}: {key} {base} as set"]
    per_key_unit = phase_seconds(config, method, inputs, throughput)[phase] / base  # the key's unit, every epoch
    iterations = min(base, max(math.ceil(MIN_SIZED_SHARE * base), int(max(seconds, 0.0) / per_key_unit)))
    words = (f"{phase}: {key} {iterations} of the base preset's {base}: {iterations * per_key_unit / 60:.1f} min at "
             f"{throughput.phases[phase]:.3g} s per iteration, of {max(seconds, 0.0) / 60:.1f} min left for it")
    return {section: {name: iterations}}, [words]


def floor_words(method: MethodShape) -> str:
    """The least training a plan releases, in words."""
    if method.dpsgd_sections:
        return f"{MIN_STEPS} DP-SGD steps"
    if method.sized_phase is not None:
        return f"the {method.sized_phase[0]} at {MIN_SIZED_SHARE:.0%} of its iterations"
    if method.phase_units is not _no_phases:
        return "start-up and its phases as configured"
    return "start-up"


def estimate_seconds(config: RunConfig, method: MethodShape, inputs: PlanInputs, throughput: Throughput,
                     compiled: bool) -> dict[str, float]:
    """Expected seconds of each phase of a run of ``config`` (and ``total``)."""
    phases = {"startup": STARTUP_SECONDS}
    if method.public_sections:
        phases["public training"] = public_seconds(config, method, throughput)
    phases.update(phase_seconds(config, method, inputs, throughput))
    for section in method.dpsgd_sections:
        phases[f"dp-sgd ({section})"] = dpsgd_seconds(config.section(section), section, inputs, throughput)
    phases["sampling"] = sampling_seconds(config, method, throughput, compiled, inputs.shape[1])
    phases["evaluation"] = evaluation_seconds(config, inputs, throughput, method.soft_labels)
    phases["total"] = sum(phases.values())
    return phases


def _set(overrides: dict[str, dict[str, Any]], key: str, value: Any) -> None:
    section, name = key.split(".")
    overrides.setdefault(section, {})[name] = value


def derive(config: RunConfig, method: MethodShape, inputs: PlanInputs, throughput: Throughput, budget: float,
           compiles: Callable[[RunConfig], bool] = lambda config: False, kept: Sequence[str] = ()
           ) -> tuple[dict[str, dict[str, Any]], list[str]]:
    """Overrides of ``config`` (its base preset's values) that fit ``budget`` seconds, and why, in words; the
    ``kept`` keys (the user's) keep their values and the rest is sized around them. ``compiles(config)``: whether
    that config's release would be sampled compiled (it depends on the release's size)."""
    floor = training_floor(config, method, inputs, throughput, kept)
    overrides, after, decisions = fit_release(config, method, inputs, throughput, compiles, budget, floor, kept)
    phases = phase_seconds(config, method, inputs, throughput)
    left = (budget - STARTUP_SECONDS - after - public_seconds(config, method, throughput)
            - sum(seconds for phase, seconds in phases.items() if method.sized_phase is None
                  or phase != method.sized_phase[0]))
    if method.sized_phase is not None:
        sized, words = sized_phase(config, method, inputs, throughput, left, kept)
        for section, values in sized.items():
            overrides.setdefault(section, {}).update(values)
        return overrides, [*decisions, *words]
    if not method.dpsgd_sections:
        return overrides, decisions
    shares = _section_shares(config, method)
    for section, share in shares.items():
        values = config.section(section)
        if f"{section}.epochs" in kept:
            decisions.append(f"{section}: batch and epochs as set")
            continue
        seconds = max(left * share, 0.0)
        fixed_batch = f"{section}.batch_size" in kept
        cost = inputs.cost(throughput, section)
        step_cap = max(dpsgd_steps(values, inputs.num_train), STEP_TARGET)
        size_ = size_dpsgd(seconds, cost, inputs.num_train, values.batch_size, multiplicity(values), fixed_batch,
                           step_cap)
        epochs = (size_.steps + 0.5) * size_.batch_size / inputs.num_train  # int(epochs / q) is the steps
        _set(overrides, f"{section}.batch_size", size_.batch_size)
        _set(overrides, f"{section}.epochs", float(f"{epochs:.6g}"))
        _set(overrides, f"{section}.physical_batch_size", min(values.physical_batch_size, size_.batch_size))
        if hasattr(values, "noise_multiplicity"):
            _set(overrides, f"{section}.noise_multiplicity", size_.noise_multiplicity)
        rows = size_.batch_size * size_.noise_multiplicity
        expected = size_.steps * cost.seconds(rows)
        rate = size_.batch_size / inputs.num_train
        decisions.append(
            f"{section}: {size_.steps} steps of batch {size_.batch_size} (q = {rate:.3g}, "
            f"K = {size_.noise_multiplicity}, {epochs:.3g} epochs): {expected / 60:.1f} min at "
            f"{cost.seconds(rows):.2f} s per step, of {seconds / 60:.1f} min left for it")
        if size_.steps == step_cap and expected < seconds * 0.95:
            decisions.append(f"{section}: the base preset's {step_cap} steps at its batch; more steps at the same "
                             f"epsilon raise the noise, so {(seconds - expected) / 60:.1f} min stay unspent")
        if expected > seconds * 1.05:
            decisions.append(f"{section}: the budget is too short for {MIN_STEPS} steps; this plan exceeds it by "
                             f"{(expected - seconds) / 60:.1f} min")
    return overrides, decisions


def training_floor(config: RunConfig, method: MethodShape, inputs: PlanInputs, throughput: Throughput,
                   kept: Sequence[str] = ()) -> float:
    """Seconds of the least training a plan releases: start-up, public training, and in each DP-SGD section
    :data:`MIN_STEPS` steps of at least :data:`MIN_BATCH` units (the data's largest batch where that is smaller;
    the user's batch where set), or the user's own steps where they set the epochs."""
    seconds = STARTUP_SECONDS + public_seconds(config, method, throughput)
    sized_phase, sized_key = method.sized_phase or (None, None)
    for phase, phase_time in phase_seconds(config, method, inputs, throughput).items():
        seconds += phase_time * (MIN_SIZED_SHARE if phase == sized_phase and sized_key not in kept else 1)
    least = max(1, min(MIN_BATCH, floor_power_of_two(inputs.num_train * MAX_SAMPLE_RATE)))
    for section in method.dpsgd_sections:
        values = config.section(section)
        batch = values.batch_size if f"{section}.batch_size" in kept else least
        dpsgd_schedule(section, batch, 1.0, inputs.num_train)  # ConfigError for a batch the data cannot hold
        steps = dpsgd_steps(values, inputs.num_train) if f"{section}.epochs" in kept else MIN_STEPS
        seconds += steps * inputs.cost(throughput, section).seconds(batch * multiplicity(values))
    return seconds


def fit_release(config: RunConfig, method: MethodShape, inputs: PlanInputs, throughput: Throughput,
                compiles: Callable[[RunConfig], bool], budget: float, floor: float, kept: Sequence[str]
                ) -> tuple[dict[str, dict[str, Any]], float, list[str]]:
    """The release size and evaluation (overrides), their seconds and the decisions in words, in the module
    docstring's order; ConfigError with the smallest budget that holds the training floor and the smallest
    release."""
    room = min(EVALUATION_SHARE * budget, budget - floor)
    options = _release_options(config, kept)
    for option in options:
        overrides, cut = option
        trial = config.replaced(overrides, "the derived plan")
        after = (sampling_seconds(trial, method, throughput, compiles(trial), inputs.shape[1])
                 + evaluation_seconds(trial, inputs, throughput, method.soft_labels))
        if after <= room:
            break
    keeping = math.ceil((floor + after) / 60)  # the budget that holds the floor and the minimum evaluation
    if after > budget - floor and "evaluation.enabled" not in kept:  # the last resort: no evaluation, said loudly
        overrides = {"sampling": overrides["sampling"], "evaluation": {"enabled": False}}
        trial = trial.replaced(overrides, "the derived plan")
        minimum, after = after, sampling_seconds(trial, method, throughput, compiles(trial), inputs.shape[1])
        cut = (f"NO evaluation (evaluation.enabled=false): the minimum evaluation would take "
               f"{(minimum - after) / 60:.1f} min more than the budget leaves beside the training floor; "
               f"--time-budget {keeping}m keeps it, `dpsynth evaluate RUN_DIR` evaluates the release later")
    if after > budget - floor:
        needed = math.ceil((floor + after) / 60)
        raise ConfigError(f"plan.time_budget {budget / 60:g} min is too short on this machine: {floor_words(method)} "
                          f"(the least a plan releases) take {floor / 60:.1f} min with start-up, and the "
                          f"smallest release {after / 60:.1f} min; give --time-budget {needed}m or more "
                          f"({keeping}m with the minimum evaluation), or a smaller dataset.train_resolution")
    size = SamplingSettings.of(trial).num_samples
    decisions = [f"release {size:,} images: sampling and evaluation {after / 60:.1f} min "
                 f"({'within' if after <= EVALUATION_SHARE * budget else 'over'} {EVALUATION_SHARE:.0%} of the "
                 f"budget; the training floor, {floor_words(method)}, takes {floor / 60:.1f} min)"]
    if cut and EvaluationSettings.of(trial).enabled:
        evaluation = evaluation_seconds(trial, inputs, throughput, method.soft_labels)
        decisions.append(f"evaluation cut to fit the budget, training first: {cut} ({evaluation / 60:.1f} min)")
    elif cut:
        decisions.append(cut)
    return overrides, after, decisions


def _release_options(config: RunConfig, kept: Sequence[str]) -> list[tuple[dict[str, dict[str, Any]], str]]:
    """The releases and evaluations a plan tries, in turn, as (overrides, the cut in words); the user's keys stay
    as set."""
    sizes = RELEASE_SIZES if "sampling.num_samples" not in kept else (SamplingSettings.of(config).num_samples,)
    options = [({"sampling": {"num_samples": size}}, "") for size in sizes]
    cuts: dict[str, Any] = {}
    for cut in EVALUATION_CUTS:
        cuts.update({key: value for key, value in cut.items() if key not in kept})
        options.append(({"sampling": {"num_samples": sizes[-1]}, "evaluation": _section_of(cuts)},
                        evaluation_words(cuts)))
    if "sampling.num_samples" not in kept:
        options += [({"sampling": {"num_samples": size}, "evaluation": _section_of(cuts)},
                     evaluation_words(cuts)) for size in SMALL_RELEASES]
    return options


def held_evaluation(config: RunConfig, inputs: PlanInputs, throughput: Throughput, soft_labels: bool, left: float,
                    pace: float, kept: Sequence[str] = (), uncut: Mapping[str, Any] | None = None,
                    slack: float = 0.0) -> tuple[dict[str, Any], float]:
    """The evaluation keys to change at run time, and the evaluation's seconds then, for a run with ``left`` seconds
    of its budget whose training and release took ``pace`` times their plan. The evaluations tried, in turn: the
    ``uncut`` one (the base preset's values of the keys :data:`EVALUATION_CUTS` cuts, where higher than planned),
    then each cut of :data:`EVALUATION_CUTS` on top of the ones before (a cut only lowers a value; the ``kept`` keys
    stay); the first whose seconds at that pace fit is taken (``slack`` seconds past ``left`` for one no larger
    than planned: a near miss is not worth a cut), else the minimum evaluation, kept however little is left.
    Without ``uncut`` a planned evaluation that fits is kept as planned."""
    planned = EvaluationSettings.of(config)

    def value(key: str) -> Any:
        return getattr(planned, key.split(".", 1)[1])

    def seconds(changes: dict[str, Any]) -> float:
        trial = config.replaced({"evaluation": _section_of(changes)}, "the evaluation held to the budget")
        return pace * evaluation_seconds(trial, inputs, throughput, soft_labels)

    values = {key: full for key, full in (uncut or {}).items() if key not in kept and full > value(key)}
    tried = [dict(values)]
    for cut in EVALUATION_CUTS:
        values.update({key: lowered for key, lowered in cut.items()
                       if key not in kept and lowered < values.get(key, value(key))})
        tried.append(dict(values))
    for changes in ({key: v for key, v in trial.items() if v != value(key)} for trial in tried):
        expected = seconds(changes)
        if expected <= left + (0.0 if any(v > value(key) for key, v in changes.items()) else slack):
            break
    return changes, expected


def _section_of(keys: dict[str, Any]) -> dict[str, Any]:
    return {key.split(".", 1)[1]: value for key, value in keys.items()}


def evaluation_words(keys: dict[str, Any]) -> str:
    """Evaluation keys and their values as a plan writes them: ``evaluation.classifier_seeds=1, ...``."""
    return ", ".join(f"{key}={value}" for key, value in keys.items())


def unet_levels(block_channels: Sequence[int], side: int) -> list[int]:
    """The base preset's UNet widths, one level deeper (twice the last width) for each doubling of the side past
    32: 64 px get 4 levels, 128 px 5, so the lowest level (where attention is) stays at 8 x 8 or below."""
    widths = list(block_channels)
    while side // 2 ** (len(widths) - 1) > 8 and side % 2 ** len(widths) == 0:
        widths.append(2 * widths[-1])
    return widths


def _section_shares(config: RunConfig, method: MethodShape) -> dict[str, float]:
    """Each DP-SGD section's share of the time: as its base preset divides the examples (epochs x K)."""
    sections = {name: config.section(name) for name in method.dpsgd_sections}
    weights = {name: values.epochs * multiplicity(values) for name, values in sections.items()}
    total = sum(weights.values())
    return {name: weight / total for name, weight in weights.items()}


def user_keys_kept(overrides: dict[str, dict[str, Any]], user_keys: list[str]) -> dict[str, dict[str, Any]]:
    """``overrides`` less the keys the user set (they win over the plan)."""
    return {section: {key: value for key, value in values.items() if f"{section}.{key}" not in user_keys}
            for section, values in overrides.items()}
