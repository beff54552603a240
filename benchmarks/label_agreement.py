"""How often a release's images are of the class they are labelled with: a CNN trained on the real training split
judges each released image; the share whose predicted class is its label, per run and per class.

A diagnostic for the data holder (it reads the private training split; print it, never release it). It tells
apart a release whose images look real but carry the wrong class (good FID, poor downstream accuracy) from one
whose images are poor.

    cd benchmarks/results/cpu-zen4/runs && python ../../../label_agreement.py *-eps10 *-eps1
"""
from __future__ import annotations

import argparse
import time

import torch

from dpsynth.api import dataset_from_config
from dpsynth.evaluation.downstream import TrainingSettings, correct_count, train_epochs
from dpsynth.evaluation.release import load_release
from dpsynth.models.classifiers import build_classifier
from dpsynth.runs import RunDirectory

RELEASE = "release/synthetic.npz"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", help="finished run directories of one dataset")
    parser.add_argument("--epochs", type=int, default=2, help="epochs of the judge CNN on the real training split")
    args = parser.parse_args()
    data = dataset_from_config(RunDirectory(args.runs[0]).config())
    device, started = torch.device("cpu"), time.perf_counter()
    judge = build_classifier("cnn", data.info.channels, data.info.num_classes)
    train_epochs(judge, data.train.images, data.train.labels, TrainingSettings(args.epochs, 128, 1e-3), device,
                 torch.Generator().manual_seed(0), lambda model: None, "judge")
    test_accuracy = correct_count(judge, data.test.images, data.test.labels, device) / len(data.test)
    print(f"judge: cnn, {args.epochs} epochs on {len(data.train)} real images, "
          f"test accuracy {100 * test_accuracy:.1f} % ({time.perf_counter() - started:.0f} s)")
    print("| run | images | label agreement | per class |\n| --- | --- | --- | --- |")
    for path in args.runs:
        release = load_release(RunDirectory(path).file(RELEASE), data.info).image_set()
        images, labels = release.images, release.labels
        per_class = [correct_count(judge, images[labels == c], labels[labels == c], device) / int((labels == c).sum())
                     for c in range(data.info.num_classes)]
        agreement = correct_count(judge, images, labels, device) / len(labels)
        print(f"| {path} | {len(labels)} | {100 * agreement:.1f} % | {' '.join(f'{100 * a:.0f}' for a in per_class)} |")


if __name__ == "__main__":
    main()
