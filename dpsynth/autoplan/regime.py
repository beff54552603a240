"""Whether a DP-SGD plan will learn, read from recorded outcomes: the plan's noise per example and steps beside the
measured runs nearest to them, and a refusal where every record around the plan learned nothing.

At a fixed number of steps T, what DP-SGD learns follows the noise each example carries in a step, sigma / B (the
noise multiplier over the expected batch; TAN, Sander et al. 2023). The package ships the outcomes of the
committed measured runs (``outcomes.json``, written by ``benchmarks/regime_records.py`` from
``benchmarks/results``): each run's data, image side, N, B, T, sigma and the CNN accuracy of its release against
the same CNN's chance. A record *learned* when its accuracy is at least halfway from chance to 100 %, learned
*nothing* when it is within a tenth of that way from chance.

A plan is compared with the records of its kind of start (from random weights, or from a public model):

- **will not learn** when a record that learned nothing had at most the plan's side (a larger image is no easier),
  at least half its steps and no less signal against its noise, sqrt(T) / (sigma / B) (the signal-to-noise ratio
  the plan's rules trade steps and batch by; a record with less noise and more steps always has more): the run is
  refused before anything is spent, unless ``plan.force`` is set;
- **expected to learn** when a record that learned had at least the plan's noise per example, at most its steps
  and at least its side;
- **untested** otherwise: printed with the nearest records, not refused.

The decision reads sigma (calibrated from epsilon, delta, the sample rate and T), B, T and the side: public or noisy
facts the plan already uses, never the private images.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, fields
from functools import cache
from importlib import resources
from typing import Any, Literal

OUTCOMES_FILE = "outcomes.json"
LEARNED_SHARE, NOTHING_SHARE = 0.5, 0.1  # of the way from chance to 100 % accuracy
STEPS_REACH = 2  # a record that learned nothing speaks for plans of up to this multiple of its steps
Verdict = Literal["learns", "untested", "fails"]
VERDICT_ORDER: tuple[Verdict, ...] = ("learns", "untested", "fails")  # best first
Start = Literal["random", "public model"]


class DpsgdRatios:
    """The two ratios a DP-SGD run (its noise multiplier ``sigma``, expected batch ``batch``, ``steps``) is placed
    by: the noise per example sigma/B and the signal-to-noise sqrt(T) B / sigma."""

    sigma: float
    batch: float
    steps: int

    @property
    def noise_per_example(self) -> float:
        return self.sigma / self.batch

    @property
    def signal_to_noise(self) -> float:
        return math.sqrt(self.steps) / self.noise_per_example


@dataclass(frozen=True)
class Outcome(DpsgdRatios):
    """One measured run: where it is recorded, its method, data, side, start, N (units), expected batch B, steps T,
    noise multiplier sigma, the CNN's accuracy on the real test images and its chance level, the machine, the date."""

    record: str
    method: str
    data: str
    side: int
    start: Start
    units: int
    batch: float
    steps: int
    sigma: float
    accuracy: float
    chance: float
    machine: str
    date: str

    @property
    def learned(self) -> bool:
        return self.accuracy >= self.chance + LEARNED_SHARE * (1 - self.chance)

    @property
    def learned_nothing(self) -> bool:
        return self.accuracy <= self.chance + NOTHING_SHARE * (1 - self.chance)

    def words(self) -> str:
        result = "learned" if self.learned else "learned nothing" if self.learned_nothing else "learned a little"
        return (f"{self.data} at {self.side} px, N = {self.units:,}: sigma/B {self.noise_per_example:.3g}, "
                f"T = {self.steps:,} -> CNN {self.accuracy:.1%} (chance {self.chance:.0%}), {result} "
                f"[{self.record}, {self.machine}, {self.date}]")

    def to_dict(self) -> dict[str, Any]:
        return {spec.name: getattr(self, spec.name) for spec in fields(self)}


@cache
def recorded_outcomes() -> tuple[Outcome, ...]:
    """The outcomes shipped with dpsynth (``dpsynth/autoplan/outcomes.json``)."""
    text = resources.files(__package__).joinpath(OUTCOMES_FILE).read_text()
    return tuple(Outcome(**row) for row in json.loads(text)["outcomes"])


@dataclass(frozen=True)
class PlannedTraining(DpsgdRatios):
    """What the check reads of a DP-SGD plan: its stage, sigma, expected batch B (units), steps T, side, start."""

    stage: str
    sigma: float
    batch: float
    steps: int
    side: int
    start: Start


@dataclass(frozen=True)
class Assessment:
    """A plan's verdict, the records that decided it and the nearest records in the (sigma/B, T) plane."""

    plan: PlannedTraining
    verdict: Verdict
    deciding: tuple[Outcome, ...]
    nearest: tuple[Outcome, ...]

    def lines(self) -> list[str]:
        """The assessment in words, for ``dpsynth privacy`` and ``dpsynth run``."""
        plan = self.plan
        head = {"learns": "expected to learn: a recorded run with as much noise per example and no more steps learned",
                "fails": "will NOT learn: a recorded run with at least half the steps and more signal against its "
                         "noise, sqrt(T) / (sigma/B), learned nothing",
                "untested": "untested: no recorded run brackets this plan"}[self.verdict]
        lines = [f"{plan.stage}: noise per example sigma/B = {plan.sigma:.3g} / {plan.batch:.4g} = "
                 f"{plan.noise_per_example:.3g} over T = {plan.steps:,} steps at {plan.side} px "
                 f"({plan.start} start): {head}"]
        shown = list(dict.fromkeys((*self.deciding[:1], *self.nearest)))
        lines += [f"  {'deciding' if outcome in self.deciding[:1] else 'nearest'}: {outcome.words()}"
                  for outcome in shown]
        return lines


def assess(plan: PlannedTraining, outcomes: tuple[Outcome, ...] | None = None, nearest: int = 3) -> Assessment:
    """The verdict on ``plan`` from ``outcomes`` (the shipped records by default), as the module docstring says."""
    outcomes = recorded_outcomes() if outcomes is None else outcomes
    alike = [outcome for outcome in outcomes if outcome.start == plan.start]
    failures = [outcome for outcome in alike if outcome.learned_nothing and outcome.side <= plan.side
                and outcome.signal_to_noise >= plan.signal_to_noise and outcome.steps >= plan.steps / STEPS_REACH]
    successes = [outcome for outcome in alike if outcome.learned and outcome.side >= plan.side
                 and outcome.noise_per_example >= plan.noise_per_example and outcome.steps <= plan.steps]
    by_distance = sorted(alike, key=lambda outcome: distance(plan, outcome))
    if failures:
        return Assessment(plan, "fails", tuple(sorted(failures, key=lambda o: distance(plan, o))),
                          tuple(by_distance[:nearest]))
    if successes:
        return Assessment(plan, "learns", tuple(sorted(successes, key=lambda o: distance(plan, o))),
                          tuple(by_distance[:nearest]))
    return Assessment(plan, "untested", (), tuple(by_distance[:nearest]))


def distance(plan: PlannedTraining, outcome: Outcome) -> float:
    """How far ``outcome`` lies from ``plan`` in the (log sigma/B, log T) plane."""
    return math.hypot(math.log(plan.noise_per_example / outcome.noise_per_example),
                      math.log(plan.steps / outcome.steps))


def least_noise_per_example(units: int, epsilon: float, steps: int, sample_rate: float) -> float:
    """The noise per example sigma / B of ``steps`` DP-SGD steps at ``sample_rate`` over ``units`` people (or
    images) calibrated to ``epsilon`` at the default delta: at a fixed epsilon it falls only about as
    sqrt(steps x ln(1 / delta)) / (epsilon x N), whatever the batch."""
    from ..privacy.accountant import Accountant, default_delta
    from ..privacy.events import SubsampledGaussianMechanism

    sigma = Accountant().calibrate([], lambda noise: SubsampledGaussianMechanism(noise, sample_rate, steps), epsilon,
                                   default_delta(units))
    return sigma / (sample_rate * units)
