"""Moving data to the compute device without stalling it, and out-of-memory errors that say what to lower."""
from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

from ..errors import ConfigError, OutOfMemory


def bf16_autocast(device: torch.device, enabled: bool) -> contextlib.AbstractContextManager:
    """bf16 autocast on ``device`` where ``enabled``; otherwise nothing (so any device type works, ``meta`` too)."""
    return torch.autocast(device.type, dtype=torch.bfloat16) if enabled else contextlib.nullcontext()


def to_device(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``tensor`` on ``device``. A CPU tensor bound for a GPU goes through pinned memory without blocking: a
    copy from pageable memory would wait for every kernel queued before it (a host synchronisation)."""
    if device.type == "cuda" and tensor.device.type == "cpu":
        return tensor.pin_memory().to(device, non_blocking=True)
    return tensor.to(device)


@contextlib.contextmanager
def memory_limited_by(setting: str, value: object, doing: str, retry: str = "dpsynth run --resume RUN_DIR"
                      ) -> Iterator[None]:
    """Turn running out of memory while ``doing`` into an :class:`OutOfMemory` error naming ``setting`` to lower
    and the command (``retry``) that continues with a lower value."""
    try:
        yield
    except torch.OutOfMemoryError:
        raise OutOfMemory(doing, setting, value, retry) from None


def pick_device(name: str) -> torch.device:
    """``auto`` is CUDA when present, else the CPU; ``cpu`` / ``cuda[:N]`` as given."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise ConfigError(f"run.device: unknown device {name!r}; use auto, cpu or cuda") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError("run.device: cuda requested but no CUDA device is available")
    return device
