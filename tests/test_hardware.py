"""Issue 26: hardware-dependent choices made at run time (bf16, threads), never baked into a preset."""
from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
import torch

from dpsynth.api import resolve_config
from dpsynth.config import with_drawn
from dpsynth.diffusion.settings import sample_steps
from dpsynth.errors import ConfigError
from dpsynth.hardware import (
    ThreadGovernor,
    flop_peak,
    flops_per_cycle,
    hardware_choices,
    resolve_bf16,
    resolve_compile,
    usable_cores,
)
from dpsynth.methods import METHODS

AVX2_ONLY = {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2"}  # what an AVX2-only CPU reports
RESOLVE = "import torch; from dpsynth.hardware import resolve_bf16; print(resolve_bf16('auto', torch.device('cpu')))"


def test_auto_bf16_follows_the_hardware_and_explicit_settings_win():
    native = bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    assert resolve_bf16("auto", torch.device("cpu")).value == native
    assert resolve_bf16(True, torch.device("cpu")).value and not resolve_bf16(False, torch.device("cpu")).value
    with pytest.raises(ConfigError, match="dpsgd.bf16 must be auto, true or false, got 'yes'"):
        resolve_bf16("yes", torch.device("cpu"), "dpsgd.bf16")


def test_on_an_avx2_only_cpu_auto_chooses_fp32():
    done = subprocess.run([sys.executable, "-c", RESOLVE], capture_output=True, text=True, check=True,
                          env={**os.environ, **AVX2_ONLY})
    assert "value=False" in done.stdout and "CPU capability AVX2" in done.stdout and "emulated" in done.stdout


def test_the_flop_peak_counts_the_vector_units_each_cpu_type_has():
    assert flops_per_cycle({"avx", "avx2", "fma"})[:2] == (32, 0)  # AVX2 EPYC: bf16 emulated
    assert flops_per_cycle({"avx2", "fma", "avx512f", "avx512_bf16"}, zen4=True)[:2] == (32, 64)
    assert flops_per_cycle({"avx2", "fma", "avx512f", "avx512_bf16", "amx_bf16"})[:2] == (64, 1024)
    peak = flop_peak()
    native = bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    assert peak.cores == usable_cores() and peak.ghz > 0 and bool(peak.bf16_per_cycle) == native
    assert peak.formula(torch.float32).startswith(f"{usable_cores()} cores x ")
    assert peak.gflops(torch.bfloat16) >= peak.gflops(torch.float32) > 0


def test_auto_compiles_the_sampler_only_for_a_large_fp32_release_on_a_cpu():
    cpu, cuda = torch.device("cpu"), torch.device("cuda")

    def compiles(image_steps: int, bf16: bool = False, device: torch.device = cpu, side: int = 32, rows: int = 500,
                 setting: bool | str = "auto") -> bool:
        return resolve_compile(setting, device, bf16, image_steps, side, rows).value

    assert compiles(500_000) and not compiles(30_000)  # a small release would not repay the compilation
    assert not compiles(600_000, bf16=True)  # bf16 autocast is faster
    assert not compiles(600_000, device=cuda)  # not measured on a GPU
    assert compiles(1, bf16=True, setting=True)
    assert compiles(5_000, side=128) and not compiles(10_000, side=64)  # 25x the work of 32 px; 4x
    assert compiles(400_000, side=28)
    assert compiles(50_000, side=64, rows=125) and not compiles(10**7, side=128, rows=25)  # a plan's chunks
    with pytest.raises(ConfigError, match="sampling.compile must be auto, true or false, got 'fast'"):
        compiles(1, setting="fast")


def test_no_preset_fixes_a_hardware_dependent_setting():
    for name, method in METHODS.items():
        for preset in method.presets:
            config = method.run_config(resolve_config(name, preset=preset))
            choices = hardware_choices(config, torch.device("cpu"), sample_steps(config))["choices"]
            assert "sampling.bf16" in choices and len(choices) >= 3, choices  # each section's bf16 key is found
            assert choices["evaluation.fast_inception"]["why"].startswith("auto"), (name, preset)
            assert all(choice["why"].startswith("auto") for choice in choices.values()), (name, preset, choices)
            assert config["run"]["threads"] == "auto"


def test_the_logged_compile_choice_counts_the_voted_side():
    config = resolve_config("dpdm", preset="cpu", overrides=["sampling.num_samples=1000", "sampling.bf16=false"])
    work = 1000 * config["diffusion"]["sample_steps"]
    dpdm = METHODS["dpdm"]
    choices = hardware_choices(dpdm.run_config(config), torch.device("cpu"), work // 1000)["choices"]
    assert work < 50_000 and not choices["sampling.compile"]["value"]
    voted = with_drawn(dpdm.run_config(config), shape=[3, 128])  # what a folder's shape vote draws
    assert hardware_choices(voted, torch.device("cpu"), sample_steps(voted))["choices"]["sampling.compile"]["value"]


def test_bad_hardware_settings_are_refused_when_the_config_is_built():
    with pytest.raises(ConfigError, match="dpsgd.bf16 must be auto, true or false"):
        resolve_config("dpdm", overrides=["dpsgd.bf16=maybe"])
    with pytest.raises(ConfigError, match="run.threads must be auto or a positive integer"):
        resolve_config("dpdm", overrides=["run.threads=0"])
    with pytest.raises(ConfigError, match="sampling.compile must be auto, true or false, got 'maybe'"):
        resolve_config("dpdm", overrides=["sampling.compile=maybe"])


@pytest.mark.alone
@pytest.mark.skipif(usable_cores() < 2 or not os.path.exists("/proc/stat"), reason="needs 2 cores and /proc/stat")
def test_the_governor_gives_up_the_cores_another_process_keeps_busy():
    torch.set_num_threads(usable_cores())
    governor = ThreadGovernor(every=0.5)
    busy = subprocess.Popen([sys.executable, "-c", "import time\nend = time.time() + 3\nwhile time.time() < end: pass"])
    try:
        time.sleep(1.0)
        assert governor.adjust() == usable_cores() - 1  # the other process holds one core
    finally:
        busy.wait()
    time.sleep(0.6)
    governor.adjust()
    time.sleep(0.6)
    assert governor.adjust() == usable_cores() or torch.get_num_threads() == usable_cores()
