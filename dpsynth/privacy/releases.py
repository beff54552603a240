"""The holder's ledger: every release made from one data set, in a private per-user store, so that the ε of all of
them together is known (and capped) before the next one runs.

A release is entered when its run begins, at the mechanisms its plan will run, and rewritten with the mechanisms that
ran when it is released; a run that never released stays counted at its plan until the holder marks it not shared.
All entries of one data set are composed by the accountant (never summed by hand), at the smallest δ among them.
"""
from __future__ import annotations

import contextlib
import fcntl
import json
import math
import os
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from ..errors import PrivacyError
from ..utils.io import atomic_write_json
from .accountant import Accountant
from .events import Event, event_from_dict, event_to_dict

RELEASES_VARIABLE = "DPSYNTH_RELEASES"
DEFAULT_STORE = "~/.local/share/dpsynth/releases.json"
_FORMAT_VERSION = 1


def store_path() -> Path:
    """Where the holder's ledger is kept: ``$DPSYNTH_RELEASES``, else ``~/.local/share/dpsynth/releases.json``."""
    return Path(os.environ.get(RELEASES_VARIABLE) or DEFAULT_STORE).expanduser()


@dataclass(frozen=True)
class HeldRelease:
    """One run's release from the data set ``data`` (:func:`~dpsynth.planning.data_key`): its mechanisms by stage
    (planned while ``status`` is ``running``, spent once ``released``), its (ε, δ), unit (person, image, or the
    holder's name for a person) and whether the holder shared it."""

    data: str
    run: str
    method: str
    unit: str
    started: str
    status: str
    delta: float
    accountant: str
    stages: Mapping[str, Sequence[Event]]
    epsilon: float | None = None
    released: str | None = None
    shared: bool = True

    def events(self) -> list[Event]:
        return [event for events in self.stages.values() for event in events]

    def to_dict(self) -> dict[str, Any]:
        stages = {name: [event_to_dict(event) for event in events] for name, events in self.stages.items()}
        return {**asdict(self), "stages": stages}

    @classmethod
    def from_dict(cls, data: dict[str, Any], path: Path) -> HeldRelease:
        try:
            stages = {name: [event_from_dict(event) for event in events] for name, events in data["stages"].items()}
            return cls(**{**data, "stages": stages})
        except (KeyError, TypeError, AttributeError) as exc:
            raise PrivacyError(f"{path}: malformed release entry ({exc}); the holder's ledger must not be edited "
                               "by hand") from None


@dataclass(frozen=True)
class Total:
    """The ε of ``releases`` composed at ``delta`` (None: one of them has no DP guarantee)."""

    releases: tuple[HeldRelease, ...]
    epsilon: float | None
    delta: float
    accountant: str

    def words(self) -> str:
        count = len(self.releases)
        together = "alone" if count == 1 else f"all {count} together"
        if self.epsilon is None:
            return f"{together}: NO differential-privacy guarantee (a release used the data without noise)"
        return (f"{together}: ε = {self.epsilon:.4f} at δ = {self.delta:.3g}, composed by the {self.accountant} "
                "accountant")


class HolderLedger:
    """The releases in the store at ``path`` (:func:`store_path`), read and written under a file lock, the file and
    its folder readable by their owner alone."""

    def __init__(self, path: str | Path | None = None) -> None:
        self.path = Path(path) if path is not None else store_path()

    def releases(self, data: str | None = None) -> list[HeldRelease]:
        """Every release (of the data set ``data`` when given), in the order they began."""
        return [entry for entry in self._read() if data is None or entry.data == data]

    def counted(self, data: str, without: str | None = None) -> list[HeldRelease]:
        """The releases of ``data`` that count towards its total: all but those marked not shared (and ``without``,
        a run directory)."""
        return [entry for entry in self.releases(data) if entry.shared and entry.run != without]

    def begin(self, entry: HeldRelease) -> None:
        """Enter a run at its plan; a run already entered (a resumed one) is kept as it is."""
        with self._locked() as entries:
            if not any(known.run == entry.run for known in entries):
                entries.append(entry)

    def release(self, run: str, stages: Mapping[str, Sequence[Event]], epsilon: float | None) -> None:
        """Rewrite the run's entry with the mechanisms that ran and its ε, as released today."""
        with self._locked() as entries:
            index = self._index(entries, run)
            entries[index] = replace(entries[index], stages=dict(stages), epsilon=epsilon, status="released",
                                     released=time.strftime("%Y-%m-%d", time.gmtime()))

    def mark(self, run: str, shared: bool) -> HeldRelease:
        """Mark the run's release shared or never shared (kept listed either way); the entry as it now stands."""
        with self._locked() as entries:
            index = self._index(entries, run)
            entries[index] = replace(entries[index], shared=shared)
            return entries[index]

    def _index(self, entries: list[HeldRelease], run: str) -> int:
        matches = [i for i, entry in enumerate(entries) if entry.run == run]
        if not matches:
            raise PrivacyError(f"{self.path}: no release of the run {run} in the holder's ledger")
        return matches[0]

    def _read(self) -> list[HeldRelease]:
        if not self.path.exists():
            return []
        try:
            data = json.loads(self.path.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise PrivacyError(f"{self.path}: the holder's ledger is unreadable ({exc}); restore it from a backup "
                               "before releasing more from the same data") from None
        if not isinstance(data, dict) or data.get("version") != _FORMAT_VERSION or not isinstance(
                data.get("releases"), list):
            raise PrivacyError(f"{self.path}: not a version-{_FORMAT_VERSION} holder's ledger")
        return [HeldRelease.from_dict(entry, self.path) for entry in data["releases"]]

    @contextlib.contextmanager
    def _locked(self) -> Iterator[list[HeldRelease]]:
        """The entries, to change in place; written back atomically (mode 0600) under an exclusive lock."""
        self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        lock = os.open(self.path.with_name(self.path.name + ".lock"), os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX)
            entries = self._read()
            yield entries
            atomic_write_json(self.path, {"version": _FORMAT_VERSION,
                                          "releases": [entry.to_dict() for entry in entries]})
        finally:
            os.close(lock)


def total(releases: Sequence[HeldRelease], accountant: str | None = None) -> Total:
    """The ε of ``releases`` composed by one accountant (``accountant``, else the newest release's) at the smallest
    δ among them."""
    if not releases:
        raise PrivacyError("no releases to compose")
    kind = accountant or releases[-1].accountant
    delta = min(entry.delta for entry in releases)
    epsilon = Accountant(kind).epsilon([event for entry in releases for event in entry.events()], delta)
    return Total(tuple(releases), epsilon if math.isfinite(epsilon) else None, delta, kind)
