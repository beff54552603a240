"""DP-ImgSyn's post-processing levers on one finished run: alignment iterations k, the feature weight alpha_f,
the public starting images, the number of aligned images, and the distilled students' epochs and temperature.

Loads the run's DP teacher and DP statistics (its private checkpoint: run this where the run is; the moment
scaling stays the run's, the units its statistics were released in), aligns starting images (the run's
public set, ``--public NAME`` or ``--init noise``; the same starts for every setting, ``--starts`` draws
several orders, to see how much a release varies with them) anew for each alignment setting, quantises them
to 8 bits, labels them with the teacher's softmax at the release temperature, and trains ``--classifier``
students by distillation as the evaluation does, ``--seeds`` seeds each: mean ± std test accuracy at the
epoch Report Noisy Max picks on the validation split (its selection epsilon goes to a scratch ledger: a
study on a public benchmark, not a release). Everything after the teacher and the statistics is
post-processing.

Usage: python benchmarks/imgsyn_levers.py RUN_DIR [--iterations 0 10 30] [--alpha-feature 10 1000]
       [--public photo-patches] [--init public] [--counts 5000] [--epochs 30] [--temperatures 4] [--seeds 3]
       [--starts 1] [--classifier cnn]
"""
from __future__ import annotations

import argparse
import copy
import time

import numpy as np
import torch
from trained import finished_run, mean_spread

from dpsynth.evaluation import EvaluationSettings
from dpsynth.evaluation.downstream import TrainingSettings, downstream_accuracy
from dpsynth.evaluation.release import Release
from dpsynth.methods.dp_imgsyn.alignment import AlignmentSettings, align_images, uniform_targets
from dpsynth.methods.dp_imgsyn.method import DPImgSyn
from dpsynth.privacy import PrivacyLedger
from dpsynth.privacy.batch_statistics import BatchStatistics, MomentScaling
from dpsynth.utils.images import to_uint8

CPU = torch.device("cpu")


def main() -> None:
    args = _arguments()
    config, dataset, state = finished_run(args.run)
    info = dataset.info
    if args.public:
        config["alignment"]["public"] = args.public
    method = DPImgSyn(config)
    teacher = method._build_teacher(info)
    teacher.load_state_dict(state["teacher"])
    private = BatchStatistics(**state["statistics"])
    scaling = MomentScaling(state["scale"], state["clip"])
    public = method._public_images(info) if args.init == "public" else None
    evaluation = EvaluationSettings.from_config(config["evaluation"])
    print(f"{args.run}: teacher {state['teacher_accuracy']:.1%}, C = {scaling.clip:.3g}, starts: "
          f"{config['alignment']['public'] if args.init == 'public' else 'noise'}; CPU "
          f"capability {torch.backends.cpu.get_cpu_capability()}, {torch.get_num_threads()} threads; {args.classifier} "
          f"accuracy over seeds 0..{args.seeds - 1} (mean ± std), Report Noisy Max epoch")
    print("| starts | k | α_f | images | align s | feature start → end | CE end | epochs | τ | accuracy |\n"
          + "| --- " * 10 + "|")
    for start_seed in range(args.starts):
        for count in args.counts:
            starts = method._starting_images(count, public, info.shape, torch.Generator().manual_seed(start_seed))
            for iterations in args.iterations:
                for alpha in args.alpha_feature or [config["alignment"]["alpha_feature"]]:
                    section = copy.deepcopy(config["alignment"])
                    section.update(iterations=iterations, alpha_feature=alpha)
                    settings = AlignmentSettings.from_config(section)
                    targets = torch.cat([uniform_targets(len(c), info.num_classes)
                                         for c in starts.split(settings.batch_size)])
                    began = time.perf_counter()
                    aligned, losses = align_images(teacher, starts, targets, private, scaling, settings, CPU)
                    seconds = time.perf_counter() - began
                    release = _release(method, teacher, aligned)
                    head = (f"| {start_seed} | {iterations} | {alpha:g} | {count} | {seconds:.0f} | "
                            f"{losses['start_feature']:.3f} → {losses['aligned_feature']:.3f} | "
                            f"{losses['aligned_classification']:.3f} |")
                    for epochs in args.epochs:
                        for temperature in args.temperatures:
                            scores = _students(args, release, temperature, epochs, dataset, evaluation)
                            print(f"{head} {epochs} | {temperature:g} | {scores} |", flush=True)


def _release(method: DPImgSyn, teacher: torch.nn.Module, aligned: torch.Tensor) -> Release:
    """The aligned images as released: quantised to 8 bits, soft labels on exactly those at the release's T."""
    images = to_uint8(aligned)
    soft = method._soft_labels(teacher, torch.from_numpy(images).float() / 255, CPU)
    return Release(images, soft.argmax(dim=1).numpy(), soft.numpy().astype(np.float32),
                   method.soft_label_temperature())


def _students(args: argparse.Namespace, release: Release, temperature: float, epochs: int, dataset: object,
              evaluation: EvaluationSettings) -> str:
    """Mean ± std test accuracy (points) of the distilled students over the seeds."""
    training = TrainingSettings(epochs, evaluation.classifier_batch_size, evaluation.classifier_lr,
                                evaluation.classifier_schedule, evaluation.classifier_ema)
    synthetic = release.image_set()
    soft = release.soft_label_tensor(temperature)
    scores = [100 * downstream_accuracy(args.classifier, synthetic, soft, temperature, dataset.val, dataset.test,
                                        dataset.info.num_classes, training, evaluation.selection_epsilon,
                                        PrivacyLedger(), CPU, seed)["test_accuracy"] for seed in range(args.seeds)]
    return mean_spread(scores)


def _arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("run", help="a DP-ImgSyn run directory past its statistics stage")
    parser.add_argument("--iterations", type=int, nargs="+", default=[0, 10])
    parser.add_argument("--alpha-feature", type=float, nargs="+", help="(default: the run's alignment.alpha_feature)")
    parser.add_argument("--counts", type=int, nargs="+", default=[5000])
    parser.add_argument("--epochs", type=int, nargs="+", default=[30])
    parser.add_argument("--temperatures", type=float, nargs="+", default=[4.0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--starts", type=int, default=1, help="start orders (public images drawn anew), 0..N-1")
    parser.add_argument("--init", choices=("public", "noise"), default="public",
                        help="start from public images or from low-pass noise (alignment.init)")
    parser.add_argument("--public", help="the public dataset to start from (default: the run's alignment.public)")
    parser.add_argument("--classifier", default="cnn")
    return parser.parse_args()


if __name__ == "__main__":
    main()
