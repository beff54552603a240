"""The interface every synthesis method implements, and the decorator that registers one defined by imported code."""
from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypeVar

import numpy as np
import torch

from ..config import SHARED_BY_NAME, Config, RunConfig, SamplingSettings, section_defaults, section_settings
from ..data import DatasetInfo, ImageSet, load_public
from ..diffusion.settings import sampling_units
from ..errors import ConfigError
from ..generators import Generator
from ..privacy import PlannedStage
from ..training.context import RunContext
from ..training.probes import Probes
from . import REGISTERED
from .declaration import Declaration

T = TypeVar("T")
E = TypeVar("E")


@dataclass(frozen=True)
class Release:
    """What :meth:`Method.generate` returns: images in [0, 1], their labels, the soft labels of a method that
    releases them (else None), and how sampling ran (precision, compilation), which the run logs."""

    images: torch.Tensor
    labels: torch.Tensor
    soft_labels: torch.Tensor | None = None
    sampling: dict[str, Any] = field(default_factory=dict)


# The `cpu` preset's release and evaluation, the same for every method so that the bench compares them alike: the
# classifier sees 20,000 images (+1.6 CNN points over 5,000 for 3.2 more minutes; 60,000 adds 0.2 more for 9.1),
# one CNN x 3 seeds keeps the evaluation under a quarter of a DPDM run (docs/evaluation.md, "The cpu protocol").
CPU_PROTOCOL: dict[str, dict[str, Any]] = {"sampling": {"num_samples": 20000}, "evaluation": {"classifiers": ["cnn"]}}


class Method(ABC):
    """A DP image-synthesis method: its config sections, presets and privacy stages.

    Subclasses set ``declaration`` (:class:`~dpsynth.methods.declaration.Declaration`: name, paper, options, smoke
    run), ``sections`` (each config section's frozen dataclass, whose fields carry its keys, defaults and rules) and
    ``presets`` (nested overrides of any config key), ``releases_soft_labels`` when ``generate`` returns soft labels,
    ``needs_public_model`` when it cannot run without ``model.init_from`` (the bench then pre-trains one). The
    derived preset (``auto``, :mod:`dpsynth.autoplan`) sizes the ``dpsgd_sections`` from what
    :meth:`throughput_probes` measures.
    """

    declaration: ClassVar[Declaration]  # its name, paper, options, smoke run: data that imports no torch
    sections: ClassVar[dict[str, type]]  # section -> the frozen dataclass whose fields are its keys and defaults
    presets: ClassVar[dict[str, dict[str, Any]]]
    default_preset: ClassVar[str] = "auto"  # derived from the data and the machine (dpsynth.autoplan)
    releases_soft_labels: ClassVar[bool] = False
    # Why ``release.model`` cannot apply when its release is not sampled from a generator it trained only through
    # the ledger's mechanisms (None: :meth:`trained_generator` gives that generator).
    no_generator: ClassVar[str | None] = ("gives no trained generator to write (a method that has one returns it from "
                                          "trained_generator and sets no_generator = None)")
    needs_public_model: ClassVar[bool] = False  # fine-tunes a public model (model.init_from) it cannot run without
    # Whether its "dp-sgd" stage trains a diffusion model on pixels, as the recorded outcomes measure (the derived
    # plan's training side and the regime's verdicts apply only then).
    pixel_regime: ClassVar[bool] = True
    dpsgd_sections: ClassVar[tuple[str, ...]] = ()  # config sections of its DP-SGD stages, which --preset auto sizes
    public_sections: ClassVar[tuple[str, ...]] = ()  # sections of public training (iterations x batch_size rows)
    # The phase of Probes.phases whose iterations a derived plan sizes to the budget, and the key it sets.
    sized_phase: ClassVar[tuple[str, str] | None] = None
    # Other config sections (``generator``) or keys (``alignment.iterations``) its throughput probes read.
    probed_keys: ClassVar[tuple[str, ...]] = ()

    def __init__(self, config: RunConfig) -> None:
        self.config = config
        self.sampling = SamplingSettings.of(config)  # how generate() chunks and computes the release
        self._public_prints: dict[str, np.ndarray] | None = None
        self._public_sets: dict[tuple[Any, ...], tuple[ImageSet, list[str]]] = {}

    @classmethod
    def defaults(cls) -> Config:
        """Its sections with their defaults, as a config (the fields of each section's dataclass)."""
        return {name: section_defaults(kind) for name, kind in cls.sections.items()}

    @classmethod
    def section_kinds(cls) -> dict[str, type]:
        """The settings class of each section of its config: the shared ones' and its own (:attr:`sections`)."""
        return {**SHARED_BY_NAME, **cls.sections}

    @classmethod
    def settings(cls, config: Mapping[str, Any], section: str) -> Any:
        """Section ``section`` of ``config`` read through its settings class (:meth:`section_kinds`), checked."""
        return section_settings(cls.section_kinds()[section], config, section)

    @classmethod
    def run_config(cls, config: Mapping[str, Any]) -> RunConfig:
        """``config`` as a :class:`~dpsynth.config.RunConfig` of this method, each section parsed once."""
        return config if isinstance(config, RunConfig) else RunConfig(config, cls.section_kinds())

    @classmethod
    def fixed_preset(cls, name: str) -> dict[str, Any]:
        """The fixed preset called ``name``; ConfigError listing the known ones (``auto`` is derived by
        :mod:`dpsynth.autoplan`)."""
        if name not in cls.presets:
            raise ConfigError(f"method {cls.declaration.name!r} has no preset {name!r}; presets: auto, "
                              f"{', '.join(cls.presets)}")
        return cls.presets[name]

    @abstractmethod
    def privacy_stages(self, info: DatasetInfo) -> list[PlannedStage]:
        """The mechanisms a run on ``info``'s training split will apply, in order; one may be calibrated."""

    @abstractmethod
    def fit(self, context: RunContext) -> None:
        """Learn from the private training split, recording every mechanism in ``context.ledger``."""

    def starts_from_public_model(self) -> bool:
        """Whether its DP-SGD starts from a model trained on public images (none by default)."""
        return False

    def pretraining_data(self, public: ImageSet, info: DatasetInfo, device: torch.device
                         ) -> tuple[ImageSet, dict[str, Any]]:
        """What ``dpsynth pretrain --for`` trains its public model on, made of the ``public`` images of ``info``'s
        shape, and what its record adds; the images themselves by default."""
        return public, {}

    @classmethod
    def ready_public_parts(cls, config: RunConfig, info: DatasetInfo, device: torch.device) -> list[str]:
        """Build the parts trained on public data alone that a run of ``config`` on ``info`` needs and a cache keeps
        (a default autoencoder, say), before a derived plan sizes the rest; what each took, in words. None by
        default."""
        return []

    def public_data(self, info: DatasetInfo) -> dict[str, np.ndarray]:
        """Fingerprints (:mod:`dpsynth.data.fingerprints`) of each public image set the method reads, named for
        an error message; checked against every private split before a run starts. None by default."""
        return {}

    def public_fingerprints(self, info: DatasetInfo) -> dict[str, np.ndarray]:
        """:meth:`public_data`, read once: the check before the run and the release's digests share it."""
        if self._public_prints is None:
            self._public_prints = self.public_data(info)
        return self._public_prints

    def public_set(self, name: str, data_dir: str | None, info: DatasetInfo, num_images: int | None = None
                   ) -> tuple[ImageSet, list[str]]:
        """The public dataset ``name`` at ``info``'s shape, with its class names
        (:func:`~dpsynth.data.registry.load_public`), read once: the run's check of it, the planner's probe and the
        fit share it."""
        key = (name, data_dir, info.channels, info.height, num_images)
        if key not in self._public_sets:
            self._public_sets[key] = load_public(name, data_dir, info, num_images)
        return self._public_sets[key]

    def throughput_probes(self, shape: tuple[int, int, int], num_classes: int, device: torch.device) -> Probes:
        """What the planner's probe times on random public tensors of ``shape`` (none by default)."""
        return Probes({})

    @classmethod
    def model_shape(cls, config: RunConfig, shape: tuple[int, int, int]) -> tuple[int, int, int]:
        """The shape of what its DP-SGD model sees, for images of ``shape``: the images' own by default."""
        return shape

    @classmethod
    def phase_units(cls, config: RunConfig, num_images: float) -> dict[str, float]:
        """Units of work (images, iterations) of each phase in its probes' ``phases`` that a run of ``config`` on
        ``num_images`` private images does, for the planner's price (none by default)."""
        return {}

    @classmethod
    def release_units(cls, config: RunConfig) -> float:
        """Units of the release's work that its probes' ``sampling`` call prices (default: a diffusion model's
        images x sampling steps, none without one)."""
        return sampling_units(config)

    def class_balance(self) -> str:
        """How the release's labels are spread over the classes, in words for the datasheet."""
        return ("the same number of images of every class (up to one): a public rule, so the release does not "
                "show the private class sizes")

    def soft_label_temperature(self) -> float:
        """The temperature of the soft labels ``generate`` returns (when it returns any)."""
        return 1.0

    def report_sections(self, info: DatasetInfo) -> dict[str, Any]:
        """Sections the method adds to privacy.json (a public model it read, say); none by default."""
        return {}

    def non_private_outputs(self) -> list[str]:
        """Run outputs that hold statistics of the private data no epsilon covers (debugging options only)."""
        return []

    @abstractmethod
    def generate(self, num_samples: int, generator: torch.Generator) -> Release:
        """``num_samples`` images in [0, 1] with labels (and soft labels or None); no private data is read."""

    def trained_generator(self) -> Generator:
        """The fitted generator :meth:`generate` samples from (``release.model`` writes it); a method that has
        none says why in ``no_generator``."""
        raise NotImplementedError(f"{self.declaration.name}: {self.no_generator}")


def register(cls: type[Method]) -> type[Method]:
    """Class decorator adding a method defined by code already imported (a notebook's, say) to the registry
    (``dpsynth.methods.METHODS``) under its declared name; a method found by its declaration needs none."""
    REGISTERED[cls.declaration.name] = cls
    return cls
