"""PE's population and its DP histograms: the synthetic samples of every class, drawn first by RANDOM_API, embedded
(with their lookahead variations) as the points the private images vote for, and bred into the next generation by
the noisy votes (on several processes, as :mod:`dpsynth.methods.pe.method` says)."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import torch

from ...data import ImageSet
from ...privacy.nearest_neighbours import dp_histograms, nearest_neighbour_votes
from ...training.context import RunContext
from ...utils.images import as_floats
from .apis import ImageAPI, Samples
from .embeddings import Embedding

T = TypeVar("T")


@dataclass(frozen=True)
class Population:
    """The samples of each class (``classes[c]``: class c's), and the API that makes and varies them."""

    api: ImageAPI
    classes: list[Samples]

    @classmethod
    def drawn(cls, context: RunContext, api: ImageAPI, sizes: list[int]) -> Population:
        """RANDOM_API's ``sizes[c]`` samples of each class c."""
        def random(label: int) -> Callable[[range, torch.Generator], Samples]:
            return lambda part, generator: api.random_api(label, len(part), generator)
        return cls(api, [Samples.joined(across_ranks(context, size, random(label)))
                         for label, size in enumerate(sizes)])

    @classmethod
    def restored(cls, api: ImageAPI, parts: dict[str, list[torch.Tensor | None]]) -> Population:
        """The population a checkpoint holds (:meth:`parts`)."""
        pairs = zip(parts["images"], parts["params"], strict=True)  # params may be None, images never
        return cls(api, [Samples(images, params) for images, params in pairs])  # type: ignore[arg-type]

    def parts(self) -> dict[str, list[torch.Tensor | None]]:
        """Its images and parameters, per class, as a checkpoint keeps them."""
        return {"images": [samples.images for samples in self.classes],
                "params": [samples.params for samples in self.classes]}

    def images_and_labels(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Every sample's image and class, class after class."""
        labels = [torch.full((len(samples),), label) for label, samples in enumerate(self.classes)]
        return torch.cat([samples.images for samples in self.classes]), torch.cat(labels)

    def lookahead(self, context: RunContext, embed: Embedding, k: int, degree: float) -> list[torch.Tensor]:
        """Per class, each sample's embedding, or (``k`` > 0) the mean embedding of its ``k`` variations."""

        def points(label: int, samples: Samples) -> torch.Tensor:
            def embedded(part: range, generator: torch.Generator) -> torch.Tensor:
                mine = samples.take(torch.tensor(part, dtype=torch.long))
                if k == 0:
                    return embed(mine.images)
                return torch.stack([embed(self.api.variation_api(mine, label, degree, generator).images)
                                    for _ in range(k)]).mean(dim=0)
            return torch.cat(across_ranks(context, len(samples), embedded))

        return [points(label, samples) for label, samples in enumerate(self.classes)]

    def next(self, context: RunContext, histograms: list[torch.Tensor], degree: float) -> Population:
        """The next generation: per class, parents drawn with replacement by its histogram (uniformly where it is
        all zero), then varied with ``degree``."""

        def offspring(label: int, samples: Samples, histogram: torch.Tensor) -> Samples:
            weights = histogram if histogram.sum() > 0 else torch.ones_like(histogram)
            parents = samples.take(torch.multinomial(weights.double(), len(samples), replacement=True,
                                                     generator=context.generator))
            return Samples.joined(across_ranks(context, len(parents), lambda part, generator: self.api.variation_api(
                parents.take(torch.tensor(part, dtype=torch.long)), label, degree, generator)))

        return Population(self.api, [offspring(label, samples, histogram) for label, (samples, histogram)
                                     in enumerate(zip(self.classes, histograms, strict=True))])


@dataclass(frozen=True)
class PrivateVotes:
    """The DP nearest-neighbour histogram of each class: its private images (embedded, ``private[c]``, with
    ``weights[c]``) vote for their nearest point of the population, the votes are summed over the ranks, then one
    Gaussian mechanism (``noise_multiplier``) noises every class's votes together and ``threshold`` zeroes the
    small counts; the mechanism is recorded in the ledger as stage ``stage``."""

    private: list[torch.Tensor]
    weights: list[torch.Tensor]
    noise_multiplier: float
    threshold: float
    stage: str

    @classmethod
    def of(cls, shard: ImageSet, shard_weights: torch.Tensor, num_classes: int, embed: Embedding,
           noise_multiplier: float, threshold: float, stage: str) -> PrivateVotes:
        """The votes of this rank's ``shard`` of the private images."""
        private = [embed(as_floats(shard.images[shard.labels == label])) for label in range(num_classes)]
        weights = [shard_weights[shard.labels == label] for label in range(num_classes)]
        return cls(private, weights, noise_multiplier, threshold, stage)

    def histograms(self, context: RunContext, points: list[torch.Tensor]) -> list[torch.Tensor]:
        """The noisy, thresholded histogram of each class over its ``points``."""
        votes = [nearest_neighbour_votes(private, candidates, weights, device=context.device)
                 for private, candidates, weights in zip(self.private, points, self.weights, strict=True)]
        context.world.all_reduce_sum(votes)  # before the noise: added once, to the whole vote vector
        return dp_histograms(votes, self.noise_multiplier, self.threshold, context.ledger, self.stage, context.noise)


def across_ranks(context: RunContext, total: int, call: Callable[[range, torch.Generator], T]) -> list[T]:
    """``call(part, generator)`` on this rank's contiguous part of ``range(total)`` with its example generator;
    every rank's result, in rank order. On one process: one call on the whole range, shared generator."""
    context.world.seed_examples(context.example_generator, context.generator)
    return context.world.gather_objects(call(range(total)[context.world.part(total)], context.example_generator))
