"""``--preset auto``: a plan derived from the data and the machine, written into the run's config.

The base is the method's ``cpu`` preset on a CPU and its ``paper`` preset (model, noise multiplicity) on a GPU,
with the accountant left at PLD. :func:`derive_config` probes this device on random public tensors
(:mod:`dpsynth.autoplan.probe`), sizes the DP-SGD sections and the release to ``plan.time_budget``
(:mod:`dpsynth.autoplan.rules`) and records the probe, the decisions and the expected seconds of each phase in
the ``plan`` section; keys the user set (``plan.user_keys``) keep the user's values. The fixed presets stay, and
:func:`check_preset_fits` refuses one whose batch and epochs do not fit the data.
"""
from __future__ import annotations

import copy
import json
import time
from dataclasses import asdict, replace
from typing import Any

import torch

from ..config import (
    SHARED_BY_NAME,
    DerivedPlan,
    PlanSettings,
    PrivacySettings,
    RunConfig,
    SamplingSettings,
    method_name,
    preset_name,
    with_record,
)
from ..data import DatasetInfo
from ..diffusion.settings import sample_steps
from ..errors import ConfigError
from ..evaluation import EvaluationSettings
from ..evaluation.inception import chosen_path
from ..hardware import resolve_bf16, resolve_compile, sampling_rows
from ..methods import get_method
from ..methods.base import Method
from ..training.probes import classifier_cost
from .memory import probe_memory
from .probe import StepCost, Throughput, dpsgd_cost, inception_cost, step_seconds
from .rules import (
    AUTO_PRESET,
    EVALUATION_CUTS,
    MIN_STEPS,
    MIN_STEPS_FROM,
    MethodShape,
    PlanInputs,
    derive,
    dpsgd_steps,
    estimate_seconds,
    evaluation_words,
    held_evaluation,
    multiplicity,
    parse_duration,
    unet_levels,
    user_keys_kept,
)


def base_preset(method: type[Method], device: torch.device) -> str:
    """The fixed preset ``auto`` starts from on ``device``."""
    return "paper" if device.type == "cuda" and "paper" in method.presets else "cpu"


def auto_preset(method: type[Method], device: torch.device) -> dict[str, Any]:
    """The base preset's values, its accountant left at the default (PLD)."""
    values = copy.deepcopy(method.presets[base_preset(method, device)])
    values.get("privacy", {}).pop("accountant", None)
    return values


def plan_inputs(info: DatasetInfo, device: torch.device, images_per_group: float = 1) -> PlanInputs:
    """The public facts a plan reads: N as planning uses it, the shape, the classes; validation and test sizes as
    the published sizes give them (never the files' counts), else estimated as N / 8 each (a private split's exact
    size must not steer a released setting); with
    groups, ``images_per_group`` images per group (a noisy mean, or the cap)."""
    per_unit = images_per_group if info.unit == "group" else 1
    estimate = int(info.num_train * per_unit // 8)
    sizes = info.public_held_out if info.size_rule == "published" and info.public_held_out else {
        "val": estimate, "test": estimate}
    return PlanInputs(info.num_train, info.shape, info.num_classes, sizes.get("val", 0), sizes.get("test", 0),
                      str(device), per_unit, info.release_side)


def method_shape(method: type[Method]) -> MethodShape:
    return MethodShape(method.dpsgd_sections, method.public_sections, method.releases_soft_labels,
                       method.phase_units, method.sized_phase, method.release_units)


CHUNK_SIDE = 32  # the side at which the base preset's chunk sizes hold on a CPU (:func:`chunked`)
MEASURED: dict[str, Throughput] = {}  # this process's probes, by what they measured


def measure(method: Method, config: RunConfig, inputs: PlanInputs, device: torch.device) -> Throughput:
    """Probe ``device`` for a run of ``config``: its DP-SGD sections, sampling, public training, the evaluation's
    classifiers and Inception (once per process for the same models, shapes and device)."""
    cls = type(method)
    timed = (*cls.dpsgd_sections, *cls.public_sections, *cls.probed_keys, "model", "diffusion", "sampling",
             "evaluation")
    key = json.dumps([cls.declaration.name, inputs.shape, inputs.evaluation_shape, inputs.num_classes, inputs.num_train,
                      str(device), {name: _value(cls, config, name) for name in timed}], sort_keys=True, default=str)
    if key not in MEASURED:
        MEASURED[key] = _probe(method, config, inputs, device)
    return MEASURED[key]


def _value(method: type[Method], config: RunConfig, key: str) -> Any:
    """A section (``generator``) or key (``alignment.iterations``) of ``config`` as ``method`` reads it; None for a
    section the method has not."""
    section, _, name = key.partition(".")
    if section not in method.sections and section not in SHARED_BY_NAME:
        return None
    values = method.settings(config, section)
    return getattr(values, name) if name else asdict(values)


def _probe(method: Method, config: RunConfig, inputs: PlanInputs, device: torch.device) -> Throughput:
    start = time.perf_counter()
    probes = method.throughput_probes(inputs.shape, inputs.num_classes, device)
    dpsgd = {section: dpsgd_cost(probe, device, inputs.num_train, rows) for section, (probe, rows)
             in probes.dpsgd.items()}
    evaluation = EvaluationSettings.of(config)
    names = evaluation.classifiers if evaluation.enabled else ()
    classifiers = {name: classifier_cost(name, inputs.evaluation_shape, inputs.num_classes,
                                         evaluation.classifier_batch_size, device) for name in names}
    path, _ = chosen_path(evaluation.fast_inception)
    inception = inception_cost(device, path, evaluation.inception_batch_size) if evaluation.enabled else 0.0
    sampling = probes.sampling() if probes.sampling else 0.0
    public = probes.public() if probes.public else 0.0
    phases = {name: per_unit() for name, per_unit in probes.phases.items()}
    return Throughput(str(device), dpsgd, sampling, public, classifiers, inception, time.perf_counter() - start,
                      phases)


STEP_TOLERANCE = 0.05  # a planned step measured within this share of its price keeps the probe's line
CHECKED: dict[str, float] = {}  # this process's measured planned steps, by what they measured
# On a CPU, a step sustained over a run costs more than one timed step: over the recorded runs (2 cores, AMX Xeon and
# AVX2 EPYC, 28-128 px, 0.3-4.5 s a step) the training loop's steps took 1.09x the step the plan priced plus 0.09 s
# (least squares: within 5 % of 8 of 9 runs, the ninth 13 % faster).
SUSTAINED_SHARE, SUSTAINED_FIXED = 1.09, 0.09


def sustained_seconds(seconds: float) -> float:
    """A CPU step of ``seconds`` as timed once, sustained over a run."""
    return SUSTAINED_SHARE * seconds + SUSTAINED_FIXED


def sustained(throughput: Throughput, device: torch.device) -> tuple[Throughput, list[str]]:
    """On a CPU, the DP-SGD step costs scaled to a step sustained over a run (:func:`sustained_seconds`), in
    words."""
    if device.type != "cpu" or not throughput.dpsgd:
        return throughput, []
    costs = {section: StepCost(sustained_seconds(cost.fixed), cost.per_row * SUSTAINED_SHARE)
             for section, cost in throughput.dpsgd.items()}
    return replace(throughput, dpsgd=costs), [
        f"DP-SGD steps priced sustained: {SUSTAINED_SHARE:g}x a timed step plus {SUSTAINED_FIXED:g} s, as the "
        "recorded runs' steps took on a CPU"]


def checked_steps(method: Method, config: RunConfig, overrides: dict[str, dict[str, Any]], inputs: PlanInputs,
                  throughput: Throughput, device: torch.device) -> tuple[Throughput, list[str]]:
    """The sustained DP-SGD step costs (:func:`sustained`) checked, on a CPU, against one measured step of the
    planned batch of each section that spans more than the two chunks the probe's line was fitted through, sustained
    alike: where it took more or less than :data:`STEP_TOLERANCE` off its price, that section's line scaled to it,
    with the decision in words."""
    if device.type != "cpu":  # a GPU's steps are near linear in the batch (measured on an H200)
        return throughput, []
    costs, words = dict(throughput.dpsgd), []
    for section, (probe, _) in method.throughput_probes(inputs.shape, inputs.num_classes, device).dpsgd.items():
        planned = replace(method.settings(config, section), **overrides.get(section, {}))
        examples = max(1, round(planned.batch_size * inputs.images_per_unit))  # each with its rows, as probed
        if examples <= 2 * probe.physical_batch_size:  # within the chunks the probe's line was fitted through
            continue
        priced = inputs.cost(throughput, section).seconds(planned.batch_size * multiplicity(planned))
        key = json.dumps([method.declaration.name, inputs.shape, section, examples, probe.physical_batch_size,
                          str(device)])
        if key not in CHECKED:  # once per process for the same step
            CHECKED[key] = step_seconds(probe, device, max(round(inputs.num_train * inputs.images_per_unit),
                                                           examples), examples)
        measured = sustained_seconds(CHECKED[key])
        ratio = measured / priced
        if abs(ratio - 1) > STEP_TOLERANCE:
            cost = costs[section]
            costs[section] = StepCost(cost.fixed * ratio, cost.per_row * ratio)
            words.append(f"{section}: a step of the planned batch measured {CHECKED[key]:.2f} s ({measured:.2f} s "
                         f"sustained) against {priced:.2f} s priced; steps priced at {ratio:.2f}x the probe's line")
    return replace(throughput, dpsgd=costs), words


def compiles_sampling(config: RunConfig, side: int, device: torch.device) -> bool:
    """Whether the release's sampler (images of ``side`` px) will be compiled
    (:func:`dpsynth.hardware.resolve_compile`)."""
    sampling = SamplingSettings.of(config)
    bf16 = resolve_bf16(sampling.bf16, device, "sampling.bf16").value
    work = sampling.num_samples * sample_steps(config)
    return bool(work) and resolve_compile(sampling.compile, device, bf16, work, side, sampling_rows(config)).value


def derive_config(config: RunConfig, info: DatasetInfo, device: torch.device, spent: float = 0.0) -> RunConfig:
    """``config`` (preset ``auto``) with the plan for ``info`` on ``device`` applied and recorded (``derived``), for
    the time budget less the ``spent`` seconds; a config of a fixed preset, checked to fit the data
    (:func:`check_preset_fits`), unchanged."""
    method_cls = get_method(method_name(config))
    if preset_name(config) != AUTO_PRESET:
        check_preset_fits(method_cls, config, info)
        return config
    plan, found = config.section("plan"), config.derived
    if found.probe is not None:  # derived already
        return config
    shape = method_shape(method_cls)
    inputs = plan_inputs(info, device, group_images(config))
    budget, kept = parse_duration(plan.time_budget) - spent, list(plan.user_keys)
    side = method_cls.model_shape(config, inputs.shape)[1]  # what its UNet sees: DP-LDM's latents, say
    config, decisions = deepened(method_cls, config, side, kept)
    decisions = [*(found.decisions or ()), *decisions]  # a choice made before the plan (its training side)
    chunked_config, decisions = chunked(method_cls, config, side, device, kept, decisions)
    if info.unit == "group" and method_cls.dpsgd_sections:
        decisions.append(group_price(config, inputs.images_per_unit))
    probed = method_cls(chunked_config)  # the method at the chunked config, whose probes price the plan
    throughput, words = sustained(measure(probed, chunked_config, inputs, device), device)
    decisions += words
    compiles = lambda trial: compiles_sampling(trial, inputs.shape[1], device)  # noqa: E731
    overrides, sized = derive(chunked_config, shape, inputs, throughput, budget, compiles, kept)
    checked, words = checked_steps(probed, chunked_config, overrides, inputs, throughput, device)
    if words:  # the planned step's measured time differs: the batch and steps sized again at it
        throughput = checked
        overrides, sized = derive(chunked_config, shape, inputs, throughput, budget, compiles, kept)
    decisions += [*sized, *words]
    planned = chunked_config.replaced(user_keys_kept(overrides, kept), "the derived plan")
    if device.type == "cuda":
        chunks = user_keys_kept(fitting_chunks(method_cls, planned, inputs, device, decisions), kept)
        planned = planned.replaced(chunks, "the derived plan's memory estimate")
    compiled = compiles_sampling(planned, inputs.shape[1], device)
    expected = estimate_seconds(planned, shape, inputs, throughput, compiled)
    return with_record(planned, DerivedPlan, base=base_preset(method_cls, device), probe=throughput.to_dict(),
                       decisions=decisions,
                       expected_seconds={phase: round(seconds, 1) for phase, seconds in expected.items()})


HOLD_SLACK = 0.05  # of the budget: a planned evaluation that overruns it by no more is kept (not cut) at run time


def budget_held(config: RunConfig, info: DatasetInfo, device: torch.device, elapsed: float, fitted: float
                ) -> tuple[dict[str, Any], str]:
    """The evaluation keys a derived plan's run changes to hold ``plan.time_budget`` after ``elapsed`` seconds of
    the command, ``fitted`` of them in training and the release (:func:`~dpsynth.autoplan.rules.held_evaluation`:
    at the pace of those against the plan's seconds for them, at least 1): cut where the planned evaluation does not
    fit what is left (and :data:`HOLD_SLACK` of the budget more), restored towards the base preset's where the plan
    cut it and more fits; and the decision in words. Nothing for a fixed preset, a plan without evaluation, or a
    run whose planned evaluation is the one that fits. Reads the plan's probe and public sizes only."""
    plan, found = PlanSettings.of(config), config.derived
    if found.probe is None or not found.expected_seconds or not EvaluationSettings.of(config).enabled:
        return {}, ""
    expected = found.expected_seconds
    ratio = fitted / max(expected["total"] - expected["evaluation"] - expected["startup"], 1.0)
    budget = parse_duration(plan.time_budget)
    left, slack = budget - elapsed, HOLD_SLACK * budget
    inputs = plan_inputs(info, device, group_images(config))
    method = get_method(method_name(config))
    changes, seconds = held_evaluation(config, inputs, Throughput.from_dict(found.probe),
                                       method.releases_soft_labels, left, max(ratio, 1.0), plan.user_keys,
                                       uncut_evaluation(method, found.base), slack)
    if not changes:
        return {}, ""
    planned = EvaluationSettings.of(config)
    restored = any(value > getattr(planned, key.split(".", 1)[1]) for key, value in changes.items())
    words = (f"evaluation {'restored within' if restored else 'cut to hold'} plan.time_budget {plan.time_budget}: "
             f"training and the release took {fitted / 60:.1f} min, {ratio:.2f}x their plan, and "
             f"{max(left, 0.0) / 60:.1f} min are left; {evaluation_words(changes)} ({seconds / 60:.1f} min"
             f"{' at that pace' if ratio > 1 else ''})")
    if seconds > left + slack:
        words += "; the minimum evaluation is kept, past the budget"
    return changes, words


def uncut_evaluation(method: type[Method], base: str | None) -> dict[str, Any]:
    """The ``base`` preset's values of the evaluation keys a plan cuts (:data:`EVALUATION_CUTS`); none without a
    base."""
    if base is None:
        return {}
    settings = EvaluationSettings.from_config(method.presets[base].get("evaluation", {}))
    return {key: getattr(settings, key.split(".", 1)[1]) for cut in EVALUATION_CUTS for key in cut}


def group_images(config: RunConfig) -> float:
    """The images a plan prices a person's share of a DP-SGD step at: the run's noisy mean of them where it drew one,
    else the most a step reads (``privacy.max_images_per_group``)."""
    return config.drawn.images_per_group or PrivacySettings.of(config).max_images_per_group


def group_price(config: RunConfig, images: float) -> str:
    """How a person's share of a DP-SGD step is priced, in words."""
    privacy = PrivacySettings.of(config)
    if config.drawn.images_per_group is not None:
        return (f"a person's share of a step is priced at {images:g} images: a noisy mean of their images, each "
                f"person's capped at privacy.max_images_per_group {privacy.max_images_per_group} (stage "
                "images-per-group)")
    return (f"a person's share of a step is priced at {images:g} images (privacy.max_images_per_group, the most a step "
            "reads of one; a run prices by a noisy mean of their images unless you set it)")


def deepened(method: type[Method], config: RunConfig, side: int, kept: list[str]) -> tuple[RunConfig, list[str]]:
    """``config`` with its UNet one level deeper per doubling of the side past 32 (:func:`unet_levels`) unless
    the user set ``model.block_channels``, and the decision in words."""
    if "model" not in method.sections or "model.block_channels" in kept:
        return config, []
    widths = unet_levels(config.section("model").block_channels, side)
    if widths == list(config.section("model").block_channels):
        return config, []
    deeper = config.replaced({"model": {"block_channels": widths}}, "the derived plan")
    return deeper, [f"UNet widths {widths}: a level per halving of {side} px down to 8 x 8"]


def chunked(method: type[Method], config: RunConfig, side: int, device: torch.device, kept: list[str],
            decisions: list[str]) -> tuple[RunConfig, list[str]]:
    """On a CPU, ``config`` with its DP-SGD chunks (``physical_batch_size``) and a diffusion model's sampling
    chunks (``sampling.batch_size``) shrunk past :data:`CHUNK_SIDE` px, keys the user set aside: each to the
    largest divisor of its value within (:data:`CHUNK_SIDE` / side)^2 of it, so a chunk holds about as many pixels
    as the base preset's and still divides the release. Chunks of 128 examples of 128 px measured twice as slow
    per example as chunks of 8 on 2 cores (a chunk's activations outgrow the caches and the allocator's reuse)."""
    if device.type != "cpu" or side <= CHUNK_SIDE:
        return config, decisions
    keys = [f"{section}.physical_batch_size" for section in method.dpsgd_sections]
    keys += ["sampling.batch_size"] if "diffusion" in config else []
    chunks: dict[str, dict[str, Any]] = {}
    for key in (key for key in keys if key not in kept):
        section, name = key.split(".")
        value = getattr(config.section(section), name)
        within = max(1.0, value * (CHUNK_SIDE / side) ** 2)
        chunks.setdefault(section, {})[name] = max(d for d in range(1, value + 1) if value % d == 0 and d <= within)
    shrunk = [f"{section}.{name} {chunk}" for section, values in chunks.items() for name, chunk in values.items()]
    if not shrunk:
        return config, decisions
    words = f"chunks of about the base preset's pixels at {CHUNK_SIDE} px: {', '.join(shrunk)}"
    return config.replaced(chunks, "the derived plan"), [*decisions, words]


def fitting_chunks(method: type[Method], config: RunConfig, inputs: PlanInputs, device: torch.device,
                   decisions: list[str]) -> dict[str, dict[str, Any]]:
    """Each DP-SGD section's physical batch: the most examples (at the planned noise multiplicity) whose chunk
    the memory estimate fits into the card (:mod:`dpsynth.autoplan.memory`), at most the batch."""
    card = torch.cuda.get_device_properties(device).total_memory
    probes = method(config).throughput_probes(inputs.shape, inputs.num_classes, device)
    chunks: dict[str, dict[str, Any]] = {}
    for section, (probe, _) in probes.dpsgd.items():
        memory = probe_memory(probe)
        examples = min(memory.largest_fitting(card), method.settings(config, section).batch_size)
        chunks[section] = {"physical_batch_size": examples}
        decisions.append(f"{section}: chunks of {examples} examples, estimated {memory.bytes(examples) / 2 ** 30:.1f} "
                         f"GiB of the card's {card / 2 ** 30:.0f} GiB ({memory.parameters / 1e6:.2f}M parameters)")
    return chunks


def check_preset_fits(method: type[Method], config: RunConfig, info: DatasetInfo) -> None:
    """ConfigError, with the fix, when a fixed preset's own DP-SGD batch exceeds the data or plans fewer than
    :data:`MIN_STEPS` steps on 500 images or more (a user's own batch and epochs are not second-guessed)."""
    chosen = PlanSettings.of(config).user_keys
    for section in method.dpsgd_sections:
        if f"{section}.batch_size" in chosen or f"{section}.epochs" in chosen:
            continue
        values = method.settings(config, section)
        batch, steps = values.batch_size, dpsgd_steps(values, info.num_train)
        fix = (f"use --preset auto (the default), which sizes the batch and steps to the data, or set "
               f"{section}.batch_size and {section}.epochs")
        if batch > info.num_train:
            raise ConfigError(f"preset {preset_name(config)!r} samples batches of {batch:,} ({section}.batch_size), "
                              f"more than the {info.num_train:,} training images of {info.name}; {fix}")
        if info.num_train >= MIN_STEPS_FROM and steps < MIN_STEPS:
            raise ConfigError(f"preset {preset_name(config)!r} plans {steps} DP-SGD steps ({section}) on the "
                              f"{info.num_train:,} training images of {info.name} (batch {batch:,}, "
                              f"{values.epochs:g} epochs), too few to train; {fix}")


