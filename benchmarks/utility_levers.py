"""Post-processing levers on one trained run: guidance weight (and where on the trajectory it acts), the number of
synthetic images the downstream classifier trains on, and its epochs.

Loads the EMA weights of a finished DPDM-family run (its private checkpoint: run this where the run is). For each
guidance setting it samples ``max(--sizes)`` images (same labels and initial noise for every setting), scores the
first ``evaluation.num_synthetic`` as the run's evaluation does (FID, FID∞, KID, recall against the same cached
real features), measures label agreement (the share of images a CNN trained on 20,000 real training images gives
their conditioning label) and trains ``--classifier`` on the first n images for each n in ``--sizes`` and each
epoch count, ``--seeds`` classifier seeds, reporting mean ± std test accuracy at the epoch Report Noisy Max picks
on the validation split (the evaluation's own protocol; its selection epsilon goes to a scratch ledger: this is a
study on a public benchmark, not a release). Every re-sampling is post-processing of the run's model.

Usage: python benchmarks/utility_levers.py RUN_DIR [--guidance 0 1 2 4] [--interval 0 1]
       [--sizes 5000 20000 60000] [--epochs 10] [--seeds 3] [--classifier cnn]
"""
from __future__ import annotations

import argparse
import time

import numpy as np
import torch
from trained import finished_run, mean_spread, trained_method

from dpsynth.data import ImageSet
from dpsynth.evaluation import EvaluationSettings
from dpsynth.evaluation.downstream import TrainingSettings, correct_count, downstream_accuracy, train_epochs
from dpsynth.evaluation.evaluate import fidelity_metrics, inception_extractor, real_features
from dpsynth.models.classifiers import build_classifier
from dpsynth.privacy import PrivacyLedger
from dpsynth.utils.images import to_uint8

CPU = torch.device("cpu")


def main() -> None:
    args = _arguments()
    config, dataset, state = finished_run(args.run)
    settings = EvaluationSettings.from_config(config["evaluation"])
    extractor = inception_extractor(settings, CPU)
    _, real = real_features(dataset, settings, extractor)
    referee = _label_referee(dataset.train)
    count = max(args.sizes)
    print(f"{args.run}: {count} images per guidance setting, CPU capability {torch.backends.cpu.get_cpu_capability()}"
          f"; {args.classifier} accuracy over seeds 0..{args.seeds - 1} (mean ± std), Report Noisy Max epoch")
    print("| guidance | interval (t/T) | sampling s | FID | FID∞ | KID | recall | label agreement | images | epochs "
          "| accuracy |\n| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for weight in args.guidance:
        method = trained_method(config, state, dataset.info, guidance=weight, guidance_interval=args.interval)
        start = time.perf_counter()
        generated = method.generate(count, torch.Generator().manual_seed(0))
        images, labels = generated.images, generated.labels
        seconds = time.perf_counter() - start
        synthetic = ImageSet(torch.from_numpy(to_uint8(images)).float().div_(255), labels)
        fidelity = fidelity_metrics(extractor(to_uint8(images[:settings.num_synthetic])), real, settings)
        agreement = correct_count(referee, synthetic.images, labels, CPU) / len(labels)
        head = (f"| {weight:g} | {args.interval[0]:g}-{args.interval[1]:g} | {seconds:.0f} | {fidelity['fid']:.1f} | "
                f"{fidelity['fid_infinity']:.1f} | {fidelity['kid']['mean']:.3f} | {fidelity['recall']:.3f} | "
                f"{agreement:.1%} |")
        for size in args.sizes:
            for epochs in args.epochs:
                accuracy = _accuracy(args, synthetic, size, epochs, dataset, settings)
                print(f"{head} {size} | {epochs} | {accuracy} |", flush=True)


def _accuracy(args: argparse.Namespace, synthetic: ImageSet, size: int, epochs: int, dataset: object,
              settings: EvaluationSettings) -> str:
    """Mean ± std (in points) of the classifier's test accuracy over the seeds, trained on the first ``size``."""
    subset = ImageSet(synthetic.images[:size], synthetic.labels[:size])
    training = TrainingSettings(epochs, settings.classifier_batch_size, settings.classifier_lr)
    scores = [100 * downstream_accuracy(args.classifier, subset, None, 1.0, dataset.val, dataset.test,
                                        dataset.info.num_classes, training, settings.selection_epsilon,
                                        PrivacyLedger(), CPU, seed)["test_accuracy"]
              for seed in range(args.seeds)]
    return mean_spread(scores)


def _label_referee(train: ImageSet, size: int = 20000) -> torch.nn.Module:
    """The CNN that judges label agreement: 5 epochs on ``size`` real training images (a diagnostic that reads
    private data, never part of a release)."""
    index = torch.from_numpy(np.random.default_rng(0).permutation(len(train))[:size])
    model = build_classifier("cnn", train.images.shape[1], int(train.labels.max()) + 1)
    torch.manual_seed(0)
    train_epochs(model, train.images[index], train.labels[index], TrainingSettings(5, 128, 3e-3), CPU,
                 torch.Generator().manual_seed(0), lambda _: None, "label referee")
    return model


def _arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("run", help="a finished run directory (DPDM, DP-FETA or FETA-Pro)")
    parser.add_argument("--guidance", type=float, nargs="+", default=[0.0, 1.0, 2.0, 4.0])
    parser.add_argument("--interval", type=float, nargs=2, default=[0.0, 1.0],
                        help="guide only where t / T lies in [LOW, HIGH] (diffusion.guidance_interval)")
    parser.add_argument("--sizes", type=int, nargs="+", default=[5000])
    parser.add_argument("--epochs", type=int, nargs="+", default=[10])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--classifier", default="cnn")
    return parser.parse_args()


if __name__ == "__main__":
    main()
