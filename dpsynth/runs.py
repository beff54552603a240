"""The run directory: config, privacy ledger and report, log, checkpoints and released artefacts.

Layout of ``runs/<method>-<dataset>-eps<epsilon>-<time>/``: the folder ``release/`` holds exactly what the
epsilon covers and may be shared; everything else is PRIVATE to the data holder.

- ``release/synthetic.npz`` and ``release/samples.png``: the release (uint8 images N x C x H x W, labels)
  and its grid, written after the budget check; ``release/privacy.json``: the accountant's report, with the
  SHA-256 of each file the release step wrote (``release_files``): those files, and nothing else that lies in
  ``release/``, are the release. No other step writes into ``release/``. With ``release.model``, also
  ``release/model.safetensors`` and ``release/model.json``: the generator the images were sampled from
  (:mod:`dpsynth.generators`).
- ``config.yaml``: the fully resolved config; ``--resume`` reads it back. Its ``hardware`` section says what
  the machine is and what ``auto`` settings (bf16, the fast Inception path) chose on it, and why.
- ``ledger.json``: every privacy event, appended as mechanisms run.
- ``checkpoint.pt``: training state in one layout for every method (:class:`Checkpoint`: phase and step, the
  models' and optimisers' states, the values released from private data, the random streams' states with the
  secret noise stream's key) *and the ledger that covers it*.
- ``log.jsonl``: one JSON record per line. It holds non-private statistics of the private data (losses,
  Poisson batch sizes, unclipped gradient norms): a diagnostic for the data holder, never shared.
- evaluation outputs (``metrics.json``, nearest real neighbours, training curves) and method pictures.

Resume rule: a checkpoint stores the ledger as it stood when the state was saved. Mechanisms that ran
after the last checkpoint produced outputs that the crash destroyed and that no artefact contains, so
on resume the ledger goes back to the checkpoint's (the rewound entries are logged) and the run
continues from there: a resumed run ends with the ledger a clean run has. Methods write an artefact
derived from private data only after the checkpoint that covers its events.
"""
from __future__ import annotations

import io
import json
import math
import time
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .config import (
    Config,
    DatasetSettings,
    PrivacySettings,
    RunConfig,
    RunSettings,
    dump_config,
    load_config,
    method_name,
    migrated_settings,
)
from .errors import DpsynthError
from .privacy import LedgerPlan, PrivacyLedger
from .utils.images import class_grid, save_png, to_uint8
from .utils.io import atomic_write, atomic_write_json, atomic_write_text, sha256

CONFIG, LEDGER, CHECKPOINT, LOG = "config.yaml", "ledger.json", "checkpoint.pt", "log.jsonl"
METHOD_METRICS = "method_metrics.json"
RELEASE = "release"
REHEARSAL = "rehearsal.json"  # in a rehearsal's directory: the stand-in, the plan and what it shrank
PRIVACY, SYNTHETIC, SAMPLES = f"{RELEASE}/privacy.json", f"{RELEASE}/synthetic.npz", f"{RELEASE}/samples.png"
DATASHEET = f"{RELEASE}/README.md"
MODEL, MODEL_CARD = f"{RELEASE}/model.safetensors", f"{RELEASE}/model.json"  # the generator, with release.model
MANIFEST = "release_files"  # privacy.json's key: the SHA-256 of each file the release step wrote
CHECKPOINT_LAYOUT = 2  # 1: each method laid its checkpoint out its own way (dpsynth 0.1.0 before the Checkpoint)


@dataclass
class Checkpoint:
    """The training state checkpoint.pt holds, one layout for every method.

    ``phase`` and ``step``: the phase the method saved it in and the steps of that phase done (None and 0 when it
    was saved between phases); ``parts``: the state dicts of the phase's models, EMA and optimisers (or tensors)
    by name; ``released``: the values computed from private data through recorded mechanisms, by name (never
    recomputed on resume); ``rng``: the random streams' states (the noise stream's holds its secret key).
    """

    phase: str | None = None
    step: int = 0
    parts: dict[str, Any] = field(default_factory=dict)
    released: dict[str, Any] = field(default_factory=dict)
    rng: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"layout": CHECKPOINT_LAYOUT, **{f.name: getattr(self, f.name) for f in fields(self)}}

    @classmethod
    def from_dict(cls, data: dict[str, Any], path: Path) -> Checkpoint:
        """The checkpoint ``data`` read from ``path``; DpsynthError for another layout."""
        layout = data.get("layout", 1)
        if layout != CHECKPOINT_LAYOUT:
            raise DpsynthError(f"{path}: checkpoint layout {layout}, written by an older dpsynth; this one reads "
                               f"layout {CHECKPOINT_LAYOUT} only and cannot resume the run: finish it with the "
                               "dpsynth that began it, or start it again")
        return cls(**{f.name: data[f.name] for f in fields(cls)})


def run_name(config: RunConfig, when: time.struct_time | None = None) -> str:
    """``<method>-<dataset>-eps<epsilon>-<YYYYmmdd-HHMMSS>``; ``nodp`` for eps<epsilon> in a run allowed to
    use the data without noise (``run.allow_non_private``), whose release no epsilon covers."""
    stamp = time.strftime("%Y%m%d-%H%M%S", when or time.localtime())
    budget = "nodp" if RunSettings.of(config).allow_non_private else f"eps{PrivacySettings.of(config).epsilon:g}"
    return f"{method_name(config)}-{DatasetSettings.of(config).name}-{budget}-{stamp}"


class RunDirectory:
    """One run's folder. Create it with :meth:`create`, reopen it for resume with :meth:`open`."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    @classmethod
    def create(cls, config: RunConfig, root: str | Path | None = None, name: str | None = None) -> RunDirectory:
        """A new run directory under ``root`` (default ``run.out_dir``) named ``name`` (default
        :func:`run_name`; ``-2``, ``-3``... appended while the name is taken)."""
        base = Path(root if root is not None else RunSettings.of(config).out_dir) / (name or run_name(config))
        path, suffix = base, 1
        while True:
            try:
                path.mkdir(parents=True)
                break
            except FileExistsError:
                suffix += 1
                path = base.with_name(f"{base.name}-{suffix}")
        run = cls(path)
        atomic_write_text(run.file(CONFIG), dump_config(config))
        return run

    @classmethod
    def open(cls, path: str | Path) -> RunDirectory:
        """An existing run directory; DpsynthError if it holds no config.yaml."""
        run = cls(path)
        if not run.file(CONFIG).is_file():
            raise DpsynthError(f"{run.path}: not a dpsynth run directory (no {CONFIG})")
        return run

    def file(self, name: str) -> Path:
        return self.path / name

    def config(self) -> Config:
        return load_config(self.file(CONFIG).read_text(), str(self.file(CONFIG)))

    def ledger(self) -> PrivacyLedger:
        """The run's ledger, continuing the saved one if there is one."""
        path = self.file(LEDGER)
        return PrivacyLedger.load(path) if path.exists() else PrivacyLedger(path)

    def write_config(self, config: RunConfig) -> None:
        atomic_write_text(self.file(CONFIG), dump_config(config))

    def record_hardware(self, hardware: dict[str, Any]) -> None:
        """Write what this machine is and the hardware-dependent choices made on it into config.yaml's
        ``hardware`` section (each start or resume rewrites it), and log them."""
        atomic_write_text(self.file(CONFIG), dump_config({**self.config(), "hardware": hardware}))
        self.log("hardware", **hardware)

    def log(self, event: str, **fields: Any) -> None:
        """Append one record to log.jsonl."""
        record = {"time": time.strftime("%Y-%m-%dT%H:%M:%S"), "event": event, **fields}
        with self.file(LOG).open("a") as handle:
            handle.write(json.dumps(record, default=_json_default) + "\n")

    def save_checkpoint(self, state: Checkpoint, ledger: PrivacyLedger, settings: dict[str, Any] | None = None
                        ) -> None:
        """Atomically save ``state`` with the ledger that covers it and the config ``settings`` a resume must
        keep, then the ledger file."""
        self._write_checkpoint({"state": state.to_dict(), "ledger": ledger.to_dict(), "settings": settings or {}})
        ledger.save()

    def _write_checkpoint(self, saved: dict[str, Any]) -> None:
        buffer = io.BytesIO()
        torch.save(saved, buffer)
        atomic_write(self.file(CHECKPOINT), lambda handle: handle.write(buffer.getvalue()))

    def _read_checkpoint(self) -> dict[str, Any]:
        path = self.file(CHECKPOINT)
        try:
            return torch.load(path, map_location="cpu", weights_only=True)
        except Exception as exc:  # torch raises many types for a damaged file
            raise DpsynthError(f"{path}: unreadable checkpoint ({exc})") from None

    def forget_noise_keys(self) -> None:
        """Remove the secret noise streams' keys from checkpoint.pt (once released, nothing resumes from it)."""
        if self.file(CHECKPOINT).exists():
            self._write_checkpoint(_without_keys(self._read_checkpoint()))

    def last_checkpoint(self) -> Checkpoint:
        """The training state of checkpoint.pt (private: read it where the run is)."""
        return Checkpoint.from_dict(self._read_checkpoint()["state"], self.file(CHECKPOINT))

    def restore(self, settings: dict[str, Any] | None = None, plan: LedgerPlan | None = None
                ) -> tuple[Checkpoint | None, PrivacyLedger]:
        """The last checkpoint's state (None without one) and the ledger that covers it, made with ``plan``;
        DpsynthError naming the key when one of the checkpoint's settings differs from ``settings`` (config.yaml
        edited since), PrivacyError when the ledger holds more than the plan allows.

        The ledger file is rewound to that ledger (an empty one without a checkpoint), and the rewind is
        logged when the file had run ahead.
        """
        state = None
        ledger = PrivacyLedger(self.file(LEDGER), plan=plan)
        if self.file(CHECKPOINT).exists():
            saved = self._read_checkpoint()
            _check_settings(migrated_settings(saved.get("settings", {})), settings, self.file(CONFIG))
            state = Checkpoint.from_dict(saved["state"], self.file(CHECKPOINT))
            ledger = PrivacyLedger.from_dict(saved["ledger"], self.file(LEDGER), plan)
        on_disk = self.ledger()
        if on_disk != ledger:
            self.log("ledger_rewound", reason="mechanisms ran after the last checkpoint; their outputs were lost",
                     ledger_before=on_disk.to_dict()["entries"], ledger_after=ledger.to_dict()["entries"])
        ledger.save()
        return state, ledger

    def write_privacy_report(self, report: dict[str, Any]) -> None:
        """Write privacy.json (once, at the release): ``report`` with the manifest of the files released beside it."""
        manifest = {Path(name).name: sha256(self.file(name))
                    for name in (SYNTHETIC, SAMPLES, MODEL, MODEL_CARD, DATASHEET) if self.file(name).is_file()}
        atomic_write_json(self.file(PRIVACY), {**report, MANIFEST: manifest})

    def write_datasheet(self, text: str) -> None:
        """Write the release's datasheet (README.md), before privacy.json lists it."""
        atomic_write_text(self.file(DATASHEET), text)

    def released_files(self) -> set[Path]:
        """The files of ``release/`` that the release step wrote, unchanged since (by privacy.json's manifest)."""
        path = self.file(PRIVACY)
        if not path.is_file():
            return set()
        manifest = json.loads(path.read_text()).get(MANIFEST) or {}
        release = self.file(RELEASE)
        return {path} | {release / name for name, digest in manifest.items()
                         if (release / name).is_file() and sha256(release / name) == digest}

    def method_metrics(self) -> dict[str, Any]:
        """What the method measured about itself (e.g. DP-ImgSyn's teacher accuracy); empty if nothing."""
        path = self.file(METHOD_METRICS)
        return json.loads(path.read_text()) if path.exists() else {}

    def report_method_metric(self, name: str, value: Any) -> None:
        atomic_write_json(self.file(METHOD_METRICS), {**self.method_metrics(), name: value})

    def save_release(self, images: torch.Tensor, labels: torch.Tensor, class_names: list[str],
                     soft_labels: torch.Tensor | None = None, soft_label_temperature: float = 1.0) -> None:
        """Write synthetic.npz (:func:`write_synthetic`) and samples.png."""
        write_synthetic(self.file(SYNTHETIC), images, labels, class_names, soft_labels, soft_label_temperature,
                        self.file(SAMPLES))


def write_synthetic(path: Path, images: torch.Tensor, labels: torch.Tensor, class_names: list[str],
                    soft_labels: torch.Tensor | None = None, soft_label_temperature: float = 1.0,
                    grid: Path | None = None) -> None:
    """Write ``path`` in the release format (uint8 images, int labels, class names, optional soft labels at their
    temperature) and, given ``grid``, a picture of one row per class there."""
    pixels, hard = to_uint8(images), labels.detach().cpu().numpy().astype(np.int64)
    arrays: dict[str, Any] = {"images": pixels, "labels": hard, "class_names": np.asarray(class_names)}
    if soft_labels is not None:
        arrays["soft_labels"] = soft_labels.detach().float().cpu().numpy()
        arrays["soft_label_temperature"] = np.float64(soft_label_temperature)
    buffer = io.BytesIO()
    np.savez_compressed(buffer, **arrays)
    atomic_write(path, lambda handle: handle.write(buffer.getvalue()))
    if grid is not None:
        save_png(class_grid(pixels, hard, len(class_names)), grid)


def _without_keys(value: Any) -> Any:
    """``value`` with every secret stream state (:meth:`SecretStream.get_state`) reduced to its draw count."""
    if isinstance(value, dict):
        if set(value) == {"key", "draws"}:
            return {"draws": value["draws"]}
        return {name: _without_keys(item) for name, item in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_without_keys(item) for item in value)
    return value


def _check_settings(saved: dict[str, Any], current: dict[str, Any] | None, config: Path) -> None:
    """DpsynthError naming the first key whose value the checkpoint holds and ``current`` changed or lacks."""
    if current is None:
        return
    for key, value in saved.items():
        if current.get(key, _MISSING) != value:
            now = current.get(key, "no value")
            raise DpsynthError(f"{config}: {key} is {now!r}, but the run's checkpoint was made with {value!r}; a "
                               "resumed run keeps what its privacy plan and data were made with (only where and in "
                               "what chunks it computes may change): put the value back")


_MISSING = object()


def inside_release(path: str | Path) -> Path | None:
    """The run directory whose ``release/`` folder holds ``path`` (or is it), or None."""
    path = Path(path).resolve()
    for folder in (path, *path.parents):
        if folder.name == RELEASE and (folder.parent / CONFIG).is_file():
            return folder.parent
    return None


def _json_default(value: Any) -> Any:
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        return value.item()
    if isinstance(value, (np.generic,)):
        return value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    raise TypeError(f"cannot log a value of type {type(value).__name__}")
