"""A released model draws images that evaluate like the run's own release.

Runs DPDM on Fashion-MNIST with ``--release-model`` (the ``cpu`` preset, fewer epochs), whose evaluation gives the
release's FID-inf; then, each in a fresh process, draws K sets of the same size from the released model with
`dpsynth sample` (fresh randomness) and evaluates each alike with `dpsynth evaluate`. Prints each FID-inf, the draws'
mean and spread, and their ratio to the release's (the baseline, measured in the same run). Resumable: finished
steps are kept in the output folder. Appends one JSON line to benchmarks/results/released-model/records.jsonl.

Usage: python benchmarks/released_model.py [--out /tmp/dpsynth-released-model] [--epochs 2] [--draws 3]
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

RECORDS = Path(__file__).parent / "results" / "released-model" / "records.jsonl"
IMAGES = 5000  # the release's size and each draw's
EVALUATION = ["--set", "evaluation.classifiers=[]"]  # FID and friends only, on 2,000 synthetic vs 2,000 real


def dpsynth(*args: str) -> None:
    """`python -m dpsynth ARGS` in a fresh process; stops on failure."""
    subprocess.run([sys.executable, "-m", "dpsynth", *args], check=True)


def released_run(out: Path, epochs: float) -> Path:
    """The finished DPDM run under ``out`` (run once)."""
    runs = out / "runs"
    done = [path for path in runs.glob("dpdm-*") if (path / "metrics.json").is_file()] if runs.is_dir() else []
    if not done:
        dpsynth("run", "dpdm", "--dataset", "fashion-mnist", "--epsilon", "10", "--preset", "cpu", "--release-model",
                "--set", f"dpsgd.epochs={epochs}", "--set", f"sampling.num_samples={IMAGES}",
                "--set", f"run.out_dir={runs}", *EVALUATION)
        done = [path for path in runs.glob("dpdm-*") if (path / "metrics.json").is_file()]
    return done[0]


def draw_metrics(run: Path, out: Path, index: int) -> dict:
    """Draw ``index``'s metrics: sampled from the released model and evaluated, each in a fresh process."""
    npz, evaluation = out / f"draw-{index}.npz", out / f"draw-{index}-evaluation"
    if not (evaluation / "metrics.json").is_file():
        if not npz.is_file():
            dpsynth("sample", str(run / "release"), "--images", str(IMAGES), "--out", str(npz))
        dpsynth("evaluate", str(npz), "--dataset", "fashion-mnist", "--out", str(evaluation), *EVALUATION)
    return json.loads((evaluation / "metrics.json").read_text())


def main() -> None:
    from dpsynth.bench.results import machine_type
    from dpsynth.provenance import source_commit

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="/tmp/dpsynth-released-model")
    parser.add_argument("--epochs", type=float, default=2.0, help="DP-SGD epochs of the run (cpu preset: 6)")
    parser.add_argument("--draws", type=int, default=3)
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    run = released_run(out, args.epochs)
    release = json.loads((run / "metrics.json").read_text())
    draws = [draw_metrics(run, out, index) for index in range(1, args.draws + 1)]
    base, drawn = release["fid_infinity"], [metrics["fid_infinity"] for metrics in draws]
    mean, spread = statistics.mean(drawn), statistics.stdev(drawn) if len(drawn) > 1 else 0.0
    machine = machine_type()
    print(f"{machine}; DPDM, Fashion-MNIST, eps 10, cpu preset with {args.epochs:g} epochs; {IMAGES} images a set")
    print(f"release (baseline)  FID-inf {base:.2f}  FID {release['fid']:.2f}  precision {release['precision']:.3f}  "
          f"recall {release['recall']:.3f}")
    for index, metrics in enumerate(draws, 1):
        print(f"draw {index}              FID-inf {metrics['fid_infinity']:.2f}  FID {metrics['fid']:.2f}  precision "
              f"{metrics['precision']:.3f}  recall {metrics['recall']:.3f}  ({metrics['fid_infinity'] / base:.3f}x)")
    print(f"draws: FID-inf {mean:.2f} +- {spread:.2f} ({mean / base:.3f}x the release's; the release lies "
          f"{abs(base - mean) / spread if spread else float('inf'):.2f} of their standard deviations from their mean)")
    RECORDS.parent.mkdir(parents=True, exist_ok=True)
    with RECORDS.open("a") as handle:
        handle.write(json.dumps({"date": time.strftime("%Y-%m-%d"), "machine": machine, "commit": source_commit(),
                                 "epochs": args.epochs, "images": IMAGES, "release": release["fid_infinity"],
                                 "release_fid": release["fid"], "draws": drawn,
                                 "draws_fid": [metrics["fid"] for metrics in draws]}) + "\n")


if __name__ == "__main__":
    main()
