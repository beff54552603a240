"""A release in the formats other tools read without dpsynth.

- ``imagefolder``: a sub-folder of PNGs per class (``<class>/000000.png``), the layout torchvision's
  ``ImageFolder`` and Hugging Face ``datasets``' ``imagefolder`` read; ``labels.csv`` gives each file's label and
  class name (a folder reader numbers classes by sorted folder name, which need not be the release's order), and
  ``soft_labels.csv`` each file's soft label where the release has them (DP-ImgSyn).
- ``diffusers``: a released pixel diffusion model (``--release-model``) as ``unet/`` and ``scheduler/`` folders
  that diffusers' ``from_pretrained`` loads, and ``sampling.json`` (steps, classifier-free guidance and its
  interval, the null class), which together sample as the run sampled.

Both check the files they read against the release's privacy.json and copy it (and the datasheet) beside what they
write, with ``export.json`` naming the released file each export was made from and its SHA-256: post-processing
of a release keeps its guarantee, and the guarantee travels with the files.
"""
from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path

from .errors import DpsynthError
from .evaluation import read_release
from .generators import DIFFUSERS_SAMPLING, DiffusionGenerator, checked_privacy, read_generator
from .provenance import provenance
from .runs import DATASHEET, MODEL, PRIVACY, RELEASE, SYNTHETIC, inside_release
from .utils.images import png_bytes
from .utils.io import sha256

FORMATS = ("imagefolder", "diffusers")
EXPORT_RECORD = "export.json"


def export_release(path: str | Path, out: str | Path, format: str) -> Path:
    """Write the release in ``path`` (a release folder, or the run directory holding one) to the new folder ``out``
    in ``format`` (:data:`FORMATS`); returns ``out``. DpsynthError naming what is missing or differs otherwise."""
    if format not in FORMATS:
        raise DpsynthError(f"--format must be one of {', '.join(FORMATS)}, got {format!r}")
    release, out = release_folder(path), Path(out)
    if inside_release(out) is not None:
        raise DpsynthError(f"--out {out}: that is inside a run's release/ folder, which holds only what its "
                           "privacy.json lists; export elsewhere")
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise DpsynthError(f"{out}: already exists and is not an empty folder; export writes a new one")
    partial = out.with_name(out.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    source = _image_folder(release, partial) if format == "imagefolder" else _diffusers(release, partial)
    for name in (Path(PRIVACY).name, Path(DATASHEET).name):
        if (release / name).is_file():
            shutil.copyfile(release / name, partial / name)
    (partial / EXPORT_RECORD).write_text(json.dumps({
        "format": format, "made_from": source.name, "made_from_sha256": sha256(source),
        "dpsynth": provenance()}, indent=1) + "\n")
    if out.exists():
        out.rmdir()
    partial.rename(out)
    return out


def release_folder(path: str | Path) -> Path:
    """The release folder ``path`` names (a run directory stands for its ``release/``); DpsynthError if it holds
    no privacy.json, which only a finished release has."""
    path = Path(path)
    folder = path / RELEASE if (path / PRIVACY).is_file() else path
    if not (folder / Path(PRIVACY).name).is_file():
        raise DpsynthError(f"{path}: no released set here (no {Path(PRIVACY).name}); give a run directory that "
                           "released, or its release/ folder")
    return folder


def _image_folder(release: Path, out: Path) -> Path:
    """The released images as ``out/<class>/<index>.png``, with labels.csv (and soft_labels.csv); returns the file
    they came from."""
    synthetic = release / Path(SYNTHETIC).name
    if not synthetic.is_file():
        raise DpsynthError(f"{release}: no {synthetic.name} to export")
    checked_privacy(release, (synthetic,), "set of images")
    data = read_release(synthetic)
    folders = class_folders(data.class_names)
    images = data.images.transpose(0, 2, 3, 1)  # uint8, H x W x C
    width = len(str(len(images) - 1))
    files = []
    for index, (image, label) in enumerate(zip(images, data.labels.tolist(), strict=True)):
        file = Path(folders[label]) / f"{index:0{width}d}.png"
        (out / file.parent).mkdir(exist_ok=True)
        (out / file).write_bytes(png_bytes(image, min_size=1))
        files.append(file.as_posix())
    with (out / "labels.csv").open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["file", "label", "class_name"])
        writer.writerows((file, label, data.class_names[label]) for file, label in zip(files, data.labels.tolist(),
                                                                                       strict=True))
    if data.soft_labels is not None:
        with (out / "soft_labels.csv").open("w", newline="") as handle:
            writer = csv.writer(handle)
            writer.writerow(["file", *data.class_names])
            writer.writerows([file, *(f"{p:.6g}" for p in row)] for file, row in zip(files, data.soft_labels.tolist(),
                                                                                      strict=True))
    return synthetic


def class_folders(class_names: tuple[str, ...] | list[str]) -> list[str]:
    """A folder name per class: its name with path separators replaced, or ``class_<k>`` where that leaves it empty,
    hidden or the same as another's."""
    names = [name.replace("/", "-").replace("\\", "-").strip() for name in class_names]
    return [name if name and not name.startswith(".") and names.count(name) == 1 else f"class_{k}"
            for k, name in enumerate(names)]


def _diffusers(release: Path, out: Path) -> Path:
    """The released diffusion model as a diffusers folder; returns the weights file it came from."""
    generator = read_generator(release, "cpu")
    if not isinstance(generator, DiffusionGenerator):
        raise DpsynthError(f"{release}: its model is a {generator.describe()}; a diffusers folder holds a pixel "
                           "diffusion model (DPDM, DP-FETA, FETA-Pro, PDP-Diffusion, PrivImage, DP-SAD); export its "
                           "images with --format imagefolder")
    generator.save_diffusers(out)
    return release / Path(MODEL).name


__all__ = ["DIFFUSERS_SAMPLING", "EXPORT_RECORD", "FORMATS", "class_folders", "export_release", "release_folder"]
