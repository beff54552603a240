"""Examples/s of DP-SGD on one process vs several (torch.distributed, gloo on the CPU), on this machine.

Every configuration runs the real engine (Poisson sampling, per-example gradients, all-reduce, one noise
draw) on the ``cpu`` preset's UNet for a fixed number of steps after a warm-up, under torchrun; rank 0
reports the sampled examples per second. Rows: one process using every core (the baseline), then N
processes sharing the cores. The ratio to the baseline is what to read: on a 2-core CPU expect little
(the point is that it runs); on a GPU node each process gets its own device.

Usage: python benchmarks/dpsgd_distributed.py [--processes 2] [--batch 128] [--steps 10]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import torch

from dpsynth.diffusion import Diffusion
from dpsynth.distributed import World
from dpsynth.models import build_unet
from dpsynth.privacy import PrivacyLedger
from dpsynth.privacy.dpsgd import DPSGD, DpsgdSettings
from dpsynth.privacy.randomness import SecretStream, derived_key

RECORDS, SHAPE = 60_000, (1, 28, 28)


def worker(args: argparse.Namespace) -> None:
    """One rank: ``args.steps`` timed DP-SGD steps after two untimed ones; rank 0 prints examples/s as JSON."""
    world = World.from_environment(torch.device("cpu"))
    torch.manual_seed(0)
    model = build_unet(1, 28, 10, [16, 32, 32], layers_per_block=1)
    diffusion, generator = Diffusion(), torch.Generator().manual_seed(0)
    examples = torch.Generator().manual_seed(world.rank + 1)
    engine = DPSGD(model, torch.optim.Adam(model.parameters(), 1e-3), diffusion.example_loss,
                   settings=DpsgdSettings(1.0, 1.0, args.batch / RECORDS, 128, bf16=True), num_records=RECORDS,
                   ledger=PrivacyLedger(), stage="dp-sgd", noise=SecretStream(derived_key(0, "bench")), world=world,
                   generator=generator, example_generator=examples)

    def make_batch(indices: torch.Tensor) -> tuple[torch.Tensor, ...]:
        times, noise = diffusion.training_inputs(len(indices), 1, SHAPE, examples)
        return torch.rand(len(indices), *SHAPE, generator=examples), indices % 10, times, noise

    for _ in range(2):
        engine.step(make_batch)
    start, sampled = time.perf_counter(), 0.0
    for _ in range(args.steps):
        sampled += engine.step(make_batch)["batch"]
    if world.is_main:
        print(json.dumps({"examples_per_second": sampled / (time.perf_counter() - start)}))
    world.close()


def measure(processes: int, threads: int, args: argparse.Namespace) -> float:
    """Examples/s of ``processes`` ranks with ``threads`` threads each, from rank 0's report."""
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={processes}",
               __file__, "--worker", "--batch", str(args.batch), "--steps", str(args.steps)]
    done = subprocess.run(command, capture_output=True, text=True, check=True,
                          env={**os.environ, "OMP_NUM_THREADS": str(threads)})
    return float(json.loads(done.stdout.strip().splitlines()[-1])["examples_per_second"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--batch", type=int, default=128, help="expected (Poisson) batch size")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return
    cores = os.cpu_count() or 1
    rows = [(1, cores), (args.processes, max(1, cores // args.processes))]
    rates = [measure(processes, threads, args) for processes, threads in rows]
    print(f"DP-SGD, cpu-preset UNet, expected batch {args.batch}, bf16, {args.steps} steps, {cores} cores")
    print(f"{'processes':>9} {'threads each':>12} {'examples/s':>10} {'vs 1 process':>12}")
    for (processes, threads), rate in zip(rows, rates, strict=True):
        print(f"{processes:>9} {threads:>12} {rate:>10.1f} {rate / rates[0]:>11.2f}x")


if __name__ == "__main__":
    main()
