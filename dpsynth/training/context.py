"""What a method's ``fit`` runs in: the data, the privacy plan and ledger, the device, the secret random streams,
checkpoints and the run's side files, on one process or several."""
from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np
import torch

from ..data import Dataset, ImageSet
from ..distributed import World
from ..errors import PrivacyError
from ..hardware import ThreadGovernor
from ..privacy import Accountant, Event, LedgerPlan, NonPrivateAccess, PrivacyLedger
from ..privacy.progress import PrivacyProgress
from ..privacy.randomness import SecretStream
from ..runs import Checkpoint, RunDirectory
from ..utils.images import class_grid, save_png, to_uint8
from ..utils.messages import tell

T = TypeVar("T")
E = TypeVar("E")


@dataclass(kw_only=True)
class RunContext:
    """What a method's ``fit`` gets: data, privacy plan and ledger, device, RNG and checkpointing.

    The ledger carries the run's plan (:class:`~dpsynth.privacy.LedgerPlan`): ``plan`` maps each stage to its
    events with the calibrated noise filled in, and the ledger refuses a mechanism beyond it.

    ``noise`` is the secret stream every DP draw (Poisson samples, noise) comes from; ``generator`` draws
    the training randomness (batches of public data, augmentation), from its own secret. Both are shared:
    on several processes (``world``) every rank makes the same draws from them. ``example_generator``
    draws per-example randomness (diffusion times and noise) for the examples this rank processes: the
    shared generator itself on one process, a per-rank one otherwise. Only rank 0 writes checkpoints, logs
    and metrics.

    Checkpoints have one layout (:class:`~dpsynth.runs.Checkpoint`) and three calls: :meth:`released` for a
    value computed from private data (computed once, checkpointed at once, restored on resume),
    :meth:`checkpoint` for a phase's progress (its models, EMA and optimisers by name) and :meth:`resume` to
    continue a phase. ``state`` is the checkpoint being resumed (None on a fresh run); from a method's first
    call of :meth:`released`, :meth:`resume` or :meth:`on_main` on (after it has built its models), every
    random stream, torch's global one included, continues from it.
    """

    dataset: Dataset
    run: RunDirectory
    ledger: PrivacyLedger
    accountant: Accountant
    delta: float
    device: torch.device
    generator: torch.Generator
    noise: SecretStream
    state: Checkpoint | None = None
    world: World = field(default_factory=World)
    governor: ThreadGovernor | None = None
    example_generator: torch.Generator = None  # type: ignore[assignment]  # set in __post_init__
    settings: dict[str, Any] = field(default_factory=dict)  # what every checkpoint stores: a resume must keep it
    group_cap: int = 16  # privacy.max_images_per_group: a group's images a DP-SGD step reads, at most
    deadline: float | None = None  # run.time_limit: the time.perf_counter() by which the run should end
    expected: dict[str, float] = field(default_factory=dict)  # a derived plan's expected seconds by phase
    stopped: dict[str, dict[str, int]] = field(default_factory=dict)  # stages the time limit cut: steps run, planned

    released_values: dict[str, Any] = field(init=False)
    _random_continued: bool = field(init=False, default=False)
    _inside_main: bool = field(init=False, default=False)  # on_main's compute is running (rank 0)

    def __post_init__(self) -> None:
        self.ledger_plan  # noqa: B018  (refuses a ledger without a plan before anything runs)
        if self.example_generator is None:
            self.example_generator = self.generator if self.world.size == 1 else torch.Generator()
        self.released_values = dict(self.state.released) if self.state is not None else {}

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
        """The random streams' states, for a checkpoint (private: it holds the noise stream's key)."""
        return {"noise": self.noise.get_state(), "generator": self.generator.get_state(),
                "torch": torch.get_rng_state()}

    def restore_random(self, state: dict[str, Any]) -> None:
        """Continue the random streams from a checkpoint's :meth:`random_state`."""
        self.noise.set_state(state["noise"])
        self.generator.set_state(state["generator"])
        torch.set_rng_state(state["torch"])

    def _continue_random(self) -> None:
        """Once per run: continue the random streams from the checkpoint being resumed (nothing on a fresh run)."""
        if not self._random_continued and self.state is not None:
            self.restore_random(self.state.rng)
        self._random_continued = True

    def released(self, name: str, compute: Callable[[], T], *, every_rank: bool = False) -> T:
        """The value released under ``name``: the resumed checkpoint's, or ``compute()``, which records its
        mechanisms in the ledger as they run, checkpointed at once with every value released so far.

        ``compute`` runs on rank 0 alone and its value goes to every rank (:meth:`on_main`); with ``every_rank``
        it runs on every rank (a computation that calls collectives, e.g. DP-SGD). Values are released between
        phases: the checkpoint this writes holds no phase.
        """
        self._continue_random()
        if name not in self.released_values:
            self.released_values[name] = compute() if every_rank else self.on_main(compute)
            self.checkpoint()
        return self.released_values[name]  # type: ignore[no-any-return]

    def checkpoint(self, phase: str | None = None, step: int = 0, **parts: Any) -> None:
        """Save step ``step`` of ``phase`` with ``parts`` (anything with a ``state_dict``, or tensors), every
        released value and the random streams' states, with the ledger that covers them (rank 0 alone)."""
        if self.world.is_main:
            states = {name: part.state_dict() if hasattr(part, "state_dict") else part for name, part in parts.items()}
            saved = Checkpoint(phase, step, states, dict(self.released_values), self.random_state())
            self.run.save_checkpoint(saved, self.ledger, self.settings)

    def resume(self, phase: str, **parts: Any) -> Checkpoint | None:
        """The checkpoint being resumed when it was saved in ``phase``, its states loaded into ``parts`` (objects
        with ``load_state_dict``); None otherwise (a fresh run, or a checkpoint of another phase)."""
        self._continue_random()
        if self.state is None or self.state.phase != phase:
            return None
        for name, part in parts.items():
            part.load_state_dict(self.state.parts[name])
        return self.state

    def resuming(self, phase: str) -> bool:
        """Whether the checkpoint being resumed was saved in ``phase``."""
        return self.state is not None and self.state.phase == phase

    def adjust_threads(self) -> None:
        """Fit the thread count to the cores other processes leave free (``run.threads=auto``; call per step)."""
        threads = self.governor.adjust() if self.governor is not None else None
        if threads is not None:
            self.log("threads", threads=threads)

    def progress(self, total: int, desc: str, initial: int = 0) -> PrivacyProgress:
        """A progress bar over ``total`` steps of stage ``desc`` that shows ε so far and, where the plan expects
        what follows the stage, when the whole run should end."""
        return PrivacyProgress(total, self.ledger, self.accountant, self.delta, desc, initial,
                               enabled=self.world.is_main, after_seconds=self.seconds_after(desc))

    def seconds_after(self, stage: str) -> float | None:
        """The seconds the run's derived plan expects after ``stage`` (:func:`seconds_after`)."""
        return seconds_after(self.expected, stage)

    def out_of_time(self, stage: str) -> bool:
        """Whether training ``stage`` further would take the run past ``run.time_limit`` (what the plan expects
        after the stage kept in reserve); the same answer on every rank."""
        if self.deadline is None:
            return False
        late = time.perf_counter() + (self.seconds_after(stage) or 0.0) > self.deadline
        return bool(self.world.broadcast_object(late if self.world.is_main else None))

    def stop_early(self, stage: str, step: int, planned: int) -> None:
        """Record that the time limit stopped ``stage`` after ``step`` of its ``planned`` steps: the release spends
        the ε of the steps that ran."""
        self.stopped[stage] = {"steps": step, "planned": planned}
        self.log("stopped by run.time_limit", stage=stage, steps=step, planned=planned)
        if self.world.is_main:
            tell("stopped by run.time_limit", f"run.time_limit: training of {stage} stopped after {step:,} of "
                 f"{planned:,} steps; the run releases what it trained, at the ε of the steps that ran", stage=stage)

    def log(self, event: str, **fields: Any) -> None:
        if self.world.is_main:
            self.run.log(event, **fields)

    def report_metric(self, name: str, value: Any) -> None:
        """A measurement of the method itself, shown with the evaluation's metrics."""
        if self.world.is_main:
            self.run.report_method_metric(name, value)

    def save_grid(self, name: str, images: torch.Tensor | np.ndarray, labels: torch.Tensor, rows: int,
                  per_class: int = 10) -> None:
        """A side file for the user: ``images`` (floats in [0, 1], or uint8) as a PNG grid, row k the first
        ``per_class`` of label k, at ``name`` in the run directory (folders made as needed); rank 0 alone writes."""
        if not self.world.is_main:
            return
        pixels = images if isinstance(images, np.ndarray) else to_uint8(images)
        path = self.run.file(name)
        path.parent.mkdir(parents=True, exist_ok=True)
        save_png(class_grid(pixels, labels.numpy(), rows, per_class), path)

    def on_main(self, compute: Callable[[], T]) -> T:
        """``compute()`` on rank 0 alone; its result, the ledger and the shared streams' states follow on
        every rank. For stages that run once (a warm-up's mechanisms, sampling a teacher); ``compute`` must
        not call collectives (an ``on_main`` inside it computes in place)."""
        self._continue_random()
        if self.world.size == 1 or self._inside_main:
            return compute()
        sent = None
        if self.world.is_main:
            self._inside_main = True
            try:
                sent = (compute(), self.ledger.to_dict(), self.random_state())
            finally:
                self._inside_main = False
        received = self.world.broadcast_object(sent)
        assert received is not None
        result, ledger, rng = received
        if not self.world.is_main:
            self.ledger.mirror(PrivacyLedger.from_dict(ledger))
            self.restore_random(rng)
        return result  # type: ignore[no-any-return]

    def private_shard(self) -> tuple[ImageSet, torch.Tensor]:
        """The training examples this rank reads in full passes (those whose index is its rank modulo the size)
        and their unit weights, from the whole training split (:meth:`~dpsynth.data.ImageSet.unit_weights`)."""
        train = self.dataset.train
        if self.world.size == 1:
            return train, train.unit_weights()
        index = torch.arange(self.world.rank, len(train), self.world.size)
        return train.subset(index), train.unit_weights()[index]


def weights(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """A copy of ``module``'s state dict on the CPU: a value :meth:`RunContext.released` keeps must not follow the
    module as it trains on."""
    return {name: value.detach().cpu().clone() for name, value in module.state_dict().items()}


def seconds_after(expected: Mapping[str, float], stage: str) -> float | None:
    """The seconds a derived plan (``expected``: seconds by phase, in order) expects the phases after ``stage``'s to
    take (the phase named by the stage or its section, e.g. ``dp-sgd (dpsgd)``); None where no phase is the stage's."""
    phases = [name for name in expected if name != "total"]
    mine = next((i for i, name in enumerate(phases) if name.split(" (")[0] == stage or f"({stage})" in name), None)
    if mine is None:
        return None
    return sum(expected[name] for name in phases[mine + 1:])
