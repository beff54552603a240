"""``dpsynth doctor``: each method a few steps on a tiny configuration on the chosen device, then checked.

A run of each method on sklearn's 8 x 8 digits (shipped with scikit-learn: no download) is stopped right after
the first checkpoint that follows a recorded mechanism, as a crash would stop it; ``dpsynth run --resume``'s
code path continues it to its release. Then: the ledger holds exactly the planned mechanisms, privacy.json's
epsilon is the accountant's on that ledger and within the target, the release has the planned number of
images of the dataset's shape and classes, the run logged a resume on the device asked for, and the model it
released (every method that has one releases it here) loads on that device and draws images of that shape. Randomness
is secret as in a real run (no seed). A GPU user runs this first (``dpsynth doctor --device cuda``).
"""
from __future__ import annotations

import contextlib
import io
import json
import tempfile
import time
import traceback
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .api import load_generator, resolve_config
from .config import ReleaseSettings, RunConfig, SamplingSettings
from .data import Dataset, load_dataset
from .data.glyphs import GLYPH_CLASSES
from .diffusion.pretrain import PretrainSettings, pretrain
from .errors import DpsynthError
from .methods import get_method, run_config_of
from .pipeline import Run, resume
from .privacy import Accountant, PrivacyLedger, check_within_plan
from .runs import LOG, PRIVACY, RELEASE, SYNTHETIC, Checkpoint, RunDirectory
from .utils.device import pick_device
from .utils.messages import silenced

DATASET, EPSILON = "digits", 8.0
PUBLIC = "glyphs"  # what a method that needs a public model starts from
# A smoke run checks the machinery, not what a few steps learn: its plan is forced past the recorded outcomes.
COMMON = ["sampling.num_samples=20", "evaluation.enabled=false", "privacy.accountant=rdp", "plan.force=true"]


class _Interrupted(Exception):
    """The doctor's stand-in for a crash right after a checkpoint."""


class _CrashAfterCheckpoint(RunDirectory):
    """A run directory whose run stops right after saving a checkpoint that covers a recorded mechanism."""

    def save_checkpoint(self, state: Checkpoint, ledger: PrivacyLedger, settings: dict[str, Any] | None = None
                        ) -> None:
        super().save_checkpoint(state, ledger, settings)
        if ledger.events():
            raise _Interrupted


@dataclass(frozen=True)
class Checkup:
    """How one method fared: passed or the first thing that failed, and the seconds it took."""

    method: str
    passed: bool
    detail: str
    seconds: float

    def line(self) -> str:
        return f"{self.method:<13} {'ok  ' if self.passed else 'FAIL'} {self.seconds:6.1f} s  {self.detail}"


def check_method(method: str, device: str, root: Path) -> Checkup:
    """Run, interrupt, resume and check ``method`` on ``device`` in a new run directory under ``root``."""
    start = time.perf_counter()
    try:
        with silenced(), contextlib.redirect_stderr(io.StringIO()):
            detail = _run_and_check(method, device, root)  # the runs' own messages and progress bars kept out
        passed = True
    except Exception as exc:  # the doctor reports every failure, whatever raised it, and goes on
        passed, detail = False, _failure(exc)
    return Checkup(method, passed, detail, time.perf_counter() - start)


def _run_and_check(method: str, device: str, root: Path) -> str:
    public = _public_model(method, device, root)
    model = [] if get_method(method).no_generator else ["release.model=true"]
    config = run_config_of(resolve_config(
        method, dataset=DATASET, epsilon=EPSILON, preset="cpu",
        overrides=[*get_method(method).declaration.smoke, *COMMON, *public, *model, f"run.device={device}",
                   f"run.out_dir={root}", f"privacy.holder_ledger={root / 'releases.json'}"]))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the tiny configuration's own warnings (small batches) are expected
        prepared, run = stopped_after_checkpoint(config)
        resume(str(run.path))
    budget = prepared.budget
    return _checked(run, prepared.dataset, budget.stages, budget.accountant, budget.delta, budget.target)


def stopped_after_checkpoint(config: RunConfig) -> tuple[Run, RunDirectory]:
    """A run of ``config`` prepared and executed in a new run directory that stops it as a crash would, right after
    its first checkpoint that follows a recorded mechanism; DpsynthError where it finishes without one."""
    prepared = Run.prepare(config)
    run = RunDirectory.create(prepared.config)
    prepared.directory = _CrashAfterCheckpoint(run.path)
    try:
        prepared.execute()
    except _Interrupted:
        return prepared, run
    raise DpsynthError("the run finished without a checkpoint after a mechanism: nothing to resume from")


def _public_model(method: str, device: str, root: Path) -> list[str]:
    """For a method that must start from a public model: a tiny one pre-trained for it on glyphs, as an override."""
    if not get_method(method).needs_public_model:
        return []
    config = run_config_of(resolve_config(method, preset="cpu", overrides=get_method(method).declaration.smoke))
    glyphs = load_dataset(PUBLIC, resolution=8, num_images=124).train
    out = pretrain(glyphs, root / f"{method}-public", PretrainSettings.for_method(config, iterations=2, batch_size=8),
                   pick_device(device), list(GLYPH_CLASSES), PUBLIC)
    return [f"model.init_from={out}"]


def _checked(run: RunDirectory, dataset: Dataset, plan: dict, accountant: Accountant, delta: float,
             target: float) -> str:
    """The release, ledger, privacy report and log of a finished run checked; a summary of them."""
    ledger = run.ledger()
    check_within_plan(ledger.stages(), plan, False, complete=True)
    report = json.loads(run.file(PRIVACY).read_text())
    epsilon = accountant.epsilon(ledger.events(), delta)
    if not report["dp_guarantee"] or abs(report["epsilon"] - epsilon) > 1e-9 or epsilon > target * (1 + 1e-6):
        raise DpsynthError(f"privacy.json says epsilon {report['epsilon']}, the ledger gives {epsilon:.4f} "
                           f"(target {target})")
    info, config = dataset.info, run.config()
    with np.load(run.file(SYNTHETIC)) as release:
        images, labels = release["images"], release["labels"]
    expected = (SamplingSettings.of(config).num_samples, info.channels, info.height, info.width)
    if images.shape != expected or images.dtype != np.uint8 or not np.isin(labels, range(info.num_classes)).all():
        raise DpsynthError(f"release: images {images.shape} {images.dtype}, labels {np.unique(labels)}; expected "
                           f"uint8 {expected} with labels below {info.num_classes}")
    events = [json.loads(line) for line in run.file(LOG).read_text().splitlines()]
    if not any(e["event"] == "resume" for e in events):
        raise DpsynthError("the log has no resume: the interrupted run was not continued from its checkpoint")
    used = [e["device"] for e in events if e["event"] == "hardware"]
    steps = sum(getattr(event, "steps", 1) for event in ledger.events())
    return (f"{steps} mechanism steps, resumed, epsilon {epsilon:.3f} <= {target:g}, {len(labels)} images "
            f"released{_model_drawn(run, expected[1:], used[-1])}, on {used[-1]}")


def _model_drawn(run: RunDirectory, shape: tuple[int, ...], device: str) -> str:
    """With a released model: it loads on ``device`` and draws images of ``shape``; how many, for the summary."""
    if not ReleaseSettings.of(run.config()).model:
        return ""
    drawn = load_generator(run.file(RELEASE), device).sample(7)
    if tuple(drawn.images.shape[1:]) != shape or not 0 <= float(drawn.images.min()) <= float(drawn.images.max()) <= 1:
        raise DpsynthError(f"released model: drew images of {tuple(drawn.images.shape)}, expected 7 x {shape} in "
                           "[0, 1]")
    return ", its model reloaded and drew 7 more"


def _failure(exc: BaseException) -> str:
    """One line: the message of a user-facing error, else the exception and where in dpsynth it was raised."""
    if isinstance(exc, DpsynthError):
        return str(exc)
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if "dpsynth" in f.filename]
    where = f" at {Path(frames[-1].filename).name}:{frames[-1].lineno}" if frames else ""
    return f"{type(exc).__name__}{where}: {str(exc).splitlines()[0] if str(exc) else ''}"


def doctor(device: str, methods: list[str], keep: str | None = None) -> list[Checkup]:
    """Check ``methods`` on ``device`` (printing a line each as it finishes); run directories under ``keep``
    (default a temporary folder, removed afterwards)."""
    resolved = pick_device(device)
    print(f"dpsynth doctor on {resolved}" + (f" ({torch.cuda.get_device_name(resolved)})"
                                             if resolved.type == "cuda" else ""), flush=True)
    with tempfile.TemporaryDirectory(prefix="dpsynth-doctor-") as scratch:
        root = Path(keep) if keep else Path(scratch)
        checkups = []
        for method in methods:
            checkups.append(check_method(method, str(resolved), root))
            print(checkups[-1].line(), flush=True)
    return checkups
