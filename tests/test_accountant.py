"""The accountant against closed forms and Opacus; calibration round trips; parallel composition."""
from __future__ import annotations

import json
import math

import dp_accounting as dpa
import pytest
from opacus.accountants import RDPAccountant
from opacus.accountants.utils import get_noise_multiplier
from scipy.stats import norm

from dpsynth.errors import PrivacyError
from dpsynth.privacy import (
    Accountant,
    DpsgdSchedule,
    GaussianMechanism,
    LaplaceMechanism,
    NonPrivateAccess,
    ParallelComposition,
    PlannedStage,
    ReportNoisyMax,
    SubsampledGaussianMechanism,
    budget_report,
    default_delta,
    plan_budget,
)
from dpsynth.privacy import accountant as accountant_module
from dpsynth.privacy.accountant import scenarios


def gaussian_delta(epsilon: float, sigma: float) -> float:
    """Balle & Wang (2018): exact delta(epsilon) of the Gaussian mechanism with sensitivity 1, std sigma."""
    return norm.cdf(0.5 / sigma - epsilon * sigma) - math.exp(epsilon) * norm.cdf(-0.5 / sigma - epsilon * sigma)


@pytest.mark.parametrize("sigma, epsilon", [(1.0, 1.0), (0.5, 4.0), (3.0, 0.3)])
def test_pld_matches_analytic_gaussian(sigma, epsilon):
    delta = gaussian_delta(epsilon, sigma)
    assert Accountant("pld").epsilon([GaussianMechanism(sigma)], delta) == pytest.approx(epsilon, rel=2e-3)
    assert Accountant("rdp").epsilon([GaussianMechanism(sigma)], delta) >= epsilon  # RDP is looser, never tighter


def test_gaussian_composition_is_one_gaussian_of_sigma_over_sqrt_t():
    """Private Evolution's CIFAR-10 example: sigma = 5 sqrt 2, T = 20, delta = 1e-5 gives epsilon ~ 2.59."""
    composed = Accountant("pld").epsilon([GaussianMechanism(5 * math.sqrt(2), count=20)], 1e-5)
    single = Accountant("pld").epsilon([GaussianMechanism(5 * math.sqrt(2) / math.sqrt(20))], 1e-5)
    assert composed == pytest.approx(2.59, abs=0.01)
    assert composed == pytest.approx(single, rel=1e-3)


@pytest.mark.parametrize("sigma, q, steps", [(1.0, 0.01, 1000), (2.03, 0.0745, 2014), (14.86, 0.0745, 2014)])
def test_rdp_agrees_with_opacus(sigma, q, steps):
    opacus = RDPAccountant()
    opacus.history = [(sigma, q, steps)]
    ours = Accountant("rdp").epsilon([SubsampledGaussianMechanism(sigma, q, steps)], 1e-5)
    assert ours == pytest.approx(opacus.get_epsilon(1e-5), rel=1e-3)
    assert Accountant("pld").epsilon([SubsampledGaussianMechanism(sigma, q, steps)], 1e-5) < ours


@pytest.mark.parametrize("epsilon", [1.0, 10.0])
def test_calibration_gives_opacus_noise_multiplier(epsilon):
    schedule = DpsgdSchedule(batch_size=4096, epochs=150, dataset_size=55000)
    delta = default_delta(55000)
    ours = Accountant("rdp").calibrate([], schedule.event, epsilon, delta)
    theirs = get_noise_multiplier(target_epsilon=epsilon, target_delta=delta, sample_rate=schedule.sample_rate,
                                  steps=schedule.steps, accountant="rdp", epsilon_tolerance=0.001)
    assert ours == pytest.approx(theirs, rel=2e-3)


@pytest.mark.parametrize("kind", ["pld", "rdp"])
def test_calibration_round_trip(kind):
    accountant, delta = Accountant(kind), 1e-5
    event = lambda sigma: SubsampledGaussianMechanism(sigma, 0.02, 500)  # noqa: E731
    sigma = accountant.calibrate([], event, 3.0, delta)
    assert 2.97 <= accountant.epsilon([event(sigma)], delta) <= 3.0
    assert accountant.epsilon([event(0.98 * sigma)], delta) > 3.0


def _fine_pld_sigma(accountant, event, epsilon, delta, near):
    """dp-accounting's own search on the accountant's grid (within 5 % of ``near``): the coarse search's reference."""
    return dpa.calibrate_dp_mechanism(accountant.fresh, lambda s: event(s).to_dp_event(), epsilon, delta,
                                      dpa.ExplicitBracketInterval(0.95 * near, 1.05 * near), tol=1e-4)


def test_pld_calibration_searches_a_coarse_grid_and_meets_the_target_on_the_fine_one():
    accountant, delta = Accountant("pld"), 1e-5
    event = lambda sigma: SubsampledGaussianMechanism(sigma, 0.05, 100)  # noqa: E731
    sigma = accountant.calibrate([], event, 3.0, delta)
    fine = _fine_pld_sigma(accountant, event, 3.0, delta, sigma)
    assert accountant.epsilon([event(sigma)], delta) <= 3.0
    assert fine <= sigma <= 1.002 * fine


def test_pld_calibration_falls_back_to_the_fine_grid_when_the_coarse_answer_misses(monkeypatch):
    monkeypatch.setattr(accountant_module, "COARSE_GRID", 0.2)  # a finer grid: its sigma is slightly too small
    accountant, delta = Accountant("pld", pld_discretization=1e-3), 1e-5
    event = lambda sigma: SubsampledGaussianMechanism(sigma, 0.05, 40)  # noqa: E731
    sigma = accountant.calibrate([], event, 2.0, delta)
    assert accountant.epsilon([event(sigma)], delta) <= 2.0
    assert sigma == pytest.approx(_fine_pld_sigma(accountant, event, 2.0, delta, sigma), rel=2e-4)


def test_calibration_accounts_for_earlier_stages():
    accountant, delta = Accountant("pld"), 1e-5
    event = lambda sigma: SubsampledGaussianMechanism(sigma, 0.02, 500)  # noqa: E731
    prior = [GaussianMechanism(3.0)]
    alone = accountant.calibrate([], event, 3.0, delta)
    after = accountant.calibrate(prior, event, 3.0, delta)
    assert after > alone
    assert accountant.epsilon(prior + [event(after)], delta) <= 3.0


def test_calibration_refuses_when_earlier_stages_spend_the_target():
    with pytest.raises(PrivacyError, match=r"earlier stages already spend epsilon = 19\.13 of the target 1 "):
        Accountant("pld").calibrate([GaussianMechanism(0.3)], lambda s: GaussianMechanism(s), 1.0, 1e-5)


def test_parallel_composition_costs_the_worst_partition_not_the_sum():
    accountant, delta = Accountant("pld"), 1e-5
    parts = {str(k): (SubsampledGaussianMechanism(2.0, 0.05 + 0.01 * k, 100),) for k in range(5)}
    parallel = ParallelComposition("label", parts)
    worst = accountant.epsilon(parts["4"], delta)
    assert accountant.epsilon([parallel], delta) == pytest.approx(worst)
    sequential = [event for part in parts.values() for event in part]
    assert accountant.epsilon(sequential, delta) > 1.5 * worst


def test_parallel_compositions_pair_by_partition_key():
    """A record of class a sees class a's part of both per-class stages, never a's and b's."""
    first = ParallelComposition("label", {"a": (GaussianMechanism(1.0),), "b": (GaussianMechanism(4.0),)})
    second = ParallelComposition("label", {"a": (GaussianMechanism(4.0),), "b": (GaussianMechanism(1.0),)})
    assert len(scenarios([first, second])) == 2
    accountant = Accountant("pld")
    paired = accountant.epsilon([GaussianMechanism(1.0), GaussianMechanism(4.0)], 1e-5)
    assert accountant.epsilon([first, second], 1e-5) == pytest.approx(paired)


def test_scenarios_keep_partitions_that_do_not_dominate_each_other():
    parts = {"a": (SubsampledGaussianMechanism(1.0, 0.5, 10),), "b": (SubsampledGaussianMechanism(0.5, 0.1, 10),)}
    assert len(scenarios([ParallelComposition("label", parts)])) == 2
    parts["c"] = (SubsampledGaussianMechanism(1.0, 0.4, 10),)  # dominated by "a"
    assert len(scenarios([ParallelComposition("label", parts)])) == 2


def test_laplace_mechanism_is_pure_dp():
    assert Accountant("pld").epsilon([LaplaceMechanism(0.5)], 1e-9) == pytest.approx(2.0, rel=1e-3)


@pytest.mark.parametrize("kind, tolerance", [("pld", 1e-3), ("rdp", 2e-2)])
def test_report_noisy_max_is_charged_its_pure_epsilon(kind, tolerance):
    assert Accountant(kind).epsilon([ReportNoisyMax(2.0)], 1e-6) == pytest.approx(0.5, rel=tolerance)
    # the worst case of pure DP costs more than Laplace releases of the same scale once composed
    assert Accountant(kind).epsilon([ReportNoisyMax(2.0, 8)], 1e-3) > Accountant(kind).epsilon(
        [LaplaceMechanism(2.0, 8)], 1e-3)


def test_two_point_rdp_matches_randomized_response_under_replace_one():
    epsilon, count = 0.7, 5
    reference = dpa.rdp.RdpAccountant(neighboring_relation=dpa.NeighboringRelation.REPLACE_ONE)
    reference.compose(dpa.RandomizedResponseDpEvent(2 / (1 + math.exp(epsilon)), 2), count)
    ours = Accountant("rdp").epsilon([ReportNoisyMax(1 / epsilon, count)], 1e-5)
    assert ours == pytest.approx(reference.get_epsilon(1e-5), rel=1e-9)


def test_default_delta_and_argument_errors():
    assert default_delta(55000) == pytest.approx(1 / (55000 * math.log(55000)))
    with pytest.raises(PrivacyError, match="delta must lie strictly between 0 and 1"):
        Accountant("pld").epsilon([GaussianMechanism(1.0)], 1.5)
    with pytest.raises(PrivacyError, match="epsilon must be a positive number"):
        Accountant("pld").calibrate([], GaussianMechanism, 0.0, 1e-5)
    with pytest.raises(PrivacyError, match="unknown accountant 'moments'"):
        Accountant("moments")
    with pytest.raises(PrivacyError, match="sample_rate must lie in"):
        SubsampledGaussianMechanism(1.0, 1.5)
    with pytest.raises(PrivacyError, match="batch_size must lie in"):
        DpsgdSchedule(batch_size=100, epochs=1, dataset_size=50)


def test_stages_calibrated_together_share_one_noise_multiplier_and_meet_the_target():
    accountant, delta = Accountant("pld"), 1e-5
    teacher, student = DpsgdSchedule(100, 3.0, 10000), DpsgdSchedule(100, 1.0, 10000)
    plan = plan_budget([PlannedStage("teacher", calibrated=teacher.event),
                        PlannedStage("student", calibrated=student.event)], 4.0, delta, accountant)
    (first,), (second,) = plan["teacher"], plan["student"]
    assert first.noise_multiplier == second.noise_multiplier
    assert (first.steps, second.steps) == (300, 100)
    assert 3.99 < accountant.epsilon([first, second], delta) <= 4.0
    together = DpsgdSchedule(100, 4.0, 10000)  # the same steps as one stage need the same noise
    assert accountant.calibrate([], together.event, 4.0, delta) == pytest.approx(first.noise_multiplier, rel=1e-3)


def test_non_private_access_has_no_epsilon_and_no_number_in_reports():
    accountant, delta = Accountant("pld"), 1e-5
    assert accountant.epsilon([GaussianMechanism(5.0), NonPrivateAccess(3)], delta) == math.inf
    plan = plan_budget([PlannedStage("teacher", event=NonPrivateAccess(10)),
                        PlannedStage("student", calibrated=DpsgdSchedule(100, 1.0, 10000).event)], 2.0, delta,
                       accountant)
    (student,) = plan["student"]  # calibrated as if alone: the paper's (unsound) argument, made explicit
    assert 1.99 < accountant.epsilon([student], delta) <= 2.0
    report = budget_report(plan, accountant, delta)
    assert report["dp_guarantee"] is False and report["epsilon"] is None
    assert [row[key] for row in report["stages"] for key in ("epsilon_share", "epsilon_alone")] == [None] * 4
    json.dumps(report, allow_nan=False)  # no Infinity / NaN in the JSON
