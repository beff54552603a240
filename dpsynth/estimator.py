"""``dpsynth.Synthesizer``: a method fitted on images held in memory, as scikit-learn fits an estimator.

    synthesizer = Synthesizer("dpdm", epsilon=10, preset="cpu", dpsgd__epochs=2)
    synthesizer.plan(images, labels, class_names=names).report  # what fit would spend, before it does
    synthesizer.fit(images, labels, class_names=names)     # arrays or tensors; groups= a person's id per image
    synthesizer.fit_dataset("folder", "/data/scans")        # or files dpsynth reads itself, as dpsynth run does
    synthesizer.privacy["epsilon"], synthesizer.metrics["fid"], synthesizer.sample(100).images
    synthesizer.release("shared/", "imagefolder")

A fit is a run like any other (:func:`dpsynth.pipeline.start`): it writes a run directory under ``out_dir``, with
its ledger, checkpoints, release and privacy.json, and enters the holder's ledger under the SHA-256 of the arrays
(:mod:`dpsynth.data.memory`), or under the dataset's name or path. Keyword settings are configuration keys with
``__`` for the dot.
"""
from __future__ import annotations

import contextlib
import json
import shutil
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch

from .api import PrivacyPreview, load_generator, privacy_preview, resolve_config
from .config import Config, DatasetSettings
from .data.memory import hold_arrays, let_go
from .errors import DpsynthError
from .evaluation import METRICS, Release, read_release
from .export import export_release
from .generators import Samples
from .methods import get_method
from .pipeline import resume, start
from .runs import PRIVACY, RELEASE, SYNTHETIC, RunDirectory, inside_release


class Synthesizer:
    """A method (``dpdm``, ``dp-merf``, ...) at a target ``epsilon``, with a ``preset`` (default the method's: a plan
    derived for this machine) and configuration keys as keyword settings (``dpsgd__lr=1e-3``); ConfigError naming
    a key that does not exist or a value it cannot take. A method that trains a generator releases it, so that
    :meth:`sample` draws more, unless ``release__model=False``."""

    def __init__(self, method: str, *, epsilon: float, preset: str | None = None, out_dir: str | Path = "runs",
                 **settings: Any) -> None:
        self.method, self.epsilon, self.preset = method, float(epsilon), preset
        gives_model = get_method(method).no_generator is None
        self.settings = {"release.model": gives_model, "run.out_dir": str(out_dir),
                         **{key.replace("__", "."): value for key, value in settings.items()}}
        self._config("memory:")  # its keys and values checked before any data is handed over
        self.run: RunDirectory | None = None
        self.stopped: Path | None = None  # the run directory of a fit a stop interrupted, which resume() continues

    def _config(self, data_dir: str | Path | None, dataset: str = "memory") -> Config:
        return resolve_config(self.method, dataset=dataset, data_dir=None if data_dir is None else str(data_dir),
                              epsilon=self.epsilon, preset=self.preset, values=self.settings.items())

    def plan(self, images: Any, labels: Any, groups: Any = None, class_names: Sequence[str] | None = None,
             num_classes: int | None = None) -> PrivacyPreview:
        """What :meth:`fit` of these arrays would spend and how its DP-SGD is judged, before anything is spent or
        written (``dpsynth privacy``): the plan, its budget (``.report``: each stage's noise and share of ε), the
        recorded outcomes' verdicts (``.regime``; ``.refused``: fit would refuse it). At the data's exact size: for
        your eyes, not to share."""
        data_dir = hold_arrays(images, labels, groups, class_names, num_classes)
        try:
            return privacy_preview(self._config(data_dir))
        finally:
            let_go(data_dir)

    def fit(self, images: Any, labels: Any, groups: Any = None, class_names: Sequence[str] | None = None,
            num_classes: int | None = None) -> Synthesizer:
        """Train on ``images`` (N x C x H x W, N x H x W x C or N x H x W; uint8, or floats in [0, 1]; NumPy or torch)
        with integer ``labels``, optional ``groups`` (a person's id per image: each person is then one record) and
        the class names (or their number: they are not read from the labels), then release; returns itself."""
        data_dir = hold_arrays(images, labels, groups, class_names, num_classes)
        with self._noting_a_stop(data_dir):
            self.run = start(self._config(data_dir))
        return self

    def fit_dataset(self, name: str, data_dir: str | Path | None = None) -> Synthesizer:
        """Train on a dataset dpsynth reads itself, as ``dpsynth run --dataset NAME --data-dir DIR`` does: a standard
        set by name (``fashion-mnist``), or your own files (``folder``: a folder of images, 16-bit PNGs or DICOM, a
        sub-folder per class or per person; ``npz``), with ``dataset__*`` settings for how; returns itself."""
        with self._noting_a_stop(None):
            self.run = start(self._config(data_dir, name))
        return self

    def plan_dataset(self, name: str, data_dir: str | Path | None = None) -> PrivacyPreview:
        """:meth:`plan` for the dataset :meth:`fit_dataset` would read."""
        return privacy_preview(self._config(data_dir, name))

    def resume(self, images: Any = None, labels: Any = None, groups: Any = None,
               class_names: Sequence[str] | None = None, num_classes: int | None = None,
               run_dir: str | Path | None = None) -> Synthesizer:
        """Continue the fit a stop interrupted (Ctrl-C; ``run_dir``: that run's directory, default the last stopped
        fit of this synthesizer) from its last checkpoint, on the same arrays handed over again (none after
        :meth:`fit_dataset`: dpsynth reads its dataset again): its plan, ledger and entry in the holder's ledger go
        on, so nothing is spent twice. DpsynthError when there is no stopped fit or the arrays are not the ones it
        read."""
        directory = run_dir if run_dir is not None else self.stopped
        if directory is None:
            raise DpsynthError(f"this {self.method} Synthesizer has no stopped fit to resume; give run_dir=")
        run = RunDirectory.open(directory)
        read, data_dir = DatasetSettings.of(run.config()), None
        if read.name != "memory" and (images is not None or labels is not None):
            raise DpsynthError(f"{run.path}: the stopped fit read dataset {read.name}, which dpsynth reads again: "
                               "resume() without arrays")
        if read.name == "memory":
            data_dir = hold_arrays(images, labels, groups, class_names, num_classes)
            if read.data_dir != data_dir:
                raise DpsynthError(f"{run.path}: these arrays are not the ones the stopped fit read (their SHA-256 "
                                   "differs): hand over the same images, labels, groups and class names")
        with self._noting_a_stop(data_dir):
            self.run = resume(str(run.path))
        self.stopped = None
        return self

    @contextlib.contextmanager
    def _noting_a_stop(self, data_dir: str | None) -> Iterator[None]:
        """Keep the run directory of a fit that a stop interrupts, for :meth:`resume`; let the arrays named
        ``data_dir`` (if any) go when the fit ends, however it ends (a resume hands them over again)."""
        try:
            yield
        except KeyboardInterrupt as stop:
            self.stopped = getattr(stop, "run_directory", None)
            raise
        finally:
            if data_dir is not None:
                let_go(data_dir)

    @property
    def run_dir(self) -> Path:
        """The fitted run's directory; DpsynthError before :meth:`fit`."""
        if self.run is None:
            raise DpsynthError(f"this {self.method} Synthesizer is not fitted yet: call fit(images, labels, ...)")
        return self.run.path

    @property
    def privacy(self) -> dict[str, Any]:
        """The release's privacy report (privacy.json): its ε and δ from the ledger, each stage's mechanisms."""
        return json.loads((self.run_dir / PRIVACY).read_text())

    @property
    def metrics(self) -> dict[str, Any]:
        """The release's evaluation against the real images (metrics.json: FID, KID, precision and recall, each
        downstream classifier's accuracy, the model selection's ε); DpsynthError where the fit did not evaluate."""
        path = self.run_dir / METRICS
        if not path.is_file():
            raise DpsynthError(f"{self.run_dir}: the fit was not evaluated (evaluation.enabled is false); fit with "
                               "evaluation__enabled=True, or evaluate the run with dpsynth evaluate")
        return json.loads(path.read_text())

    @property
    def synthetic(self) -> Release:
        """The released set: uint8 images N x C x H x W, labels (and soft labels), class names."""
        return read_release(self.run_dir / SYNTHETIC)

    def sample(self, count: int | None = None, labels: Sequence[int] | torch.Tensor | None = None,
               generator: torch.Generator | None = None, device: str = "auto") -> Samples:
        """More images from the released model (post-processing: no further ε), as
        :meth:`dpsynth.generators.Generator.sample` draws them; DpsynthError for a method that releases only images
        (PE, DP-ImgSyn) or a fit with ``release__model=False``."""
        reason = get_method(self.method).no_generator
        if reason is not None:
            raise DpsynthError(f"{self.method} releases a set of images, not a model ({reason}); .synthetic holds it")
        return load_generator(self.run_dir, device).sample(count, labels, generator)

    def release(self, directory: str | Path, format: str | None = None) -> Path:
        """Write the release to the new folder ``directory``: as released (privacy.json, synthetic.npz, the datasheet,
        the model), or exported (``imagefolder``, ``diffusers``: :func:`dpsynth.export.export_release`)."""
        if format is not None:
            return export_release(self.run_dir, directory, format)
        directory = Path(directory)
        if directory.exists() or inside_release(directory) is not None:
            raise DpsynthError(f"{directory}: already exists or lies inside a run's release/ folder; release writes "
                               "a new folder elsewhere")
        shutil.copytree(self.run_dir / RELEASE, directory)
        return directory
