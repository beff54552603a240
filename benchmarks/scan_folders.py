"""Two folders shaped like a holder's data, for measuring derived plans above 32 px (``dataset folder``):

- ``scans-64``: grey 16-bit PNG "scans" of the ten digits, 64 x 64, kept by patient
  (``digit-3/patient-0042/scan-1.png``): each patient has ``--scans`` scans of one class, the digit rendered in one
  installed font per patient (:mod:`dpsynth.data.glyphs`) with a random size, rotation and position per scan, its
  intensity mapped to 18,000..40,000 as CT exports are, with Gaussian noise of 600. Read it with the declared
  window ``dataset.window=[18000,40000]``.
- ``photos-128``: RGB JPEGs, 160 x 144 px crops of scikit-learn's two sample photographs, one class per
  photograph, kept by class (``temple/000017.jpg``), no groups.
- ``scans-128``: as ``scans-64`` at 128 x 128, ``--large-patients`` patients of ``--large-scans`` scans each
  (a hospital's 2,000 people x 5 scans by default). Read it with ``dataset.resolution=128``.
- ``scans-pP-64`` for each P of ``--more-patients``: as ``scans-64`` with P patients (a fifth of them held out
  for validation and test), for recipes at other sizes.

Usage: python benchmarks/scan_folders.py --out /tmp/dpsynth-folders [--patients 1000] [--scans 4] [--photos 3000]
       [--large-patients 2000] [--large-scans 5] [--more-patients 375 3750]
"""
from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from dpsynth.data.glyphs import DEFAULT_RANGES, find_fonts, render_character

SCAN_LOW, SCAN_HIGH, SCAN_NOISE = 18_000, 40_000, 600.0
PHOTO_CROP, PHOTO_NAMES = (160, 144), ("temple", "flower")


def write_scans(folder: Path, patients: int, scans: int, side: int = 64, seed: int = 0) -> int:
    """``patients`` x ``scans`` 16-bit PNGs of ``side`` px under ``folder``, a tenth of the patients per digit."""
    fonts = find_fonts()
    rng = np.random.default_rng(seed)
    generator = torch.Generator().manual_seed(seed)
    for patient in range(patients):
        digit, font = patient % 10, int(rng.integers(len(fonts)))
        home = folder / f"digit-{digit}" / f"patient-{patient:04d}"
        home.mkdir(parents=True, exist_ok=True)
        for scan, params in enumerate(DEFAULT_RANGES.draw(scans, len(fonts), generator).tolist()):
            glyph = render_character(str(digit), fonts, [font, *params[1:]], (side, side))
            values = SCAN_LOW + glyph * ((SCAN_HIGH - SCAN_LOW) / 255) + rng.normal(0, SCAN_NOISE, glyph.shape)
            pixels = np.clip(values, 0, 65535).round().astype(np.uint16)
            Image.fromarray(pixels).save(home / f"scan-{scan}.png")  # PIL writes uint16 as a 16-bit grey PNG
    return patients * scans


def write_photos(folder: Path, count: int, seed: int = 0) -> int:
    """``count`` JPEG crops, alternating between the two photographs, in a class folder per photograph."""
    from sklearn.datasets import load_sample_images

    photos = load_sample_images().images
    rng = np.random.default_rng(seed)
    width, height = PHOTO_CROP
    for index in range(count):
        label = index % len(PHOTO_NAMES)
        photo = photos[label]
        top, left = rng.integers(photo.shape[0] - height + 1), rng.integers(photo.shape[1] - width + 1)
        (folder / PHOTO_NAMES[label]).mkdir(parents=True, exist_ok=True)
        Image.fromarray(photo[top:top + height, left:left + width]).save(
            folder / PHOTO_NAMES[label] / f"{index:06d}.jpg", quality=90)
    return count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--patients", type=int, default=1000)
    parser.add_argument("--scans", type=int, default=4)
    parser.add_argument("--photos", type=int, default=3000)
    parser.add_argument("--large-patients", type=int, default=2000)
    parser.add_argument("--large-scans", type=int, default=5)
    parser.add_argument("--more-patients", type=int, nargs="*", default=[])
    args = parser.parse_args()
    folders = [("scans-64", write_scans, (args.patients, args.scans)),
               ("photos-128", write_photos, (args.photos,)),
               ("scans-128", write_scans, (args.large_patients, args.large_scans, 128)),
               *((f"scans-p{patients}-64", write_scans, (patients, args.scans)) for patients in args.more_patients)]
    for name, write, sizes in folders:
        folder, done = args.out / name, args.out / f"{name}.complete"
        if done.exists():
            print(f"{folder}: built already")
            continue
        count = write(folder, *sizes)
        done.write_text(str(count))
        print(f"{folder}: {count} images")


if __name__ == "__main__":
    main()
