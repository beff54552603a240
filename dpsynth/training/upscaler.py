"""Training the release's upscaler (:class:`~dpsynth.models.upscaler.Upscaler`) on PUBLIC images only: each step
shrinks a batch of them to a small side (area averaging, as a release made at that side would look) and learns to
lift it back. Nothing private is read, so the model, and every release lifted by it, costs no epsilon.

``default_upscaler`` builds the default one from images that installed packages ship (characters drawn in the
installed fonts and crops of scikit-learn's two photographs), once per side and recipe, into a cache folder.
"""
from __future__ import annotations

import hashlib
import json
import time
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from torch.nn import functional
from tqdm.auto import tqdm

from ..data import ImageSet, load_dataset
from ..errors import ConfigError
from ..models.saved import fresh_folder, save_model
from ..models.upscaler import SavedUpscaler, Upscaler, UpscalerShape, load_upscaler
from ..utils.images import as_floats

DEFAULT_CACHE = "~/.cache/dpsynth/upscalers"
DEFAULT_SOURCES = (("glyphs", 1240), ("photo-patches", 2000))  # (public set, images) of the default upscaler


@dataclass(frozen=True)
class UpscalerTraining:
    """Adam steps, their batch, learning rate and the small sides the steps shrink to."""

    iterations: int = 300
    batch_size: int = 16
    lr: float = 2e-3
    low_sides: tuple[int, ...] = (28, 32)


def train_upscaler(public: list[ImageSet], side: int, out: str | Path, training: UpscalerTraining,
                   device: torch.device, name: str, described: str, seed: int = 0) -> SavedUpscaler:
    """Train an upscaler to ``side`` px on the ``public`` image sets (each at ``side``), save it in ``out`` with
    the fingerprints of every training image, and load it back."""
    out = fresh_folder(out)
    low = [low_side for low_side in training.low_sides if low_side < side]
    if not low:
        raise ConfigError(f"an upscaler to {side} px needs a smaller side to lift from; low sides given: "
                          f"{list(training.low_sides)}")
    channels = torch.cat([as_floats(images.images).reshape(-1, 1, side, side) for images in public])
    generator = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    model = Upscaler().to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=training.lr)
    started, loss = time.perf_counter(), torch.zeros(())
    for _ in tqdm(range(training.iterations), desc="upscaler", dynamic_ncols=True):
        index = torch.randint(len(channels), (training.batch_size,), generator=generator)
        small_side = low[int(torch.randint(len(low), (1,), generator=generator))]
        target = channels[index].to(device)
        small = functional.interpolate(target, size=(small_side, small_side), mode="area")
        loss = functional.l1_loss(model(small, side), target)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    save_model(SavedUpscaler, model.cpu(), model.shape, {
        "name": name, "side": side, "trained_on": described, "images": sum(len(images) for images in public),
        "training": asdict(training), "final_l1": round(loss.item(), 5),
        "seconds": round(time.perf_counter() - started, 1), "private_images": 0},
        [images.images for images in public], out)
    return load_upscaler(out)


def default_upscaler(side: int, device: torch.device, cache_dir: str = DEFAULT_CACHE,
                     training: UpscalerTraining = UpscalerTraining()) -> SavedUpscaler:
    """The default upscaler to ``side`` px, trained once on :data:`DEFAULT_SOURCES` into ``cache_dir``."""
    recipe = json.dumps([side, DEFAULT_SOURCES, asdict(training), asdict(UpscalerShape())], sort_keys=True)
    name = f"dpsynth-default-{side}px-{hashlib.sha256(recipe.encode()).hexdigest()[:10]}"
    folder = Path(cache_dir).expanduser() / name
    if folder.is_dir():
        return load_upscaler(folder)
    with warnings.catch_warnings():  # a part of a published set: its size steers nothing here
        warnings.simplefilter("ignore")
        public = [load_dataset(source, resolution=side, channels=1 if source == "glyphs" else 3,
                               num_images=count).train for source, count in DEFAULT_SOURCES]
    described = ("characters drawn in the installed fonts (dataset glyphs) and crops of scikit-learn's two sample "
                 "photographs (dataset photo-patches)")
    return train_upscaler(public, side, folder, training, device, name, described)
