"""Privacy events: what a mechanism that touched private data did, in accountant-neutral terms.

Every noise parameter is a *noise multiplier*: the noise scale divided by the query's sensitivity
(L2 sensitivity for Gaussian noise, L1 for Laplace noise), under add / remove-one adjacency.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import Any

import dp_accounting as dpa
from dp_accounting import dp_event

from ..errors import PrivacyError


def _check_positive(value: float, what: str) -> None:
    if not value > 0:
        raise PrivacyError(f"{what} must be positive, got {value}")


@dataclass(frozen=True)
class _Repeated:
    """A mechanism run ``count`` times with one noise multiplier; consecutive runs merge into one event."""

    noise_multiplier: float
    count: int = 1

    def __post_init__(self) -> None:
        _check_positive(self.noise_multiplier, "noise_multiplier")
        _check_positive(self.count, "count")

    def merged(self, other: Event) -> Event | None:
        if type(other) is type(self) and other.noise_multiplier == self.noise_multiplier:
            return replace(self, count=self.count + other.count)
        return None


@dataclass(frozen=True)
class GaussianMechanism(_Repeated):
    """``count`` Gaussian mechanisms on the whole dataset, noise std = noise_multiplier x L2 sensitivity."""

    kind: str = field(default="gaussian", init=False)

    def to_dp_event(self) -> dpa.DpEvent:
        return dpa.SelfComposedDpEvent(dpa.GaussianDpEvent(self.noise_multiplier), self.count)


@dataclass(frozen=True)
class SubsampledGaussianMechanism:
    """``steps`` Gaussian mechanisms, each on a Poisson sample with inclusion probability ``sample_rate``."""

    noise_multiplier: float
    sample_rate: float
    steps: int = 1
    kind: str = field(default="subsampled_gaussian", init=False)

    def __post_init__(self) -> None:
        _check_positive(self.noise_multiplier, "noise_multiplier")
        _check_positive(self.steps, "steps")
        if not 0 < self.sample_rate <= 1:
            raise PrivacyError(f"sample_rate must lie in (0, 1], got {self.sample_rate}")

    def to_dp_event(self) -> dpa.DpEvent:
        step = dpa.PoissonSampledDpEvent(self.sample_rate, dpa.GaussianDpEvent(self.noise_multiplier))
        return dpa.SelfComposedDpEvent(step, self.steps)

    def merged(self, other: Event) -> Event | None:
        if not isinstance(other, SubsampledGaussianMechanism):
            return None
        if (other.noise_multiplier, other.sample_rate) != (self.noise_multiplier, self.sample_rate):
            return None
        return replace(self, steps=self.steps + other.steps)


@dataclass(frozen=True)
class LaplaceMechanism(_Repeated):
    """``count`` Laplace mechanisms, noise scale b = noise_multiplier x L1 sensitivity."""

    kind: str = field(default="laplace", init=False)

    def to_dp_event(self) -> dpa.DpEvent:
        return dpa.SelfComposedDpEvent(dpa.LaplaceDpEvent(self.noise_multiplier), self.count)


@dataclass(frozen=True)
class ReportNoisyMax(_Repeated):
    """``count`` Report Noisy Max selections over monotone sensitivity-1 scores (e.g. correct counts).

    With Laplace noise of scale b = noise_multiplier, each selection is (1 / b)-DP under add / remove
    adjacency (Dwork & Roth, Claim 3.9). Its privacy loss is not that of one Laplace release, so it is
    accounted as the worst case of every epsilon-DP mechanism: the two-point loss +-epsilon of binary
    randomized response, which is exactly the loss of the discrete Laplace mechanism DLap(epsilon) on a
    sensitivity-1 integer query (the event dp-accounting supports under add / remove adjacency).
    """

    kind: str = field(default="report_noisy_max", init=False)

    @property
    def epsilon(self) -> float:
        return 1.0 / self.noise_multiplier

    def to_dp_event(self) -> dpa.DpEvent:
        return dpa.SelfComposedDpEvent(dp_event.DiscreteLaplaceDpEvent(self.epsilon, 1), self.count)


@dataclass(frozen=True)
class ParallelComposition:
    """Mechanisms run on disjoint partitions of the data, e.g. one per class (``partition_by='label'``).

    A record lies in exactly one partition, so it is exposed only to that partition's events. Parallel
    compositions that share ``partition_by`` partition the data the same way (a record's label is its
    label everywhere), so the accountant pairs their parts by key.
    """

    partition_by: str
    parts: dict[str, tuple[SimpleEvent, ...]]
    kind: str = field(default="parallel", init=False)

    def __post_init__(self) -> None:
        if not self.parts:
            raise PrivacyError("a parallel composition needs at least one partition")
        if any(isinstance(e, ParallelComposition) for events in self.parts.values() for e in events):
            raise PrivacyError("parallel compositions cannot be nested")

    def merged(self, other: Event) -> Event | None:
        return None


def per_class(events: tuple[SimpleEvent, ...], num_classes: int, grouped: bool) -> tuple[Event, ...]:
    """What the same ``events`` run for every class cost. Each image is of one class, so over images the classes
    compose in parallel. A group's images may be of several classes: weighted to add at most one image's worth
    to all classes' releases together (:meth:`~dpsynth.data.ImageSet.unit_weights`), a group moves the classes'
    releases, side by side, by at most one image's sensitivity, so with groups (``grouped``) each event is one
    mechanism on that joint vector (a subsampled one samples the groups once for all classes): the same cost
    as one class's part of the parallel composition, recorded as what it is."""
    if grouped:
        return events
    return (ParallelComposition("label", {str(c): events for c in range(num_classes)}),)


@dataclass(frozen=True)
class NonPrivateAccess:
    """``count`` uses of the private data with no noise (e.g. non-private training): no epsilon covers them.

    Allowed only when a run opts in (``run.allow_non_private``); any composition holding it has epsilon
    infinity, so the run's reports say it has no differential-privacy guarantee.
    """

    count: int = 1
    kind: str = field(default="non_private", init=False)

    def __post_init__(self) -> None:
        _check_positive(self.count, "count")

    def to_dp_event(self) -> dpa.DpEvent:
        return dpa.SelfComposedDpEvent(dpa.NonPrivateDpEvent(), self.count)

    def merged(self, other: Event) -> Event | None:
        return replace(self, count=self.count + other.count) if isinstance(other, NonPrivateAccess) else None


SimpleEvent = GaussianMechanism | SubsampledGaussianMechanism | LaplaceMechanism | ReportNoisyMax | NonPrivateAccess
Event = SimpleEvent | ParallelComposition
_SIMPLE = {cls.kind: cls for cls in (GaussianMechanism, SubsampledGaussianMechanism, LaplaceMechanism,
                                      ReportNoisyMax, NonPrivateAccess)}


def event_to_dict(event: Event) -> dict[str, Any]:
    """JSON-ready form of an event."""
    if isinstance(event, ParallelComposition):
        parts = {key: [event_to_dict(e) for e in events] for key, events in event.parts.items()}
        return {"kind": event.kind, "partition_by": event.partition_by, "parts": parts}
    return asdict(event)


def event_from_dict(data: dict[str, Any]) -> Event:
    """Inverse of :func:`event_to_dict`; PrivacyError on an unknown or malformed record."""
    fields = dict(data)
    kind = fields.pop("kind", None)
    if kind == "parallel":
        parts = {key: tuple(_simple_from_dict(e) for e in events) for key, events in fields["parts"].items()}
        return ParallelComposition(fields["partition_by"], parts)
    return _simple_from_dict(data)


def _simple_from_dict(data: dict[str, Any]) -> SimpleEvent:
    fields = dict(data)
    kind = fields.pop("kind", None)
    if kind not in _SIMPLE:
        raise PrivacyError(f"unknown privacy event kind {kind!r} in the ledger")
    try:
        return _SIMPLE[kind](**fields)
    except TypeError as exc:
        raise PrivacyError(f"malformed {kind} event {data}: {exc}") from None
