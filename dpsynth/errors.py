"""User-facing errors: the CLI prints their message without a traceback."""
from __future__ import annotations


class DpsynthError(Exception):
    """A problem the user can fix (bad input, missing file, impossible budget)."""


class DataError(DpsynthError):
    """A dataset file is missing, corrupt or inconsistent."""


class ConfigError(DpsynthError):
    """A configuration key or value is unknown or invalid."""


class PrivacyError(DpsynthError):
    """A privacy budget cannot be met or a privacy record is inconsistent."""


class AuditFailure(DpsynthError):
    """A privacy audit found a lower bound on epsilon above a mechanism's claim: ``dpsynth audit`` exits 1 (bad
    input exits 2)."""

    exit_code = 1


class AuditCrash(DpsynthError):
    """A privacy audit could not run a mechanism (an error, not a finding): ``dpsynth audit`` exits 3, so a script
    tells a crash from a leak (1) and from bad input (2)."""

    exit_code = 3


class OutOfMemory(DpsynthError):
    """Device memory ran out while ``doing``: the setting to lower and the command (``retry``, whose run directory
    may still be the placeholder RUN_DIR) that continues with half of it."""

    def __init__(self, doing: str, setting: str, value: object, retry: str) -> None:
        self.doing, self.setting, self.value, self.retry = doing, setting, value, retry
        lower = max(1, value // 2) if isinstance(value, int) else value
        super().__init__(f"out of memory while {doing}: lower {setting} (now {value}; it changes neither the "
                         "privacy guarantee nor, beyond float rounding, what is learnt), e.g. "
                         f"{retry} --set {setting}={lower}; a run keeps its last checkpoint")

    def in_run(self, run_directory: object) -> OutOfMemory:
        """The same error with RUN_DIR in its command replaced by the run's directory."""
        return OutOfMemory(self.doing, self.setting, self.value, self.retry.replace("RUN_DIR", str(run_directory)))


class PrivacyWarning(UserWarning):
    """A privacy setting that is legal but weaker than the field's conventions."""
