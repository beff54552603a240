"""GPU memory of the `paper` presets' DP-SGD chunks, estimated on the CPU (:mod:`dpsynth.autoplan.memory`, which
the derived GPU plans use); the physical batch that fits a card. On an H200 the estimate was 1.75x the peak
measured by `scripts/gpu-check.sh` (benchmarks/results/gpu-check/); an out-of-memory error names the setting to
lower (``dpsynth.utils.device.memory_limited_by``).

Usage: python benchmarks/gpu_memory.py [--cards 24 80]
"""
from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from dpsynth.autoplan.memory import ChunkMemory, chunk_memory
from dpsynth.diffusion import Diffusion
from dpsynth.diffusion.settings import UNetSettings
from dpsynth.methods.dp_imgsyn.method import TeacherSettings
from dpsynth.models import build_unet, group_norm_resnet
from dpsynth.privacy.per_example import BatchedGradients
from dpsynth.training.private import DiffusionDpsgdSection

SHAPES = {"28 x 28 x 1 (MNIST, F-MNIST)": (1, 28), "32 x 32 x 3 (CIFAR-10, CelebA, Camelyon)": (3, 32)}
GIB = 2 ** 30


@dataclass(frozen=True)
class Stage:
    """A paper preset's DP-SGD stage: its model, rows per example (K) and a pass that saves activations."""

    name: str
    build: Callable[[int, int], nn.Module]
    rows: int
    physical: int
    backward: Callable[[nn.Module, int, int, int], None]


DPSGD, TEACHER = DiffusionDpsgdSection(), TeacherSettings()  # the defaults of DPDM and DP-ImgSyn


def _diffusion_pass(model: nn.Module, channels: int, side: int, examples: int) -> None:
    """The batched engine's pass: per-example losses of ``examples`` x K rows, gradients at module outputs."""
    diffusion, k = Diffusion(prediction="v"), DPSGD.noise_multiplicity
    times, noise = diffusion.training_inputs(examples, k, (channels, side, side), torch.Generator().manual_seed(0))
    batch = (torch.rand(examples, channels, side, side), torch.randint(0, 10, (examples,)), times, noise)
    BatchedGradients(model, diffusion.example_losses, dict(model.named_parameters()))(batch)


def _classifier_pass(model: nn.Module, channels: int, side: int, examples: int) -> None:
    logits = model(torch.rand(examples, channels, side, side) * 2 - 1)
    nn.functional.cross_entropy(logits, torch.randint(0, 10, (examples,))).backward()


def _unet(channels: int, side: int) -> nn.Module:
    model = UNetSettings()
    return build_unet(channels, side, 10, model.block_channels, model.layers_per_block, model.attention,
                      model.norm_groups)


def _resnet(channels: int, side: int) -> nn.Module:
    return group_norm_resnet(channels, 10, TEACHER.blocks, TEACHER.widths, TEACHER.groups)


STAGES = [
    Stage("dpdm / dp-feta / feta-pro dpsgd, dp-sad teacher", _unet, DPSGD.noise_multiplicity,
          DPSGD.physical_batch_size, _diffusion_pass),
    Stage("dp-imgsyn teacher (ResNet-18)", _resnet, 1, TEACHER.physical_batch_size,
          _classifier_pass),
]


def chunk(stage: Stage, channels: int, side: int) -> ChunkMemory:
    """The memory of ``stage``'s DP-SGD chunks on images of ``channels`` x ``side`` x ``side``."""
    torch.manual_seed(0)
    return chunk_memory(stage.build(channels, side), lambda model, examples: stage.backward(model, channels, side,
                                                                                            examples),
                        output_gradients=stage.backward is _diffusion_pass)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cards", type=float, nargs="+", default=[24, 80], help="GPU memory in GiB")
    args = parser.parse_args()
    for stage in STAGES:
        for shape, (channels, side) in SHAPES.items():
            memory = chunk(stage, channels, side)
            fits = {card: memory.largest_fitting(card * GIB) for card in args.cards}
            print(f"{stage.name}, {shape}: {memory.parameters / 1e6:.2f}M parameters, K = {stage.rows}; per example "
                  f"{memory.per_example / 2 ** 20:.1f} MiB (activations and gradients); physical batch "
                  f"{stage.physical}: {memory.bytes(stage.physical) / GIB:.1f} GiB; largest that fits "
                  + ", ".join(f"{card:g} GB: {count}" for card, count in fits.items()))


if __name__ == "__main__":
    main()
