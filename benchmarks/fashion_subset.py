"""A Fashion-MNIST subset as an .npz (``dataset npz``): ``--images`` of its training images drawn by a fixed seed,
with class names, for measuring plans on a smaller private set. 6,250 images split 80 / 10 / 10 % give 5,000
training images.

Usage: python benchmarks/fashion_subset.py --images 6250 --out fashion-6250.npz
"""
from __future__ import annotations

import argparse

import numpy as np
import torch

from dpsynth.data import load_dataset


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--images", type=int, required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    full = load_dataset("fashion-mnist")
    chosen = torch.randperm(len(full.train), generator=torch.Generator().manual_seed(0))[:args.images]
    images = full.train.images[chosen].numpy()
    np.savez_compressed(args.out, images=images, labels=full.train.labels[chosen].numpy(),
                        class_names=np.array(full.info.class_names))
    print(f"{args.out}: {args.images} Fashion-MNIST training images")


if __name__ == "__main__":
    main()
