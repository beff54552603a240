"""DP-SGD beside other work: each process's step time when two run at once, against one running alone.

    .venv/bin/python benchmarks/dpsgd_under_load.py [--steps 30] [--batch 64] [--modes fixed governed]

``fixed``: torch's default thread count (every core) for the whole run; ``governed``: dpsynth's default,
a :class:`~dpsynth.hardware.ThreadGovernor` that keeps the thread count at the cores the other processes
leave free. Each mode times one worker alone, then two started together, and prints each one's slowdown:
on 2 cores a fair share is 2x; more threads than free cores make it far worse.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time


def worker(args: argparse.Namespace) -> None:
    """``args.steps`` timed DP-SGD steps (after one untimed) of the cpu-preset UNet; prints seconds per step."""
    import torch

    from dpsynth.diffusion import Diffusion
    from dpsynth.hardware import ThreadGovernor, resolve_bf16
    from dpsynth.models import build_unet
    from dpsynth.privacy import PrivacyLedger
    from dpsynth.privacy.dpsgd import DPSGD, DpsgdSettings
    from dpsynth.privacy.randomness import SecretStream, derived_key

    torch.manual_seed(0)
    model = build_unet(1, 28, 10, [16, 32, 32], layers_per_block=1)
    diffusion, examples = Diffusion(), torch.Generator().manual_seed(0)
    bf16 = resolve_bf16("auto", torch.device("cpu")).value
    records = 60_000
    engine = DPSGD(model, torch.optim.Adam(model.parameters(), 1e-3), diffusion.example_loss,
                   settings=DpsgdSettings(1.0, 1.0, args.batch / records, 128, bf16=bf16), num_records=records,
                   ledger=PrivacyLedger(), stage="dp-sgd", noise=SecretStream(derived_key(0, "bench")))
    governor = ThreadGovernor(every=2.0) if args.mode == "governed" else None

    def make_batch(indices: torch.Tensor) -> tuple[torch.Tensor, ...]:
        times, noise = diffusion.training_inputs(len(indices), 1, (1, 28, 28), examples)
        return torch.rand(len(indices), 1, 28, 28, generator=examples), indices % 10, times, noise

    engine.step(make_batch)
    start = time.perf_counter()
    for _ in range(args.steps):
        engine.step(make_batch)
        if governor is not None:
            governor.adjust()
    print(json.dumps({"seconds_per_step": (time.perf_counter() - start) / args.steps, "bf16": bf16,
                      "threads_at_end": torch.get_num_threads()}))


def launch(mode: str, args: argparse.Namespace) -> subprocess.Popen:
    command = [sys.executable, __file__, "--worker", "--mode", mode, "--steps", str(args.steps), "--batch",
               str(args.batch)]
    return subprocess.Popen(command, stdout=subprocess.PIPE, text=True)


def result(process: subprocess.Popen) -> dict:
    out, _ = process.communicate()
    if process.returncode != 0:
        raise SystemExit(f"worker failed with exit status {process.returncode}")
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--batch", type=int, default=64, help="expected (Poisson) batch size")
    parser.add_argument("--modes", nargs="+", choices=["fixed", "governed"], default=["fixed", "governed"])
    parser.add_argument("--mode", choices=["fixed", "governed"], help=argparse.SUPPRESS)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return
    import torch

    print(f"CPU capability {torch.backends.cpu.get_cpu_capability()}, {os.cpu_count()} cores, expected batch "
          f"{args.batch}, {args.steps} steps; a fair share for two processes is a 2.00x slowdown")
    for mode in args.modes:
        alone = result(launch(mode, args))
        together = [result(process) for process in [launch(mode, args) for _ in range(2)]]
        slowdowns = ", ".join(f"{r['seconds_per_step'] / alone['seconds_per_step']:.2f}x "
                              f"(ending with {r['threads_at_end']} threads)" for r in together)
        print(f"{mode:>8}, bf16 {alone['bf16']}: alone {alone['seconds_per_step']:.2f} s/step; two at once: "
              f"{slowdowns}")


if __name__ == "__main__":
    main()
