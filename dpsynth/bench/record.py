"""A finished bench record (``results.csv`` and the header of ``results.md``) read back, for pages that quote it:
whole tables and single numbers, formatted as the bench formats them, so the docs cannot drift from the record."""
from __future__ import annotations

import csv
import re
from pathlib import Path
from typing import Any

from ..errors import DpsynthError
from .results import seeds_accuracy, spread

# How a quoted number is written: (scale, decimals, unit) per results.csv column; accuracy_<name> as percent.
FORMATS = {"epsilon": (1, 3, ""), "fid": (1, 1, ""), "fid_infinity": (1, 1, ""), "kid": (1, 3, ""),
           "precision": (1, 3, ""), "recall": (1, 3, ""), "synthesis_wall_min": (1, 1, ""),
           "synthesis_cpu_min": (1, 1, ""), "evaluation_wall_min": (1, 1, ""), "evaluation_cpu_min": (1, 1, ""),
           "peak_rss_gib": (1, 2, ""), "public_pretraining_min": (1, 1, "")}
TEXTS = {"privacy_split"}  # columns quoted as written: each stage's share of epsilon
NOT_YET = "(not yet measured)"
HEADER = re.compile(r"^- (generated|machine):? (.*)$", re.MULTILINE)


def read_rows(bench: Path) -> list[dict[str, Any]]:
    """The rows of ``bench/results.csv``, numbers as floats, empty cells as None."""
    path = bench / "results.csv"
    if not path.is_file():
        raise DpsynthError(f"{path}: no bench record here (dpsynth bench --out {bench} writes one)")
    with path.open(newline="") as handle:
        return [{key: _number(value) for key, value in row.items()} for row in csv.DictReader(handle)]


def _number(text: str) -> Any:
    if text == "":
        return None
    try:
        return float(text)
    except ValueError:
        return text


def provenance(bench: Path) -> dict[str, str]:
    """``generated`` (date, version, commit, preset) and ``machine``, as results.md's header states them."""
    found = dict(HEADER.findall((bench / "results.md").read_text()))
    if set(found) != {"generated", "machine"}:
        raise DpsynthError(f"{bench / 'results.md'}: its header lacks the generated or machine line")
    return found


def table(bench: Path) -> str:
    """results.md's tables (every dataset's, with the across-syntheses one) under one line saying when, by what
    and on which machine they were measured."""
    text, about = (bench / "results.md").read_text(), provenance(bench)
    body = text[text.index("\n## "):].strip()
    return f"Measured {about['generated']}, on {about['machine']}.\n\n{body.replace('## ', '#### ')}\n"


def value(bench: Path, method: str, epsilon: float, key: str, dataset: str | None = None) -> str:
    """One cell's ``key`` (a results.csv column) as the bench writes it; over several finished syntheses, their
    mean ± standard deviation; NOT_YET while the cell is planned but unfinished (a record still running). DpsynthError
    naming what is missing when the record lacks the cell or the key."""
    planned = [row for row in read_rows(bench) if row["method"] == method and row["target_epsilon"] == epsilon
               and (dataset is None or row["dataset"] == dataset)]
    if not planned:
        raise DpsynthError(f"{bench}: no cell {method} at target epsilon {epsilon:g}"
                           + (f" on {dataset}" if dataset else ""))
    if key not in planned[0] or (key not in FORMATS and key not in TEXTS and not key.startswith("accuracy_")):
        raise DpsynthError(f"{bench}: no column {key!r} to quote; one of {', '.join(_quotable(planned[0]))}")
    rows = [row for row in planned if row["status"] == "done"]
    if not rows:
        return NOT_YET
    if key.startswith("accuracy_"):
        return _accuracy(rows, key)
    if key in TEXTS:
        return str(rows[0][key])
    scale, digits, unit = FORMATS[key]
    return spread([row[key] for row in rows], scale, digits, unit)


def _quotable(row: dict[str, Any]) -> list[str]:
    return [key for key in row if key in FORMATS or key in TEXTS
            or (key.startswith("accuracy_") and not key.endswith("_std"))]


def _accuracy(rows: list[dict[str, Any]], key: str) -> str:
    """Percent; one synthesis: mean ± std over its classifier seeds, several: mean ± std over the syntheses."""
    if len(rows) == 1:
        return seeds_accuracy(rows[0], key.removeprefix("accuracy_"))
    return spread([row[key] for row in rows], 100, 1, " %")
