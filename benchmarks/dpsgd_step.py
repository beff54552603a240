"""Examples/s of one DP-SGD step (per-example grads + clip + noise) vs a non-private step, same UNet and batch.

Usage: python benchmarks/dpsgd_step.py [--channels 32 64 64] [--batch 64] [--k 1] [--steps 3] [--threads 2]
"""
from __future__ import annotations

import argparse
import time

import torch

from dpsynth.diffusion import Diffusion
from dpsynth.models import build_unet
from dpsynth.privacy import PrivacyLedger
from dpsynth.privacy.dpsgd import DPSGD, DpsgdSettings


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--channels", type=int, nargs="+", default=[32, 64, 64])
    parser.add_argument("--resolution", type=int, default=28)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--k", type=int, default=1)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--no-attention", action="store_true")
    parser.add_argument("--bf16", action="store_true", help="also time the DP-SGD step under bf16 autocast")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    shape = (1, args.resolution, args.resolution)
    model = build_unet(1, args.resolution, 10, args.channels, attention=not args.no_attention)
    diffusion, generator = Diffusion(), torch.Generator().manual_seed(0)
    images, labels = torch.rand(args.batch * 4, *shape), torch.randint(0, 10, (args.batch * 4,))

    def make_batch(idx: torch.Tensor) -> tuple[torch.Tensor, ...]:
        times, noise = diffusion.training_inputs(len(idx), args.k, shape, generator)
        return images[idx], labels[idx], times, noise

    def nonprivate_step() -> None:
        idx = torch.arange(args.batch)
        x, y, t, n = make_batch(idx)
        x0 = x * 2 - 1
        abar = diffusion.alphas_cumprod[t.flatten()].view(-1, 1, 1, 1)
        noisy = abar.sqrt() * x0.repeat_interleave(args.k, 0) + (1 - abar).sqrt() * n.flatten(0, 1)
        predicted = model(noisy, t.flatten(), class_labels=y.repeat_interleave(args.k)).sample
        loss = (predicted - n.flatten(0, 1)).pow(2).mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()

    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)
    def engine(bf16: bool) -> DPSGD:
        settings = DpsgdSettings(1.0, 1.0, 0.25, args.batch, bf16=bf16)
        return DPSGD(model, optimizer, diffusion.example_loss, settings, len(labels), PrivacyLedger(), "bench",
                     generator)

    steps = {"non-private": nonprivate_step, "dp-sgd": lambda: engine(False).step(make_batch)}
    if args.bf16:
        steps["dp-sgd bf16"] = lambda: engine(True).step(make_batch)
    results = {}
    for name, step in steps.items():
        step()  # warm-up
        start = time.perf_counter()
        for _ in range(args.steps):
            step()
        results[name] = args.steps * args.batch / (time.perf_counter() - start)
    params = sum(p.numel() for p in model.parameters())
    print(f"UNet {args.channels} ({params / 1e6:.2f}M params), {args.resolution}px, batch {args.batch}, K {args.k}, "
          f"{args.threads} threads")
    for name, rate in results.items():
        print(f"{name:>12}: {rate:8.1f} examples/s")
    print(f"dp-sgd / non-private time ratio: {results['non-private'] / results['dp-sgd']:.2f}x")
    if args.bf16:
        print(f"dp-sgd bf16 speed-up over fp32 dp-sgd: {results['dp-sgd bf16'] / results['dp-sgd']:.2f}x")


if __name__ == "__main__":
    main()
