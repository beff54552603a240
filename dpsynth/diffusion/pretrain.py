"""Non-private pre-training of a diffusion model on PUBLIC data, saved in diffusers format, and loading it as
the starting point of a DP-SGD method (``model.init_from``).

The directory it writes (``model_index.json``, ``unet/``, ``scheduler/``) is what ``DDPMPipeline.save_pretrained``
writes, so PE's diffusion API loads an unconditional one exactly as it loads a model downloaded elsewhere;
beside it, ``pretraining.json`` (the settings, the public dataset and its class names) and the fingerprints of
the training images, so a run checks they are not its private data. The model is saved every
``checkpoint_every`` iterations (atomically: written beside, then renamed), so an interrupted run leaves the
last saved model.
"""
from __future__ import annotations

import json
import shutil
import time
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from tqdm.auto import tqdm

from ..data import ImageSet
from ..data.fingerprints import FINGERPRINTS, fingerprints, load_fingerprints
from ..errors import ConfigError
from ..models import build_unet
from ..utils.device import to_device
from ..utils.images import as_floats
from ..utils.io import directory_sha256
from .ddpm import Diffusion, drop_labels
from .settings import PretrainSettings

if TYPE_CHECKING:  # diffusers is imported where a model is saved or loaded
    from diffusers import UNet2DModel

TRAINING_STATE = "pretraining.json"


def pretrain(data: ImageSet, out: str | Path, settings: PretrainSettings, device: torch.device,
             class_names: list[str] | None = None, dataset: str = "", seed: int = 0,
             training_prints: np.ndarray | None = None, extra: dict[str, Any] | None = None) -> Path:
    """Train a DDPM on ``data`` (public images, or a map of each, whose ``training_prints`` are the images'
    fingerprints; class-conditional on its labels, ``class_names``, when ``settings.conditional``) and save it in
    ``out``, its record with ``extra``."""
    out = Path(out)
    if out.exists() and any(out.iterdir()):
        raise ConfigError(f"--out {out}: the directory exists and is not empty; choose a new one")
    _, channels, height, width = data.images.shape
    if height != width:
        raise ConfigError(f"pretrain needs square images, got {height} x {width}")
    num_classes = (len(class_names) if class_names else int(data.labels.max()) + 1) if settings.conditional else None
    torch.manual_seed(seed)
    generator = torch.Generator().manual_seed(seed)
    diffusion = Diffusion(settings.timesteps, settings.beta_schedule, settings.prediction)
    model = build_unet(channels, height, num_classes, settings.block_channels, settings.layers_per_block,
                       settings.attention, settings.norm_groups).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=settings.lr)
    prints = fingerprints(data.images) if training_prints is None else training_prints
    record = {"dataset": dataset, "images": len(data), "fingerprints": len(prints),
              "class_names": class_names if settings.conditional else None, "settings": asdict(settings),
              **(extra or {})}
    started = time.perf_counter()
    model.train()
    for step in tqdm(range(1, settings.iterations + 1), desc="pretrain", dynamic_ncols=True):
        index = torch.randint(len(data), (settings.batch_size,), generator=generator)
        times, noise = diffusion.training_inputs(settings.batch_size, 1, (channels, height, width), generator)
        labels = None if num_classes is None else to_device(
            drop_labels(data.labels[index], num_classes, settings.label_dropout, generator), device)
        images, times, noise = (to_device(t, device) for t in (as_floats(data.images[index]), times, noise))
        loss = diffusion.batch_loss(model, images, labels, times, noise)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if step % settings.checkpoint_every == 0 or step == settings.iterations:
            save_diffusers(model, diffusion, out, {**record, "step": step, "loss": loss.item(),
                                                   "seconds": round(time.perf_counter() - started, 1)}, prints)
    return out


def save_diffusers(model: UNet2DModel, diffusion: Diffusion, out: Path, state: dict[str, Any],
                   training_fingerprints: np.ndarray) -> None:
    """Write ``model`` and the DDPM scheduler as a DDPMPipeline directory, with the fingerprints of its
    training images (so a run can check they are not its private data), replacing ``out`` atomically."""
    partial = out.with_name(out.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    from diffusers import DDPMPipeline

    DDPMPipeline(unet=model, scheduler=diffusion.train_scheduler).save_pretrained(partial)
    (partial / TRAINING_STATE).write_text(json.dumps(state))
    np.save(partial / FINGERPRINTS, training_fingerprints)
    shutil.rmtree(out, ignore_errors=True)
    partial.rename(out)


def read_pretraining(directory: str | Path, setting: str) -> dict[str, Any]:
    """The ``pretraining.json`` of a model directory ``dpsynth pretrain`` wrote; ConfigError naming ``setting``
    when ``directory`` is not one."""
    path = Path(directory) / TRAINING_STATE
    if not (Path(directory) / "unet" / "config.json").is_file() or not path.is_file():
        raise ConfigError(f"{setting}: {directory} is not a model written by dpsynth pretrain (expected unet/ and "
                          f"{TRAINING_STATE}); write one: dpsynth pretrain --for METHOD --dataset PUBLIC --out DIR")
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{setting}: {path} is unreadable ({exc})") from None


def finished_pretraining(directory: str | Path) -> bool:
    """Whether ``directory`` holds a model whose pre-training ran to its last iteration."""
    try:
        record = json.loads((Path(directory) / TRAINING_STATE).read_text())
    except (OSError, ValueError):
        return False
    return bool(record.get("step")) and record.get("step") == record.get("settings", {}).get("iterations")


def public_fingerprints(directory: str | Path) -> np.ndarray | None:
    """The fingerprints of a public model's training images (None when it has none), their count checked against
    its ``pretraining.json`` when it has one (:func:`~dpsynth.data.fingerprints.load_fingerprints`)."""
    path = Path(directory) / TRAINING_STATE
    try:
        record = json.loads(path.read_text()) if path.is_file() else {}
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{path} is unreadable ({exc})") from None
    return load_fingerprints(directory, record.get("fingerprints"), record.get("images"))


def model_label(setting: str, directory: str | Path) -> str:
    """How a release names the training data of the public model in ``directory`` (set by ``setting``): by the
    directory's name and the SHA-256 of its ``unet/`` (weights and config), never by a local path."""
    return (f"the training data of {setting} {Path(directory).name!r} (its unet/ SHA-256 "
            f"{directory_sha256(Path(directory) / 'unet')})")


def init_from_public(model: UNet2DModel, directory: str | Path, class_names: list[str], diffusion: Diffusion,
                     setting: str = "model.init_from", class_start: str = "shared") -> dict[str, Any]:
    """Load the weights of the public model in ``directory`` into ``model`` (built for the private data).

    The UNet and the diffusion (timesteps, schedule, prediction) must be the same; ConfigError naming what
    differs otherwise. The class embedding is copied when the public classes are the private ones (same names,
    same order). Otherwise the private null row starts at the public null (unconditional) row, and each private
    class row at ``class_start``: ``shared``, the public null row too (the fine-tuned model starts as the public
    model's unconditional one); ``spread``, a public class row of its own, the C rows chosen farthest apart
    (:func:`spread_start`), so the classes are told apart from the first step. An unconditional public model
    gives zero rows. Returns what was done, for the run's log."""
    record = read_pretraining(directory, setting)
    from diffusers import UNet2DModel

    public = UNet2DModel.from_pretrained(directory, subfolder="unet", low_cpu_mem_usage=False)
    _check_same_diffusion(record, diffusion, directory, setting)
    _check_same_unet(public, model, directory, setting)
    weights = {k: v for k, v in public.state_dict().items() if not k.startswith("class_embedding.")}
    model.load_state_dict(weights, strict=False)
    embedding = model.class_embedding.weight
    with torch.no_grad():
        if public.class_embedding is None:
            embedding.zero_()
            classes = "zero (the public model is unconditional)"
        elif record.get("class_names") == class_names:
            embedding.copy_(public.class_embedding.weight)
            classes = "copied (same classes)"
        elif class_start == "spread":
            rows = public.class_embedding.weight
            embedding.copy_(torch.cat([spread_start(rows[:-1], len(class_names)), rows[-1:]]))
            classes = f"public class rows spread apart ({len(rows) - 1} public classes), null from the public null"
        else:
            embedding.copy_(public.class_embedding.weight[-1].expand_as(embedding))
            classes = f"the public null class ({len(public.class_embedding.weight) - 1} public classes)"
    return {"directory": str(directory), "dataset": record.get("dataset"), "images": record.get("images"),
            "step": record.get("step"), "seconds": record.get("seconds"), "class_embedding": classes}


def spread_rows(rows: torch.Tensor, count: int) -> torch.Tensor:
    """Indices of ``count`` of ``rows`` chosen farthest apart: the row farthest from their mean, then each time
    the row farthest from those chosen (the rows are reused in that order when there are fewer than ``count``)."""
    chosen = [int((rows - rows.mean(0)).norm(dim=1).argmax())]
    while len(chosen) < min(count, len(rows)):
        chosen.append(int(torch.cdist(rows, rows[chosen]).min(dim=1).values.argmax()))
    return torch.tensor([chosen[i % len(chosen)] for i in range(count)])


def spread_start(rows: torch.Tensor, count: int) -> torch.Tensor:
    """``count`` distinct starting rows from the public class ``rows``: those of :func:`spread_rows`; where a row
    is reused (fewer public classes than private ones), it is moved by a Gaussian offset as large as the public
    rows' spread per dimension, from a fixed seed (public randomness), so that no two classes start alike."""
    started = rows[spread_rows(rows, count)].clone()
    reused = count - len(rows)
    if reused > 0:
        scale = rows.std(0) if len(rows) > 1 else rows.std().expand(rows.shape[1])
        offsets = torch.randn(reused, rows.shape[1], generator=torch.Generator().manual_seed(0), dtype=rows.dtype)
        started[len(rows):] += offsets.to(rows.device) * scale
    return started


def _check_same_diffusion(record: dict[str, Any], diffusion: Diffusion, directory: str | Path, setting: str) -> None:
    trained = record.get("settings", {})
    wanted = {"timesteps": diffusion.timesteps, "beta_schedule": diffusion.beta_schedule,
              "prediction": diffusion.prediction}
    differ = [f"diffusion.{key} is {value!r} here, {trained.get(key)!r} there" for key, value in wanted.items()
              if trained.get(key) != value]
    if differ:
        raise ConfigError(f"{setting}: the public model {directory} learnt another diffusion ({'; '.join(differ)}); "
                          "pretrain it with --for METHOD (and the run's --preset) so the two match")


def _check_same_unet(public: UNet2DModel, private: UNet2DModel, directory: str | Path, setting: str) -> None:
    keys = {"in_channels": "the image channels", "sample_size": "the resolution",
            "block_out_channels": "model.block_channels", "layers_per_block": "model.layers_per_block",
            "down_block_types": "model.attention", "norm_num_groups": "model.norm_groups"}
    shown = {key: ([_listed(model.config[key]) for model in (private, public)]) for key in keys}
    differ = [f"{what}: {shown[key][0]} here, {shown[key][1]} there" for key, what in keys.items()
              if shown[key][0] != shown[key][1]]
    if differ:
        raise ConfigError(f"{setting}: the public model {directory} has another shape ({'; '.join(differ)}); "
                          "pretrain it with --for METHOD (and the run's --preset), on images of the private "
                          "data's size and channels (--set dataset.resolution=N dataset.channels=C)")


def _listed(value: Any) -> Any:
    """A config value with tuples as lists (diffusers' configs hold either)."""
    return list(value) if isinstance(value, (list, tuple)) else value
