"""Accuracy and FID-inf against synthesis time: one point per finished cell of the given bench directories.

Writes the figure for the docs and prints the table that the docs' ``<!-- frontier: DIR ... -->`` marker
generates (``dpsynth/bench/frontier.py``); all points must come from one CPU type.

Usage: python benchmarks/frontier.py BENCH_DIR [BENCH_DIR ...] --png docs/images/frontier.png
"""
from __future__ import annotations

import argparse
from pathlib import Path

from dpsynth.bench import frontier


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("benches", nargs="+", type=Path, help="bench directories (each with results.csv)")
    parser.add_argument("--png", type=Path, required=True, help="where the figure goes")
    args = parser.parse_args()
    frontier.plot(frontier.points(args.benches), args.png)
    print(frontier.table(args.benches), end="")


if __name__ == "__main__":
    main()
