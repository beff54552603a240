"""The recorded outcomes of DP-SGD runs (noise per example sigma/B, steps T, CNN accuracy) that dpsynth's planner
reads to tell a plan that will learn from one that will not (dpsynth.autoplan.regime), gathered from
benchmarks/results.

Usage: python benchmarks/regime_records.py            (print them)
       python benchmarks/regime_records.py --write    (rewrite dpsynth/autoplan/outcomes.json)
"""
from __future__ import annotations

import argparse
from pathlib import Path

from dpsynth.autoplan.regime import OUTCOMES_FILE
from dpsynth.bench.regime import outcomes, shipped_text

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--write", action="store_true", help=f"rewrite dpsynth/autoplan/{OUTCOMES_FILE}")
    args = parser.parse_args()
    found = outcomes(ROOT / "benchmarks" / "results")
    if args.write:
        (ROOT / "dpsynth" / "autoplan" / OUTCOMES_FILE).write_text(shipped_text(found))
    for outcome in found:
        print(outcome.words())


if __name__ == "__main__":
    main()
