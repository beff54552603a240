"""The sampler's UNet per side, against the CPU's peak: seconds per image-step (one UNet call on one image) in eager
fp32, eager bf16 autocast (where bf16 is native) and compiled fp32 (`torch.compile` with freezing, as
``sampling.compile`` runs it), at each side a plan trains at (the `cpu` UNet, one level deeper per doubling past
32 px: :func:`dpsynth.autoplan.rules.unet_levels`). Prints GFLOP per image-step (counted), GFLOP/s and the share
of :func:`dpsynth.hardware.flop_peak`, the compiled / eager ratio the planner prices sampling by
(:data:`dpsynth.hardware.COMPILED_SAMPLING`) and the compilation's seconds; appends one record per side to
``benchmarks/results/sampling-sides/records.jsonl``. Inductor's cache starts empty (a temporary directory), so every
compilation is cold, as a run's first is.

Usage: python benchmarks/sampling_sides.py [--sides 28 32 64 128] [--rows 500 | --plan-chunks] [--calls 2]
(``--plan-chunks``: at each side, the chunk a derived plan samples in on a CPU, :func:`dpsynth.autoplan.plan.chunked`)
(``ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2`` restricts an AVX-512 CPU to AVX2, where bf16 is emulated
and a plan compiles)
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from torch.utils.flop_counter import FlopCounterMode

from dpsynth.api import resolve_config
from dpsynth.autoplan.plan import chunked
from dpsynth.autoplan.rules import unet_levels
from dpsynth.bench.results import machine_type
from dpsynth.config import SamplingSettings
from dpsynth.diffusion import Diffusion
from dpsynth.diffusion.inference import sampling_inputs, sampling_model
from dpsynth.hardware import FlopPeak, flop_peak
from dpsynth.methods import get_method
from dpsynth.models import build_unet

RECORDS = Path(__file__).resolve().parent / "results" / "sampling-sides" / "records.jsonl"
PATHS = {"eager fp32": {"bf16": False, "compile": False}, "eager bf16": {"bf16": True, "compile": False},
         "compiled fp32": {"bf16": False, "compile": True}}


def main() -> None:
    args = _arguments()
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="inductor-")
    torch.set_num_threads(args.threads)
    native = torch.ops.mkldnn._is_mkldnn_bf16_supported()
    peak = flop_peak()
    print(f"{machine_type()}, CPU capability {torch.backends.cpu.get_cpu_capability()}, {args.threads} threads; "
          f"peak {peak.formula(torch.float32)}; bf16 {peak.formula(torch.bfloat16)}")
    RECORDS.parent.mkdir(parents=True, exist_ok=True)
    for side in args.sides:
        record = measure_side(side, plan_chunk(side) if args.plan_chunks else args.rows, args, native, peak)
        with RECORDS.open("a") as handle:
            handle.write(json.dumps(record) + "\n")


def plan_chunk(side: int) -> int:
    """Images a sampling call of a derived plan holds on a CPU at ``side`` px."""
    dpdm = get_method("dpdm")
    config = dpdm.run_config(resolve_config("dpdm", preset="auto"))
    smaller, _ = chunked(dpdm, config, side, torch.device("cpu"), [], [])
    return smaller["sampling"]["batch_size"]


def measure_side(side: int, rows: int, args: argparse.Namespace, native: bool, peak: FlopPeak) -> dict[str, Any]:
    """Every path's seconds per image-step at ``side`` in calls of ``rows`` images, its GFLOP/s and share of the
    peak, printed and returned."""
    unet = resolve_config("dpdm", preset="cpu")["model"]
    widths = unet_levels(unet["block_channels"], side)
    torch.manual_seed(0)
    model = build_unet(1, side, 10, widths, unet["layers_per_block"], unet["attention"], unet["norm_groups"]).eval()
    example = sampling_inputs(rows, (1, side, side), Diffusion().timesteps)
    flops = _flops(model, example) / rows
    paths: dict[str, dict[str, float]] = {}
    for name, settings in PATHS.items():
        if name == "eager bf16" and not native:
            continue
        seconds, compile_seconds = _time(model, example, settings, args.calls)
        rate = flops / seconds
        share = rate / 1e9 / peak.gflops(torch.bfloat16 if settings["bf16"] else torch.float32)
        paths[name] = {"seconds_per_image_step": seconds, "gflop_per_s": rate / 1e9, "share_of_peak": share,
                       "compile_seconds": compile_seconds}
        print(f"{side:4d} px x {rows:3d} {str(widths):>22}  {name:>13}: {seconds * 1e3:7.2f} ms per image-step, "
              f"{rate / 1e9:6.1f} GFLOP/s ({share:.2f} of peak)"
              + (f", {compile_seconds:.0f} s compiling" if compile_seconds else ""), flush=True)
    ratio = paths["compiled fp32"]["seconds_per_image_step"] / paths["eager fp32"]["seconds_per_image_step"]
    print(f"{side:4d} px  compiled / eager fp32: {ratio:.2f}; {flops / 1e9:.3f} GFLOP per image-step", flush=True)
    return {"side": side, "block_channels": widths, "rows": rows, "gflop_per_image_step": flops / 1e9,
            "paths": paths, "compiled_over_eager": ratio, "machine": machine_type(),
            "cpu_capability": torch.backends.cpu.get_cpu_capability(), "threads": args.threads,
            "peak_gflop_per_s": {"fp32": peak.gflops(torch.float32), "bf16": peak.gflops(torch.bfloat16)},
            "date": time.strftime("%Y-%m-%d")}


def _flops(model: torch.nn.Module, example: tuple[torch.Tensor, ...]) -> float:
    """FLOP of one UNet call on ``example`` (a multiply-add counts 2)."""
    images, times, labels = example
    counter = FlopCounterMode(display=False)
    with torch.no_grad(), counter:
        model(images, times, class_labels=labels)
    return float(counter.get_total_flops())


def _time(model: torch.nn.Module, example: tuple[torch.Tensor, ...], settings: dict[str, bool], calls: int
          ) -> tuple[float, float]:
    """Median seconds per image-step over ``calls`` UNet calls after a warm one, and the compilation's seconds."""
    images, times, labels = example
    with sampling_model(model, SamplingSettings(**settings), 10**9, example) as chosen:
        chosen.model(images, times, class_labels=labels)
        rounds = []
        for _ in range(calls):
            start = time.perf_counter()
            chosen.model(images, times, class_labels=labels)
            rounds.append(time.perf_counter() - start)
    return statistics.median(rounds) / len(images), chosen.compile_seconds


def _arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sides", type=int, nargs="+", default=[28, 32, 64, 128])
    chunk = parser.add_mutually_exclusive_group()
    chunk.add_argument("--rows", type=int, default=500, help="images per UNet call (sampling.batch_size)")
    chunk.add_argument("--plan-chunks", action="store_true", help="at each side, the chunk a CPU plan samples in")
    parser.add_argument("--calls", type=int, default=2, help="timed calls per path (after a warm one)")
    parser.add_argument("--threads", type=int, default=2)
    return parser.parse_args()


if __name__ == "__main__":
    main()
