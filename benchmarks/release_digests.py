"""The SHA-256 of seeded smoke releases (DPDM, FETA-Pro, DP-SAD, PE on scikit-learn's digits, the noise seeded by
``run.seed``: such a release is not private), to show that a change of structure left what the methods compute
unchanged: run it at two commits on the same machine and compare (floating point differs between CPU types).

Usage: python benchmarks/release_digests.py [--methods dpdm feta-pro dp-sad pe]
       PYTHONPATH=/path/to/other/checkout python benchmarks/release_digests.py     (the other commit's code)
"""
from __future__ import annotations

import argparse
import hashlib
import tempfile
import warnings
from pathlib import Path

import numpy as np

from dpsynth.api import resolve_config
from dpsynth.doctor import COMMON
from dpsynth.methods import METHODS
from dpsynth.pipeline import start
from dpsynth.provenance import source_commit

SEED = 7


def release_digest(method: str, root: Path) -> str:
    """The SHA-256 of the images and labels of ``method``'s seeded smoke release."""
    config = resolve_config(method, dataset="digits", epsilon=5.0, preset="cpu",
                            overrides=[*METHODS[method].declaration.smoke, *COMMON, "run.device=cpu", f"run.seed={SEED}",
                                       f"run.out_dir={root}", f"privacy.holder_ledger={root / 'releases.json'}"])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the seeded noise's warning: known
        run = start(config)
    digest = hashlib.sha256()
    with np.load(run.file("release/synthetic.npz")) as release:
        for key in ("images", "labels"):
            digest.update(np.ascontiguousarray(release[key]).tobytes())
    return digest.hexdigest()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--methods", nargs="+", default=["dpdm", "feta-pro", "dp-sad", "pe"])
    args = parser.parse_args()
    print(f"commit {source_commit()}")
    with tempfile.TemporaryDirectory() as root:
        for method in args.methods:
            print(f"{method:<10} {release_digest(method, Path(root) / method)}", flush=True)


if __name__ == "__main__":
    main()
