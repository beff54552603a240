"""Privacy reports: each stage's mechanism and share of the budget, as in every run's privacy.json."""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from .accountant import Accountant
from .events import Event, ParallelComposition, SimpleEvent, SubsampledGaussianMechanism
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
    steps: dict[tuple[str, float, float], int] = {}
    for event in flat:
        key = (event.kind, event.noise_multiplier, getattr(event, "sample_rate", 1.0))
        steps[key] = steps.get(key, 0) + _repetitions(event)
    summary: dict[str, Any] = {"name": name, "mechanisms": [
        {"mechanism": kind, "noise_multiplier": noise, "sample_rate": rate, "steps": count}
        for (kind, noise, rate), count in steps.items()]}
    if partitions:
        summary["partitions"] = partitions
    return summary


def _repetitions(event: SimpleEvent) -> int:
    return event.steps if isinstance(event, SubsampledGaussianMechanism) else event.count


def budget_report(stages: Mapping[str, Sequence[Event]], accountant: Accountant, delta: float) -> dict[str, Any]:
    """Total epsilon of the stages composed, and each stage's description and share.

    ``epsilon_share`` is the increase in total epsilon when the stage joins the ones before it (the
    shares add up to the total); ``epsilon_alone`` is the stage's epsilon on its own.
    """
    rows, so_far, spent = [], [], 0.0
    for name, events in stages.items():
        so_far += list(events)
        total = accountant.epsilon(so_far, delta)
        row = describe_stage(name, events, accountant, delta)
        row["epsilon_share"] = total - spent
        row["epsilon_alone"] = accountant.epsilon(events, delta)
        rows.append(row)
        spent = total
    return {"epsilon": spent, "delta": delta, "accountant": accountant.kind, "stages": rows}


def ledger_report(ledger: PrivacyLedger, accountant: Accountant, delta: float) -> dict[str, Any]:
    """The report of a run's ledger: synthesis budget, plus the evaluation budget when it was used."""
    report = budget_report(ledger.stages("synthesis"), accountant, delta)
    evaluation = ledger.stages("evaluation")
    if evaluation:
        report["evaluation"] = budget_report(evaluation, accountant, delta)
    return report
