"""Images/s of Inception feature extraction: the plain fp32 eager loop vs the fast path, and their FIDs.

Both extract features of the same Fashion-MNIST train and test images in one run; the script prints each
speed, the speed-up ratio, and FID(train, test) under each (the fast path must stay within 0.5 FID).

Usage: python benchmarks/inception_features.py [--images 250] [--batch 50] [--threads 2]
"""
from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from dpsynth.data import load_dataset
from dpsynth.evaluation import InceptionFeatures, Moments, fid
from dpsynth.hardware import resolve_bf16
from dpsynth.utils.images import to_uint8


def timed(extractor: InceptionFeatures, images: np.ndarray) -> tuple[np.ndarray, float]:
    """Features of ``images`` and images/s, after one warm-up batch that is not timed."""
    extractor(images[:extractor.batch_size])
    start = time.perf_counter()
    features = extractor(images)
    return features, len(images) / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--images", type=int, default=250, help="images per set (train and test)")
    parser.add_argument("--batch", type=int, default=50)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    dataset = load_dataset("fashion-mnist")
    train, test = (to_uint8(split.images[:args.images]) for split in (dataset.train, dataset.test))
    results = {}
    for name, fast in (("fp32 eager", False), ("fast (frozen, optimised, bf16, channels-last)", True)):
        extractor = InceptionFeatures("cpu", fast=fast, batch_size=args.batch)
        train_features, speed = timed(extractor, train)
        test_features = extractor(test)
        results[name] = (speed, fid(Moments.of(train_features), Moments.of(test_features)))
        print(f"{name:<46} {speed:6.2f} images/s   FID(train, test) at {args.images} each = {results[name][1]:.3f}")
    (base_speed, base_fid), (fast_speed, fast_fid) = results.values()
    print(f"speed-up {fast_speed / base_speed:.2f}x   |FID difference| {abs(fast_fid - base_fid):.3f}")
    choice = resolve_bf16("auto", torch.device("cpu"))
    print(f"evaluation.fast_inception=auto takes the {'fast' if choice.value else 'fp32 eager'} path ({choice.reason})")


if __name__ == "__main__":
    main()
