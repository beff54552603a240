"""The privacy ledger: every mechanism that touched private data, appended as it runs."""
from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ..errors import PrivacyError
from ..utils.io import atomic_write_json
from .events import Event, event_from_dict, event_to_dict
from .planning import check_within_plan

BUDGETS = ("synthesis", "evaluation")
_FORMAT_VERSION = 1


@dataclass(frozen=True)
class LedgerEntry:
    """One stage's use of one mechanism; ``budget`` separates synthesis from evaluation spending."""

    stage: str
    event: Event
    budget: str = "synthesis"

    def __post_init__(self) -> None:
        if self.budget not in BUDGETS:
            raise PrivacyError(f"unknown budget {self.budget!r}; expected one of {', '.join(BUDGETS)}")


@dataclass(frozen=True)
class LedgerPlan:
    """What a run may spend: its planned synthesis events by stage, and whether a stage may use the private
    data without noise (``run.allow_non_private``)."""

    stages: Mapping[str, Sequence[Event]]
    allow_non_private: bool = False

    def check(self, recorded: Mapping[str, Sequence[Event]]) -> None:
        """PrivacyError unless ``recorded`` is a beginning of the plan (:func:`check_within_plan`)."""
        check_within_plan(recorded, self.stages, self.allow_non_private)


class PrivacyLedger:
    """An append-only record of privacy events, saved to ``path`` after every append when one is given.

    Consecutive appends of the same mechanism by the same stage merge (1,000 DP-SGD steps become one
    entry with steps = 1000), so the file stays small however long the run.

    A ledger made with a ``plan`` holds only what the plan allows: its ``entries`` are checked when it is
    made, and a synthesis entry that would take a stage beyond the plan raises before it is written (so the
    mechanism, which records before it releases, never runs). A run's ledger always has its plan
    (:class:`~dpsynth.training.context.RunContext` refuses one without); a ledger without one (an audit's, a
    script's) records whatever it is given.
    """

    def __init__(self, path: str | Path | None = None, entries: list[LedgerEntry] | None = None,
                 plan: LedgerPlan | None = None) -> None:
        self.path = Path(path) if path is not None else None
        self._entries: list[LedgerEntry] = list(entries or [])
        self.plan = plan
        if plan is not None:
            plan.check(self.stages())

    def record(self, stage: str, event: Event, budget: str = "synthesis") -> None:
        """Append that ``stage`` ran ``event`` on private data, and save. With a plan, a synthesis entry is
        first checked against it as the synthesis stages would then stand: if that fails, nothing is written."""
        entry = LedgerEntry(stage, event, budget)
        entries = list(self._entries)
        if entries and (entries[-1].stage, entries[-1].budget) == (stage, budget):
            merged = entries[-1].event.merged(event)
            if merged is not None:
                entry = replace(entry, event=merged)
                entries.pop()
        entries.append(entry)
        if self.plan is not None and budget == "synthesis":
            self.plan.check(_grouped(entries, budget))
        self._entries = entries
        self.save()

    def mirror(self, other: PrivacyLedger) -> None:
        """Take ``other``'s entries: a rank > 0 following rank 0's ledger after a stage only rank 0 ran."""
        self._entries = list(other._entries)
        self.save()

    def __iter__(self) -> Iterator[LedgerEntry]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, PrivacyLedger) and self._entries == other._entries

    def events(self, budget: str = "synthesis") -> list[Event]:
        """All events charged to ``budget``, in the order they ran."""
        return [entry.event for entry in self._entries if entry.budget == budget]

    def stages(self, budget: str = "synthesis") -> dict[str, list[Event]]:
        """Events charged to ``budget``, grouped by stage in order of first appearance."""
        return _grouped(self._entries, budget)

    def to_dict(self) -> dict[str, Any]:
        entries = [{"stage": e.stage, "budget": e.budget, "event": event_to_dict(e.event)} for e in self._entries]
        return {"version": _FORMAT_VERSION, "entries": entries}

    @classmethod
    def from_dict(cls, data: dict[str, Any], path: str | Path | None = None,
                  plan: LedgerPlan | None = None) -> PrivacyLedger:
        if data.get("version") != _FORMAT_VERSION or not isinstance(data.get("entries"), list):
            raise PrivacyError(f"{path or 'ledger'}: not a version-{_FORMAT_VERSION} privacy ledger")
        try:
            entries = [LedgerEntry(e["stage"], event_from_dict(e["event"]), e["budget"]) for e in data["entries"]]
        except (KeyError, TypeError) as exc:
            raise PrivacyError(f"{path or 'ledger'}: malformed ledger entry ({exc})") from None
        return cls(path, entries, plan)

    def save(self) -> None:
        """Write the ledger atomically to its path (no-op for an in-memory ledger)."""
        if self.path is not None:
            atomic_write_json(self.path, self.to_dict())

    @classmethod
    def load(cls, path: str | Path) -> PrivacyLedger:
        """Read a ledger saved by :meth:`save`; appends to it continue in the same file."""
        path = Path(path)
        try:
            data = json.loads(path.read_text())
        except FileNotFoundError:
            raise PrivacyError(f"{path}: privacy ledger not found") from None
        except json.JSONDecodeError as exc:
            raise PrivacyError(f"{path}: privacy ledger is not valid JSON ({exc})") from None
        return cls.from_dict(data, path)


def _grouped(entries: list[LedgerEntry], budget: str) -> dict[str, list[Event]]:
    grouped: dict[str, list[Event]] = {}
    for entry in entries:
        if entry.budget == budget:
            grouped.setdefault(entry.stage, []).append(entry.event)
    return grouped
