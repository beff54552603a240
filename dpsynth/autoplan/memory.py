"""Device memory of a DP-SGD chunk, estimated from a real pass of a few examples; the chunk that fits a card.

A chunk of ``physical_batch_size`` examples holds at once: the activations autograd saves for the backward pass
(counted with ``saved_tensors_hooks`` on a pass of a few examples, scaled linearly; the batched engine also holds
the gradient at every parametrised module's output, counted alike), the examples' per-example gradients (examples
x parameters x 4 bytes, and as much again for the clipping's temporaries), and the model with Adam's two moments
and the EMA (5 x parameters x 4 bytes). What the estimate leaves out (the CUDA context, cuDNN workspaces, the
caching allocator's fragmentation) is covered by fitting the total into :data:`USABLE` of the card.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from ..privacy.per_example import BatchedGradients
from ..training.probes import DpsgdProbe

USABLE = 0.75  # of the card's memory, for what the estimate leaves out


@dataclass(frozen=True)
class ChunkMemory:
    """Bytes of a DP-SGD chunk: ``fixed`` (model, Adam, EMA) plus ``per_example`` x examples."""

    fixed: float
    per_example: float
    parameters: int

    def bytes(self, examples: int) -> float:
        return self.fixed + examples * self.per_example

    def largest_fitting(self, card_bytes: float) -> int:
        """The most examples whose chunk fits :data:`USABLE` of ``card_bytes`` (at least 1)."""
        return max(1, int((USABLE * card_bytes - self.fixed) // self.per_example))


def chunk_memory(model: nn.Module, backward: Callable[[nn.Module, int], None], examples: int = 2,
                 output_gradients: bool = True) -> ChunkMemory:
    """The memory of ``model``'s DP-SGD chunks, from ``backward(model, examples)`` (a pass that saves what the
    engine's does); ``output_gradients``: the batched engine also holds each parametrised module's output
    gradient."""
    seen: dict[int, int] = {}
    outputs = [0]

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        seen[storage.data_ptr()] = storage.nbytes()
        return tensor

    def output_gradient(module: nn.Module, inputs: tuple, output: torch.Tensor) -> None:
        outputs[0] += output.nbytes if output_gradients and isinstance(output, torch.Tensor) else 0

    handles = [module.register_forward_hook(output_gradient) for module in model.modules()
               if any(True for _ in module.parameters(recurse=False))]
    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
            backward(model, examples)
    finally:
        for handle in handles:
            handle.remove()
    parameters = sum(p.numel() for p in model.parameters())
    activations = (sum(seen.values()) + outputs[0]) / examples
    return ChunkMemory(5 * 4 * parameters, activations + 2 * 4 * parameters, parameters)


def probe_memory(probe: DpsgdProbe, examples: int = 2) -> ChunkMemory:
    """:func:`chunk_memory` of a DP-SGD section's probe: the batched engine's pass where the section has a batch
    loss, else one backward pass of the summed loss (what vmap holds per example, approximately)."""
    def backward(model: nn.Module, count: int) -> None:
        batch = probe.make_batch(torch.arange(count))
        if probe.batch_loss is not None:
            BatchedGradients(model, probe.batch_loss, dict(model.named_parameters()))(batch)
        else:
            torch.stack([probe.loss(model, *example) for example in zip(*batch, strict=True)]).sum().backward()

    return chunk_memory(probe.model, backward, examples, output_gradients=probe.batch_loss is not None)
