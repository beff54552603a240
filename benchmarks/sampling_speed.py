"""Seconds to sample a release with the `cpu` UNet: DDIM 25 in eager fp32 (the sampler before) vs DPM-Solver++.

Every contender samples the same ``--images`` images (chunks of ``--batch``) in one process, in turn, ``--rounds``
times; the median is scaled to ``--release`` images (sampling time is linear in the image count). A compiled
contender's compilation (once per release) is timed apart and added once; inductor's cache starts empty (a
temporary directory), so the first compiled contender pays a cold compilation and later ones a warm one.
The ratio the sampler is judged by: DDIM 25 eager fp32 / DPM-Solver++ at the release's settings with ``auto``
precision and compile (target >= 3). Image quality at each step count is measured on a trained model
(the README's sampler table).

Usage: python benchmarks/sampling_speed.py [--images 1000] [--release 5000] [--steps 10 15 25] [--threads 2]
"""
from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

import torch

from dpsynth.config import SamplingSettings
from dpsynth.diffusion import Diffusion
from dpsynth.diffusion.inference import sampling_inputs, sampling_model
from dpsynth.models import build_unet


def main() -> None:
    args = _arguments()
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="inductor-")
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model = build_unet(1, 28, 10, [16, 32, 32]).eval()
    diffusion = Diffusion(prediction="v")
    labels = torch.arange(args.images) % 10
    contenders = {"ddim 25, eager fp32": ("ddim", 25, {"bf16": False, "compile": False})}
    for steps in args.steps:
        contenders[f"dpm-solver++ {steps}, auto"] = ("dpm-solver++", steps, {"bf16": "auto", "compile": "auto"})
    contenders[f"dpm-solver++ {args.steps[0]}, eager fp32"] = ("dpm-solver++", args.steps[0],
                                                               {"bf16": False, "compile": False})
    if not torch.ops.mkldnn._is_mkldnn_bf16_supported():
        contenders[f"dpm-solver++ {args.steps[0]}, compiled fp32"] = ("dpm-solver++", args.steps[0],
                                                                       {"bf16": False, "compile": True})
    release = {}
    print(f"cpu UNet, {args.images} images in chunks of {args.batch}, {args.threads} threads, CPU capability "
          f"{torch.backends.cpu.get_cpu_capability()}, scaled to {args.release} images")
    for name, (sampler, steps, settings) in contenders.items():
        seconds, compile_seconds, chosen = _time(model, diffusion, labels, sampler, steps, settings, args)
        release[name] = seconds * args.release / args.images + compile_seconds
        print(f"{name:>32}: {release[name]:7.1f} s per release ({compile_seconds:.1f} s compiling; "
              f"bf16 {chosen['sampling_bf16']}, compiled {chosen['sampling_compiled']})")
    baseline = release["ddim 25, eager fp32"]
    for steps in args.steps:
        ratio = baseline / release[f"dpm-solver++ {steps}, auto"]
        print(f"ddim 25 eager fp32 / dpm-solver++ {steps} auto: {ratio:.2f}x   (target >= 3 at the default step count)")


def _time(model: torch.nn.Module, diffusion: Diffusion, labels: torch.Tensor, sampler: str, steps: int,
          settings: dict, args: argparse.Namespace) -> tuple[float, float, dict]:
    """Median seconds to sample ``labels`` (compilation excluded), the compilation's seconds, the choices."""
    example = sampling_inputs(args.batch, (1, 28, 28), diffusion.timesteps)
    with sampling_model(model, SamplingSettings(**settings), args.release * steps, example) as chosen:
        rounds = []
        for _ in range(args.rounds):
            start = time.perf_counter()
            for chunk in labels.split(args.batch):
                diffusion.sample(chosen.model, chunk, (1, 28, 28), 10, steps, 0.0, torch.Generator().manual_seed(0),
                                 sampler, chosen.device)
            rounds.append(time.perf_counter() - start)
    return statistics.median(rounds), chosen.compile_seconds, chosen.report()


def _arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--images", type=int, default=1000, help="images sampled per contender and round")
    parser.add_argument("--release", type=int, default=5000, help="release size the times are scaled to")
    parser.add_argument("--batch", type=int, default=500, help="sampling.batch_size")
    parser.add_argument("--steps", type=int, nargs="+", default=[10, 15, 25], help="DPM-Solver++ step counts")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--threads", type=int, default=2)
    return parser.parse_args()


if __name__ == "__main__":
    main()
