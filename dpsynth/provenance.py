"""What made a release: dpsynth's version, the commit of the source it ran from, the public data it read."""
from __future__ import annotations

import hashlib
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from . import __version__

if TYPE_CHECKING:
    import numpy as np

SOURCE = Path(__file__).resolve().parent


def _git(*args: str) -> str | None:
    try:
        found = subprocess.run(["git", *args], cwd=SOURCE, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return found.stdout.strip() if found.returncode == 0 else None


def source_commit() -> str | None:
    """The short commit of the git checkout dpsynth runs from, ``+modified`` when its tracked files differ from
    it; None outside a checkout (an installed wheel)."""
    commit = _git("rev-parse", "--short", "HEAD")
    if commit is None:
        return None
    return commit + ("+modified" if _git("status", "--porcelain", "--untracked-files=no") else "")


def version_line() -> str:
    """``dpsynth VERSION (commit C)``, as ``dpsynth --version`` prints it."""
    commit = source_commit()
    return f"dpsynth {__version__} (commit {commit or 'unknown: not run from a git checkout'})"


def provenance() -> dict[str, str | None]:
    """The version and commit a release records in privacy.json."""
    return {"version": __version__, "commit": source_commit()}


def public_data_digests(public: Mapping[str, np.ndarray]) -> dict[str, dict[str, int | str]]:
    """Per public image set (its sorted, distinct fingerprints by name, :mod:`dpsynth.data.fingerprints`): how
    many distinct images it holds and the SHA-256 of their fingerprints, so an auditor can tell which public data a
    release read."""
    return {name: {"distinct_images": len(prints), "fingerprints_sha256": _digest(prints)}
            for name, prints in public.items()}


def _digest(prints: np.ndarray) -> str:
    ordered = prints.astype("<u8")  # a copy, sorted in place: the digest does not depend on the order given
    ordered.sort()
    return hashlib.sha256(ordered.tobytes()).hexdigest()
