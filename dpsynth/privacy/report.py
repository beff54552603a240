"""Privacy reports: each stage's mechanism and share of the budget, as in every run's privacy.json."""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from .accountant import Accountant
from .events import Event, NonPrivateAccess, ParallelComposition, SimpleEvent, SubsampledGaussianMechanism
from .ledger import PrivacyLedger


def _worst_part(event: ParallelComposition, accountant: Accountant, delta: float) -> tuple[SimpleEvent, ...]:
    return max(event.parts.values(), key=lambda part: accountant.epsilon(part, delta))


def describe_stage(name: str, events: Sequence[Event], accountant: Accountant, delta: float) -> dict[str, Any]:
    """Name and mechanisms of a stage (of its worst partition if per-class): one entry per kind of
    mechanism, noise multiplier and sample rate, with the number of times it ran."""
    flat: list[SimpleEvent] = []
    partitions = 0
    for event in events:
        if isinstance(event, ParallelComposition):
            partitions = max(partitions, len(event.parts))
            flat += _worst_part(event, accountant, delta)
        else:
            flat.append(event)
    steps: dict[tuple[str, float | None, float], int] = {}
    for event in flat:
        key = (event.kind, getattr(event, "noise_multiplier", None), getattr(event, "sample_rate", 1.0))
        steps[key] = steps.get(key, 0) + _repetitions(event)
    summary: dict[str, Any] = {"name": name, "mechanisms": [
        {"mechanism": kind, "noise_multiplier": noise, "sample_rate": rate, "steps": count}
        for (kind, noise, rate), count in steps.items()]}
    if partitions:
        summary["partitions"] = partitions
    return summary


def _repetitions(event: SimpleEvent) -> int:
    return event.steps if isinstance(event, SubsampledGaussianMechanism) else event.count


def non_private_stages(stages: Mapping[str, Sequence[Event]]) -> list[str]:
    """The stages that used the private data without noise."""
    return [name for name, events in stages.items() if any(isinstance(e, NonPrivateAccess) for e in events)]


def _finite(value: float) -> float | None:
    return value if math.isfinite(value) else None


def budget_report(stages: Mapping[str, Sequence[Event]], accountant: Accountant, delta: float) -> dict[str, Any]:
    """Total epsilon of the stages composed, and each stage's description and share.

    ``epsilon_share`` is the increase in total epsilon when the stage joins the ones before it (the
    shares add up to the total); ``epsilon_alone`` is the stage's epsilon on its own. A stage that used
    the data without noise (:class:`NonPrivateAccess`) voids the guarantee: ``dp_guarantee`` is false
    and every epsilon from it on is None (JSON null), never a number.
    """
    rows, so_far, spent = [], [], 0.0
    for name, events in stages.items():
        so_far += list(events)
        total = accountant.epsilon(so_far, delta)
        row = describe_stage(name, events, accountant, delta)
        row["epsilon_share"] = _finite(total - spent) if math.isfinite(spent) else None
        row["epsilon_alone"] = _finite(accountant.epsilon(events, delta))
        rows.append(row)
        spent = total
    if not math.isfinite(spent):  # no stage's own epsilon either: none could be taken for the run's
        rows = [{**row, "epsilon_alone": None} for row in rows]
    return {"epsilon": _finite(spent), "dp_guarantee": math.isfinite(spent), "delta": delta,
            "accountant": accountant.kind, "stages": rows}


def ledger_report(ledger: PrivacyLedger, accountant: Accountant, delta: float) -> dict[str, Any]:
    """The report of a run's ledger: synthesis budget, plus the evaluation budget when it was used."""
    report = budget_report(ledger.stages("synthesis"), accountant, delta)
    evaluation = ledger.stages("evaluation")
    if evaluation:
        report["evaluation"] = budget_report(evaluation, accountant, delta)
    return report
