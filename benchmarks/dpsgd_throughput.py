"""Examples/s of one DP-SGD step: our batched engine vs our vmap engine (the engine before it) vs Opacus' hooks
vs a non-private step.

Same UNet (same initial weights), batch, noise multiplicity K and threads, in one process. Each round times
one step of every contender in turn (so a busy machine slows them alike); the median over rounds is printed,
with the ratios the engine is judged by: batched / vmap speed (target >= 2), batched / non-private time
(target <= 1.3) and ours / Opacus. ``--bf16`` adds every contender under bf16 autocast (what ``dpsgd.bf16:
auto`` takes where bf16 is native).

Opacus has no noise multiplicity: its hooks give one gradient per row of the B*K rows, which we sum per
example (each row's loss carries 1/K) before its DPOptimizer clips, adds noise and steps.

Usage: python benchmarks/dpsgd_throughput.py [--channels 16 32 32] [--batch 128] [--k 1] [--rounds 5]
       [--threads 2] [--bf16] [--profile]
"""
from __future__ import annotations

import argparse
import copy
import statistics
import time
import warnings
from collections.abc import Callable

import torch

from dpsynth.diffusion import Diffusion
from dpsynth.hardware import resolve_bf16
from dpsynth.models import build_unet
from dpsynth.privacy import PrivacyLedger
from dpsynth.privacy.dpsgd import DPSGD, DpsgdSettings
from dpsynth.privacy.randomness import SecretStream, derived_key

SIGMA, CLIP = 1.0, 1.0


def main() -> None:
    args = _arguments()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    shape = (1, args.resolution, args.resolution)
    model = build_unet(1, args.resolution, 10, args.channels, attention=not args.no_attention)
    diffusion, generator = Diffusion(), torch.Generator().manual_seed(0)
    images, labels = torch.rand(args.batch, *shape), torch.randint(0, 10, (args.batch,))

    def inputs() -> tuple[torch.Tensor, torch.Tensor]:
        return diffusion.training_inputs(args.batch, args.k, shape, generator)

    contenders: dict[str, Callable[[], None]] = {}
    for bf16 in (False, True) if args.bf16 else (False,):
        tag = " bf16" if bf16 else ""
        contenders[f"non-private{tag}"] = _nonprivate(copy.deepcopy(model), diffusion, images, labels, inputs, bf16)
        contenders[f"opacus hooks{tag}"] = _opacus(copy.deepcopy(model), diffusion, images, labels, inputs, args.k,
                                                   bf16)
        contenders[f"ours vmap{tag}"] = _ours(copy.deepcopy(model), diffusion, images, labels, inputs, bf16, False)
        contenders[f"ours batched{tag}"] = _ours(copy.deepcopy(model), diffusion, images, labels, inputs, bf16, True)
    seconds: dict[str, list[float]] = {name: [] for name in contenders}
    for step in contenders.values():
        step()  # warm-up
    for _ in range(args.rounds):
        for name, step in contenders.items():
            start = time.perf_counter()
            step()
            seconds[name].append(time.perf_counter() - start)
    rate = {name: args.batch / statistics.median(times) for name, times in seconds.items()}
    params = sum(p.numel() for p in model.parameters())
    print(f"UNet {args.channels} ({params / 1e6:.2f}M params), {args.resolution}x{args.resolution}, batch "
          f"{args.batch}, K {args.k}, {args.threads} threads, median of {args.rounds} rounds")
    for name, value in rate.items():
        print(f"{name:>20}: {value:8.1f} examples/s")
    for tag in ("", " bf16") if args.bf16 else ("",):
        batched, vmap = rate[f"ours batched{tag}"], rate[f"ours vmap{tag}"]
        print(f"{tag or ' fp32'}: batched / vmap speed {batched / vmap:.2f}x (target >= 2); batched / non-private "
              f"time {rate[f'non-private{tag}'] / batched:.2f}x (target <= 1.3); batched / opacus speed "
              f"{batched / rate[f'opacus hooks{tag}']:.2f}x")
    if args.bf16:
        choice = resolve_bf16("auto", torch.device("cpu"))
        auto = " bf16" if choice.value else ""
        print(f"dpsgd.bf16=auto takes {'bf16' if choice.value else 'fp32'} ({choice.reason}): batched{auto} / "
              f"vmap{auto} speed {rate[f'ours batched{auto}'] / rate[f'ours vmap{auto}']:.2f}x")
    if args.profile:
        for name in ("ours batched", "ours vmap", "non-private"):
            _profile(contenders[name], name)


def _arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--channels", type=int, nargs="+", default=[16, 32, 32], help="UNet block widths")
    parser.add_argument("--resolution", type=int, default=28)
    parser.add_argument("--batch", type=int, default=128, help="examples per step (one physical batch)")
    parser.add_argument("--k", type=int, default=1, help="noise multiplicity: diffusion draws per example")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--no-attention", action="store_true")
    parser.add_argument("--bf16", action="store_true", help="also time both DP steps under bf16 autocast")
    parser.add_argument("--profile", action="store_true", help="print where our step and a non-private step spend time")
    return parser.parse_args()


Batch = Callable[[], tuple[torch.Tensor, torch.Tensor]]


def _rows(diffusion: Diffusion, model: torch.nn.Module, images: torch.Tensor, labels: torch.Tensor,
          times: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
    """Each of the B*K rows' loss (mean over pixels), the rows of one example adjacent."""
    k = times.shape[1]
    x0 = images.repeat_interleave(k, 0) * 2 - 1
    flat_times, flat_noise = times.flatten(), noise.flatten(0, 1)
    abar = diffusion.alphas_cumprod[flat_times].view(-1, 1, 1, 1)
    noisy = abar.sqrt() * x0 + (1 - abar).sqrt() * flat_noise
    target = abar.sqrt() * flat_noise - (1 - abar).sqrt() * x0 if diffusion.prediction == "v" else flat_noise
    predicted = model(noisy, flat_times, class_labels=labels.repeat_interleave(k)).sample
    return (predicted - target).pow(2).flatten(1).mean(1)


def _nonprivate(model: torch.nn.Module, diffusion: Diffusion, images: torch.Tensor, labels: torch.Tensor,
                inputs: Batch, bf16: bool) -> Callable[[], None]:
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)

    def step() -> None:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            loss = _rows(diffusion, model, images, labels, *inputs()).mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return step


def _opacus(model: torch.nn.Module, diffusion: Diffusion, images: torch.Tensor, labels: torch.Tensor,
            inputs: Batch, k: int, bf16: bool = False) -> Callable[[], None]:
    from opacus import GradSampleModule
    from opacus.optimizers import DPOptimizer

    warnings.filterwarnings("ignore", message="Full backward hook is firing")  # Opacus hooks, every step
    hooked = GradSampleModule(model, loss_reduction="sum")
    optimizer = DPOptimizer(torch.optim.Adam(hooked.parameters(), lr=1e-4), noise_multiplier=SIGMA,
                            max_grad_norm=CLIP, expected_batch_size=len(labels), loss_reduction="sum")

    def step() -> None:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            loss = _rows(diffusion, hooked, images, labels, *inputs()).sum() / k
        loss.backward()
        for param in hooked.parameters():  # per-row gradients -> per-example gradients (sum over its K rows)
            param.grad_sample = param.grad_sample.float().view(len(labels), k, *param.shape).sum(1)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return step


def _ours(model: torch.nn.Module, diffusion: Diffusion, images: torch.Tensor, labels: torch.Tensor,
          inputs: Batch, bf16: bool, batched: bool) -> Callable[[], None]:
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)
    # sample rate 1 over the batch's own examples: every step uses all of them, as the others do
    settings = DpsgdSettings(SIGMA, CLIP, 1.0, len(labels), bf16=bf16)
    engine = DPSGD(model, optimizer, diffusion.example_loss, settings=settings, num_records=len(labels),
                   ledger=PrivacyLedger(), stage="bench", noise=SecretStream(derived_key(1, "bench")),
                   batch_loss=diffusion.example_losses if batched else None)

    def make_batch(index: torch.Tensor) -> tuple[torch.Tensor, ...]:
        times, noise = inputs()
        return images[index], labels[index], times[: len(index)], noise[: len(index)]

    return lambda: engine.step(make_batch) and None


def _profile(step: Callable[[], None], name: str) -> None:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as profiler:
        step()
    print(f"\n{name}: operators by total CPU time")
    print(profiler.key_averages().table(sort_by="cpu_time_total", row_limit=15))


if __name__ == "__main__":
    main()
