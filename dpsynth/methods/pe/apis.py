"""Foundation-model APIs for PE: RANDOM_API(label, n) and VARIATION_API(samples, degree).

A population is a :class:`Samples`: images in [0, 1] at the private data's shape, plus whatever the API
needs to vary them (the text simulator's rendering parameters; nothing for a diffusion model, which varies
the pixels). ``degree`` lies in (0, 1]: larger means more variation.

The APIs are an open registry: ``api.name`` names a factory registered with :func:`register_api` (``drawtext`` and
``diffusion`` here), or one another package names under the ``dpsynth.pe_apis`` entry-point group
(``name = "module:factory"``), so that a model of your own plugs in without editing dpsynth.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from importlib.metadata import entry_points
from pathlib import Path
from typing import Protocol

import numpy as np
import torch

from ...config import positive
from ...data import DatasetInfo
from ...data.glyphs import DEFAULT_RANGES, TextRanges, find_fonts, render_character
from ...errors import ConfigError, DataError
from ...utils.device import memory_limited_by, to_device
from ...utils.images import convert_images


@dataclass(frozen=True)
class Samples:
    """N images (float N x C x H x W in [0, 1]) and, for APIs that render from parameters, N x P parameters."""

    images: torch.Tensor
    params: torch.Tensor | None = None

    def __len__(self) -> int:
        return len(self.images)

    def take(self, index: torch.Tensor) -> Samples:
        return Samples(self.images[index], None if self.params is None else self.params[index])

    @staticmethod
    def joined(parts: list[Samples]) -> Samples:
        params = [p.params for p in parts]
        return Samples(torch.cat([p.images for p in parts]),
                       None if any(p is None for p in params) else torch.cat(params))  # type: ignore[arg-type]


class ImageAPI(Protocol):
    """What PE asks of a foundation model: images of class ``label`` (in [0, 1], at the private data's shape) drawn
    with ``generator`` alone, so that a run resumes and splits over processes as it would in one. An API whose model
    was trained on images may also give ``training_fingerprints()`` (:mod:`dpsynth.data.fingerprints` of them, or
    None): a run checks them against the private data, and warns where there are none."""

    def random_api(self, label: int, n: int, generator: torch.Generator) -> Samples: ...

    def variation_api(self, samples: Samples, label: int, degree: float, generator: torch.Generator) -> Samples: ...


@dataclass(frozen=True, kw_only=True)
class ApiSettings:
    """The ``api`` section: which foundation-model API (``drawtext`` renders ``characters`` in the fonts found
    under ``font_dirs``; ``diffusion`` samples the diffusers ``model`` with ``steps`` DDIM steps, ``batch_size``
    images at a time; any other name, an API registered with :func:`register_api`, which reads the keys it
    needs)."""

    name: str = "drawtext"
    characters: str = "0123456789"
    font_dirs: tuple[str, ...] = ("/usr/share/fonts/truetype", "/usr/share/fonts/opentype")
    model: str | None = None
    steps: int = positive(default=100)
    batch_size: int = positive(default=100)


# Builds an API from the ``api`` section, the private data's public facts (shape, classes; no image) and the device.
ApiFactory = Callable[[ApiSettings, DatasetInfo, torch.device], ImageAPI]
API_ENTRY_POINTS = "dpsynth.pe_apis"
_FACTORIES: dict[str, ApiFactory] = {}


def register_api(name: str) -> Callable[[ApiFactory], ApiFactory]:
    """Decorator registering ``factory`` as the PE API ``name`` (``--set api.name=NAME``)."""
    def registered(factory: ApiFactory) -> ApiFactory:
        _FACTORIES[name] = factory
        return factory
    return registered


def api_names() -> list[str]:
    """The APIs ``api.name`` may name: those registered, then the entry points'."""
    listed = [point.name for point in entry_points(group=API_ENTRY_POINTS)]
    return [*_FACTORIES, *(name for name in listed if name not in _FACTORIES)]


def build_api(settings: ApiSettings, info: DatasetInfo, device: torch.device) -> ImageAPI:
    """The API ``settings.name`` names, built for ``info``'s images; ConfigError listing the known ones."""
    if settings.name not in _FACTORIES:
        points = [point for point in entry_points(group=API_ENTRY_POINTS) if point.name == settings.name]
        if not points:
            raise ConfigError(f"api.name must be one of {', '.join(api_names())} (or an API registered with "
                              f"dpsynth.methods.pe.apis.register_api), got {settings.name!r}")
        register_api(settings.name)(points[0].load())
    return _FACTORIES[settings.name](settings, info, device)


class DrawTextAPI:
    """A simulator rendering one character per image (white on black) with a random font, size, rotation,
    stroke width and position (:mod:`dpsynth.data.glyphs`); no model, no download. Class ``c`` is the character
    ``characters[c]``. RANDOM_API draws the parameters uniformly within ``ranges``; VARIATION_API moves each by
    degree x (its range width) / 2 and changes the font with probability degree / 2."""

    def __init__(self, info: DatasetInfo, characters: str, fonts: list[Path], ranges: TextRanges = DEFAULT_RANGES
                 ) -> None:
        if len(characters) != info.num_classes:
            raise ValueError(f"{len(characters)} characters ({characters!r}) for {info.num_classes} classes of "
                             f"{info.name}; give one character per class")
        self.info, self.characters, self.fonts, self.ranges = info, characters, fonts, ranges

    def random_api(self, label: int, n: int, generator: torch.Generator) -> Samples:
        params = self.ranges.draw(n, len(self.fonts), generator)
        return Samples(self._render(label, params), params)

    def variation_api(self, samples: Samples, label: int, degree: float, generator: torch.Generator) -> Samples:
        if samples.params is None:
            raise ValueError("the drawtext API can only vary images it rendered itself")
        bounds = self.ranges.bounds()
        n = len(samples)
        step = torch.randn((n, len(bounds)), generator=generator, dtype=torch.float64)
        moved = samples.params[:, 1:] + step * degree * (bounds[:, 1] - bounds[:, 0]) / 2
        moved = torch.maximum(torch.minimum(moved, bounds[:, 1]), bounds[:, 0])
        refont = torch.rand(n, generator=generator) < degree / 2
        font = torch.where(refont, torch.randint(0, len(self.fonts), (n,), generator=generator).double(),
                           samples.params[:, 0])
        params = torch.cat([font[:, None], moved], dim=1)
        return Samples(self._render(label, params), params)

    def _render(self, label: int, params: torch.Tensor) -> torch.Tensor:
        size = (self.info.height, self.info.width)
        images = np.stack([render_character(self.characters[label], self.fonts, row.tolist(), size)
                           for row in params])
        pixels = torch.from_numpy(images).float().div(255)[:, None]
        return pixels.expand(-1, self.info.channels, -1, -1).contiguous()


class DiffusionAPI:
    """A diffusion model saved in diffusers format (``unet/`` and ``scheduler/`` in one directory).

    RANDOM_API is DDIM sampling with ``steps`` steps; VARIATION_API is SDEdit: noise the images to the
    fraction ``degree`` of the DDIM schedule, then denoise. The model is unconditional; conditional PE
    tells classes apart through the private votes alone. Outputs are resized to the private data's shape.
    """

    def __init__(self, path: str, info: DatasetInfo, steps: int, batch_size: int, device: torch.device,
                 memory_setting: str = "batch_size") -> None:
        from diffusers import DDIMScheduler, UNet2DModel

        directory = Path(path)
        if not (directory / "unet" / "config.json").is_file() or not (directory / "scheduler").is_dir():
            raise DataError(f"{directory} is not a diffusers model directory (expected unet/config.json and "
                            "scheduler/, as DDPMPipeline.save_pretrained or dpsynth pretrain write them)")
        self.unet = UNet2DModel.from_pretrained(directory, subfolder="unet", low_cpu_mem_usage=False).to(device).eval()
        if self.unet.config.num_class_embeds is not None:
            raise DataError(f"{directory} is class-conditional; PE's diffusion API needs an unconditional model")
        self.scheduler = DDIMScheduler.from_pretrained(directory, subfolder="scheduler")
        if steps < 1:
            raise ValueError(f"steps must be >= 1, got {steps}")
        self.info, self.steps, self.batch_size, self.device = info, steps, batch_size, device
        self.memory_setting = memory_setting  # the setting an out-of-memory error tells the user to lower

    def random_api(self, label: int, n: int, generator: torch.Generator) -> Samples:
        return Samples(self._batched(n, None, 1.0, generator))

    def variation_api(self, samples: Samples, label: int, degree: float, generator: torch.Generator) -> Samples:
        if not 0 < degree <= 1:
            raise ValueError(f"a variation degree must lie in (0, 1], got {degree}")
        return Samples(self._batched(len(samples), samples.images, degree, generator))

    def _batched(self, n: int, images: torch.Tensor | None, degree: float, generator: torch.Generator
                 ) -> torch.Tensor:
        with memory_limited_by(self.memory_setting, self.batch_size, "running the diffusion API"):
            parts = [self._denoise(min(self.batch_size, n - s),
                                   None if images is None else images[s:s + self.batch_size], degree, generator)
                     for s in range(0, n, self.batch_size)]
        return torch.cat(parts) if parts else torch.empty(0, *self.info.shape)

    @torch.no_grad()
    def _denoise(self, n: int, images: torch.Tensor | None, degree: float, generator: torch.Generator
                 ) -> torch.Tensor:
        """SDEdit of ``images`` from ``degree`` of the schedule; without images, n samples from pure noise."""
        config = self.unet.config
        self.scheduler.set_timesteps(self.steps)
        timesteps = self.scheduler.timesteps[self.steps - max(1, round(degree * self.steps)):]
        x = to_device(torch.randn((n, config.in_channels, config.sample_size, config.sample_size),
                                  generator=generator), self.device)
        if images is not None:
            start = to_device(convert_images(images, config.in_channels, config.sample_size), self.device) * 2 - 1
            x = self.scheduler.add_noise(start, x, timesteps[:1])
        for t in timesteps:
            x = self.scheduler.step(self.unet(x, t).sample, t, x).prev_sample
        return convert_images(((x + 1) / 2).clamp(0, 1).cpu(), self.info.channels, (self.info.height, self.info.width))



@register_api("drawtext")
def drawtext_api(settings: ApiSettings, info: DatasetInfo, device: torch.device) -> DrawTextAPI:
    """The text simulator, one character of ``api.characters`` per class."""
    if len(settings.characters) != info.num_classes:
        raise ConfigError(f"api.characters: {len(settings.characters)} characters ({settings.characters!r}) for "
                          f"{info.num_classes} classes of {info.name}; give one character per class")
    return DrawTextAPI(info, settings.characters, find_fonts(list(settings.font_dirs)))


@register_api("diffusion")
def diffusion_api(settings: ApiSettings, info: DatasetInfo, device: torch.device) -> DiffusionAPI:
    """The diffusers model ``api.model``."""
    if not settings.model:
        raise ConfigError("api.model: the diffusion API needs a diffusers model directory "
                          "(--set api.model=DIR, e.g. one written by dpsynth pretrain)")
    try:
        return DiffusionAPI(settings.model, info, settings.steps, settings.batch_size, device, "api.batch_size")
    except DataError as error:
        raise ConfigError(f"api.model: {error}") from None
