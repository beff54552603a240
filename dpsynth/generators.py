"""Trained generators as a release holds them: the weights a run sampled its images with (``model.safetensors``)
and what rebuilds and samples them (``model.json``).

Three kinds: the class-conditional diffusion UNet of DPDM, DP-FETA, FETA-Pro, PDP-Diffusion, PrivImage and DP-SAD's
student, sampled by its sampler; DP-LDM's, which samples latent images that a public autoencoder decodes; and
DP-MERF's one-step generator. A run samples its release through the same object
it writes (:meth:`Generator.sample`), so a model loaded later (:func:`load_generator`) samples as the run did: the
same images from the same random stream on the same machine.
"""
from __future__ import annotations

import json
import secrets
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, ClassVar, cast

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save
from torch import nn
from tqdm.auto import tqdm

from .config import SamplingSettings, positive, section_settings
from .diffusion import Diffusion
from .diffusion.inference import sampling_inputs, sampling_model
from .diffusion.settings import DiffusionSettings, UNetSettings
from .errors import ConfigError, DpsynthError
from .models import build_unet
from .models.autoencoder import SavedAutoencoder, build_autoencoder, shape_of
from .models.generator import ConditionalGenerator
from .runs import MANIFEST, MODEL, MODEL_CARD, PRIVACY
from .utils.device import memory_limited_by
from .utils.io import atomic_write, atomic_write_json, sha256

MODEL_WEIGHTS, CARD = Path(MODEL).name, Path(MODEL_CARD).name  # model.safetensors, model.json
CARD_FORMAT = "dpsynth generator"
CARD_VERSION = 1  # the layout of model.json this dpsynth writes and reads
PRIVACY_REPORT = Path(PRIVACY).name  # the release's report, listing its files by SHA-256
DIFFUSERS_SAMPLING = "sampling.json"  # how a diffusers folder (DiffusionGenerator.save_diffusers) samples


def balanced_labels(count: int, num_classes: int) -> torch.Tensor:
    """0, 1, ..., num_classes - 1, 0, 1, ... (``count`` labels)."""
    return torch.arange(count) % num_classes


@dataclass(frozen=True)
class Samples:
    """Images in [0, 1] (N x C x H x W, on the CPU), their labels, and how sampling ran (precision, compilation)."""

    images: torch.Tensor
    labels: torch.Tensor
    sampling: dict[str, Any] = field(default_factory=dict)


class Generator(ABC):
    """A trained class-conditional image generator: its module, the shape (C, H, W) and class names of its images,
    and (once loaded from a release) the release's privacy report."""

    kind: ClassVar[str]

    def __init__(self, module: nn.Module, shape: tuple[int, int, int], class_names: Sequence[str],
                 method: str) -> None:
        self.module, self.shape, self.class_names, self.method = module, shape, list(class_names), method
        self.privacy: dict[str, Any] = {}

    @property
    def device(self) -> torch.device:
        return next(self.module.parameters()).device

    def describe(self) -> str:
        """One line: the method, the kind, the images and classes, and the guarantee when loaded from a release."""
        text = (f"{self.method} {self.kind} generator of {' x '.join(map(str, self.shape))} images, "
                f"{len(self.class_names)} classes")
        if not self.privacy:
            return text
        if not self.privacy.get("dp_guarantee"):
            return f"{text}; NO differential-privacy guarantee (its privacy.json says why)"
        seeded = ", NOT private: its noise was seeded by the user (run.seed)" \
            if self.privacy.get("noise_seed") != "secret" else ""
        return f"{text}; (epsilon, delta) = ({self.privacy['epsilon']:.4f}, {self.privacy['delta']:.3g}){seeded}"

    def labels_for(self, count: int | None = None, labels: Sequence[int] | torch.Tensor | None = None,
                   per_class: Mapping[str | int, int] | None = None) -> torch.Tensor:
        """The labels to draw: ``count`` over the classes in turn (equal numbers, up to one), or ``labels`` (class
        indices), or ``per_class`` (a count for each class named or numbered); ConfigError unless exactly one is
        given (``count`` may come with the others when it is their total)."""
        if labels is not None or per_class is not None:
            if labels is not None and per_class is not None:
                raise ConfigError("sample: give labels or per_class, not both")
            chosen = self._checked(labels) if labels is not None else self._of_counts(per_class or {})
            if count is not None and count != len(chosen):
                raise ConfigError(f"sample: {count} images asked for, but the labels given make {len(chosen)}")
            return chosen
        if count is None or count < 1:
            raise ConfigError(f"sample: give a positive number of images, labels or counts per class, got {count!r}")
        return balanced_labels(count, len(self.class_names))

    def _checked(self, labels: Sequence[int] | torch.Tensor) -> torch.Tensor:
        """``labels`` as a tensor; ConfigError unless each is a class index."""
        chosen = torch.as_tensor(labels, dtype=torch.long).flatten()
        if len(chosen) == 0 or chosen.min() < 0 or chosen.max() >= len(self.class_names):
            raise ConfigError(f"sample: labels must be class indices 0 to {len(self.class_names) - 1} "
                              f"({', '.join(self.class_names)}), got {chosen.unique().tolist()[:10]}")
        return chosen

    def _of_counts(self, per_class: Mapping[str | int, int]) -> torch.Tensor:
        """The labels of ``per_class``'s counts, class after class; ConfigError for an unknown class or a count
        below zero, or none at all."""
        parts = []
        for name, number in per_class.items():
            if not isinstance(number, int) or number < 0:
                raise ConfigError(f"sample: the count of class {name!r} must be a whole number of at least 0, "
                                  f"got {number!r}")
            parts.append(torch.full((number,), self.class_index(name), dtype=torch.long))
        if not parts or sum(map(len, parts)) == 0:
            raise ConfigError("sample: the counts per class add up to no image")
        return torch.cat(parts)

    def class_index(self, name: str | int) -> int:
        """The index of class ``name`` (a class name, else its number); ConfigError listing the classes."""
        if str(name) in self.class_names:
            return self.class_names.index(str(name))
        if isinstance(name, int) or str(name).isdigit():
            if 0 <= int(name) < len(self.class_names):
                return int(name)
        raise ConfigError(f"sample: no class {name!r}; the classes are {', '.join(self.class_names)} (or their "
                          f"numbers 0 to {len(self.class_names) - 1})")

    @torch.no_grad()
    def sample(self, count: int | None = None, labels: Sequence[int] | torch.Tensor | None = None,
               generator: torch.Generator | None = None, settings: SamplingSettings | None = None,
               per_class: Mapping[str | int, int] | None = None) -> Samples:
        """``count`` images, classes in turn, or one image of each of ``labels``, or ``per_class`` counts
        (:meth:`labels_for`); random from ``generator`` (default: fresh from the OS), computed as ``settings`` say
        (chunk size, bf16, compilation; default auto). Post-processing of the trained model: it reads no private
        data and spends no epsilon."""
        chosen = self.labels_for(count, labels, per_class)
        if generator is None:
            generator = torch.Generator().manual_seed(secrets.randbits(63))
        self.module.eval()
        return self._draw(chosen, generator, settings or SamplingSettings())

    @abstractmethod
    def _draw(self, labels: torch.Tensor, generator: torch.Generator, settings: SamplingSettings) -> Samples:
        """One image of each of ``labels``."""

    @abstractmethod
    def settings(self) -> dict[str, Any]:
        """The sections of model.json that rebuild the module and say how it samples (public config values)."""

    @abstractmethod
    def contents(self) -> str:
        """What model.safetensors and model.json hold, in words, for the datasheet."""

    @classmethod
    @abstractmethod
    def rebuilt(cls, card: dict[str, Any], shape: tuple[int, int, int], class_names: list[str]) -> Generator:
        """A generator of this kind with a fresh module shaped as ``card`` says (its weights not yet loaded)."""

    def card(self) -> dict[str, Any]:
        """model.json: the format, the kind, the method, the images' shape and classes, and :meth:`settings`."""
        return {"format": CARD_FORMAT, "version": CARD_VERSION, "kind": self.kind, "method": self.method,
                "image_shape": list(self.shape), "class_names": self.class_names, **self.settings()}

    def tensors(self) -> dict[str, torch.Tensor]:
        """The module's state (parameters and buffers), fp32 on the CPU: what model.safetensors holds."""
        return {name: value.detach().cpu().contiguous().clone() for name, value in self.module.state_dict().items()}

    def save(self, directory: Path, made_by: dict[str, Any]) -> None:
        """Write model.safetensors and model.json (``made_by``: dpsynth's version and commit) into ``directory``."""
        tensors = self.tensors()
        atomic_write(directory / MODEL_WEIGHTS, lambda handle: handle.write(save(tensors, metadata={"format": "pt"})))
        atomic_write_json(directory / CARD, {**self.card(), "dpsynth": made_by})


class DiffusionGenerator(Generator):
    """A class-conditional diffusion UNet (label ``num_classes`` is the null class of guidance) and its sampler."""

    kind = "diffusion"

    def __init__(self, module: nn.Module, shape: tuple[int, int, int], class_names: Sequence[str], method: str,
                 architecture: UNetSettings, diffusion: DiffusionSettings) -> None:
        super().__init__(module, shape, class_names, method)
        self.architecture, self.diffusion_settings = architecture, diffusion
        self.diffusion = Diffusion(diffusion.timesteps, diffusion.beta_schedule, diffusion.prediction)

    def with_sampler(self, **changes: Any) -> DiffusionGenerator:
        """This model with other sampler settings (``sampler``, ``sample_steps``, ``guidance``,
        ``guidance_interval``); ConfigError naming the key for a value its ``diffusion`` section forbids."""
        unknown = set(changes) - {"sampler", "sample_steps", "guidance", "guidance_interval"}
        if unknown:
            raise ConfigError(f"with_sampler: {', '.join(sorted(unknown))} is no sampler setting; these are: sampler, "
                              "sample_steps, guidance, guidance_interval")
        values = {**asdict(self.diffusion_settings), **changes}
        settings = section_settings(DiffusionSettings, {"diffusion": values}, "diffusion")
        changed = DiffusionGenerator(self.module, self.shape, self.class_names, self.method, self.architecture,
                                     settings)
        changed.privacy = self.privacy
        return changed

    def _draw(self, labels: torch.Tensor, generator: torch.Generator, settings: SamplingSettings) -> Samples:
        """Chunks of ``settings.batch_size`` images, on the model as :func:`sampling_model` prepares it."""
        sampler = self.diffusion_settings
        chunks = labels.split(settings.batch_size)
        rows = len(chunks[0]) * (2 if sampler.guidance else 1)  # a call's inputs, doubled under guidance
        num_classes = len(self.class_names)
        with memory_limited_by("sampling.batch_size", settings.batch_size, "sampling"), \
                sampling_model(self.module, settings, len(labels) * sampler.sample_steps,
                               sampling_inputs(rows, self.shape, self.diffusion.timesteps)) as chosen:
            images = torch.cat([
                self.diffusion.sample(chosen.model, chunk, self.shape, num_classes, sampler.sample_steps,
                                      sampler.guidance, generator, sampler.sampler, chosen.device,
                                      sampler.guidance_interval)
                for chunk in tqdm(chunks, desc="sampling", dynamic_ncols=True)
            ])
        return Samples(images, labels, chosen.report())

    def save_diffusers(self, out: Path) -> None:
        """Write the model as diffusers loads it: ``unet/`` (``UNet2DModel.from_pretrained``), ``scheduler/`` (the
        run's sampler on the model's noise schedule) and ``sampling.json`` (its steps, guidance and guidance
        interval, the null class that guidance contrasts with, the image shape and class names)."""
        settings = self.diffusion_settings
        self.module.save_pretrained(out / "unet")  # type: ignore[operator]  # a diffusers UNet2DModel
        self.diffusion.scheduler(settings.sampler, settings.sample_steps).save_pretrained(out / "scheduler")
        atomic_write_json(out / DIFFUSERS_SAMPLING, {
            "sample_steps": settings.sample_steps, "guidance": settings.guidance,
            "guidance_interval": list(settings.guidance_interval), "timesteps": self.diffusion.timesteps,
            "null_class": len(self.class_names), "image_shape": list(self.shape), "class_names": self.class_names})

    def contents(self) -> str:
        settings = self.diffusion_settings
        return ("the UNet's weights as the images were sampled with (the EMA of training); its architecture, noise "
                f"schedule, image shape, classes and sampler ({settings.sampler} in {settings.sample_steps} steps at "
                f"guidance {settings.guidance:g}, which sampling may change)")

    def settings(self) -> dict[str, Any]:
        architecture = {spec.name: getattr(self.architecture, spec.name) for spec in fields(UNetSettings)
                        if spec.name not in ("init_from", "class_start")}  # how it was started is no part of it
        return {"architecture": _plain(architecture), "diffusion": _plain(asdict(self.diffusion_settings))}

    @classmethod
    def rebuilt(cls, card: dict[str, Any], shape: tuple[int, int, int], class_names: list[str]) -> Generator:
        architecture = section_settings(UNetSettings, card, "architecture")
        diffusion = section_settings(DiffusionSettings, card, "diffusion")
        module = build_unet(shape[0], shape[1], len(class_names), list(architecture.block_channels),
                            architecture.layers_per_block, architecture.attention, architecture.norm_groups)
        return cls(module, shape, class_names, card["method"], architecture, diffusion)


class LatentModel(nn.Module):
    """A latent diffusion model as one module: the UNet over latent images and the public autoencoder that
    decodes them (``unet``, ``autoencoder``), saved together in model.safetensors."""

    def __init__(self, unet: nn.Module, autoencoder: nn.Module) -> None:
        super().__init__()
        self.unet, self.autoencoder = unet, autoencoder


class LatentDiffusionGenerator(Generator):
    """DP-LDM's model: a class-conditional diffusion UNet sampling latent images (``latent``, a
    :class:`DiffusionGenerator` of the latent shape) that the public autoencoder decodes."""

    kind = "latent-diffusion"

    def __init__(self, latent: DiffusionGenerator, autoencoder: SavedAutoencoder, shape: tuple[int, int, int]) -> None:
        super().__init__(LatentModel(latent.module, autoencoder.model), shape, latent.class_names, latent.method)
        self.latent, self.autoencoder = latent, autoencoder

    def _draw(self, labels: torch.Tensor, generator: torch.Generator, settings: SamplingSettings) -> Samples:
        latents = self.latent._draw(labels, generator, settings)
        images = self.autoencoder.decode(latents.images, self.device, settings.batch_size)
        return Samples(images, labels, latents.sampling)

    def contents(self) -> str:
        return (f"{self.latent.contents()}, over latent images of {' x '.join(map(str, self.latent.shape))}; and the "
                f"public autoencoder that decodes them ({self.autoencoder.name}, trained on public images only)")

    def settings(self) -> dict[str, Any]:
        record = self.autoencoder.record
        kept = ("name", "side", "channels", "latent_mean", "latent_std", "latent_scale", "trained_on", "images")
        autoencoder = {"shape": _plain(asdict(self.autoencoder.shape)), "sha256": self.autoencoder.weights_sha256,
                       **{key: record[key] for key in kept if key in record}}
        return {**self.latent.settings(), "latent_shape": list(self.latent.shape), "autoencoder": autoencoder}

    @classmethod
    def rebuilt(cls, card: dict[str, Any], shape: tuple[int, int, int], class_names: list[str]) -> Generator:
        latent_shape = tuple(card.get("latent_shape") or ())
        if len(latent_shape) != 3 or not isinstance(card.get("autoencoder"), dict):
            raise ConfigError("a latent-diffusion card needs latent_shape [channels, height, width] and autoencoder")
        latent = DiffusionGenerator.rebuilt(card, latent_shape, class_names)  # type: ignore[arg-type]
        record = dict(card["autoencoder"])
        try:
            model = build_autoencoder(int(record["channels"]), shape_of(record))
        except (KeyError, TypeError, ValueError) as error:
            raise ConfigError(f"autoencoder: {error}") from None
        saved = SavedAutoencoder(model, Path(), record, str(record.get("sha256", "")))
        return cls(cast(DiffusionGenerator, latent), saved, shape)


@dataclass(frozen=True, kw_only=True)
class OneStepArchitecture:
    """A one-step generator's latent size and width (model.json's ``architecture``)."""

    latent: int = positive()
    width: int = positive()


class OneStepGenerator(Generator):
    """DP-MERF's generator (:class:`~dpsynth.models.generator.ConditionalGenerator`): a Gaussian latent and a
    label to an image in one pass."""

    kind = "one-step"

    def __init__(self, module: ConditionalGenerator, shape: tuple[int, int, int], class_names: Sequence[str],
                 method: str, architecture: OneStepArchitecture) -> None:
        super().__init__(module, shape, class_names, method)
        self.architecture = architecture

    def _draw(self, labels: torch.Tensor, generator: torch.Generator, settings: SamplingSettings) -> Samples:
        return Samples(one_step_images(self.module, labels, settings.batch_size, self.device, generator).clamp(0, 1),
                       labels)

    def contents(self) -> str:
        return ("the generator's weights as the images were sampled with (its BatchNorm statistics are of its own "
                "outputs, not of private images); its latent size, width, image shape and classes")

    def settings(self) -> dict[str, Any]:
        return {"architecture": asdict(self.architecture)}

    @classmethod
    def rebuilt(cls, card: dict[str, Any], shape: tuple[int, int, int], class_names: list[str]) -> Generator:
        architecture = section_settings(OneStepArchitecture, card, "architecture")
        module = ConditionalGenerator(shape[0], shape[1], shape[2], len(class_names), architecture.latent,
                                      architecture.width)
        return cls(module, shape, class_names, card["method"], architecture)


@torch.no_grad()
def one_step_images(module: nn.Module, labels: torch.Tensor, batch_size: int, device: torch.device,
                    generator: torch.Generator) -> torch.Tensor:
    """Images of a one-step generator (eval mode) for ``labels``, in chunks of ``batch_size``, on the CPU."""
    module.eval()
    latent: int = module.latent  # type: ignore[assignment]
    return torch.cat([module(torch.randn((len(chunk), latent), generator=generator).to(device), chunk.to(device)).cpu()
                      for chunk in labels.split(batch_size)])


KINDS: dict[str, type[Generator]] = {kind.kind: kind for kind in (DiffusionGenerator, LatentDiffusionGenerator,
                                                                   OneStepGenerator)}


def _plain(values: dict[str, Any]) -> dict[str, Any]:
    """``values`` with tuples as lists, as JSON writes them."""
    return {key: list(value) if isinstance(value, tuple) else value for key, value in values.items()}


def read_generator(directory: str | Path, device: torch.device | str = "cpu") -> Generator:
    """The generator a release folder holds (model.json and model.safetensors, written by a run with
    ``release.model: true``), on ``device``, with the release's privacy report (``.privacy``).

    Both files must be those the folder's privacy.json lists by SHA-256: a model that differs is not the one the
    guarantee covers. DpsynthError naming the file and what was expected otherwise."""
    directory = Path(directory)
    card_path, weights_path = directory / CARD, directory / MODEL_WEIGHTS
    if not card_path.is_file() or not weights_path.is_file():
        raise DpsynthError(f"{directory}: no released model ({CARD} and {MODEL_WEIGHTS}); a run writes them "
                           "into its release/ folder when started with --release-model (release.model=true)")
    privacy = checked_privacy(directory, (card_path, weights_path))
    card = _read_card(card_path)
    shape = tuple(card["image_shape"])
    try:
        generator = KINDS[card["kind"]].rebuilt(card, shape, list(card["class_names"]))  # type: ignore[arg-type]
    except ConfigError as error:
        raise DpsynthError(f"{card_path}: {error}") from None
    try:
        state = load_file(weights_path)
    except (SafetensorError, OSError) as error:
        raise DpsynthError(f"{weights_path}: unreadable safetensors file ({error})") from None
    try:
        generator.module.load_state_dict(state, strict=True)
    except RuntimeError as error:
        first = str(error).splitlines()[0]
        raise DpsynthError(f"{weights_path}: its tensors do not fit the model {CARD} describes ({first})") \
            from None
    generator.module.to(device).eval()
    generator.privacy = privacy
    return generator


def _read_card(path: Path) -> dict[str, Any]:
    """model.json, checked for the format, version, kind, shape and classes; DpsynthError naming it otherwise."""
    try:
        card = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as error:
        raise DpsynthError(f"{path}: not a JSON file ({error})") from None
    if not isinstance(card, dict) or card.get("format") != CARD_FORMAT:
        raise DpsynthError(f"{path}: not a dpsynth model card (expected \"format\": \"{CARD_FORMAT}\")")
    if card.get("version") != CARD_VERSION:
        raise DpsynthError(f"{path}: model card version {card.get('version')!r}; this dpsynth reads version "
                           f"{CARD_VERSION}: load it with the dpsynth that wrote it (its \"dpsynth\" field)")
    if card.get("kind") not in KINDS:
        raise DpsynthError(f"{path}: kind {card.get('kind')!r}; known kinds: {', '.join(KINDS)}")
    shape, names = card.get("image_shape"), card.get("class_names")
    if not (isinstance(shape, list) and len(shape) == 3 and all(isinstance(s, int) and s > 0 for s in shape)):
        raise DpsynthError(f"{path}: image_shape must be [channels, height, width], got {shape!r}")
    if not (isinstance(names, list) and names and all(isinstance(name, str) for name in names)):
        raise DpsynthError(f"{path}: class_names must be a non-empty list of names, got {names!r}")
    return card


def checked_privacy(directory: Path, files: Sequence[Path], what: str = "model") -> dict[str, Any]:
    """The release folder's privacy.json, after checking that it lists each of ``files`` with its SHA-256;
    DpsynthError naming the file (a released ``what``) otherwise."""
    path = directory / PRIVACY_REPORT
    try:
        report = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as error:
        raise DpsynthError(f"{path}: a released {what} is read from its release folder, whose {PRIVACY_REPORT} "
                           f"states its guarantee; cannot read it ({error})") from None
    listed = report.get(MANIFEST) or {}
    for file in files:
        if listed.get(file.name) != sha256(file):
            how = "with another SHA-256" if file.name in listed else "not at all"
            raise DpsynthError(f"{file}: {path} lists it {how}: no guarantee covers a {what} that differs from the "
                               "released one")
    return report


__all__ = ["CARD", "KINDS", "MODEL_WEIGHTS", "DiffusionGenerator", "Generator", "LatentDiffusionGenerator",
           "LatentModel", "OneStepArchitecture",
           "OneStepGenerator", "Samples", "balanced_labels", "checked_privacy", "one_step_images", "read_generator"]
