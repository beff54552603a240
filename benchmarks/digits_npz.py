"""scikit-learn's 1,797 digits upscaled from 8 x 8 to ``--side`` pixels (bicubic) as an .npz (``dataset npz``): a
small grey set at a diffusion model's usual size, for measuring plans. Split 80 / 10 / 10 %, 1,437 images train.

Usage: python benchmarks/digits_npz.py --side 28 --out digits-28.npz
"""
from __future__ import annotations

import argparse

import numpy as np
from PIL import Image
from sklearn.datasets import load_digits


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--side", type=int, default=28)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    digits = load_digits()
    small = (digits.images * 255 / 16).round().astype(np.uint8)
    images = np.stack([np.asarray(Image.fromarray(image).resize((args.side, args.side), Image.Resampling.BICUBIC))
                       for image in small])[:, None]
    names = np.array([str(digit) for digit in range(10)])
    np.savez_compressed(args.out, images=images, labels=digits.target, class_names=names)
    print(f"{args.out}: {len(images)} digits at {args.side} x {args.side}")


if __name__ == "__main__":
    main()
