"""Measured derived plans (``benchmarks/plan-run.sh``) read back: what each plan expected against the wall time it
took, and what it gave, as tables for the docs (``<!-- plans: DIR -->``, ``<!-- plan-outcomes: FOLDER ... -->``)."""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from ..config import DerivedPlan, PlanSettings, SamplingSettings, load_config, method_name, preset_name
from ..errors import DpsynthError
from ..methods import get_method
from ..runs import CONFIG


def measured(root: Path) -> list[dict[str, Any]]:
    """One row per finished measurement under ``root`` (a folder NAME with wall.txt, machine.txt and its run)."""
    return [measurement(folder) for folder in sorted(root.iterdir()) if (folder / "wall.txt").is_file()]


REFUSAL = re.compile(r"plan\.time_budget (\S+) min is too short on this machine.*give --time-budget (\S+) or more")


def measurement(folder: Path) -> dict[str, Any]:
    """The row of one finished measurement folder (``benchmarks/plan-run.sh ROOT NAME``): a run, or a plan refused
    for a budget too short."""
    runs = [path for path in folder.iterdir() if (path / CONFIG).is_file()] if folder.is_dir() else []
    refusal = REFUSAL.search((folder / "run.out").read_text()) if (folder / "run.out").is_file() else None
    if not runs and refusal and (folder / "wall.txt").is_file():
        return {"name": folder.name, "machine": (folder / "machine.txt").read_text().strip(), "date": None,
                "budget": f"{refusal[1]}m", "refused": f"refused: give --time-budget {refusal[2]}",
                "measured_min": float((folder / "wall.txt").read_text()) / 60}
    if len(runs) != 1 or not (folder / "wall.txt").is_file():
        raise DpsynthError(f"{folder}: not a finished measurement: expected wall.txt beside one run directory "
                           f"(found {len(runs)})")
    return _row(folder.name, runs[0], float((folder / "wall.txt").read_text()),
                (folder / "machine.txt").read_text().strip())


def _row(name: str, run: Path, wall: float, machine: str) -> dict[str, Any]:
    config = load_config((run / CONFIG).read_text(), str(run / CONFIG))
    metrics = json.loads((run / "metrics.json").read_text()) if (run / "metrics.json").is_file() else {}
    privacy = json.loads((run / "release" / "privacy.json").read_text())
    method = get_method(method_name(config))
    sections = [(name, method.settings(config, name).batch_size, stage["mechanisms"][0]["steps"])  # each DP-SGD
                for stage in privacy["stages"] for name in [stage["name"].replace("-", "")]  # section's; dp-sgd: dpsgd
                if stage["mechanisms"][0]["mechanism"] == "subsampled_gaussian" and name in method.dpsgd_sections]
    cnn = metrics.get("accuracy", {}).get("cnn", {})
    plan = PlanSettings.of(config)
    expected = DerivedPlan.of(config).expected_seconds or {}  # a fixed preset expects nothing
    stamp = re.search(r"-(\d{4})(\d{2})(\d{2})-\d{6}$", run.name)
    return {"name": name, "machine": machine, "date": "-".join(stamp.groups()) if stamp else None,
            "dataset_size": privacy["dataset_size"],
            "method": method_name(config), "sections": sections,
            "batch": sections[-1][1] if sections else None, "steps": sections[-1][2] if sections else None,
            "trained_at": privacy.get("upscaling", {}).get("private_side"),
            "release": SamplingSettings.of(config).num_samples, "epsilon": privacy["epsilon"],
            "preset": preset_name(config), "measured_min": wall / 60,
            "budget": plan.time_budget if expected else None,
            "expected_min": expected["total"] / 60 if expected else None,
            "cnn": cnn.get("test_accuracy"), "cnn_std": cnn.get("test_accuracy_std"),
            "cnn_seeds": len(cnn.get("seeds", [])),
            "fid_infinity": metrics.get("fid_infinity")}


QUOTABLE = {"measured_min": "{:.1f}", "expected_min": "{:.1f}", "steps": "{:,}", "batch": "{:,}",
            "release": "{:,}", "dataset_size": "{:,}", "fid_infinity": "{:.1f}", "epsilon": "{:.3f}",
            "budget": "{}", "machine": "{}", "date": "{}"}


def quote(folder: Path, key: str) -> str:
    """One value of one measurement (``<!-- plan: FOLDER KEY -->``): a QUOTABLE key, or ``cnn`` (mean ± std)."""
    row = measurement(folder)
    if key == "cnn":
        return _outcome(row).split(" | ")[0]
    if key not in QUOTABLE:
        raise DpsynthError(f"{folder}: no value {key!r} to quote; one of cnn, {', '.join(QUOTABLE)}")
    return QUOTABLE[key].format(row[key])


def _schedule(row: dict[str, Any]) -> str:
    """A row's batch x steps (each section's, named, where it has several), and the side it trained at where that
    was below the release's; a method without DP-SGD by name."""
    sections = row["sections"]
    if not sections:
        return f"{row['method']}: no DP-SGD"
    schedule = ", ".join(f"{name} {batch} x {steps}" if len(sections) > 1 else f"{batch} x {steps}"
                         for name, batch, steps in sections)
    return schedule + (f" at {row['trained_at']} px" if row.get("trained_at") else "")


def _outcome(row: dict[str, Any]) -> str:
    """CNN accuracy (mean ± std over its classifier seeds, or the one seed's, said) and FID-inf cells of a row."""
    if row["cnn"] is None:
        accuracy = "–"
    elif row["cnn_seeds"] == 1:
        accuracy = f"{100 * row['cnn']:.1f} % (1 seed)"
    else:
        accuracy = f"{100 * row['cnn']:.1f} ± {100 * (row['cnn_std'] or 0):.1f} %"
    return accuracy + " | " + ("–" if row["fid_infinity"] is None else f"{row['fid_infinity']:.1f}")


def outcomes(folders: list[Path]) -> str:
    """What the measurements in ``folders`` gave, side by side, without their times (``<!-- plan-outcomes -->``:
    runs compared for accuracy, some of which may have shared the machine)."""
    lines = ["| measurement | preset | N | batch x steps | release | CNN accuracy | FID∞ | CPU |", "| --- " * 8 + "|"]
    for row in map(measurement, folders):
        lines.append(f"| {row['name']} | {row['preset']} | {row['dataset_size']:,} | {_schedule(row)} "
                     f"| {row['release']:,} | {_outcome(row)} | {row['machine']} |")
    return "\n".join(lines)


def table(root: Path) -> str:
    """The measurements as a Markdown table, each row with its machine (a fixed preset expects nothing)."""
    lines = ["| measurement | budget | N | batch x steps | release | expected min | measured min | "
             "measured / expected | CNN accuracy | FID∞ | CPU |", "| --- " * 11 + "|"]
    for row in measured(root):
        if "refused" in row:
            lines.append(f"| {row['name']} | {row['budget']} | – | {row['refused']} | – | – | "
                         f"{row['measured_min']:.1f} | – | – | – | {row['machine']} |")
            continue
        expected = row["expected_min"]
        timing = ("– | " if expected is None else f"{expected:.1f} | ") + f"{row['measured_min']:.1f} | " + (
            "–" if expected is None else f"{row['measured_min'] / expected:.2f}")
        lines.append(f"| {row['name']} | {row['budget'] or row['preset']} | {row['dataset_size']:,} | "
                     f"{_schedule(row)} | {row['release']:,} | {timing} | {_outcome(row)} | "
                     f"{row['machine']} |")
    return "\n".join(lines)
