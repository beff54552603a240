"""Measured derived plans (``benchmarks/plan-run.sh``) read back: what each plan expected against the wall time it
took, and what it gave, as a table for the docs (``<!-- plans: DIR -->``)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from ..errors import DpsynthError


def measured(root: Path) -> list[dict[str, Any]]:
    """One row per finished measurement under ``root`` (a folder NAME with wall.txt, machine.txt and its run)."""
    rows = []
    for folder in sorted(path for path in root.iterdir() if (path / "wall.txt").is_file()):
        runs = [path for path in folder.iterdir() if (path / "config.yaml").is_file()]
        if len(runs) != 1:
            raise DpsynthError(f"{folder}: expected one run directory beside wall.txt, found {len(runs)}")
        rows.append(_row(folder.name, runs[0], float((folder / "wall.txt").read_text()),
                         (folder / "machine.txt").read_text().strip()))
    return rows


def _row(name: str, run: Path, wall: float, machine: str) -> dict[str, Any]:
    config = yaml.safe_load((run / "config.yaml").read_text())
    metrics = json.loads((run / "metrics.json").read_text()) if (run / "metrics.json").is_file() else {}
    privacy = json.loads((run / "release" / "privacy.json").read_text())
    dpsgd = privacy["stages"][-1]["mechanisms"][0]
    cnn = metrics.get("accuracy", {}).get("cnn", {})
    return {"name": name, "machine": machine, "dataset_size": privacy["dataset_size"],
            "batch": config["dpsgd"]["batch_size"], "steps": dpsgd["steps"],
            "release": config["sampling"]["num_samples"], "epsilon": privacy["epsilon"],
            "expected_min": config["plan"]["expected_seconds"]["total"] / 60, "measured_min": wall / 60,
            "cnn": cnn.get("test_accuracy"), "cnn_std": cnn.get("test_accuracy_std"),
            "fid_infinity": metrics.get("fid_infinity")}


def table(root: Path) -> str:
    """The measurements as a Markdown table, each row with its machine."""
    lines = ["| measurement | N | batch x steps | release | expected min | measured min | measured / expected | "
             "CNN accuracy | FID∞ | CPU |", "| --- " * 10 + "|"]
    for row in measured(root):
        accuracy = "–" if row["cnn"] is None else f"{100 * row['cnn']:.1f} ± {100 * (row['cnn_std'] or 0):.1f} %"
        fid = "–" if row["fid_infinity"] is None else f"{row['fid_infinity']:.1f}"
        lines.append(f"| {row['name']} | {row['dataset_size']:,} | {row['batch']} x {row['steps']} | "
                     f"{row['release']:,} | {row['expected_min']:.1f} | {row['measured_min']:.1f} | "
                     f"{row['measured_min'] / row['expected_min']:.2f} | {accuracy} | {fid} | {row['machine']} |")
    return "\n".join(lines)
