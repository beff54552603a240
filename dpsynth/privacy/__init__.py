"""Privacy: mechanism events, the ledger they are written to, one accountant, calibration and reports."""
from .accountant import ACCOUNTANTS, Accountant, default_delta
from .events import (
    Event,
    GaussianMechanism,
    LaplaceMechanism,
    NonPrivateAccess,
    ParallelComposition,
    ReportNoisyMax,
    SubsampledGaussianMechanism,
)
from .ledger import LedgerPlan, PrivacyLedger
from .planning import DpsgdSchedule, PlannedStage, check_within_plan, plan_budget
from .report import budget_report, ledger_report, non_private_stages

__all__ = [
    "ACCOUNTANTS", "Accountant", "DpsgdSchedule", "Event", "GaussianMechanism", "LaplaceMechanism", "LedgerPlan",
    "NonPrivateAccess", "ParallelComposition", "PlannedStage", "PrivacyLedger", "ReportNoisyMax",
    "SubsampledGaussianMechanism",
    "budget_report", "check_within_plan", "default_delta", "ledger_report", "non_private_stages", "plan_budget",
]
