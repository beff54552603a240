"""The measured recipes ``dpsynth privacy`` recommends from (:mod:`dpsynth.autoplan.recipes`), gathered from the
committed measurements: every evaluated run of a measured derived plan (``benchmarks/plan-run.sh``: a
``wall.txt`` beside it) on data of at least :data:`HOLDER_SIDE` px, with the real-image CNN of
``benchmarks/real_cnn.py`` (``real-cnn/DATA-SIDEpx.json`` under the results) where one was measured.

``python benchmarks/regime_records.py --write`` rewrites ``dpsynth/autoplan/recipes.json`` with the outcomes; a
test checks that the shipped file is what the records say.
"""
from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..autoplan.recipes import HOLDER_SIDE, Recipe
from ..autoplan.rules import parse_duration
from ..config import Config, DatasetSettings, Drawn, PlanSettings, method_name, preset_name
from ..errors import DpsynthError
from ..runs import REHEARSAL
from .frontier import RELEASED_SHAPE
from .regime import class_count, data_name, provenance, public_units, recorded_config, trained_side

REAL_CNN = "real-cnn"  # the folder of benchmarks/real_cnn.py's records, under the results


def recipes(results: Path) -> list[Recipe]:
    """The recipes under ``results``, by data, side, N, epsilon and budget."""
    found = [recipe_of(path.parent, results) for path in sorted(results.glob("**/metrics.json"))]
    return sorted((recipe for recipe in found if recipe is not None),
                  key=lambda r: (r.side, r.units, r.epsilon, r.budget_minutes, r.method, r.record))


def recipe_of(run: Path, results: Path) -> Recipe | None:
    """The recipe of the run in ``run``, or None when it is no measured plan at a holder's side (a rehearsal is
    none) or has no CNN."""
    measurement = run.parent
    cnn = json.loads((run / "metrics.json").read_text()).get("accuracy", {}).get("cnn")
    privacy_path, wall_path = run / "release" / "privacy.json", measurement / "wall.txt"
    if cnn is None or not privacy_path.is_file() or not wall_path.is_file() or (run / REHEARSAL).is_file():
        return None
    config = recorded_config(run)
    privacy = json.loads(privacy_path.read_text())
    train_side = trained_side(run, config)
    side = (privacy.get("upscaling") or {}).get("release_side", train_side)
    if side < HOLDER_SIDE or preset_name(config) != "auto":
        return None
    metrics = json.loads((run / "metrics.json").read_text())
    machine, date = provenance(run, results)
    return Recipe(record=str(run.relative_to(results)), method=method_name(config), data=data_name(config),
                  units=public_units(run), side=side, train_side=train_side,
                  channels=released_channels(run, config),
                  epsilon=float(privacy["target_epsilon"]),
                  budget_minutes=parse_duration(PlanSettings.of(config).time_budget) / 60,
                  wall_minutes=round(int(wall_path.read_text()) / 60, 1),
                  accuracy=float(cnn["test_accuracy"]), chance=1 / class_count(run, config),
                  real_accuracy=real_accuracy(results, data_name(config), side),
                  fid_infinity=metrics.get("fid_infinity"),
                  machine=machine, date=date)


def released_channels(run: Path, config: Config) -> int:
    """The channels of the run's release: as its datasheet states them, else declared, else drawn by its vote."""
    readme = run / "release" / "README.md"
    stated = RELEASED_SHAPE.search(readme.read_text()) if readme.is_file() else None
    if stated:
        return int(stated[1])
    declared, drawn = DatasetSettings.of(config).channels, Drawn.of(config).shape
    if isinstance(declared, int):
        return declared
    if drawn is None:
        raise DpsynthError(f"{run}: no datasheet, config or drawn record gives the release's channels")
    return int(drawn[0])


def real_cnn_path(results: Path, data: str, side: int) -> Path:
    """Where ``benchmarks/real_cnn.py`` records the real-image CNN of ``data`` at ``side`` px."""
    return results / REAL_CNN / f"{data}-{side}px.json"


def real_accuracy(results: Path, data: str, side: int) -> float | None:
    path = real_cnn_path(results, data, side)
    return float(json.loads(path.read_text())["cnn"]) if path.is_file() else None


def shipped_text(found: list[Recipe]) -> str:
    """``recipes.json``'s text for ``found``."""
    rows: list[dict[str, Any]] = [recipe.to_dict() for recipe in found]
    return json.dumps({"about": "written by benchmarks/regime_records.py from benchmarks/results; do not edit",
                       "recipes": rows}, indent=1) + "\n"


def table(found: Sequence[Recipe]) -> str:
    """The recipes as the own-data guide shows them: what each measured plan was and what it released."""
    lines = ["| data | side | N | ε | budget | method (trained at) | CNN (chance) | same CNN on real images | FID∞ "
             "| wall | machine, date |", "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for recipe in found:
        real = f"{recipe.real_accuracy:.1%}" if recipe.real_accuracy is not None else "not measured"
        fid = f"{recipe.fid_infinity:.1f}" if recipe.fid_infinity is not None else "-"
        lines.append(f"| {recipe.data} | {recipe.side} px | {recipe.units:,} | {recipe.epsilon:g} | "
                     f"{recipe.budget_minutes:g} min | {recipe.method} ({recipe.train_side} px) | "
                     f"{recipe.accuracy:.1%} ({recipe.chance:.0%}) | {real} | {fid} | {recipe.wall_minutes:g} min | "
                     f"{recipe.machine}, {recipe.date} |")
    return "\n".join(lines) + "\n"
