"""Hardware-dependent choices, made at run time from what the machine does and recorded with the run.

bf16 (DP-SGD autocast, the sampler) pays only where the hardware computes it natively: a CPU with bf16 matrix
units (AVX-512 BF16 / AMX: 1.6x faster convolutions measured) or a GPU that supports it. On an AVX2-only CPU
oneDNN emulates it, and the DP-SGD step was 5.9x and Inception 10x slower than in fp32. So every such setting
takes ``auto`` (the default), ``true`` or ``false``, and ``auto`` asks the hardware. The Inception network FID
uses is the exception: its bf16 features moved FID further than sampling does, so ``auto`` keeps it in fp32.
"""
from __future__ import annotations

import math
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from .config import DatasetSettings, EvaluationSection, RunConfig, RunSettings, SamplingSettings
from .errors import ConfigError

AUTO = "auto"
COMPILE_SIDE = 32  # the sampler's side where a config declares none and no DP vote chose it


@dataclass(frozen=True)
class Choice:
    """A resolved setting and why it has that value."""

    value: bool
    reason: str


def _explicit(setting: Any, key: str) -> Choice | None:
    """The choice ``true`` / ``false`` set for ``key``, None for ``auto``; ConfigError naming ``key`` otherwise."""
    if isinstance(setting, bool):
        return Choice(setting, "set in the config")
    if setting != AUTO:
        raise ConfigError(f"{key} must be auto, true or false, got {setting!r}")
    return None


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
    if (explicit := _explicit(setting, key)) is not None:
        return explicit
    supported, why = native_bf16(device)
    return Choice(supported, f"auto: {why}")


@dataclass(frozen=True)
class CompiledSampling:
    """The ``cpu`` sampler's UNet at one side and chunk (images a call), fp32 on an AVX2 CPU: eager seconds per
    image-step (one image through the UNet once), the compiled graph's time as a share of it, and a cold
    compilation's seconds."""

    eager_seconds: float
    share: float
    compile_seconds: float

    def repays(self, image_steps: int) -> bool:
        """Whether compiling saves more than it costs on ``image_steps`` image-steps."""
        return image_steps * self.eager_seconds * (1 - self.share) > self.compile_seconds


# benchmarks/sampling_sides.py on an AMD EPYC (Zen 4), 2 cores, restricted to AVX2 (ATEN_CPU_CAPABILITY=avx2
# ONEDNN_MAX_CPU_ISA=AVX2), 2026-12-06, by (side, images a call): the `cpu` UNet one level deeper per doubling past
# 32 px, at the default chunk (500) and at the chunk a plan samples in on a CPU (about the base preset's pixels:
# 125 at 64 px, 25 at 128); the records in benchmarks/results/sampling-sides/records.jsonl. Eager calls of many
# large images outgrow the caches, which compiling recovers; small chunks leave it little to gain.
COMPILED_SAMPLING: dict[tuple[int, int], CompiledSampling] = {
    (28, 500): CompiledSampling(2.23e-3, 0.52, 40.0),
    (32, 500): CompiledSampling(2.85e-3, 0.62, 67.0),
    (64, 500): CompiledSampling(15.43e-3, 0.51, 98.0),
    (128, 500): CompiledSampling(70.31e-3, 0.51, 119.0),
    (64, 125): CompiledSampling(11.06e-3, 0.65, 54.0),  # the mean of two runs (0.66, 0.64)
    (128, 25): CompiledSampling(37.16e-3, 1.02, 142.0),
}


def compiled_sampling(side: int, rows: int) -> CompiledSampling:
    """What compiling the sampler gives, as measured at the side of :data:`COMPILED_SAMPLING` nearest ``side``, then
    the chunk nearest ``rows`` images a call (both on a log scale)."""
    def distance(measured: tuple[int, int]) -> tuple[float, float]:
        return abs(math.log(side / measured[0])), abs(math.log(rows / measured[1]))
    return COMPILED_SAMPLING[min(COMPILED_SAMPLING, key=distance)]


def resolve_compile(setting: Any, device: torch.device, bf16: bool, image_steps: int, side: int, rows: int,
                    key: str = "sampling.compile") -> Choice:
    """``true`` / ``false`` as set; ``auto`` compiles the sampling model on a CPU that samples in fp32 where the
    release's ``image_steps`` at ``side`` px in chunks of ``rows`` images repay the compilation
    (:func:`compiled_sampling`: after 40-142 s of compilation, depending on the side and chunk, the compiled graph
    took 0.51-0.62x the eager time in chunks of 500, 0.65x at 64 px in a plan's chunks of 125 and gained nothing at
    128 px in its chunks of 25). Next to native bf16
    autocast compiling gained 5 %; on a GPU it was not measured."""
    if (explicit := _explicit(setting, key)) is not None:
        return explicit
    if device.type != "cpu":
        return Choice(False, f"auto: not compiled on {device.type} (not measured there)")
    if bf16:
        return Choice(False, "auto: bf16 is native here, compiling would add 5 % for 35 s")
    measured = compiled_sampling(side, rows)
    if not measured.repays(image_steps):
        return Choice(False, f"auto: {image_steps} image-steps at {side} px, {rows} a call, would not repay the "
                             f"{measured.compile_seconds:.0f} s compilation (the compiled graph takes "
                             f"{measured.share:.2f}x the eager time there)")
    return Choice(True, f"auto: fp32 on a CPU, where the compiled graph takes {measured.share:.2f}x the eager time "
                        f"at {side} px, {rows} a call")


def resolve_fast_inception(setting: Any) -> Choice:
    """``evaluation.fast_inception``: ``true`` (bf16) / ``false`` as set; ``auto`` is false on every device. On
    the fixed pair of sets of ``benchmarks/inception_features.py`` (1,000 synthetic Fashion-MNIST images against
    1,000 real) bf16 features moved FID by 2.21, more than the 1.60 two draws of one model differ by, where a path
    is eligible below a tenth of that; fp32 fused moved it by less than 0.0001 (AMD EPYC with AVX-512 BF16)."""
    if (explicit := _explicit(setting, "evaluation.fast_inception")) is not None:
        return explicit
    return Choice(False, "auto: fp32 (bf16 features moved FID by more than two draws of one model differ)")


def hardware_choices(config: RunConfig, device: torch.device, sample_steps: int) -> dict[str, Any]:
    """What this machine is and every bf16 and compile setting of ``config`` resolved on it (for the log), for a
    release of ``sample_steps`` denoising steps an image (0: not denoised)."""
    choices = {key: resolve_bf16(value, device, key) for key, value in _bf16_settings(config)}
    choices["evaluation.fast_inception"] = resolve_fast_inception(EvaluationSection.of(config).fast_inception)
    if "sampling.bf16" in choices:
        choices["sampling.compile"] = resolve_compile(SamplingSettings.of(config).compile, device,
                                                      choices["sampling.bf16"].value,
                                                      SamplingSettings.of(config).num_samples * sample_steps,
                                                      _side(config), sampling_rows(config))
    return {"device": str(device), "cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "threads": RunSettings.of(config).threads, "threads_at_start": torch.get_num_threads(),
            "choices": {key: {"value": choice.value, "why": choice.reason} for key, choice in choices.items()}}


def sampling_rows(config: RunConfig) -> int:
    """Images a sampling call holds: ``sampling.batch_size``, or the whole release where it is smaller."""
    sampling = SamplingSettings.of(config)
    return min(sampling.batch_size, sampling.num_samples)


def _side(config: RunConfig) -> int:
    """The release's side: declared, else the DP vote's (``drawn.shape``), else :data:`COMPILE_SIDE`."""
    resolution, voted = DatasetSettings.of(config).resolution, config.drawn.shape
    return resolution if isinstance(resolution, int) else int(voted[1]) if voted else COMPILE_SIDE


def _bf16_settings(config: RunConfig) -> list[tuple[str, Any]]:
    """(dotted key, value) of every ``bf16`` key."""
    return [(f"{section}.bf16", values["bf16"]) for section, values in config.items()
            if isinstance(values, Mapping) and "bf16" in values]


def cpuinfo(field: str) -> str | None:
    """The first ``field`` of /proc/cpuinfo, or None where there is none (not Linux)."""
    try:
        return next(line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                    if line.startswith(field))
    except (OSError, StopIteration):
        return None


@dataclass(frozen=True)
class FlopPeak:
    """The CPU's arithmetic peak: cores x clock x FLOP a core issues per cycle in fp32 and in bf16 (0 where bf16
    is emulated), each FMA counting 2 FLOP. ``units`` names what the per-cycle figures assume."""

    cores: int
    ghz: float
    fp32_per_cycle: int
    bf16_per_cycle: int
    units: str

    def gflops(self, dtype: torch.dtype) -> float:
        """Peak GFLOP/s in ``dtype`` (bf16 where emulated: fp32's, the units oneDNN falls back on)."""
        per_cycle = self.bf16_per_cycle if dtype == torch.bfloat16 and self.bf16_per_cycle else self.fp32_per_cycle
        return self.cores * self.ghz * per_cycle

    def formula(self, dtype: torch.dtype) -> str:
        """How :meth:`gflops` came about, in words."""
        per_cycle = self.bf16_per_cycle if dtype == torch.bfloat16 and self.bf16_per_cycle else self.fp32_per_cycle
        return (f"{self.cores} cores x {self.ghz:.2f} GHz x {per_cycle} FLOP/cycle ({self.units}) "
                f"= {self.gflops(dtype):.0f} GFLOP/s")


def flop_peak() -> FlopPeak:
    """The peak of this CPU as torch uses it, from its flags, cores and the clock the OS reports (the maximum where
    cpufreq gives one, else ``cpu MHz``, the nominal clock under a hypervisor: boost can exceed it). Vector units
    torch does not use count out (``ATEN_CPU_CAPABILITY=avx2``; bf16 where oneDNN emulates it)."""
    flags = set((cpuinfo("flags") or "").split())
    if torch.backends.cpu.get_cpu_capability() != "AVX512":
        flags = {flag for flag in flags if not flag.startswith(("avx512", "amx"))}
    if not torch.ops.mkldnn._is_mkldnn_bf16_supported():
        flags -= {"avx512_bf16", "amx_bf16"}
    zen4 = cpuinfo("vendor_id") == "AuthenticAMD" and cpuinfo("cpu family") == "25"
    fp32, bf16, units = flops_per_cycle(flags, zen4)
    return FlopPeak(usable_cores(), _clock_ghz(), fp32, bf16, units)


def flops_per_cycle(flags: set[str], zen4: bool = False) -> tuple[int, int, str]:
    """(fp32, bf16, units): FLOP per core and cycle of a CPU with these /proc/cpuinfo ``flags``. Two FMA pipes of the
    widest vectors (AVX2: 2 x 8 fp32 x 2 = 32; AVX-512: 64, but 32 on AMD Zen 4, which splits 512-bit operations
    over 256-bit pipes); AVX-512 BF16 doubles that for bf16; AMX tiles do 1,024 bf16 FLOP; bf16 0 where emulated."""
    if "avx512f" in flags:
        fp32, units = (32, "AVX-512 on Zen 4's 256-bit pipes") if zen4 else (64, "2 AVX-512 FMA pipes")
    elif {"avx2", "fma"} <= flags:
        fp32, units = 32, "2 AVX2 FMA pipes"
    else:
        fp32, units = 16, "2 SSE/AVX pipes without FMA"
    bf16 = 1024 if "amx_bf16" in flags else 2 * fp32 if "avx512_bf16" in flags else 0
    units += ", AMX tiles for bf16" if "amx_bf16" in flags else ", AVX-512 BF16" if bf16 else ""
    return fp32, bf16, units


def _clock_ghz() -> float:
    try:
        return int(Path("/sys/devices/system/cpu/cpu0/cpufreq/cpuinfo_max_freq").read_text()) / 1e6
    except (OSError, ValueError):
        return float(cpuinfo("cpu MHz") or 0) / 1e3


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
