"""MkDocs hook: markers replaced at build time by what the code and the bench record say, so the pages cannot
drift from them.

- ``<!-- config: shared -->`` or ``<!-- config: METHOD -->``: a table of the code's defaults
  (dpsynth.config.BASE_CONFIG, each method's sections and presets);
- ``<!-- bench: DIR -->``: the tables of the bench record ``benchmarks/results/DIR`` (DIR may be a sub-path, e.g.
  ``cpu-frontier/dpdm-1h``) with when and where it ran;
- ``<!-- bench: DIR METHOD EPSILON KEY -->``: one number of that record (a results.csv column, e.g.
  ``accuracy_cnn`` or ``fid_infinity``) of one cell, formatted as the bench formats it;
- ``<!-- frontier: DIR [DIR ...] -->``: the accuracy / FID-inf against synthesis hours table of those records'
  finished cells, with the one machine that measured them;
- ``<!-- plans: DIR -->``: the derived plans measured in ``benchmarks/results/DIR`` (``benchmarks/plan-run.sh``),
  expected against measured time;
- ``<!-- plan-outcomes: FOLDER [FOLDER ...] -->``: what those measurements (one folder each) gave, side by side,
  without their times.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from dpsynth.bench import frontier, plans, record
from dpsynth.config_reference import config_table

RESULTS = Path(__file__).resolve().parents[1] / "benchmarks" / "results"
CONFIG = re.compile(r"<!-- config: ([a-z0-9-]+) -->")
BENCH = re.compile(r"<!-- bench: ([a-z0-9._/-]+)(?: ([a-z0-9-]+) ([0-9.]+|inf) (\w+))? -->")
FRONTIER = re.compile(r"<!-- frontier: ([a-z0-9._/ -]+) -->")
PLANS = re.compile(r"<!-- plans: ([a-z0-9._/-]+) -->")
OUTCOMES = re.compile(r"<!-- plan-outcomes: ([a-z0-9._/ -]+) -->")


def bench_marker(match: re.Match[str]) -> str:
    directory, method, epsilon, key = match.groups()
    if method is None:
        return record.table(RESULTS / directory)
    return record.value(RESULTS / directory, method, float(epsilon), key)


def frontier_marker(match: re.Match[str]) -> str:
    return frontier.table([RESULTS / directory for directory in match.group(1).split()])


def on_page_markdown(markdown: str, **_: Any) -> str:
    markdown = CONFIG.sub(lambda match: config_table(match.group(1)), markdown)
    markdown = PLANS.sub(lambda match: plans.table(RESULTS / match.group(1)), markdown)
    markdown = OUTCOMES.sub(lambda match: plans.outcomes([RESULTS / folder for folder in match.group(1).split()]),
                            markdown)
    return FRONTIER.sub(frontier_marker, BENCH.sub(bench_marker, markdown))
