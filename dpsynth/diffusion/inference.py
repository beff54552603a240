"""The model a release is sampled with: bf16 autocast or an inductor-compiled graph, chosen for the hardware.

Both are decided at run time (:mod:`dpsynth.hardware`) and recorded in the run's log. Measured on the ``cpu``
UNet, one denoising step of 500 images (``benchmarks/sampling_speed.py``): on a CPU with native bf16 (AVX-512
BF16) bf16 autocast takes 0.37x the fp32 time and compiling it gains 5 % more; on an AVX2 CPU bf16 is 7.7x
slower and a compiled fp32 graph (inductor with weight freezing) takes 0.51-0.62x the eager time in chunks of 500,
depending on the side, and less gain in the smaller chunks a plan samples large images in, for 40-142 s of
compilation the first time (inductor's on-disk cache serves a repeat, as
after a resume; :data:`~dpsynth.hardware.COMPILED_SAMPLING`). So ``sampling.bf16: auto`` takes bf16 where it is
native and ``sampling.compile: auto`` compiles on a CPU that samples in fp32 where the release repays it; on a GPU
auto compiles nothing (not measured there).
"""
from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ..config import SamplingSettings
from ..hardware import Choice, resolve_bf16, resolve_compile
from ..utils.device import bf16_autocast


@dataclass
class SamplingModel:
    """What to call to sample (the module or its compiled graph) and how it was chosen."""

    model: Any
    device: torch.device
    bf16: Choice
    compiled: Choice
    compile_seconds: float = 0.0

    def report(self) -> dict[str, Any]:
        return {"sampling_bf16": self.bf16.value, "sampling_compiled": self.compiled.value,
                "sampling_compile_seconds": round(self.compile_seconds, 1)}


def sampling_inputs(rows: int, shape: tuple[int, ...], timesteps: int) -> tuple[torch.Tensor, ...]:
    """Noisy images, times and labels of one UNet call on ``rows`` rows, laid out as :meth:`Diffusion.denoise`
    passes them (one time expanded over the rows): a compiled graph guards on strides, and an example with other
    strides cost a second compilation at the first real call (measured: 14-70 s on AVX2)."""
    return torch.zeros(rows, *shape), torch.tensor(timesteps - 1).expand(rows), torch.zeros(rows, dtype=torch.long)


@contextlib.contextmanager
def sampling_model(model: nn.Module, settings: SamplingSettings, image_steps: int, example: tuple[torch.Tensor, ...]
                   ) -> Iterator[SamplingModel]:
    """``model`` prepared by ``settings`` (``bf16``, ``compile``) to sample ``image_steps`` images x steps;
    autocast is active inside.

    ``example`` (:func:`sampling_inputs` of one chunk) is run once to compile, so the time reported is the
    compilation's. A last chunk of another size is compiled again when it comes (keep ``sampling.num_samples`` a
    multiple of ``sampling.batch_size`` where compiling)."""
    device = next(model.parameters()).device
    bf16 = resolve_bf16(settings.bf16, device, "sampling.bf16")
    compiled = resolve_compile(settings.compile, device, bf16.value, image_steps, example[0].shape[-1],
                               len(example[0]))
    chosen = SamplingModel(model, device, bf16, compiled)
    with torch.no_grad(), bf16_autocast(device, bf16.value):
        if compiled.value:
            start = time.perf_counter()
            chosen.model = torch.compile(model, options={"freezing": True})
            images, times, labels = (tensor.to(device) for tensor in example)
            chosen.model(images, times, class_labels=labels)
            chosen.compile_seconds = time.perf_counter() - start
        yield chosen
