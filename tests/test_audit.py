"""Privacy audits: the bound's statistics, every mechanism's canary audit, and a broken mechanism caught."""
from __future__ import annotations

import math
import subprocess
import sys

import numpy as np
import pytest

from dpsynth.privacy import Accountant, GaussianMechanism
from dpsynth.privacy.audit import AUDITS, clopper_pearson_upper, epsilon_from_rates, lower_bound, run_audit

DELTA = 1e-5


def test_clopper_pearson_upper_bound_of_zero_failures_has_its_closed_form():
    assert clopper_pearson_upper(0, 1000, 0.975) == pytest.approx(1 - 0.025 ** (1 / 1000))
    assert clopper_pearson_upper(1000, 1000, 0.975) == 1.0
    assert 0.05 < clopper_pearson_upper(50, 1000, 0.975) < 0.07


def test_epsilon_from_rates_is_the_dp_inequality_solved_for_epsilon():
    assert epsilon_from_rates(0.01, 0.5, 0.0) == pytest.approx(math.log(0.5 / 0.01))
    assert epsilon_from_rates(0.5, 0.5, 0.0) == 0.0  # a coin flip forces nothing


def test_on_gaussian_scores_the_bound_is_within_a_factor_two_of_the_gaussian_mechanisms_epsilon():
    rng = np.random.default_rng(0)
    trials = 200_000
    claimed = Accountant("pld").epsilon([GaussianMechanism(1.0)], DELTA)
    bound = lower_bound(rng.normal(0, 1, trials), rng.normal(1, 1, trials), DELTA)
    assert claimed / 2 < bound < claimed


@pytest.mark.parametrize(("mechanism", "trials", "least"), [
    ("dp-sgd-step", 3_000, 0.5), ("mean-images", 10_000, 0.5), ("frequency-features", 5_000, 0.5),
    ("pe-histogram", 5_000, 0.5), ("groupnorm-statistics", 2_000, 0.2), ("mode-images", 5_000, 0.0),
    ("report-noisy-max", 100_000, 0.3), ("merf-features", 3_000, 0.3), ("semantic-histogram", 5_000, 0.5),
])
def test_no_mechanism_leaks_more_than_its_ledger_claims(mechanism, trials, least):
    result = run_audit(mechanism, AUDITS[mechanism](), trials, DELTA)
    assert result.claimed_epsilon > 0  # the mechanism recorded itself
    assert least <= result.lower_bound <= result.claimed_epsilon  # the audit has power, and finds no leak


def test_the_audit_catches_noise_divided_by_the_batch_size_twice():
    result = run_audit("broken-gaussian-sum", AUDITS["broken-gaussian-sum"](), 10_000, DELTA)
    assert result.lower_bound > result.claimed_epsilon + 2


def test_dpsynth_audit_prints_a_table_and_flags_a_bound_above_the_claim():
    done = subprocess.run([sys.executable, "-m", "dpsynth", "audit", "report-noisy-max", "broken-gaussian-sum",
                           "--trials", "2000"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    rows = done.stdout.splitlines()
    assert rows[0].split()[:3] == ["mechanism", "claimed", "eps"]
    assert rows[1].startswith("report-noisy-max") and "ABOVE" not in rows[1]
    assert rows[2].startswith("broken-gaussian-sum") and rows[2].endswith("LOWER BOUND ABOVE THE CLAIM")
