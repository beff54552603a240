"""Budget planning: fixed-noise stages, then one stage whose noise is calibrated to meet the target."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ..errors import PrivacyError
from .accountant import Accountant
from .events import Event, NonPrivateAccess, SimpleEvent, SubsampledGaussianMechanism


@dataclass(frozen=True)
class PlannedStage:
    """A stage of a method: either a fixed ``event`` or a ``calibrated`` family event(sigma)."""

    name: str
    event: Event | None = None
    calibrated: Callable[[float], SimpleEvent] | None = None

    def __post_init__(self) -> None:
        if (self.event is None) == (self.calibrated is None):
            raise PrivacyError(f"stage {self.name!r} needs exactly one of a fixed event or a calibrated family")


def plan_budget(
    stages: list[PlannedStage], target_epsilon: float, delta: float, accountant: Accountant
) -> dict[str, list[Event]]:
    """Each stage's event, the calibrated stages sharing one noise multiplier set so the plan meets the target.

    Stages that use the data without noise (:class:`NonPrivateAccess`, an explicit opt-in) are left out
    of the calibration: the private stages then meet the target on their own, and the run's reports
    state that no epsilon covers the whole run.
    """
    fixed = {stage.name: stage.event for stage in stages if stage.event is not None}
    private = [event for event in fixed.values() if not isinstance(event, NonPrivateAccess)]
    families = {stage.name: stage.calibrated for stage in stages if stage.calibrated is not None}
    if not families:
        spent = accountant.epsilon(private, delta)
        if spent > target_epsilon:
            raise PrivacyError(f"the planned stages spend epsilon = {spent:.4g}, over the target {target_epsilon:g}")
        return {name: [event] for name, event in fixed.items()}
    sigma = accountant.calibrate(private, lambda s: [family(s) for family in families.values()], target_epsilon,
                                 delta)
    resolved: dict[str, Event] = {**fixed, **{name: family(sigma) for name, family in families.items()}}
    return {stage.name: [resolved[stage.name]] for stage in stages}


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
