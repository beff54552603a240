"""Rendered characters: PE's text simulator and ``glyphs``, a labelled public dataset of any size.

A glyph is one character drawn white on black in one of the installed fonts, at a random size, rotation,
stroke width and position, drawn at 4x resolution and downsampled (anti-aliased). No model, no download.
"""
from __future__ import annotations

import string
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from PIL import Image, ImageDraw, ImageFont

from ..errors import ConfigError

DEFAULT_FONT_DIRS = ("/usr/share/fonts/truetype", "/usr/share/fonts/opentype")
FONT_PACKAGES = "fonts-dejavu-core fonts-liberation fonts-freefont-ttf"
# Rendering parameters: font index, size (fraction of the image height), rotation (degrees), stroke width
# (fraction of the size), horizontal and vertical offset (fractions of the image side).
PARAMS = ("font", "size", "rotation", "stroke", "dx", "dy")
GLYPH_CLASSES = string.digits + string.ascii_uppercase + string.ascii_lowercase  # 62 classes
GLYPHS_PER_CLASS = 200
GLYPH_SEED = 0


@dataclass(frozen=True)
class TextRanges:
    """Ranges of the rendering parameters (font aside), each drawn uniformly."""

    size: tuple[float, float] = (0.55, 0.9)
    rotation: tuple[float, float] = (-25.0, 25.0)
    stroke: tuple[float, float] = (0.0, 0.08)
    offset: tuple[float, float] = (-0.12, 0.12)

    def bounds(self) -> torch.Tensor:
        return torch.tensor([self.size, self.rotation, self.stroke, self.offset, self.offset], dtype=torch.float64)

    def draw(self, n: int, num_fonts: int, generator: torch.Generator) -> torch.Tensor:
        """N x 6 parameters (:data:`PARAMS`): a uniform font index and uniform values within the ranges."""
        bounds = self.bounds()
        font = torch.randint(0, num_fonts, (n, 1), generator=generator).double()
        uniform = torch.rand((n, len(bounds)), generator=generator, dtype=torch.float64)
        return torch.cat([font, bounds[:, 0] + uniform * (bounds[:, 1] - bounds[:, 0])], dim=1)


DEFAULT_RANGES = TextRanges()


def find_fonts(directories: list[str] | tuple[str, ...] = DEFAULT_FONT_DIRS, setting: str = "api.font_dirs"
               ) -> list[Path]:
    """The .ttf / .otf files under ``directories``, sorted; ConfigError naming ``setting`` when there are none."""
    fonts = sorted(p for d in directories for p in Path(d).rglob("*") if p.suffix.lower() in (".ttf", ".otf"))
    if not fonts:
        raise ConfigError(f"{setting}: no .ttf or .otf fonts under {', '.join(directories)}; install some "
                          f"(apt-get install {FONT_PACKAGES})")
    return fonts


def render_character(character: str, fonts: list[Path], params: list[float], size: tuple[int, int]) -> np.ndarray:
    """One H x W uint8 image of ``character`` rendered with ``params`` (:data:`PARAMS`)."""
    font_index, scale_of_height, rotation, stroke, dx, dy = params
    (height, width), scale = size, 4
    canvas = Image.new("L", (width * scale, height * scale), 0)
    points = max(1, round(scale_of_height * height * scale))
    font = ImageFont.truetype(str(fonts[int(font_index)]), points)
    centre = (width * scale * (0.5 + dx), height * scale * (0.5 + dy))
    ImageDraw.Draw(canvas).text(centre, character, fill=255, font=font, anchor="mm",
                                stroke_width=round(stroke * points), stroke_fill=255)
    canvas = canvas.rotate(rotation, resample=Image.Resampling.BILINEAR, center=centre)
    return np.asarray(canvas.resize((width, height), Image.Resampling.BOX))


def render_glyphs(per_class: int, resolution: int, fonts: list[Path], seed: int = GLYPH_SEED,
                  classes: int = len(GLYPH_CLASSES)) -> tuple[np.ndarray, np.ndarray]:
    """``per_class`` glyphs of each of the first ``classes`` of the 62 characters (uint8 N x 1 x H x W, labels),
    from a fixed seed."""
    generator = torch.Generator().manual_seed(seed)
    params = DEFAULT_RANGES.draw(per_class * classes, len(fonts), generator)
    labels = np.arange(len(params)) % classes
    images = np.stack([render_character(GLYPH_CLASSES[label], fonts, row.tolist(), (resolution, resolution))
                       for label, row in zip(labels, params, strict=True)])
    return images[:, None], labels.astype(np.int64)
