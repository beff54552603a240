"""The interface every synthesis method implements, and the registry that finds them by name."""
from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypeVar

import numpy as np
import torch

from ..config import Config
from ..data import Dataset, DatasetInfo, ImageSet
from ..distributed import World
from ..errors import ConfigError, PrivacyError
from ..hardware import ThreadGovernor
from ..privacy import Accountant, Event, LedgerPlan, NonPrivateAccess, PlannedStage, PrivacyLedger
from ..privacy.randomness import SecretStream
from ..runs import RunDirectory
from ..utils.progress import PrivacyProgress

T = TypeVar("T")
E = TypeVar("E")


@dataclass(kw_only=True)
class RunContext:
    """What a method's ``fit`` gets: data, privacy plan and ledger, device, RNG and checkpointing.

    The ledger carries the run's plan (:class:`~dpsynth.privacy.LedgerPlan`): ``plan`` maps each stage to its
    events with the calibrated noise filled in, and the ledger refuses a mechanism beyond it. ``state`` is the last
    checkpoint's state on resume (None on a fresh run); ``checkpoint(state)`` saves one together with
    the ledger that covers it.

    ``noise`` is the secret stream every DP draw (Poisson samples, noise) comes from; ``generator`` draws
    the training randomness (batches of public data, augmentation), from its own secret. Both are shared:
    on several processes (``world``) every rank makes the same draws from them. ``example_generator``
    draws per-example randomness (diffusion times and noise) for the examples this rank processes: the
    shared generator itself on one process, a per-rank one otherwise. Checkpoints carry both streams'
    states (:meth:`random_state`). Only rank 0 writes checkpoints, logs and metrics.
    """

    dataset: Dataset
    run: RunDirectory
    ledger: PrivacyLedger
    accountant: Accountant
    delta: float
    device: torch.device
    generator: torch.Generator
    noise: SecretStream
    state: dict[str, Any] | None = None
    world: World = field(default_factory=World)
    governor: ThreadGovernor | None = None
    example_generator: torch.Generator = None  # type: ignore[assignment]  # set in __post_init__
    settings: dict[str, Any] = field(default_factory=dict)  # what every checkpoint stores: a resume must keep it

    def __post_init__(self) -> None:
        self.ledger_plan  # noqa: B018  (refuses a ledger without a plan before anything runs)
        if self.example_generator is None:
            self.example_generator = self.generator if self.world.size == 1 else torch.Generator()

    @property
    def ledger_plan(self) -> LedgerPlan:
        """The plan the ledger checks every mechanism against; PrivacyError when it has none."""
        if self.ledger.plan is None:
            raise PrivacyError("a run's ledger must carry its privacy plan (PrivacyLedger(plan=LedgerPlan(...))): "
                               "without one nothing stops a mechanism beyond the plan")
        return self.ledger.plan

    @property
    def plan(self) -> Mapping[str, Sequence[Event]]:
        """The planned events of each stage."""
        return self.ledger_plan.stages

    @property
    def allow_non_private(self) -> bool:
        """Whether a stage may use the private data without noise (``run.allow_non_private``)."""
        return self.ledger_plan.allow_non_private

    def planned_event(self, stage: str, *kinds: type[E]) -> E:
        """The one planned event of ``stage``; PrivacyError unless it is of one of the ``kinds`` the method
        expects (a non-private one only where the run allows it)."""
        events = self.plan.get(stage, [])
        allowed = tuple(k for k in kinds if k is not NonPrivateAccess or self.allow_non_private)
        if len(events) != 1 or not isinstance(events[0], allowed):
            raise PrivacyError(f"the privacy plan gives stage {stage!r} {events}, not one "
                               f"{' or '.join(k.__name__ for k in allowed)}; stopped before it ran")
        return events[0]  # type: ignore[return-value]

    def random_state(self) -> dict[str, Any]:
        """The shared streams' states, for a checkpoint (private: it holds the noise stream's key)."""
        return {"noise": self.noise.get_state(), "generator": self.generator.get_state()}

    def restore_random(self, state: dict[str, Any]) -> None:
        """Continue both shared streams from a checkpoint's :meth:`random_state`."""
        self.noise.set_state(state["noise"])
        self.generator.set_state(state["generator"])

    def adjust_threads(self) -> None:
        """Fit the thread count to the cores other processes leave free (``run.threads=auto``; call per step)."""
        threads = self.governor.adjust() if self.governor is not None else None
        if threads is not None:
            self.log("threads", threads=threads)

    def checkpoint(self, state: dict[str, Any]) -> None:
        if self.world.is_main:
            self.run.save_checkpoint(state, self.ledger, self.settings)

    def progress(self, total: int, desc: str, initial: int = 0) -> PrivacyProgress:
        return PrivacyProgress(total, self.ledger, self.accountant, self.delta, desc, initial,
                               enabled=self.world.is_main)

    def log(self, event: str, **fields: Any) -> None:
        if self.world.is_main:
            self.run.log(event, **fields)

    def report_metric(self, name: str, value: Any) -> None:
        """A measurement of the method itself, shown with the evaluation's metrics."""
        if self.world.is_main:
            self.run.report_method_metric(name, value)

    def on_main(self, compute: Callable[[], T]) -> T:
        """``compute()`` on rank 0 alone; its result, the ledger and the shared streams' states follow on
        every rank. For stages that run once (a warm-up's mechanisms, sampling a teacher); ``compute`` must
        not call collectives."""
        if self.world.size == 1:
            return compute()
        sent = (compute(), self.ledger.to_dict(), self.random_state()) if self.world.is_main else None
        received = self.world.broadcast_object(sent)
        assert received is not None
        result, ledger, rng = received
        if not self.world.is_main:
            self.ledger.mirror(PrivacyLedger.from_dict(ledger))
            self.restore_random(rng)
        return result  # type: ignore[return-value]

    def private_shard(self) -> ImageSet:
        """The training examples this rank reads in full passes: those whose index is its rank modulo the size."""
        train = self.dataset.train
        if self.world.size == 1:
            return train
        return train.subset(torch.arange(self.world.rank, len(train), self.world.size))


@dataclass(frozen=True)
class Release:
    """What :meth:`Method.generate` returns: images in [0, 1], their labels, the soft labels of a method that
    releases them (else None), and how sampling ran (precision, compilation), which the run logs."""

    images: torch.Tensor
    labels: torch.Tensor
    soft_labels: torch.Tensor | None = None
    sampling: dict[str, Any] = field(default_factory=dict)


class Method(ABC):
    """A DP image-synthesis method: its config sections, presets and privacy stages.

    Subclasses set ``name``, ``description``, ``sections`` (their config sections with defaults) and
    ``presets`` (nested overrides of any config key), ``releases_soft_labels`` when ``generate`` returns soft
    labels, and register with :func:`register`.
    """

    name: ClassVar[str]
    description: ClassVar[str]
    sections: ClassVar[dict[str, dict[str, Any]]]
    presets: ClassVar[dict[str, dict[str, Any]]]
    default_preset: ClassVar[str] = "cpu"
    releases_soft_labels: ClassVar[bool] = False

    def __init__(self, config: Config) -> None:
        self.config = config

    @classmethod
    def preset(cls, name: str | None) -> tuple[str, dict[str, Any]]:
        """The preset called ``name`` (the default one for None); ConfigError listing the known ones."""
        name = name or cls.default_preset
        if name not in cls.presets:
            raise ConfigError(f"method {cls.name!r} has no preset {name!r}; presets: {', '.join(cls.presets)}")
        return name, cls.presets[name]

    @abstractmethod
    def privacy_stages(self, info: DatasetInfo) -> list[PlannedStage]:
        """The mechanisms a run on ``info``'s training split will apply, in order; one may be calibrated."""

    @abstractmethod
    def fit(self, context: RunContext) -> None:
        """Learn from the private training split, recording every mechanism in ``context.ledger``."""

    def public_data(self, info: DatasetInfo) -> dict[str, np.ndarray]:
        """Fingerprints (:mod:`dpsynth.data.fingerprints`) of each public image set the method reads, named for
        an error message; checked against every private split before a run starts. None by default."""
        return {}

    def soft_label_temperature(self) -> float:
        """The temperature of the soft labels ``generate`` returns (when it returns any)."""
        return 1.0

    def non_private_outputs(self) -> list[str]:
        """Run outputs that hold statistics of the private data no epsilon covers (debugging options only)."""
        return []

    @abstractmethod
    def generate(self, num_samples: int, generator: torch.Generator) -> Release:
        """``num_samples`` images in [0, 1] with labels (and soft labels or None); no private data is read."""


REGISTERED: dict[str, type[Method]] = {}


def register(cls: type[Method]) -> type[Method]:
    """Class decorator adding a method to the registry (``dpsynth.methods.METHODS``) under its ``name``."""
    REGISTERED[cls.name] = cls
    return cls
