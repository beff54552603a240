"""The ceiling a release is read against: the CNN a run's evaluation trains, with the default evaluation protocol
(its epochs, Report Noisy Max's epoch choice), trained on the run's real training images (at the data's side)
instead of the release, and tested on the same real test split. Writes
``benchmarks/results/real-cnn/DATA-SIDEpx.json``, which the recipe table (dpsynth.bench.recipes) reads as the
accuracy the data allows. A study of the data for the records, not a release: its model-selection epsilon goes
to a scratch ledger.

Usage: python benchmarks/real_cnn.py RUN_DIR [--seeds 3]
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from dpsynth.api import dataset_from_config, resolve_config
from dpsynth.bench.recipes import real_cnn_path
from dpsynth.bench.regime import data_name
from dpsynth.bench.results import machine_type
from dpsynth.config import method_name
from dpsynth.data import ImageSet
from dpsynth.evaluation import EvaluationSettings
from dpsynth.evaluation.downstream import downstream_accuracy
from dpsynth.privacy import PrivacyLedger
from dpsynth.runs import RunDirectory
from dpsynth.utils.images import as_floats

RESULTS = Path(__file__).resolve().parent / "results"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run", type=Path)
    parser.add_argument("--seeds", type=int, default=3)
    args = parser.parse_args()
    config = RunDirectory(args.run).config()
    dataset = dataset_from_config(config)
    settings = EvaluationSettings.of(resolve_config(method_name(config)))  # the default protocol, not a cut one
    train = ImageSet(as_floats(dataset.train.images), dataset.train.labels)
    start = time.perf_counter()
    runs = [downstream_accuracy("cnn", train, None, 1.0, dataset.val, dataset.test, dataset.info.num_classes,
                                settings.training(False), settings.selection_epsilon / args.seeds, PrivacyLedger(),
                                torch.device("cpu"), settings.seed + seed) for seed in range(args.seeds)]
    scores = [run["test_accuracy"] for run in runs]
    record = {"cnn": statistics.mean(scores), "std": statistics.stdev(scores) if len(scores) > 1 else 0.0,
              "seeds": args.seeds, "epochs": runs[0]["epochs"], "trained_on": len(train),
              "side": dataset.info.height, "seconds": round(time.perf_counter() - start, 1), "run": str(args.run),
              "machine": machine_type(), "date": time.strftime("%Y-%m-%d")}
    path = real_cnn_path(RESULTS, data_name(config), dataset.info.height)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=1) + "\n")
    print(json.dumps(record))


if __name__ == "__main__":
    main()
