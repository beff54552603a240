"""Empirical lower bounds on epsilon (Jagielski et al. 2020; Nasr et al. 2021): canaries and hypothesis tests.

An audit runs a mechanism many times on a dataset D and on D plus a canary record, and reduces each output to
one number (the distinguisher's score, larger when the canary looks present). A threshold on the score is a
test between D and D'; (epsilon, delta)-DP forces, for every test,

    FPR + e^eps FNR >= 1 - delta   and   FNR + e^eps FPR >= 1 - delta,

so ``log((1 - delta - FPR) / FNR)`` (and its mirror) bounds epsilon from below. The threshold is chosen on
the first half of the trials and the rates are measured on the second half, with one-sided Clopper-Pearson
upper bounds at 97.5 % each, so the reported bound holds with 95 % confidence. A lower bound above the
claimed epsilon means the mechanism, its accounting, or the claim is wrong.
"""
from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from scipy.stats import beta

from ..errors import ConfigError
from ..privacy.accountant import Accountant
from ..privacy.ledger import PrivacyLedger
from ..privacy.randomness import SecretStream, derived_key

# score(with_canary, ledger, noise): one run of the mechanism, reduced to the distinguisher's score
Trial = Callable[[bool, PrivacyLedger, SecretStream], float]
CONFIDENCE = 0.95
_THRESHOLDS = 200


@dataclass(frozen=True)
class AuditResult:
    """The claimed epsilon (from the ledger of one run), the 95 % lower bound, and what it cost."""

    mechanism: str
    claimed_epsilon: float
    lower_bound: float
    delta: float
    trials: int
    seconds: float


def clopper_pearson_upper(failures: int, trials: int, level: float) -> float:
    """One-sided upper confidence bound, at ``level``, on a rate of which ``failures`` of ``trials`` were seen."""
    return 1.0 if failures >= trials else float(beta.ppf(level, failures + 1, trials - failures))


def epsilon_from_rates(false_positive: float, false_negative: float, delta: float) -> float:
    """The largest epsilon the two error rates of one test force (0 when they force none)."""
    bounds = [0.0]
    for first, second in ((false_positive, false_negative), (false_negative, false_positive)):
        if second > 0 and 1 - delta - first > 0:
            bounds.append(math.log((1 - delta - first) / second))
    return max(bounds)


def _rates(without: np.ndarray, with_canary: np.ndarray, threshold: float) -> tuple[int, int]:
    """False positives (score > threshold without the canary) and false negatives (<= with it)."""
    return int((without > threshold).sum()), int((with_canary <= threshold).sum())


def lower_bound(without: np.ndarray, with_canary: np.ndarray, delta: float) -> float:
    """The 95 % lower bound on epsilon from the scores of runs without and with the canary."""
    half = len(without) // 2
    level = 1 - (1 - CONFIDENCE) / 2  # two upper bounds, each at 97.5 %: both hold together with 95 %

    def bound(scores_without: np.ndarray, scores_with: np.ndarray, threshold: float) -> float:
        false_positives, false_negatives = _rates(scores_without, scores_with, threshold)
        return epsilon_from_rates(clopper_pearson_upper(false_positives, len(scores_without), level),
                                  clopper_pearson_upper(false_negatives, len(scores_with), level), delta)

    pooled = np.concatenate([without[:half], with_canary[:half]])
    tails = np.logspace(-6, -1, _THRESHOLDS // 2)  # the best thresholds sit far out in one tail
    candidates = np.unique(np.quantile(pooled, np.concatenate([np.linspace(0, 1, _THRESHOLDS), tails, 1 - tails])))
    best = max(candidates, key=lambda t: bound(without[:half], with_canary[:half], t))
    return bound(without[half:], with_canary[half:], best)


def run_audit(name: str, trial: Trial, trials: int, delta: float, seed: int = 0) -> AuditResult:
    """``trials`` runs of ``trial`` without and with the canary; the claim is the PLD epsilon of one run's
    ledger (what the mechanism recorded), at ``delta``."""
    if trials < 100:
        raise ConfigError(f"an audit needs at least 100 trials, got {trials}")
    start, noise = time.perf_counter(), SecretStream(derived_key(seed, "audit"))  # an audit may be seeded
    ledger = PrivacyLedger()
    trial(False, ledger, noise)
    claimed = Accountant("pld").epsilon(ledger.events(), delta) if ledger.events() else 0.0
    scores = {canary: np.array([trial(canary, PrivacyLedger(), noise) for _ in range(trials)])
              for canary in (False, True)}
    return AuditResult(name, claimed, lower_bound(scores[False], scores[True], delta), delta, trials,
                       time.perf_counter() - start)
