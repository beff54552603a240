"""DP-SGD on torch.func: per-example gradients, clipping, one Gaussian noise draw per logical batch.

Each step Poisson-samples the private set at rate q, computes per-example gradients with
``vmap(grad(loss))`` in physical chunks, clips each example's whole gradient to L2 norm C, sums, adds
N(0, (sigma C)^2) once, divides by the *expected* batch size q N and hands the result to the optimiser.
The step is recorded in the ledger before the noisy gradient is used.

With a ``batch_loss`` (the per-example losses of a whole batch) and a model of supported layers, the
per-example gradients come from one batched pass instead (:mod:`dpsynth.privacy.per_example`, 1.1-1.4x faster
on the ``cpu`` UNet), once a probe on the first batch agreed with vmap.

On several processes (:class:`~dpsynth.distributed.World`) every rank draws the same Poisson sample from
the shared secret stream and processes the sampled examples whose index is its rank modulo the world size;
the clipped sums are all-reduced, then every rank adds the same noise draw of the shared stream to
its copy of the global sum. Each example is sampled with probability q and its clipped gradient enters
the sum once, and the sum gets N(0, (sigma C)^2) once: the single-process mechanism, step for step.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import nn
from torch.func import functional_call, grad, vmap

from ..distributed import World
from ..errors import PrivacyError
from ..utils.device import bf16_autocast
from .events import NonPrivateAccess, SubsampledGaussianMechanism
from .ledger import PrivacyLedger
from .mechanisms import gaussian_noise, poisson_sample
from .per_example import BatchedGradients, BatchLoss, public_probe, unsupported
from .randomness import SecretStream

Params = dict[str, torch.Tensor]
PROBE_EXAMPLES = 8  # examples in the public probe batch that decides the per-example engine
# loss(model, params, buffers, *example_tensors) for ONE example (tensors without the batch dimension)
ExampleLoss = Callable[..., torch.Tensor]


@dataclass(frozen=True)
class DpsgdSettings:
    """Noise multiplier sigma, clipping norm C, sampling rate q, the physical chunk size, bf16 autocast.

    A noise multiplier of None runs the same steps with neither clipping nor noise, recorded in the ledger
    as :class:`NonPrivateAccess` (for configurations a user explicitly allows to be non-private).
    """

    noise_multiplier: float | None
    clip: float
    sample_rate: float
    physical_batch_size: int = 64
    bf16: bool = False


def per_example_gradients(
    model: nn.Module, loss: ExampleLoss, params: Params, buffers: Params, batch: Sequence[torch.Tensor]
) -> Params:
    """Gradient of ``loss`` for each example of ``batch`` (first dimension), one tensor per parameter."""

    def example_loss(p: Params, *example: torch.Tensor) -> torch.Tensor:
        return loss(lambda *args, **kw: functional_call(model, (p, buffers), args, kw), *example)

    return vmap(grad(example_loss), in_dims=(None,) + (0,) * len(batch))(params, *batch)


def group_means(grads: Params, segments: torch.Tensor) -> Params:
    """Per group, the mean of its examples' gradients (``segments``: each example's group, 0 .. G-1)."""
    first = next(iter(grads.values()))
    segments = segments.to(first.device)
    count = int(segments.max()) + 1
    sizes = torch.bincount(segments, minlength=count).to(first.dtype)
    means = {}
    for name, g in grads.items():
        total = torch.zeros((count, *g.shape[1:]), dtype=g.dtype, device=g.device).index_add_(0, segments, g)
        means[name] = total / sizes.view(-1, *([1] * (g.dim() - 1)))
    return means


def clipped_sum(grads: Params, clip: float) -> tuple[Params, torch.Tensor]:
    """Sum over examples of each example's gradient scaled to L2 norm <= clip; also the unclipped norms.

    An example whose gradient is not finite (a bf16 overflow, a pathological input) gets factor 0: it
    contributes nothing, instead of turning the whole sum into NaN. Its norm is returned as it was. On the CPU
    the rows are zeroed only when there is one (asking costs nothing there); on an accelerator always, in
    place: asking would stall the device's queue once per chunk (a host synchronisation)."""
    norms = torch.stack([torch.linalg.vector_norm(g, dim=tuple(range(1, g.dim()))).pow(2)
                         for g in grads.values()]).sum(0).sqrt()
    finite = torch.isfinite(norms)
    factors = torch.where(finite, (clip / (norms + 1e-12)).clamp(max=1.0), torch.zeros_like(norms))
    if norms.device.type != "cpu" or not bool(finite.all()):  # else 0 x inf = NaN would enter the sum
        grads = {name: g.nan_to_num_(0.0, 0.0, 0.0) for name, g in grads.items()}
    return {name: torch.einsum("b,b...->...", factors, g) for name, g in grads.items()}, norms


class _ClipGradient(torch.autograd.Function):
    """Identity forward; backward scales the incoming gradient to L2 norm <= max_norm (per example under vmap)."""

    generate_vmap_rule = True

    @staticmethod
    def forward(x: torch.Tensor, max_norm: float) -> torch.Tensor:
        return x.clone()

    @staticmethod
    def setup_context(ctx: torch.autograd.function.FunctionCtx, inputs: tuple, output: torch.Tensor) -> None:
        ctx.max_norm = inputs[1]  # type: ignore[attr-defined]

    @staticmethod
    def backward(ctx: torch.autograd.function.FunctionCtx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        scale = (ctx.max_norm / (grad.norm() + 1e-12)).clamp(max=1.0)  # type: ignore[attr-defined]
        return grad * scale, None


def clip_gradient(x: torch.Tensor, max_norm: float) -> torch.Tensor:
    """``x`` unchanged, but the gradient flowing back through it is clipped to L2 norm ``max_norm``.

    Inside :func:`per_example_gradients` this clips each example's gradient with respect to an
    intermediate output (DP-SAD's student output, Eq. 17). It bounds no sensitivity by itself: what is
    backpropagated further still depends on the example, so DP-SGD's parameter clipping stays.
    """
    return _ClipGradient.apply(x, max_norm)


@dataclass(frozen=True)
class Groups:
    """The training images' groups, for DP-SGD with one group as the unit of privacy: each group's image indices,
    of which at most ``cap`` enter a step (a random choice when it has more)."""

    members: list[torch.Tensor]
    cap: int

    @classmethod
    def of(cls, groups: torch.Tensor, cap: int) -> Groups:
        """From each image's group id (any integers)."""
        _, dense = torch.unique(groups, return_inverse=True)
        order = torch.argsort(dense, stable=True)
        return cls(list(order.split(torch.bincount(dense).tolist())), cap)

    def __len__(self) -> int:
        return len(self.members)

    def chunks(self, sampled: torch.Tensor, examples: int, generator: torch.Generator | None
               ) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """(image indices, each image's group position in the chunk) of chunks of whole sampled groups, about
        ``examples`` images each (a group of more than ``examples`` images, capped, makes a chunk alone)."""
        chunks: list[tuple[torch.Tensor, torch.Tensor]] = []
        images: list[torch.Tensor] = []
        segments: list[torch.Tensor] = []
        size = 0
        for group in sampled.tolist():
            members = self.members[group]
            if len(members) > self.cap:
                members = members[torch.randperm(len(members), generator=generator)[:self.cap]]
            if images and size + len(members) > examples:
                chunks.append((torch.cat(images), torch.cat(segments)))
                images, segments, size = [], [], 0
            segments.append(torch.full((len(members),), len(images), dtype=torch.long))
            images.append(members)
            size += len(members)
        if images:
            chunks.append((torch.cat(images), torch.cat(segments)))
        return chunks


class DPSGD:
    """Private gradient steps for ``model`` on a private dataset, recorded in ``ledger`` as ``stage``.

    ``make_batch(indices)`` returns the per-example tensors (data and any per-example randomness, e.g.
    diffusion times and noise, drawn from ``example_generator``) for the sampled indices; ``loss`` maps
    one example to a scalar. The noisy sum is divided by the expected batch size q x ``public_size`` (the
    training set's public size; default ``num_records``, when that is public), never by a private count.
    ``noise`` (the secret stream) draws the Poisson samples and the Gaussian noise; on several processes it
    must be in the same state on every rank, as must ``generator`` (the shared training generator), from which
    ``example_generator`` is reseeded every step.

    With ``groups`` the records are groups (``num_records`` of them): a step Poisson-samples groups, and each
    sampled group contributes the mean of its (at most ``groups.cap``) images' gradients, clipped to C: adding or
    removing a whole group moves the clipped sum by at most C, as one image does without groups.
    """

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer, loss: ExampleLoss, *,
                 settings: DpsgdSettings, num_records: int, ledger: PrivacyLedger, stage: str,
                 noise: SecretStream, world: World | None = None, generator: torch.Generator | None = None,
                 example_generator: torch.Generator | None = None, batch_loss: BatchLoss | None = None,
                 public_size: int | None = None, groups: Groups | None = None) -> None:
        if groups is not None and len(groups) != num_records:
            raise PrivacyError(f"DP-SGD over groups samples the {len(groups)} groups, not {num_records} records")
        self.model, self.optimizer, self.loss, self.settings = model, optimizer, loss, settings
        self.num_records, self.ledger, self.stage, self.noise = num_records, ledger, stage, noise
        self.groups = groups
        self.public_size = num_records if public_size is None else public_size
        self.world = world or World()
        self.generator, self.example_generator = generator, example_generator or generator
        self.params: Params = {n: p for n, p in model.named_parameters() if p.requires_grad}
        why_not = "no batch loss" if batch_loss is None else unsupported(model)
        self.batched = (BatchedGradients(model, batch_loss, self.params)
                        if batch_loss is not None and why_not is None else None)
        self.engine = {"per_example": "vmap", "why": why_not} if why_not else None  # decided at the first step

    def step(self, make_batch: Callable[[torch.Tensor], Sequence[torch.Tensor]]) -> dict[str, torch.Tensor]:
        """One DP-SGD step; returns the sampled batch size, the mean unclipped gradient norm (both private
        diagnostics) and the number of examples dropped for a non-finite gradient, as 0-d tensors on the device
        (reading them waits for the device: callers do that only when they show or log them)."""
        s = self.settings
        clip = s.clip if s.noise_multiplier is not None else math.inf
        indices = poisson_sample(self.num_records, s.sample_rate, self.noise)
        if self.generator is not None and self.example_generator is not None:
            self.world.seed_examples(self.example_generator, self.generator)
        detached = {n: p.detach() for n, p in self.params.items()}
        buffers = {n: b.detach() for n, b in self.model.named_buffers()}
        total = {n: torch.zeros_like(p) for n, p in detached.items()}
        norm_sum = torch.zeros((), dtype=torch.float64, device=next(iter(detached.values())).device)
        dropped = torch.zeros_like(norm_sum)
        for chunk, segments in self._chunks(self.world.own(indices)):
            batch = make_batch(chunk)
            if self.engine is None:
                self.engine = self._choose_engine(batch, detached, buffers)
            with bf16_autocast(norm_sum.device, s.bf16):
                if self.batched is not None:
                    grads = self.batched(batch)
                else:
                    grads = per_example_gradients(self.model, self.loss, detached, buffers, batch)
            grads = {n: g.float() for n, g in grads.items()}
            summed, norms = clipped_sum(grads if segments is None else group_means(grads, segments), clip)
            for name in total:
                total[name] += summed[name]
            finite = torch.isfinite(norms)
            norm_sum += torch.where(finite, norms, 0.0).double().sum()
            dropped += (~finite).sum().double()
        self.world.all_reduce_sum([*total.values(), norm_sum, dropped])
        if s.noise_multiplier is None:
            self.ledger.record(self.stage, NonPrivateAccess())
        else:
            self.ledger.record(self.stage, SubsampledGaussianMechanism(s.noise_multiplier, s.sample_rate))
            for name, noise in self._noise(s.noise_multiplier * s.clip).items():
                total[name] += noise
        expected = s.sample_rate * self.public_size
        for name, param in self.params.items():
            param.grad = total[name] / expected
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        kept = (len(indices) - dropped).clamp(min=1)
        return {"batch": torch.tensor(float(len(indices))), "grad_norm": norm_sum / kept, "nonfinite_dropped": dropped}

    def _chunks(self, indices: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor | None]]:
        """The chunks of the sampled records' examples, with each example's group in the chunk (None without
        groups); an empty Poisson sample (or a rank's empty share) has none."""
        size = self.settings.physical_batch_size
        if self.groups is not None:
            return list(self.groups.chunks(indices, size, self.example_generator))
        return [(chunk, None) for chunk in indices.split(size) if len(chunk)]

    def _noise(self, std: float) -> Params:
        """N(0, std^2) for every parameter: one draw of the secret stream, one copy to the device."""
        sizes = [param.numel() for param in self.params.values()]
        flat = gaussian_noise(torch.Size([sum(sizes)]), std, self.noise, next(iter(self.params.values())))
        return {name: part.view_as(param) for (name, param), part
                in zip(self.params.items(), flat.split(sizes), strict=True)}

    def _choose_engine(self, batch: Sequence[torch.Tensor], params: Params, buffers: Params) -> dict[str, str]:
        """The batched engine if, on random public tensors of ``batch``'s shapes (:data:`PROBE_EXAMPLES`
        examples), it agrees with vmap and one example's gradient does not move when the others change; else vmap.
        Nothing of the private batch but its shapes enters the choice."""
        assert self.batched is not None
        generator = torch.Generator().manual_seed(0)  # public randomness: the probe is not a secret
        probe, others = (public_probe(batch, PROBE_EXAMPLES, generator) for _ in range(2))
        reference = per_example_gradients(self.model, self.loss, params, buffers, probe)
        try:
            if not self.batched.agrees_with(reference, probe):
                why = "disagreed with vmap on a probe batch (examples interact, or in-place updates)"
            elif not self.batched.independent(probe, others):
                why = "an example's gradient moved when the others changed (an operation across the batch)"
            else:
                return {"per_example": "batched", "why": "agreed with vmap on a public probe batch, examples "
                                                         "independent"}
        except RuntimeError as exc:
            why = str(exc)
        self.batched = None
        return {"per_example": "vmap", "why": why}


class EMA:
    """Exponential moving average of a model's parameters (used for sampling).

    The decay warms up as min(decay, (1 + t) / (10 + t)) after t updates, as diffusers' EMAModel does:
    with a fixed 0.99 the random initial weights would still hold 22 % of the average after 150 steps,
    which on a short CPU run turns the samples into noise (measured).
    """

    def __init__(self, model: nn.Module, decay: float) -> None:
        self.decay = decay
        self.updates = 0
        self.shadow = {n: p.detach().clone() for n, p in model.named_parameters()}

    @torch.no_grad()
    def update(self, model: nn.Module) -> None:
        decay = min(self.decay, (1 + self.updates) / (10 + self.updates))
        self.updates += 1
        for name, param in model.named_parameters():
            self.shadow[name].lerp_(param.detach(), 1.0 - decay)

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {**self.shadow, "__updates__": torch.tensor(self.updates)}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        self.updates = int(state["__updates__"])
        for name, value in state.items():
            if name != "__updates__":
                self.shadow[name].copy_(value)

    @torch.no_grad()
    def copy_to(self, model: nn.Module) -> None:
        for name, param in model.named_parameters():
            param.copy_(self.shadow[name])
