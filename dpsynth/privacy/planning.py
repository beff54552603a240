"""Budget planning: fixed-noise stages, then one stage whose noise is calibrated to meet the target."""
from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

from ..errors import PrivacyError
from .accountant import Accountant
from .events import Event, NonPrivateAccess, SimpleEvent, SubsampledGaussianMechanism


@dataclass(frozen=True)
class PlannedStage:
    """A stage of a method: either a fixed ``event`` (or a tuple of events run in turn) or a ``calibrated`` family
    event(sigma); ``noise_free``: the calibrated stage can also run without noise (an infinite target epsilon)."""

    name: str
    event: Event | tuple[Event, ...] | None = None
    calibrated: Callable[[float], SimpleEvent] | None = None
    noise_free: bool = False

    def __post_init__(self) -> None:
        if (self.event is None) == (self.calibrated is None):
            raise PrivacyError(f"stage {self.name!r} needs exactly one of a fixed event or a calibrated family")

    def fixed_events(self) -> list[Event]:
        """The fixed events, in the order they run (none for a calibrated stage)."""
        if self.event is None:
            return []
        return list(self.event) if isinstance(self.event, tuple) else [self.event]


def plan_budget(
    stages: list[PlannedStage], target_epsilon: float, delta: float, accountant: Accountant
) -> dict[str, list[Event]]:
    """Each stage's event, the calibrated stages sharing one noise multiplier set so the plan meets the target.

    Stages that use the data without noise (:class:`NonPrivateAccess`, an explicit opt-in) are left out
    of the calibration: the private stages then meet the target on their own, and the run's reports
    state that no epsilon covers the whole run. An infinite target runs the calibrated stages without noise.
    """
    if math.isinf(target_epsilon):
        return {stage.name: stage.fixed_events() or [without_noise(stage)] for stage in stages}
    fixed = {stage.name: stage.fixed_events() for stage in stages if stage.event is not None}
    private = [event for events in fixed.values() for event in events if not isinstance(event, NonPrivateAccess)]
    families = {stage.name: stage.calibrated for stage in stages if stage.calibrated is not None}
    if not families:
        spent = accountant.epsilon(private, delta)
        if spent > target_epsilon:
            raise PrivacyError(f"the planned stages spend epsilon = {spent:.4g}, over the target {target_epsilon:g}")
        return fixed
    sigma = accountant.calibrate(private, lambda s: [family(s) for family in families.values()], target_epsilon,
                                 delta)
    resolved: dict[str, list[Event]] = {**fixed, **{name: [family(sigma)] for name, family in families.items()}}
    return {stage.name: resolved[stage.name] for stage in stages}


def without_noise(stage: PlannedStage) -> NonPrivateAccess:
    """A calibrated stage's uses of the data, without noise; PrivacyError if the stage cannot run so."""
    assert stage.calibrated is not None
    if not stage.noise_free:
        raise PrivacyError(f"stage {stage.name!r} cannot run without noise, so an infinite epsilon does not apply "
                           "to this method; give a finite privacy.epsilon")
    event = stage.calibrated(1.0)
    return NonPrivateAccess(event.steps if isinstance(event, SubsampledGaussianMechanism) else 1)


@dataclass(frozen=True)
class DpsgdSchedule:
    """Poisson-sampled DP-SGD: expected batch B out of N records, for a number of epochs."""

    batch_size: int
    epochs: float
    dataset_size: int

    def __post_init__(self) -> None:
        if not 0 < self.batch_size <= self.dataset_size:
            raise PrivacyError(f"batch_size must lie in [1, {self.dataset_size}] (the private set's size), "
                               f"got {self.batch_size}")
        if not self.epochs > 0:
            raise PrivacyError(f"epochs must be positive, got {self.epochs}")

    @property
    def sample_rate(self) -> float:
        return self.batch_size / self.dataset_size

    @property
    def steps(self) -> int:
        """int(epochs / q), as Opacus counts them."""
        return max(1, int(self.epochs / self.sample_rate))

    def event(self, noise_multiplier: float) -> SubsampledGaussianMechanism:
        return SubsampledGaussianMechanism(noise_multiplier, self.sample_rate, self.steps)


def check_within_plan(recorded: Mapping[str, Sequence[Event]], plan: Mapping[str, Sequence[Event]],
                      allow_non_private: bool, complete: bool = False) -> None:
    """PrivacyError unless every recorded stage is planned and its events are a beginning of the planned ones
    (same mechanisms and noise, no more steps), so the epsilon spent stays within the plan's; a stage that
    used the data without noise needs ``allow_non_private``. ``complete``: every planned event has run."""
    for stage, events in recorded.items():
        if stage not in plan:
            raise PrivacyError(f"stage {stage!r} ran a mechanism the privacy plan does not hold "
                               f"(planned stages: {', '.join(plan) or 'none'}); nothing is released")
        if any(isinstance(event, NonPrivateAccess) for event in events) and not allow_non_private:
            raise PrivacyError(f"stage {stage!r} used the private data without noise, and run.allow_non_private "
                               "is off; stopped")
        if not _begins(events, plan[stage]):
            raise PrivacyError(f"stage {stage!r} ran {list(events)}, beyond its plan {list(plan[stage])}; stopped")
    unfinished = [stage for stage, events in plan.items() if list(recorded.get(stage, [])) != list(events)]
    if complete and unfinished:
        raise PrivacyError(f"stage(s) {', '.join(unfinished)} did not run as planned; nothing is released")


def _begins(events: Sequence[Event], planned: Sequence[Event]) -> bool:
    """``events`` are ``planned`` up to a point, the last of them possibly with fewer repetitions."""
    if not events:
        return True
    if len(events) > len(planned) or list(events[:-1]) != list(planned[:len(events) - 1]):
        return False
    last, target = events[-1], planned[len(events) - 1]
    repeats = next((name for name in ("steps", "count") if hasattr(target, name)), None)
    return last == target or (repeats is not None and type(last) is type(target)
                              and getattr(last, repeats) <= getattr(target, repeats)
                              and replace(last, **{repeats: getattr(target, repeats)}) == target)
