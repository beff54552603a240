"""Atomic file writes (a crash leaves either the old file or the new one, never half of one) and file digests."""
from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any


def atomic_write(path: str | Path, write: Callable[[IO[bytes]], object]) -> None:
    """Write ``path`` through ``write(fileobj)`` into a temporary file, fsync, then rename over it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            write(handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_text(path: str | Path, text: str) -> None:
    """Atomically write a UTF-8 text file."""
    atomic_write(path, lambda handle: handle.write(text.encode("utf-8")))


def atomic_write_json(path: str | Path, obj: Any) -> None:
    """Atomically write ``obj`` as indented JSON."""
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=False) + "\n")


def sha256(path: Path) -> str:
    """The SHA-256 of a file's bytes, in hex."""
    return hashlib.sha256(path.read_bytes()).hexdigest()


def directory_sha256(directory: Path) -> str:
    """The SHA-256, in hex, of every file under ``directory``: of one line per file, in path order, holding its path
    relative to ``directory`` and its own SHA-256 (the same wherever the directory lies)."""
    lines = [f"{path.relative_to(directory).as_posix()} {sha256(path)}\n"
             for path in sorted(directory.rglob("*")) if path.is_file()]
    return hashlib.sha256("".join(lines).encode()).hexdigest()
