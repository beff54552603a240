"""A super-resolution model that lifts images made at a small side to a larger one: bicubic interpolation plus a
small convolutional correction learnt on PUBLIC images only (:mod:`dpsynth.training.upscaler` trains it).

It works on one channel at a time (an RGB image is lifted channel by channel), so one model serves grey and
colour releases, and at any ratio of sides (the correction runs at the target side). A saved model is a folder:
``upscaler.safetensors`` (the weights, whose SHA-256 names it in a release), ``upscaler.json`` (how it was built,
on which public images) and ``fingerprints.npy`` (the fingerprints of those images, so a run checks that none of
them is a private image).
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file, save_file
from torch import nn
from torch.nn import functional

from ..data.fingerprints import FINGERPRINTS, load_fingerprints
from ..errors import ConfigError, DataError
from ..utils.io import sha256

WEIGHTS, CARD = "upscaler.safetensors", "upscaler.json"


@dataclass(frozen=True)
class UpscalerShape:
    """The correction network: ``depth`` 3 x 3 convolutions of ``width`` channels."""

    width: int = 16
    depth: int = 3


class Upscaler(nn.Module):
    """Images N x C x h x w in [0, 1] to N x C x side x side: bicubic, plus a learnt residual, clamped to [0, 1]."""

    def __init__(self, shape: UpscalerShape = UpscalerShape()) -> None:
        super().__init__()
        self.shape = shape
        layers: list[nn.Module] = []
        channels = 1
        for _ in range(shape.depth - 1):
            layers += [nn.Conv2d(channels, shape.width, 3, padding=1), nn.SiLU()]
            channels = shape.width
        last = nn.Conv2d(channels, 1, 3, padding=1)
        nn.init.zeros_(last.weight)
        nn.init.zeros_(last.bias)  # type: ignore[arg-type]  # (it has one) starts as plain bicubic interpolation
        layers.append(last)
        self.body = nn.Sequential(*layers)

    def forward(self, images: torch.Tensor, side: int) -> torch.Tensor:
        count, channels, height, width = images.shape
        single = images.reshape(count * channels, 1, height, width)
        base = functional.interpolate(single, size=(side, side), mode="bicubic", align_corners=False)
        return (base + self.body(base)).clamp(0, 1).reshape(count, channels, side, side)


def save_upscaler(model: Upscaler, out: Path, record: dict[str, Any]) -> None:
    """Write ``model`` and ``record`` (how and on what it was trained) into the folder ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    save_file({name: tensor.detach().cpu().contiguous() for name, tensor in model.state_dict().items()},
              str(out / WEIGHTS))
    (out / CARD).write_text(json.dumps({"shape": asdict(model.shape), **record}, indent=1) + "\n")


@dataclass(frozen=True)
class SavedUpscaler:
    """A saved upscaler: the model, its folder, its record and the SHA-256 of its weights."""

    model: Upscaler
    folder: Path
    record: dict[str, Any]
    weights_sha256: str

    @property
    def name(self) -> str:
        return str(self.record.get("name") or self.folder.name)

    def fingerprints(self) -> np.ndarray:
        """The fingerprints of the public images it was trained on (DataError when the folder lacks them)."""
        prints = load_fingerprints(self.folder, self.record.get("fingerprints"))
        if prints is None:
            raise DataError(f"{self.folder}: no {FINGERPRINTS}: nothing shows that the upscaler's training images are "
                            "not private ones; write it again with dpsynth pretrain --upscaler")
        return prints

    @torch.no_grad()
    def lift(self, images: torch.Tensor, side: int, device: torch.device, chunk: int = 256) -> torch.Tensor:
        """``images`` in [0, 1] lifted to ``side`` x ``side``, ``chunk`` at a time on ``device`` (returned on the
        CPU)."""
        model = self.model.to(device)
        return torch.cat([model(part.float().to(device), side).cpu() for part in images.split(chunk)])


def load_upscaler(folder: str | Path, setting: str = "release.upscaler") -> SavedUpscaler:
    """The upscaler saved in ``folder``; ConfigError naming ``setting`` when the folder holds none."""
    folder = Path(folder).expanduser()
    if not (folder / WEIGHTS).is_file() or not (folder / CARD).is_file():
        raise ConfigError(f"{setting}: {folder} holds no upscaler (expected {WEIGHTS} and {CARD}); write one with "
                          "dpsynth pretrain --upscaler --dataset PUBLIC --out DIR")
    try:
        record = json.loads((folder / CARD).read_text())
        model = Upscaler(UpscalerShape(**record["shape"]))
        model.load_state_dict(load_file(str(folder / WEIGHTS)))
    except (OSError, ValueError, KeyError, TypeError, RuntimeError) as exc:
        raise ConfigError(f"{setting}: {folder / CARD} or {WEIGHTS} is damaged ({exc})") from None
    return SavedUpscaler(model.eval(), folder, record, sha256(folder / WEIGHTS))
