"""A short throughput probe on public random tensors: what a DP-SGD step, a sampling call, a downstream classifier
and the Inception network cost on this device, for the planner (:mod:`dpsynth.autoplan.rules`).

Nothing private enters: the probe's images, labels and sampled batches are random, and its DP-SGD noise is drawn
from a fresh secret stream of its own. Each measurement runs its computation once to warm up (the DP-SGD engine
chooses its per-example gradients, oneDNN picks kernels), then times it.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from functools import cache
from typing import Any

import numpy as np
import torch

from ..privacy import PrivacyLedger
from ..privacy.dpsgd import DPSGD, DpsgdSettings
from ..privacy.randomness import SecretStream
from ..training.probes import DpsgdProbe, timed


@dataclass(frozen=True)
class StepCost:
    """Seconds of one DP-SGD step of ``rows`` example rows (examples x noise multiplicity): ``fixed + per_row x
    rows`` (the noise, the optimiser and the EMA are the fixed part)."""

    fixed: float
    per_row: float

    def seconds(self, rows: float) -> float:
        return self.fixed + self.per_row * rows


def dpsgd_cost(probe: DpsgdProbe, device: torch.device, num_records: int, rows_per_example: int = 1) -> StepCost:
    """The fixed and per-row seconds of a DP-SGD step over ``num_records`` records: a least-squares line through
    steps of an eighth of, one and two physical batches (the faster of two steps each, after a warm-up step in
    which the engine chooses its per-example gradients), their sizes as Poisson sampling drew them. The two-chunk
    step carries the cost of a chunk; a larger batch's time is extrapolated."""
    physical = probe.physical_batch_size
    engine = probe_engine(probe, device, num_records)
    probe_step(engine, probe, physical, device)
    measured = []
    for chunks in (1 / 8, 1, 2):
        examples = min(max(1, round(chunks * physical)), num_records)
        measured.append(min((probe_step(engine, probe, examples, device) for _ in range(2)),
                            key=lambda step: step[1] / max(step[0], 1.0)))
    rows = np.array([examples * rows_per_example for examples, _ in measured])
    seconds = np.array([seconds for _, seconds in measured])
    per_row, fixed = np.polyfit(rows, seconds, 1)
    per_row = max(float(per_row), float(seconds[-1] / rows[-1]) / 4)  # a noisy fit never makes rows free
    return StepCost(max(float(fixed), 0.0), per_row)


def step_seconds(probe: DpsgdProbe, device: torch.device, num_records: int, examples: int) -> float:
    """Seconds of one DP-SGD step that reads ``examples`` examples (of ``num_records``), after a warm-up step, scaled
    from the examples Poisson sampling drew to ``examples``."""
    engine = probe_engine(probe, device, num_records)
    probe_step(engine, probe, examples, device)
    drawn, seconds = probe_step(engine, probe, examples, device)
    return seconds * examples / max(drawn, 1.0)


def probe_engine(probe: DpsgdProbe, device: torch.device, num_records: int) -> DPSGD:
    """A DP-SGD engine over ``probe``'s model on ``device``, its noise from a fresh secret stream of its own."""
    model = probe.model.to(device)
    physical = probe.physical_batch_size
    return DPSGD(model, torch.optim.Adam(model.parameters(), lr=1e-4), probe.loss,
                 settings=DpsgdSettings(1.0, 1.0, min(physical / num_records, 1.0), physical, probe.bf16),
                 num_records=num_records, ledger=PrivacyLedger(), stage="probe", noise=SecretStream.fresh(),
                 generator=torch.Generator().manual_seed(0), batch_loss=probe.batch_loss)


def probe_step(engine: DPSGD, probe: DpsgdProbe, examples: int, device: torch.device) -> tuple[float, float]:
    """The examples Poisson sampling drew for one probe step of expected size ``examples``, and its seconds (with the
    section's ``after_step``)."""
    engine.settings = replace(engine.settings, sample_rate=min(examples / engine.num_records, 1.0))
    stats: dict[str, torch.Tensor] = {}

    def step() -> None:
        stats.update(engine.step(probe.make_batch))
        if probe.after_step is not None:
            probe.after_step()

    seconds = timed(step, device)
    return float(stats["batch"]), seconds


@cache
def inception_cost(device: torch.device, path: str, batch_size: int) -> float:
    """Seconds per image of the Inception features FID uses (a warm-up, then one batch timed; measured once per
    process). A CPU warms up on two images (half the probe's time; the full batch then ran within 10 %
    of a warm one), a GPU on the full batch (its kernels are chosen per shape)."""
    from ..evaluation.inception import InceptionFeatures

    extractor = InceptionFeatures(device, path, batch_size)
    images = np.random.default_rng(0).integers(0, 256, (batch_size, 3, 32, 32), dtype=np.uint8)
    extractor(images if device.type == "cuda" else images[:2])
    return timed(lambda: extractor(images), device) / batch_size


@dataclass(frozen=True)
class Throughput:
    """What the probe measured on ``device``: each DP-SGD section's step cost, seconds per unit of the release's work
    (``sample_per_image_step``: an image-step of a diffusion sampler, a method's own unit for others) and per row
    of public training, each downstream classifier's seconds per image, Inception's seconds per image,
    the probe's own seconds and the seconds per unit of each other phase the method times (``Probes.phases``)."""

    device: str
    dpsgd: dict[str, StepCost]
    sample_per_image_step: float
    public_per_row: float
    classifiers: dict[str, dict[str, float]]
    inception_per_image: float
    probe_seconds: float
    phases: dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """For config.yaml: plain numbers, rounded to 4 significant digits."""
        record = asdict(self)
        return _rounded(record)

    @classmethod
    def from_dict(cls, record: dict[str, Any]) -> Throughput:
        costs = {name: StepCost(**cost) for name, cost in record["dpsgd"].items()}
        return cls(**{**record, "dpsgd": costs})


def _rounded(value: Any) -> Any:
    if isinstance(value, dict):
        return {key: _rounded(item) for key, item in value.items()}
    return float(f"{value:.4g}") if isinstance(value, float) else value
