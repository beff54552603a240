"""One accountant, built on Google's dp-accounting, that turns privacy events into (epsilon, delta)."""
from __future__ import annotations

import functools
import itertools
import logging
import math
from collections.abc import Callable, Sequence

import dp_accounting as dpa
import numpy as np
from dp_accounting import dp_event, pld, rdp
from dp_accounting.pld.privacy_loss_distribution import PrivacyLossDistribution as PLD
from dp_accounting.pld.privacy_loss_distribution import from_gaussian_mechanism

from ..config import ACCOUNTANTS
from ..errors import PrivacyError
from .events import Event, ParallelComposition, SimpleEvent

COARSE_GRID = 10  # PLD calibration searches on a grid this many times coarser (see _calibrate_scenario)
Scenario = tuple[SimpleEvent, ...]

# dp-accounting's RDP logs a warning for every order whose series does not converge; those orders are
# simply skipped, which is sound, so the warnings only add noise to the console.
logging.getLogger("absl").setLevel(logging.ERROR)


def default_delta(n: int) -> float:
    """DPImageBench's delta for a private set of size n: 1 / (n ln n)."""
    if n < 2:
        raise PrivacyError(f"the private training set needs at least 2 records, has {n}")
    return 1.0 / (n * math.log(n))


def scenarios(events: Sequence[Event]) -> list[Scenario]:
    """The distinct sequences of simple events one record can be exposed to.

    A record lies in one part of each partitioning (e.g. one class for ``partition_by='label'``), so it
    sees every non-parallel event plus, for each partitioning, the parts with one key. The privacy loss
    of the whole composition is the worst over these scenarios.
    """
    shared: list[SimpleEvent] = []
    by_partitioning: dict[str, list[ParallelComposition]] = {}
    for event in events:
        if isinstance(event, ParallelComposition):
            by_partitioning.setdefault(event.partition_by, []).append(event)
        else:
            shared.append(event)
    choices = []
    for group in by_partitioning.values():
        keys = sorted({key for event in group for key in event.parts})
        choices.append([tuple(e for event in group for e in event.parts.get(key, ())) for key in keys])
    unique = {tuple(shared) + tuple(itertools.chain.from_iterable(combo)) for combo in itertools.product(*choices)}
    return [s for s in sorted(unique, key=repr) if not any(t != s and _dominates(t, s) for t in unique)]


def _dominates(worse: Scenario, better: Scenario) -> bool:
    """True when ``worse`` leaks at least as much as ``better`` at every (epsilon, delta).

    Event by event, same mechanism with no more noise, no lower sampling rate and no fewer repetitions:
    each mechanism's privacy profile is monotone in those, and composition keeps the order.
    """
    if len(worse) != len(better):
        return False
    for w, b in zip(worse, better, strict=True):
        if type(w) is not type(b) or getattr(w, "noise_multiplier", 0) > getattr(b, "noise_multiplier", 0):
            return False
        if getattr(w, "sample_rate", 1.0) < getattr(b, "sample_rate", 1.0):
            return False
        if getattr(w, "steps", getattr(w, "count", 1)) < getattr(b, "steps", getattr(b, "count", 1)):
            return False
    return True


def two_point_rdp(epsilon: float, orders: np.ndarray) -> np.ndarray:
    """Renyi divergences of the pair (p, 1 - p) vs (1 - p, p) with p = e^eps / (1 + e^eps), at ``orders``.

    This is the binary randomized-response pair: the worst case of epsilon-DP, and exactly the discrete
    Laplace mechanism DLap(epsilon) on a sensitivity-1 query.
    """
    log_p, log_q = -np.logaddexp(0.0, -epsilon), -np.logaddexp(0.0, epsilon)
    return np.logaddexp(orders * log_p + (1 - orders) * log_q, orders * log_q + (1 - orders) * log_p) / (orders - 1)


class _RdpAccountant(rdp.RdpAccountant):
    """dp-accounting's RDP accountant, plus the discrete Laplace mechanism at sensitivity 1."""

    def _maybe_compose(self, event: dpa.DpEvent, count: int, do_compose: bool):  # type: ignore[no-untyped-def]
        if isinstance(event, dp_event.DiscreteLaplaceDpEvent) and event.sensitivity == 1:
            if do_compose:
                self._rdp += count * two_point_rdp(event.noise_parameter, self._orders)
            return None
        return super()._maybe_compose(event, count, do_compose)


class _PldAccountant(pld.PLDAccountant):
    """dp-accounting's PLD accountant, with the PLDs of Poisson-subsampled Gaussian steps memoised: a run's plan,
    progress bar, release check and report compose the same DP-SGD step again and again, and building its PLD
    is most of an epsilon's cost (seconds). The values are dp-accounting's, unchanged."""

    def _maybe_compose(self, event: dpa.DpEvent, count: int, do_compose: bool):  # type: ignore[no-untyped-def]
        if (isinstance(event, dp_event.PoissonSampledDpEvent) and isinstance(event.event, dp_event.GaussianDpEvent)
                and event.sampling_probability > 0 and event.event.noise_multiplier > 0):
            if do_compose:
                self._pld = self._pld.compose(_subsampled_gaussian_pld(  # type: ignore[has-type]
                    event.event.noise_multiplier, event.sampling_probability, count,
                    self._value_discretization_interval, self.neighboring_relation))
            return None
        return super()._maybe_compose(event, count, do_compose)


@functools.lru_cache(maxsize=256)
def _subsampled_gaussian_pld(noise_multiplier: float, sampling_prob: float, count: int, interval: float,
                             relation: dpa.NeighboringRelation) -> PLD:
    """``count`` composed steps of the subsampled Gaussian mechanism, as dp-accounting's PLD accountant builds them
    (PLDs are immutable: composing returns a new one)."""
    return _subsampled_gaussian_step(noise_multiplier, sampling_prob, interval, relation).self_compose(count)


@functools.lru_cache(maxsize=64)
def _subsampled_gaussian_step(noise_multiplier: float, sampling_prob: float, interval: float,
                              relation: dpa.NeighboringRelation) -> PLD:
    return from_gaussian_mechanism(
        standard_deviation=noise_multiplier, value_discretization_interval=interval, sampling_prob=sampling_prob,
        neighboring_relation=relation)


class Accountant:
    """(epsilon, delta) of compositions of events: ``pld`` (tight, default) or ``rdp`` (what papers report)."""

    def __init__(self, kind: str = "pld", pld_discretization: float = 1e-4) -> None:
        if kind not in ACCOUNTANTS:
            raise PrivacyError(f"unknown accountant {kind!r}; expected one of {', '.join(ACCOUNTANTS)}")
        self.kind = kind
        self.pld_discretization = pld_discretization

    def fresh(self) -> dpa.PrivacyAccountant:
        """A new, empty dp-accounting accountant of this kind (add / remove-one adjacency)."""
        if self.kind == "pld":
            return _PldAccountant(value_discretization_interval=self.pld_discretization)
        return _RdpAccountant()

    def _scenario_epsilon(self, scenario: Scenario, delta: float) -> float:
        if not scenario:
            return 0.0
        composed = dpa.ComposedDpEvent([event.to_dp_event() for event in scenario])
        return float(self.fresh().compose(composed).get_epsilon(delta))

    def epsilon(self, events: Sequence[Event], delta: float) -> float:
        """The epsilon at ``delta`` of all ``events`` composed (0 for none)."""
        check_delta(delta)
        return max(self._scenario_epsilon(s, delta) for s in scenarios(events))

    def calibrate(
        self,
        prior: Sequence[Event],
        make_event: Callable[[float], SimpleEvent | Sequence[SimpleEvent]],
        target_epsilon: float,
        delta: float,
        tol: float = 1e-4,
    ) -> float:
        """The smallest noise multiplier sigma such that ``prior`` then ``make_event(sigma)`` meet the target.

        ``make_event`` may return several events (stages that share one noise multiplier). Raises
        PrivacyError when ``prior`` alone already spends the target.
        """
        check_epsilon(target_epsilon)
        spent = self.epsilon(prior, delta)
        if spent >= target_epsilon:
            raise PrivacyError(
                f"earlier stages already spend epsilon = {spent:.4g} of the target {target_epsilon:g} "
                f"(delta = {delta:.3g}); raise the target or give those stages more noise")
        return max(self._calibrate_scenario(s, make_event, target_epsilon, delta, tol) for s in scenarios(prior))

    def _calibrate_scenario(
        self, prior: Scenario, make_event: Callable[[float], SimpleEvent | Sequence[SimpleEvent]], target: float,
        delta: float, tol: float
    ) -> float:
        """Calibrate with RDP first (cheap at any sigma), then, for PLD, search just below RDP's answer.

        PLD needs less noise than RDP, and evaluating PLD at a tiny sigma over thousands of steps takes
        gigabytes, so its search stays within [sigma_rdp / 2, 1.05 sigma_rdp]. The search runs on a grid
        ``COARSE_GRID`` times coarser (5-8x faster; pessimistic PLDs only overstate epsilon, so its sigma
        is at most ~0.1 % too large), and its answer is checked once on the accountant's own grid; the fine
        search runs only if that check fails.
        """
        prior_events = [event.to_dp_event() for event in prior]

        def composed(sigma: float) -> dpa.DpEvent:
            made = make_event(sigma)
            events = made if isinstance(made, Sequence) else [made]
            return dpa.ComposedDpEvent(prior_events + [event.to_dp_event() for event in events])

        sigma_rdp = _calibrate(rdp.RdpAccountant, composed, target, delta, dpa.LowerEndpointAndGuess(0.05, 1.0), tol)
        if self.kind == "rdp":
            return sigma_rdp
        bracket = dpa.ExplicitBracketInterval(0.5 * sigma_rdp, 1.05 * sigma_rdp)
        coarse = Accountant(self.kind, self.pld_discretization * COARSE_GRID)
        sigma = _calibrate(coarse.fresh, composed, target, delta, bracket, tol)
        if self.fresh().compose(composed(sigma)).get_epsilon(delta) <= target:
            return sigma
        return _calibrate(self.fresh, composed, target, delta, bracket, tol)


def _calibrate(
    fresh: Callable[[], dpa.PrivacyAccountant],
    composed: Callable[[float], dpa.DpEvent],
    target: float,
    delta: float,
    bracket: dpa.ExplicitBracketInterval | dpa.LowerEndpointAndGuess,
    tol: float,
) -> float:
    try:
        return float(dpa.calibrate_dp_mechanism(fresh, composed, target, delta, bracket, tol=tol))
    except dpa.mechanism_calibration.NoBracketIntervalFoundError:
        raise PrivacyError(f"no noise multiplier meets epsilon = {target:g} at delta = {delta:.3g}") from None
    except ValueError:
        raise PrivacyError(
            f"epsilon = {target:g} at delta = {delta:.3g} would need a noise multiplier outside the searched "
            f"range {bracket}; targets that large give no meaningful protection") from None


def check_epsilon(epsilon: float) -> None:
    """PrivacyError unless epsilon is a positive finite number."""
    if not (isinstance(epsilon, (int, float)) and 0 < epsilon < math.inf):
        raise PrivacyError(f"epsilon must be a positive number, got {epsilon!r}")


def check_delta(delta: float) -> None:
    """PrivacyError unless 0 < delta < 1."""
    if not (isinstance(delta, (int, float)) and 0 < delta < 1):
        raise PrivacyError(f"delta must lie strictly between 0 and 1, got {delta!r}")
