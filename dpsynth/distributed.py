"""Data parallelism over torch.distributed: which process this is, and the few collectives dpsynth uses.

``torchrun`` (or ``dpsynth run --nproc N``) starts one process per device and sets RANK, WORLD_SIZE and
LOCAL_RANK; :meth:`World.from_environment` reads them and joins the process group (NCCL on CUDA, gloo on
the CPU). Without them the world is one process and every collective is a no-op, so single-process runs
take exactly the code path they always took.

Privacy-relevant conventions (see the README's "Several GPUs or machines"):
- every rank holds the same *shared* generator (same seed, same draws), so Poisson samples and noise are
  identical on every rank; example ``i`` of a sample is processed by rank ``i mod W`` only;
- clipped per-example sums are all-reduced *before* noise, and every rank then adds the one noise draw
  of the shared generator to its identical copy of the sum: one draw, replicated rather than broadcast;
- the ledger, checkpoints, logs and the release are written by rank 0 alone.
"""
from __future__ import annotations

import ctypes
import os
import signal
import sys
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

import torch
import torch.distributed as dist
from torch import nn

from .errors import ConfigError, DpsynthError

T = TypeVar("T")
_ENVIRONMENT = ("RANK", "WORLD_SIZE", "LOCAL_RANK")


@dataclass(frozen=True)
class World:
    """This process's ``rank`` among ``size`` processes, and its ``local_rank`` on its machine."""

    rank: int = 0
    size: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @classmethod
    def from_environment(cls, device: torch.device) -> World:
        """The world torchrun describes (one process without its variables); joins the process group."""
        if "WORLD_SIZE" not in os.environ:
            return cls()
        values = {}
        for name in _ENVIRONMENT:
            try:
                values[name] = int(os.environ[name])
            except (KeyError, ValueError):
                raise ConfigError(f"environment variable {name} must be an integer set by torchrun, got "
                                  f"{os.environ.get(name)!r}") from None
        world = cls(values["RANK"], values["WORLD_SIZE"], values["LOCAL_RANK"])
        _die_with_launcher()
        if not 0 <= world.rank < world.size:
            raise ConfigError(f"RANK={world.rank} is outside 0..WORLD_SIZE-1 (WORLD_SIZE={world.size})")
        if world.size > 1 and not dist.is_initialized():
            if device.type == "cuda":
                torch.cuda.set_device(world.device(device))
            dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
        return world

    def device(self, device: torch.device) -> torch.device:
        """``device`` for this process: CUDA device LOCAL_RANK when several processes share a machine."""
        if device.type != "cuda" or self.size == 1:
            return device
        if self.local_rank >= torch.cuda.device_count():
            raise ConfigError(f"process {self.local_rank} of this machine needs CUDA device {self.local_rank}, but "
                              f"only {torch.cuda.device_count()} are visible: start one process per GPU")
        return torch.device("cuda", self.local_rank)

    def own(self, indices: torch.Tensor) -> torch.Tensor:
        """The indices (into the whole dataset) this rank processes: those equal to its rank modulo the size."""
        return indices if self.size == 1 else indices[indices % self.size == self.rank]

    def part(self, total: int) -> slice:
        """This rank's contiguous part of ``range(total)``; the parts of all ranks tile it in rank order."""
        bounds = [total * r // self.size for r in range(self.size + 1)]
        return slice(bounds[self.rank], bounds[self.rank + 1])

    def seed_examples(self, example: torch.Generator, shared: torch.Generator) -> None:
        """On several processes, seed this rank's per-example generator from one draw of the shared generator
        and the rank: a resumed run redraws what an unbroken one would, though rank 0 saves only the shared
        generator's state. On one process (where the two are one generator): nothing."""
        if self.size > 1:
            example.manual_seed(int(torch.randint(0, 2 ** 62, (), generator=shared)) + self.rank)

    def all_reduce_sum(self, tensors: Iterable[torch.Tensor]) -> None:
        """Replace each tensor, in place, by its sum over the ranks (one flat all-reduce per dtype and device)."""
        if self.size == 1:
            return
        groups: dict[tuple[torch.dtype, torch.device], list[torch.Tensor]] = {}
        for tensor in tensors:
            groups.setdefault((tensor.dtype, tensor.device), []).append(tensor)
        nccl = dist.get_backend() == "nccl"  # reduces CUDA tensors only: CPU ones (PE's votes) travel through one
        for group in groups.values():
            flat = torch.cat([t.reshape(-1) for t in group])
            flat = flat.cuda() if nccl else flat
            with self._peers():
                dist.all_reduce(flat, op=dist.ReduceOp.SUM)
            for tensor, value in zip(group, flat.split([t.numel() for t in group]), strict=True):
                tensor.copy_(value.view_as(tensor))

    def broadcast_object(self, value: T | None) -> T:
        """Rank 0's ``value`` (any picklable object; the other ranks pass None) on every rank."""
        if self.size == 1:
            return value  # type: ignore[return-value]
        box = [value if self.is_main else None]
        with self._peers():
            dist.broadcast_object_list(box, src=0)
        return box[0]  # type: ignore[return-value]

    def gather_objects(self, value: T) -> list[T]:
        """Every rank's ``value``, in rank order, on every rank."""
        if self.size == 1:
            return [value]
        values: list[Any] = [None] * self.size
        with self._peers():
            dist.all_gather_object(values, value)
        return values

    def broadcast_module(self, module: nn.Module) -> None:
        """Overwrite ``module``'s parameters and buffers with rank 0's (what DDP does when it starts)."""
        if self.size == 1:
            return
        with torch.no_grad(), self._peers():
            for tensor in [*module.parameters(), *module.buffers()]:
                dist.broadcast(tensor.data, src=0)

    @contextmanager
    def _peers(self) -> Iterator[None]:
        """A collective; its failure (a peer gone: the process that failed says why) as one DpsynthError line."""
        try:
            yield
        except RuntimeError as exc:  # torch.distributed's errors (DistError among them) are RuntimeErrors
            reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
            raise DpsynthError(f"rank {self.rank}: a collective failed, most likely because another process of "
                               f"the run stopped (its own message says why): {reason}") from None

    def close(self) -> None:
        """Leave the process group (after the last collective)."""
        if self.size > 1 and dist.is_initialized():
            dist.destroy_process_group()


def _die_with_launcher() -> None:
    """Have Linux SIGKILL this rank if its launcher dies: torchrun starts ranks in sessions of their own, so a
    killed launcher would leave them training, and writing the run directory, unseen. (Killed ranks lose
    nothing a resume does not redo: see the resume rule.)"""
    if sys.platform.startswith("linux"):
        pr_set_pdeathsig = 1
        ctypes.CDLL(None).prctl(pr_set_pdeathsig, signal.SIGKILL)
