"""Private Evolution (Lin et al.): no training on private data; a foundation-model API evolves a population
toward the private set, guided only by DP nearest-neighbour votes (Alg. 1-4).

Per class c (conditional PE, Alg. 3/4): S_0 = RANDOM_API(N_c); for t = 1..T the private images of class c
vote for their nearest member of S_{t-1} (embedding distance to the mean of k lookahead variations), the
votes of every class get Gaussian noise together (one sensitivity-1 mechanism per iteration) and a
threshold, parents are drawn by the noisy histogram and varied with degree d_t into S_t. S_T is released.
The per-class population sizes N_c follow the class sizes, released once with Gaussian noise (the paper
assumes a balanced private set, which is itself private knowledge).

On several processes the API calls are split: each rank makes its contiguous part of every call's samples
(with its own generator) and the parts are gathered, so the population is the same on every rank; each rank
embeds its shard of the private set, the votes are all-reduced, and then every rank adds the same noise
draw of the shared secret stream: one Gaussian mechanism per iteration, as on one process.
"""
from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache

import numpy as np
import torch

from ...config import (
    RunConfig,
    RunSettings,
    SamplingSettings,
    at_least,
    one_of,
    positive,
    preset_with,
    section_settings,
)
from ...data import DatasetInfo
from ...data.fingerprints import FINGERPRINTS
from ...errors import ConfigError, PrivacyWarning
from ...privacy import GaussianMechanism, PlannedStage
from ...privacy.mechanisms import release_counts
from ...privacy.nearest_neighbours import nearest_neighbour_votes
from ...runs import LOG
from ...training.context import RunContext
from ...training.probes import Probes, timed
from ...utils.device import pick_device
from ..base import CPU_PROTOCOL, Method, Release
from . import DECLARATION
from .apis import ApiSettings, ImageAPI, Samples, api_names, build_api
from .callbacks import Callback, Generation, NonPrivateDistance, checkpoint, log_histograms, save_grid
from .embeddings import EMBEDDINGS, Embedding, build_embedding
from .population import Population, PrivateVotes

PHASE, COUNTS_STAGE, HISTOGRAMS_STAGE = "pe", "class-counts", "histograms"
# The phases the planner prices, each per unit: an image the API makes or varies, an image embedded, a private
# image's vote among its class's share of the population.
RANDOM_PHASE, VARIATION_PHASE, EMBEDDING_PHASE, VOTES_PHASE = "random API", "variation API", "embedding", "votes"
PROBE_IMAGES, PROBE_VOTERS = 16, 256  # images the API makes for the probe; random private rows that vote


@dataclass(frozen=True, kw_only=True)
class EvolutionSettings:
    """The ``pe`` section: T ``iterations`` of a ``population`` with k ``lookahead`` variations per vote, the
    histograms' noise multiplier (None: calibrated to the budget) and threshold (None: sqrt(2) sigma), the
    variation degree per iteration (``[start, end]`` spaced linearly, or one per iteration), the embedding,
    how the population splits over classes (``noisy`` class sizes, released with ``count_noise``, or
    ``balanced``) and the non-private debugging distance."""

    iterations: int = positive(default=20)
    population: int = positive(default=50000)
    lookahead: int = at_least(0, default=8)
    noise_multiplier: float | None = positive(default=None)
    threshold: float | None = at_least(0, default=None)
    degrees: tuple[float, ...] = positive(default=(0.98, 0.6))
    embedding: str = one_of(*EMBEDDINGS, default="inception")
    class_counts: str = one_of("noisy", "balanced", default="noisy")
    count_noise: float = positive(default=100.0)
    debug_nonprivate_fd: bool = False

    def __post_init__(self) -> None:
        if len(self.schedule()) != self.iterations or not all(0 < d <= 1 for d in self.degrees):
            raise ConfigError(f"pe.degrees: give [start, end] or one degree in (0, 1] per iteration "
                              f"({self.iterations}), got {list(self.degrees)}")

    def schedule(self) -> list[float]:
        """The variation degree of each iteration."""
        if len(self.degrees) == 2 and self.iterations != 2:
            return np.linspace(self.degrees[0], self.degrees[1], self.iterations).tolist()
        return list(self.degrees)


class PrivateEvolution(Method):
    """A population per class evolved by RANDOM_API / VARIATION_API and DP nearest-neighbour histograms."""

    declaration = DECLARATION
    probed_keys = ("api", "pe")
    no_generator = ("trains no generator: its release is the population the DP votes selected from a public "
                    "model's images, and that model never read the private data; release more by running it again")
    sections = {"api": ApiSettings, "pe": EvolutionSettings}
    presets = {
        # The paper's CIFAR-10 settings (App. J): T = 20, k = 8, N_syn = 50k, 100 DDIM steps, SDEdit from
        # 98 % down to 60 % of the schedule, Inception embedding; sigma calibrated to the budget.
        "paper": {},
        # Sized for a 2-core CPU: a smaller population and lookahead, raw-pixel embedding, 10 DDIM steps.
        "cpu": preset_with(CPU_PROTOCOL, {"api": {"steps": 10}, "pe": {
            "iterations": 8, "population": 2000, "lookahead": 2, "embedding": "pixels", "degrees": [0.9, 0.4]}}),
    }

    def __init__(self, config: RunConfig) -> None:
        super().__init__(config)
        self.api_settings = section_settings(ApiSettings, config, "api")
        self.evolution = section_settings(EvolutionSettings, config, "pe")
        if self.api_settings.name not in api_names():
            raise ConfigError(f"api.name must be one of {', '.join(api_names())} (or an API registered with "
                              f"dpsynth.methods.pe.apis.register_api), got {self.api_settings.name!r}")
        self.api: ImageAPI | None = None
        self.api_device: torch.device | None = None
        self.population: list[Samples] | None = None
        self.info: DatasetInfo | None = None

    def class_balance(self) -> str:
        if self.evolution.class_counts == "balanced":
            return super().class_balance()
        return (f"in proportion to DP counts of the private classes (stage {COUNTS_STAGE}, Gaussian noise of std "
                f"{self.evolution.count_noise:g}): the release shows the class sizes only through that noise")

    def privacy_stages(self, info: DatasetInfo) -> list[PlannedStage]:
        settings, stages = self.evolution, []
        if settings.class_counts == "noisy":
            stages.append(PlannedStage(COUNTS_STAGE, GaussianMechanism(settings.count_noise)))
        if settings.noise_multiplier is None:
            stages.append(PlannedStage(HISTOGRAMS_STAGE,
                                       calibrated=lambda sigma: GaussianMechanism(sigma, settings.iterations)))
        else:
            stages.append(PlannedStage(HISTOGRAMS_STAGE,
                                       GaussianMechanism(settings.noise_multiplier, settings.iterations)))
        return stages

    def public_data(self, info: DatasetInfo) -> dict[str, np.ndarray]:
        """The fingerprints of the API's training data: the diffusion API's, which ``dpsynth pretrain`` saves with
        the model; a registered API's ``training_fingerprints()``; none for the text simulator, which has none."""
        settings = self.api_settings
        if settings.name == "drawtext" or settings.name == "diffusion" and not settings.model:
            return {}
        if settings.name == "diffusion" and settings.model:
            from ...diffusion.pretrain import model_label, public_fingerprints  # diffusers' import: this API alone

            label, prints = model_label("api.model", settings.model), public_fingerprints(settings.model)
            where = f"api.model {settings.model} holds no {FINGERPRINTS} (dpsynth pretrain writes one)"
        else:
            api = self.built_api(info, pick_device(RunSettings.of(self.config).device))
            label = f"the training data of the API api.name {settings.name!r}"
            prints = getattr(api, "training_fingerprints", lambda: None)()
            where = f"the API {settings.name!r} gives no training_fingerprints()"
        if prints is None:
            warnings.warn(f"{where}: its training data cannot be checked to be disjoint from the private data; make "
                          "sure it is", PrivacyWarning, stacklevel=2)
            return {}
        return {label: prints}

    def throughput_probes(self, shape: tuple[int, int, int], num_classes: int, device: torch.device) -> Probes:
        """The API's random and variation calls (the release's unit: a variation at the last degree), the
        embedding and the votes, on the API's own images and random embeddings (nothing private)."""
        settings, generator = self.evolution, torch.Generator().manual_seed(0)
        info = DatasetInfo("probe", *shape, [str(c) for c in range(num_classes)], "probe")
        api = cache(lambda: build_api(self.api_settings, info, device))  # the probe's own, at its shape
        embed = cache(lambda: build_embedding(settings.embedding, device))
        samples = cache(lambda: api().random_api(0, PROBE_IMAGES, generator))  # made once, untimed

        def per_image(call: Callable[[Samples], object]) -> float:
            call(samples().take(torch.arange(2)))  # a warm-up
            return timed(lambda: call(samples()), device) / PROBE_IMAGES

        def variation(degree: float) -> Callable[[], float]:
            return lambda: per_image(lambda some: api().variation_api(some, 0, degree, generator))

        def random() -> float:
            return per_image(lambda some: api().random_api(0, len(some), generator))

        def embedding() -> float:
            return per_image(lambda some: embed()(some.images))

        def votes() -> float:
            dimension = embed()(samples().images[:1]).shape[1]
            private = torch.rand(PROBE_VOTERS, dimension, generator=generator)
            candidates = torch.rand(max(1, settings.population // num_classes), dimension, generator=generator)
            weights = torch.ones(PROBE_VOTERS)
            return timed(lambda: nearest_neighbour_votes(private, candidates, weights, device=device),
                         device) / PROBE_VOTERS

        schedule = settings.schedule()
        return Probes({}, sampling=variation(schedule[-1]), phases={
            RANDOM_PHASE: random, VARIATION_PHASE: variation(float(np.mean(schedule))), EMBEDDING_PHASE: embedding,
            VOTES_PHASE: votes})

    @classmethod
    def phase_units(cls, config: RunConfig, num_images: float) -> dict[str, float]:
        """RANDOM_API makes the population; each iteration varies it k times for the lookahead and once for the
        offspring, embeds it (k times, or once without lookahead) and lets every private image vote; the private
        images are embedded once."""
        pe = section_settings(EvolutionSettings, config, "pe")
        population, iterations, lookahead = pe.population, pe.iterations, pe.lookahead
        return {RANDOM_PHASE: population, VARIATION_PHASE: iterations * (lookahead + 1) * population,
                EMBEDDING_PHASE: num_images + iterations * max(lookahead, 1) * population,
                VOTES_PHASE: iterations * num_images}

    @classmethod
    def release_units(cls, config: RunConfig) -> float:
        """The variations a release of more images than the population makes."""
        population = section_settings(EvolutionSettings, config, "pe").population
        return max(0, SamplingSettings.of(config).num_samples - population)

    def built_api(self, info: DatasetInfo, device: torch.device) -> ImageAPI:
        """The API ``api.name`` names (:func:`~dpsynth.methods.pe.apis.build_api`) on ``device``, built once."""
        if self.api is None or self.api_device != device:
            self.api, self.api_device = build_api(self.api_settings, info, device), device
        return self.api

    def fit(self, context: RunContext) -> None:
        """Draw the first population (or resume it), then per iteration: the lookahead points, the DP histograms of
        the private votes, the next generation; the :meth:`callbacks` see each generation."""
        info, settings, degrees = context.dataset.info, self.evolution, self.evolution.schedule()
        api = self.built_api(info, context.device)
        embed = build_embedding(settings.embedding, context.device)
        event = context.planned_event(HISTOGRAMS_STAGE, GaussianMechanism)
        threshold = settings.threshold if settings.threshold is not None else 2 ** 0.5 * event.noise_multiplier
        votes = PrivateVotes.of(*context.private_shard(), info.num_classes, embed, event.noise_multiplier, threshold,
                                HISTOGRAMS_STAGE)
        callbacks = self.callbacks(context, votes, embed)
        population, start = self._initial_population(context, api)
        if start == 0:
            for callback in callbacks:
                callback(context, Generation(0, population))
        progress = context.progress(settings.iterations, "pe", initial=start)
        for t in range(start, settings.iterations):
            histograms = votes.histograms(context, population.lookahead(context, embed, settings.lookahead,
                                                                        degrees[t]))
            population = population.next(context, histograms, degrees[t])
            for callback in callbacks:
                callback(context, Generation(t + 1, population, degrees[t], histograms))
            progress.update({})
            context.adjust_threads()
        progress.close()
        self.api, self.population, self.info = api, population.classes, info

    def callbacks(self, context: RunContext, votes: PrivateVotes, embed: Embedding) -> list[Callback]:
        """What is done with each generation, in order: checkpoint it (first: the rest is written only once it is
        kept), draw its grid, log its histograms, and with ``pe.debug_nonprivate_fd`` its NON-private distance to
        the private images (:mod:`dpsynth.methods.pe.callbacks`). A subclass adds its own."""
        kept: list[Callback] = [checkpoint(PHASE), save_grid, log_histograms]
        if not self.non_private_outputs():
            return kept
        if context.world.size > 1:
            raise ConfigError("pe.debug_nonprivate_fd needs a single process (each rank holds a shard)")
        warnings.warn(f"pe.debug_nonprivate_fd is on: {self.non_private_outputs()[0]}", stacklevel=2)
        return [*kept, NonPrivateDistance(votes.private, embed)]

    def non_private_outputs(self) -> list[str]:
        if not self.evolution.debug_nonprivate_fd:
            return []
        return [f"{LOG}: the pe-debug-NONPRIVATE events (pe.debug_nonprivate_fd) hold each iteration's Fréchet "
                "distance to the private set, which no epsilon covers; do not share that log"]

    def _initial_population(self, context: RunContext, api: ImageAPI) -> tuple[Population, int]:
        """The population and the iterations done: the checkpoint's, or RANDOM_API's per class."""
        sizes = self._class_sizes(context)
        resumed = context.resume(PHASE)
        if resumed is not None:
            return Population.restored(api, resumed.parts), resumed.step
        return Population.drawn(context, api, sizes), 0

    def _class_sizes(self, context: RunContext) -> list[int]:
        """Population size per class: ``pe.population`` split by the noisy class sizes (or evenly)."""
        info, settings = context.dataset.info, self.evolution
        total, classes = settings.population, info.num_classes
        if total < classes:
            raise ConfigError(f"pe.population must be at least the number of classes ({classes}), got {total}")
        if settings.class_counts == "balanced":
            shares = torch.ones(classes, dtype=torch.float64)
        else:
            train = context.dataset.train
            counts = torch.bincount(train.labels, weights=train.unit_weights(), minlength=classes)
            shares = context.released(COUNTS_STAGE, lambda: release_counts(
                counts, 1.0, settings.count_noise, context.ledger, COUNTS_STAGE, context.noise)).clamp_min(1)
        return apportion(total, shares)

    def generate(self, num_samples: int, generator: torch.Generator) -> Release:
        """``num_samples`` images, split over classes as the population is; beyond the population's size,
        variations of it with the last degree (post-processing: no privacy cost)."""
        if self.api is None or self.population is None:
            raise RuntimeError("generate() needs a fitted population: call fit() first")
        sizes = apportion(num_samples, torch.tensor([len(p) for p in self.population], dtype=torch.float64))
        images, labels = [], []
        for label, (samples, size) in enumerate(zip(self.population, sizes, strict=True)):
            chosen = samples.take(torch.arange(min(size, len(samples))))
            extra = size - len(chosen)
            if extra > 0:
                parents = samples.take(torch.randint(len(samples), (extra,), generator=generator))
                varied = self.api.variation_api(parents, label, self.evolution.schedule()[-1], generator)
                chosen = Samples.joined([chosen, varied])
            images.append(chosen.images)
            labels.append(torch.full((size,), label))
        return Release(torch.cat(images), torch.cat(labels))


def apportion(total: int, shares: torch.Tensor) -> list[int]:
    """``total`` split in proportion to ``shares`` (largest remainders), at least 1 each."""
    exact = shares / shares.sum() * (total - len(shares))
    sizes = exact.floor().long() + 1
    remainder = total - int(sizes.sum())
    sizes[torch.argsort(exact - exact.floor(), descending=True)[:remainder]] += 1
    return sizes.tolist()
