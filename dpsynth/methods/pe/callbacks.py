"""What PE does with each generation beside breeding the next: callbacks called, in order, on the first population
(iteration 0) and after every iteration. The run's own keep the population (a checkpoint, first: what follows is
written only once it is safe), draw its grid and log the histograms; a subclass of the method adds its own
(:meth:`~dpsynth.methods.pe.method.PrivateEvolution.callbacks`)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from ...evaluation.fidelity import Moments, fid
from ...training.context import RunContext
from .embeddings import Embedding
from .population import Population

ITERATIONS_DIR = "iterations"


@dataclass(frozen=True)
class Generation:
    """A population after ``iteration`` iterations, with the variation degree and the DP histograms that made it
    (None for the first population)."""

    iteration: int
    population: Population
    degree: float | None = None
    histograms: list[torch.Tensor] | None = None


class Callback(Protocol):
    def __call__(self, context: RunContext, generation: Generation) -> None: ...


def checkpoint(phase: str) -> Callback:
    """Keep the population in the run's checkpoint as phase ``phase``: a resume continues from it."""

    def keep(context: RunContext, generation: Generation) -> None:
        context.checkpoint(phase, generation.iteration, **generation.population.parts())
    return keep


def save_grid(context: RunContext, generation: Generation) -> None:
    """A grid of the population's images, a row per class (``iterations/iteration-NNN.png``)."""
    images, labels = generation.population.images_and_labels()
    context.save_grid(f"{ITERATIONS_DIR}/iteration-{generation.iteration:03d}.png", images, labels,
                      len(generation.population.classes))


def log_histograms(context: RunContext, generation: Generation) -> None:
    """The iteration's degree and statistics of its noisy, thresholded histograms (DP already: safe to log)."""
    if generation.histograms is None:
        return
    counts = torch.cat(generation.histograms)
    context.log("pe-iteration", iteration=generation.iteration, degree=generation.degree,
                nonzero_fraction=float((counts > 0).double().mean()), noisy_total=float(counts.sum()),
                max_count=float(counts.max()))


@dataclass(frozen=True)
class NonPrivateDistance:
    """NOT DP: the Fréchet distance, in PE's embedding space, between the population and the private images
    (``private``, embedded), logged as ``pe-debug-NONPRIVATE``."""

    private: list[torch.Tensor]
    embed: Embedding

    def __call__(self, context: RunContext, generation: Generation) -> None:
        images, _ = generation.population.images_and_labels()
        distance = fid(Moments.of(torch.cat(self.private).double().cpu().numpy()),
                       Moments.of(self.embed(images).double().cpu().numpy()))
        context.log("pe-debug-NONPRIVATE", iteration=generation.iteration, frechet_distance=distance)
