"""Hardware-dependent choices, made at run time from what the machine does and recorded with the run.

bf16 (DP-SGD autocast, the fast Inception path) pays only where the hardware computes it natively: a CPU with
bf16 matrix units (AVX-512 BF16 / AMX: 1.6x faster convolutions measured) or a GPU that supports it. On an
AVX2-only CPU oneDNN emulates it, and the DP-SGD step was 5.9x and Inception 10x slower than in fp32. So every
such setting takes ``auto`` (the default), ``true`` or ``false``, and ``auto`` asks the hardware.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Any

import torch

from .config import Config, EvaluationSection, PrivacySettings, RunSettings, SamplingSettings
from .errors import ConfigError

AUTO = "auto"
COMPILE_IMAGE_STEPS = 50_000  # sampling work (images x steps at 32 px) from which compiling the fp32 CPU sampler pays
COMPILE_SIDE = 32  # the side COMPILE_IMAGE_STEPS was measured at (28-32 px): a larger image counts (side / 32)^2


@dataclass(frozen=True)
class Choice:
    """A resolved setting and why it has that value."""

    value: bool
    reason: str


def native_bf16(device: torch.device) -> tuple[bool, str]:
    """Whether ``device`` computes bf16 natively, and what says so."""
    if device.type == "cuda":  # bf16 tensor cores from compute capability 8.0 (Ampere); emulated before
        supported = torch.cuda.is_bf16_supported(including_emulation=False)
        return supported, f"{torch.cuda.get_device_name(device)}: bf16 {'native' if supported else 'emulated'}"
    supported = bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    return supported, (f"CPU capability {torch.backends.cpu.get_cpu_capability()}, oneDNN bf16 "
                       f"{'native' if supported else 'emulated (slower than fp32)'}")


def resolve_bf16(setting: Any, device: torch.device, key: str = "bf16") -> Choice:
    """``true`` / ``false`` as set, or for ``auto`` bf16 exactly where ``device`` computes it natively."""
    if isinstance(setting, bool):
        return Choice(setting, "set in the config")
    if setting != AUTO:
        raise ConfigError(f"{key} must be auto, true or false, got {setting!r}")
    supported, why = native_bf16(device)
    return Choice(supported, f"auto: {why}")


def resolve_compile(setting: Any, device: torch.device, bf16: bool, image_steps: int, side: int = COMPILE_SIDE,
                    key: str = "sampling.compile") -> Choice:
    """``true`` / ``false`` as set; ``auto`` compiles the sampling model on a CPU that samples in fp32, for a
    release of at least :data:`COMPILE_IMAGE_STEPS` images x steps, a larger ``side`` than :data:`COMPILE_SIDE`
    counting as (side / 32)^2 images.

    Measured on the ``cpu`` UNet (:mod:`dpsynth.diffusion.inference`): compiled fp32 takes 0.51x the eager
    time on AVX2 after 35-40 s of compilation, which 50,000 image-steps (5,000 images, 10 steps) about repay;
    next to native bf16 autocast compiling gains 5 %; on a GPU it was not measured."""
    if isinstance(setting, bool):
        return Choice(setting, "set in the config")
    if setting != AUTO:
        raise ConfigError(f"{key} must be auto, true or false, got {setting!r}")
    if device.type != "cpu":
        return Choice(False, f"auto: not compiled on {device.type} (not measured there)")
    if bf16:
        return Choice(False, "auto: bf16 is native here, compiling would add 5 % for 35 s")
    if image_steps * (max(side, COMPILE_SIDE) / COMPILE_SIDE) ** 2 < COMPILE_IMAGE_STEPS:
        return Choice(False, f"auto: {image_steps} image-steps would not repay the compilation")
    return Choice(True, "auto: fp32 on a CPU, where the compiled graph takes half the eager time")


def hardware_choices(config: Config, device: torch.device) -> dict[str, Any]:
    """What this machine is and every bf16 and compile setting of ``config`` resolved on it (for the log)."""
    choices = {key: resolve_bf16(value, device, key) for key, value in _bf16_settings(config)}
    if "sampling.bf16" in choices:
        choices["sampling.compile"] = resolve_compile(SamplingSettings.of(config).compile, device,
                                                      choices["sampling.bf16"].value, _image_steps(config),
                                                      _side(config))
    return {"device": str(device), "cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "threads": RunSettings.of(config).threads, "threads_at_start": torch.get_num_threads(),
            "choices": {key: {"value": choice.value, "why": choice.reason} for key, choice in choices.items()}}


def _image_steps(config: Config) -> int:
    """Images x denoising steps of a run's release (0 for a method that does not denoise)."""
    return SamplingSettings.of(config).num_samples * config.get("diffusion", {}).get("sample_steps", 0)


def _side(config: Config) -> int:
    """The release's side: declared, else the DP vote's (``privacy.noisy_shape``), else :data:`COMPILE_SIDE`."""
    resolution = config.get("dataset", {}).get("resolution")
    voted = PrivacySettings.of(config).noisy_shape
    return resolution if isinstance(resolution, int) else int(voted[1]) if voted else COMPILE_SIDE


def _bf16_settings(config: Config) -> list[tuple[str, Any]]:
    """(dotted key, value) of every ``bf16`` key and of ``evaluation.fast_inception``."""
    found = [(f"{section}.bf16", values["bf16"]) for section, values in config.items()
             if isinstance(values, dict) and "bf16" in values]
    return found + [("evaluation.fast_inception", EvaluationSection.of(config).fast_inception)]


def usable_cores() -> int:
    """The cores this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


class ThreadGovernor:
    """Keeps torch's thread count at the cores other processes leave free, so a run beside other work slows
    in proportion: with more threads than free cores, OpenMP threads wait on each other's preempted peers
    and a step took several times longer (``benchmarks/dpsgd_under_load.py``).

    :meth:`adjust` (call it once per step; it acts at most every ``every`` seconds) measures, from
    ``/proc/stat`` and this process's CPU time since its last measurement, how many cores the others kept
    busy, and sets ``usable - round(others)`` threads (at least 1). Without ``/proc/stat`` it does nothing.
    """

    def __init__(self, every: float = 10.0) -> None:
        self.every, self.usable = every, usable_cores()
        self._last = self._sample()

    @staticmethod
    def _sample() -> tuple[float, float, float] | None:
        """(wall time, busy core-seconds of the machine, CPU seconds of this process), or None off Linux."""
        try:
            with open("/proc/stat") as handle:
                fields = [float(v) for v in handle.readline().split()[1:]]
        except OSError:
            return None
        ticks = os.sysconf("SC_CLK_TCK")
        busy = (sum(fields) - fields[3] - (fields[4] if len(fields) > 4 else 0.0)) / ticks  # less idle, iowait
        own = os.times()
        return time.monotonic(), busy, own.user + own.system

    def adjust(self) -> int | None:
        """Re-measure if ``every`` seconds have passed; the new thread count when it changed, else None."""
        now = self._sample()
        if now is None or self._last is None or now[0] - self._last[0] < self.every:
            return None
        wall, busy, own = (a - b for a, b in zip(now, self._last, strict=True))
        self._last = now
        others = max(0.0, (busy - own) / wall)
        threads = max(1, self.usable - round(others))
        if threads == torch.get_num_threads():
            return None
        torch.set_num_threads(threads)
        return threads


def check_threads(setting: Any) -> None:
    """ConfigError unless ``run.threads`` is ``auto`` or a positive integer."""
    if setting != AUTO and (isinstance(setting, bool) or not isinstance(setting, int) or setting < 1):
        raise ConfigError(f"run.threads must be auto or a positive integer, got {setting!r}")


def thread_governor(setting: Any) -> ThreadGovernor | None:
    """``run.threads``: ``auto`` gives a :class:`ThreadGovernor`; a positive integer fixes that many threads."""
    check_threads(setting)
    if setting == AUTO:
        return ThreadGovernor()
    torch.set_num_threads(setting)
    return None
