"""The recorded outcomes the planner reads, gathered from benchmarks/results: those of DP-SGD runs (noise per example
sigma/B, steps T, CNN accuracy), which tell a plan that will learn from one that will not (dpsynth.autoplan.regime),
and the measured recipes at holders' sides (method, training side, budget, what came out), which `dpsynth privacy`
recommends from (dpsynth.autoplan.recipes).

Usage: python benchmarks/regime_records.py            (print them)
       python benchmarks/regime_records.py --write    (rewrite dpsynth/autoplan/outcomes.json and recipes.json)
"""
from __future__ import annotations

import argparse
from pathlib import Path

from dpsynth.autoplan.recipes import RECIPES_FILE
from dpsynth.autoplan.regime import OUTCOMES_FILE
from dpsynth.bench import recipes, regime

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--write", action="store_true", help=f"rewrite dpsynth/autoplan/{OUTCOMES_FILE} and "
                                                             f"{RECIPES_FILE}")
    args = parser.parse_args()
    results = ROOT / "benchmarks" / "results"
    outcomes, measured = regime.outcomes(results), recipes.recipes(results)
    if args.write:
        (ROOT / "dpsynth" / "autoplan" / OUTCOMES_FILE).write_text(regime.shipped_text(outcomes))
        (ROOT / "dpsynth" / "autoplan" / RECIPES_FILE).write_text(recipes.shipped_text(measured))
    for outcome in outcomes:
        print(outcome.words())
    for recipe in measured:
        print(recipe.words())


if __name__ == "__main__":
    main()
