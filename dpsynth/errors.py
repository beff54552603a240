"""User-facing errors: the CLI prints their message without a traceback."""


class DpsynthError(Exception):
    """A problem the user can fix (bad input, missing file, impossible budget)."""


class DataError(DpsynthError):
    """A dataset file is missing, corrupt or inconsistent."""


class ConfigError(DpsynthError):
    """A configuration key or value is unknown or invalid."""


class PrivacyError(DpsynthError):
    """A privacy budget cannot be met or a privacy record is inconsistent."""


class PrivacyWarning(UserWarning):
    """A privacy setting that is legal but weaker than the field's conventions."""
