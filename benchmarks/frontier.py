"""Accuracy and FID-inf against synthesis time: one point per cell of the given bench directories.

Each point is a finished cell (its results.csv row and its run's config.yaml): CNN accuracy (with its spread
over classifier seeds) and FID-inf against the synthesis's wall-clock hours on the machine that ran it, one
series per method and target epsilon (inf: the DP-SGD without noise). Writes the figure and a Markdown table
(with the model and schedule of each point) for the docs; all points should come from one CPU type, which the
bench records name (results.md).

Usage: python benchmarks/frontier.py BENCH_DIR [BENCH_DIR ...] --png docs/images/frontier.png
       [--markdown frontier.md]
"""
from __future__ import annotations

import argparse
import csv
from pathlib import Path
from typing import Any

import matplotlib
import yaml

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def points(directories: list[Path]) -> list[dict[str, Any]]:
    """The finished cells of ``directories``, each with its configuration's model and schedule."""
    found = []
    for directory in directories:
        with (directory / "results.csv").open() as handle:
            for row in csv.DictReader(handle):
                if row["status"] != "done":
                    continue
                run = directory / "runs" / Path(row["run_dir"]).name  # older records give the whole path
                config = yaml.safe_load((run / "config.yaml").read_text())
                found.append({**row, "bench": directory.name, "hours": float(row["synthesis_wall_min"]) / 60,
                              "cpu_hours": float(row["synthesis_cpu_min"]) / 60, "model": _model(config)})
    return sorted(found, key=lambda p: (p["method"], float(p["target_epsilon"]), p["hours"]))


def _model(config: dict[str, Any]) -> str:
    model, dpsgd = config["model"], config.get("dpsgd", {})
    return (f"{list(model['block_channels'])} x{model['layers_per_block']}, batch {dpsgd.get('batch_size')}, "
            f"{dpsgd.get('epochs')} epochs")


def plot(found: list[dict[str, Any]], path: Path) -> None:
    figure, (accuracy, fid) = plt.subplots(1, 2, figsize=(10, 4))
    series = dict.fromkeys((p["method"], p["target_epsilon"]) for p in found)
    for method, epsilon in series:
        own = [p for p in found if (p["method"], p["target_epsilon"]) == (method, epsilon)]
        hours = [p["hours"] for p in own]
        label = f"{method}, ε = {float(epsilon):g}" + (" (no noise)" if float(epsilon) == float("inf") else "")
        accuracy.errorbar(hours, [100 * float(p["accuracy_cnn"]) for p in own],
                          yerr=[100 * float(p["accuracy_cnn_std"] or 0) for p in own], marker="o", capsize=3,
                          label=label)
        fid.plot(hours, [float(p["fid_infinity"]) for p in own], marker="o", label=label)
    for axis, title in ((accuracy, "CNN accuracy on real test images (%)"), (fid, "FID∞ (lower is better)")):
        axis.set_xlabel("synthesis, wall-clock hours on 2 cores")
        axis.set_title(title)
        axis.set_xlim(left=0)
        axis.grid(alpha=0.3)
    accuracy.legend(fontsize=8)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=120)
    plt.close(figure)


def markdown(found: list[dict[str, Any]]) -> str:
    lines = ["| method | ε | model, DP-SGD | synthesis h (CPU-h) | acc. cnn | FID∞ | bench |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for p in found:
        spread = float(p["accuracy_cnn_std"] or 0)
        lines.append(f"| {p['method']} | {float(p['target_epsilon']):g} | {p['model']} | {p['hours']:.2f} "
                     f"({p['cpu_hours']:.2f}) | {100 * float(p['accuracy_cnn']):.1f} ± {100 * spread:.1f} % | "
                     f"{float(p['fid_infinity']):.1f} | {p['bench']} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("benches", nargs="+", type=Path, help="bench directories (each with results.csv)")
    parser.add_argument("--png", type=Path, required=True, help="where the figure goes")
    parser.add_argument("--markdown", type=Path, help="where the table goes (default: printed)")
    args = parser.parse_args()
    found = points(args.benches)
    plot(found, args.png)
    table = markdown(found)
    if args.markdown:
        args.markdown.write_text(table)
    else:
        print(table, end="")


if __name__ == "__main__":
    main()
