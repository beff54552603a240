"""Privacy audits: the canary harness that turns a threshold test into a lower bound on epsilon, and one canary
design per mechanism the methods run on private data (``dpsynth audit``)."""
from .designs import AUDITS, BROKEN
from .harness import AuditResult, Trial, clopper_pearson_upper, epsilon_from_rates, lower_bound, run_audit

__all__ = ["AUDITS", "BROKEN", "AuditResult", "Trial", "clopper_pearson_upper", "epsilon_from_rates", "lower_bound",
           "run_audit"]
