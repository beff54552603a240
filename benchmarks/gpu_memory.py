"""GPU memory of the `paper` presets' DP-SGD chunks, estimated on the CPU; the physical batch that fits a card.

A chunk of ``physical_batch_size`` examples holds at once: the activations autograd saves for the backward
pass (counted with ``saved_tensors_hooks`` on a real pass of a few examples, scaled linearly; the batched
engine also holds the gradient at every parametrised module's output, counted alike), the examples'
per-example gradients (examples x parameters x 4 bytes, and as much again for the clipping's temporaries),
and the model with Adam's two moments and the EMA (5 x parameters x 4 bytes). What the estimate leaves out
(the CUDA context, cuDNN workspaces, the caching allocator's fragmentation) is covered by fitting the total
into 75 % of the card. No GPU was lent when this was written: it is an estimate, not a measurement; an
out-of-memory error names the setting to lower (``dpsynth.utils.device.memory_limited_by``).

Usage: python benchmarks/gpu_memory.py [--cards 24 80]
"""
from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from dpsynth.diffusion import Diffusion
from dpsynth.methods.dp_imgsyn import DPImgSyn
from dpsynth.methods.dpdm import DPDM
from dpsynth.models import build_unet, group_norm_resnet
from dpsynth.privacy.per_example import BatchedGradients

SHAPES = {"28 x 28 x 1 (MNIST, F-MNIST)": (1, 28), "32 x 32 x 3 (CIFAR-10, CelebA, Camelyon)": (3, 32)}
USABLE = 0.75  # of the card's memory, for what the estimate leaves out
GIB = 2 ** 30


@dataclass(frozen=True)
class Stage:
    """A paper preset's DP-SGD stage: its model, rows per example (K) and a pass that saves activations."""

    name: str
    build: Callable[[int, int], nn.Module]
    rows: int
    physical: int
    backward: Callable[[nn.Module, int, int, int], None]


def _diffusion_pass(model: nn.Module, channels: int, side: int, examples: int) -> None:
    """The batched engine's pass: per-example losses of ``examples`` x K rows, gradients at module outputs."""
    diffusion, k = Diffusion(prediction="v"), DPDM.sections["dpsgd"]["noise_multiplicity"]
    times, noise = diffusion.training_inputs(examples, k, (channels, side, side), torch.Generator().manual_seed(0))
    batch = (torch.rand(examples, channels, side, side), torch.randint(0, 10, (examples,)), times, noise)
    BatchedGradients(model, diffusion.example_losses, dict(model.named_parameters()))(batch)


def _classifier_pass(model: nn.Module, channels: int, side: int, examples: int) -> None:
    logits = model(torch.rand(examples, channels, side, side) * 2 - 1)
    nn.functional.cross_entropy(logits, torch.randint(0, 10, (examples,))).backward()


def _unet(channels: int, side: int) -> nn.Module:
    model = DPDM.sections["model"]
    return build_unet(channels, side, 10, model["block_channels"], model["layers_per_block"], model["attention"],
                      model["norm_groups"])


def _resnet(channels: int, side: int) -> nn.Module:
    teacher = DPImgSyn.sections["teacher"]
    return group_norm_resnet(channels, 10, teacher["blocks"], teacher["widths"], teacher["groups"])


STAGES = [
    Stage("dpdm / dp-feta / feta-pro dpsgd, dp-sad teacher", _unet, DPDM.sections["dpsgd"]["noise_multiplicity"],
          DPDM.sections["dpsgd"]["physical_batch_size"], _diffusion_pass),
    Stage("dp-imgsyn teacher (ResNet-18)", _resnet, 1, DPImgSyn.sections["teacher"]["physical_batch_size"],
          _classifier_pass),
]


def saved_bytes_per_example(stage: Stage, channels: int, side: int, examples: int = 2) -> tuple[float, int]:
    """Bytes autograd saves per example in ``stage``'s pass, and the model's parameter count."""
    torch.manual_seed(0)
    model = stage.build(channels, side)
    seen: dict[int, int] = {}
    outputs = [0]

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        seen[storage.data_ptr()] = storage.nbytes()
        return tensor

    def output_gradient(module: nn.Module, inputs: tuple, output: torch.Tensor) -> None:
        outputs[0] += output.nbytes if stage.backward is _diffusion_pass else 0

    handles = [m.register_forward_hook(output_gradient) for m in model.modules()
               if any(True for _ in m.parameters(recurse=False))]
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        stage.backward(model, channels, side, examples)
    for handle in handles:
        handle.remove()
    return (sum(seen.values()) + outputs[0]) / examples, sum(p.numel() for p in model.parameters())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cards", type=float, nargs="+", default=[24, 80], help="GPU memory in GiB")
    args = parser.parse_args()
    for stage in STAGES:
        for shape, (channels, side) in SHAPES.items():
            activations, parameters = saved_bytes_per_example(stage, channels, side)
            per_example = activations + 2 * 4 * parameters
            fixed = 5 * 4 * parameters
            used = fixed + stage.physical * per_example
            fits = {card: int((USABLE * card * GIB - fixed) // per_example) for card in args.cards}
            print(f"{stage.name}, {shape}: {parameters / 1e6:.2f}M parameters, K = {stage.rows}; per example "
                  f"{activations / 2 ** 20:.1f} MiB activations + {8 * parameters / 2 ** 20:.1f} MiB gradients; "
                  f"physical batch {stage.physical}: {used / GIB:.1f} GiB; largest that fits "
                  + ", ".join(f"{card:g} GB: {count}" for card, count in fits.items()))


if __name__ == "__main__":
    main()
