"""Downstream accuracy against the release size and the classifier recipe, at one fixed generator.

Trains the evaluation's classifiers (the run's ``evaluation`` section: classifiers, seeds, epoch chosen by Report
Noisy Max on the validation split, recorded in its evaluation ledger) on the first N images of a finished run's
release (its labels cycle through the classes, so every prefix is balanced) for each size, and with each recipe
(``default``: the section as it is; ``epochs=E``; ``augment``: images shifted by up to 2 pixels) at the first
size. Prints accuracy and wall minutes per setting, and each setting's time as a ratio to the first (the
run's own setting when it comes first); the bench's results.csv gives the synthesis time beside it.

Usage: python benchmarks/release_size.py RUN_DIR [--sizes 5000 20000 60000] [--recipes default epochs=20 augment]
[--classifiers cnn]
The release must hold the largest size (run it with ``--set sampling.num_samples=60000``).
"""
from __future__ import annotations

import argparse
import dataclasses
import time
from pathlib import Path

from dpsynth.api import dataset_from_config
from dpsynth.evaluation import EvaluationSettings, load_release, selection_ledger
from dpsynth.evaluation.downstream import TrainingSettings, downstream_accuracy, seeded_accuracy
from dpsynth.runs import SYNTHETIC, RunDirectory
from dpsynth.utils.device import pick_device


def recipe(base: TrainingSettings, name: str) -> TrainingSettings:
    """``base`` changed as recipe ``name`` says."""
    if name == "default":
        return base
    if name == "augment":
        return dataclasses.replace(base, augment=True)
    if name.startswith("epochs="):
        return dataclasses.replace(base, epochs=int(name.removeprefix("epochs=")))
    raise SystemExit(f"unknown recipe {name!r}: default, augment or epochs=E")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("run", type=Path, help="a finished run directory")
    parser.add_argument("--sizes", type=int, nargs="+", default=[5000, 20000, 60000])
    parser.add_argument("--recipes", nargs="+", default=["default", "epochs=20", "augment"])
    parser.add_argument("--classifiers", nargs="+", help="default: the run's evaluation.classifiers")
    args = parser.parse_args()
    run = RunDirectory.open(str(args.run))
    config = run.config()
    dataset = dataset_from_config(config)
    settings = EvaluationSettings.from_config(config["evaluation"])
    if args.classifiers:
        settings = dataclasses.replace(settings, classifiers=tuple(args.classifiers))
    release = load_release(run.file(SYNTHETIC), dataset.info)
    if len(release) < max(args.sizes):
        raise SystemExit(f"{run.path}: the release holds {len(release)} images, fewer than {max(args.sizes)}")
    images = release.image_set()
    ledger, device = selection_ledger(dataset, config["dataset"]["split_seed"]), pick_device("auto")
    base = settings.training(soft_labels=False)
    seeds = range(settings.seed, settings.seed + settings.classifier_seeds)
    share = settings.selection_epsilon / max(1, len(settings.classifiers) * len(seeds))
    cases = [(size, "default") for size in args.sizes] + [(args.sizes[0], r) for r in args.recipes if r != "default"]
    print(f"{run.path.name}: {len(release)} released images, classifiers {', '.join(settings.classifiers)}")
    first = None
    for size, name in cases:
        subset = type(images)(images.images[:size], images.labels[:size])
        start = time.perf_counter()
        scores = {classifier: seeded_accuracy([
            downstream_accuracy(classifier, subset, None, 1.0, dataset.val, dataset.test, dataset.info.num_classes,
                                recipe(base, name), share, ledger, device, seed) for seed in seeds])
            for classifier in settings.classifiers}
        took = (time.perf_counter() - start) / 60
        first = first or took
        accuracy = ", ".join(f"{c} {100 * s['test_accuracy']:.1f} ± {100 * s['test_accuracy_std']:.1f} %"
                             for c, s in scores.items())
        print(f"{size:>6} images, {name:<10} {accuracy}; {took:.1f} min ({took / first:.2f}x the first)", flush=True)


if __name__ == "__main__":
    main()
