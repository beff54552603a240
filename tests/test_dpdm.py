"""DPDM end to end on a tiny model: run, release, privacy report, and SIGKILL-then-resume."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import kill_after_recorded_steps

from dpsynth.privacy import PrivacyLedger

TINY = ["--dataset", "digits", "--epsilon", "8", "--device", "cpu",
        "--set", "model.block_channels=[8, 16]", "--set", "model.norm_groups=4", "--set", "dpsgd.batch_size=64",
        "--set", "dpsgd.epochs=1", "--set", "dpsgd.checkpoint_every=5", "--set", "dpsgd.noise_multiplicity=2",
        "--set", "sampling.num_samples=30", "--set", "diffusion.sample_steps=4"]


def dpsynth(*args: str, out_dir: Path) -> subprocess.Popen:
    command = [sys.executable, "-m", "dpsynth", "run", *args]
    if "--resume" not in args:
        command += ["--set", f"run.out_dir={out_dir}"]
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})


def run_dir_of(process: subprocess.Popen) -> Path:
    line = process.stdout.readline()
    assert line.startswith("run directory: "), line + process.stderr.read()
    return Path(line.split(": ", 1)[1].strip())


def test_dpdm_run_releases_within_budget(tmp_path):
    process = dpsynth("dpdm", *TINY, out_dir=tmp_path)
    run = run_dir_of(process)
    assert process.wait(timeout=300) == 0, process.stderr.read()
    report = json.loads((run / "privacy.json").read_text())
    assert report["epsilon"] <= 8.0 and report["target_epsilon"] == 8.0
    (stage,) = report["stages"]
    assert stage["name"] == "dp-sgd" and stage["steps"] == int(1 / (64 / 1437))
    assert PrivacyLedger.load(run / "ledger.json").events()[0].steps == stage["steps"]
    with np.load(run / "synthetic.npz") as release:
        assert release["images"].shape == (30, 1, 8, 8) and release["images"].dtype == np.uint8
        assert sorted(set(release["labels"].tolist())) == list(range(10))
    assert (run / "samples.png").exists() and (run / "config.yaml").exists()


@pytest.mark.slow
def test_sigkill_during_training_then_resume_matches_a_clean_run(tmp_path):
    clean = dpsynth("dpdm", *TINY, out_dir=tmp_path / "clean")
    clean_dir = run_dir_of(clean)
    assert clean.wait(timeout=300) == 0, clean.stderr.read()

    crash = dpsynth("dpdm", *TINY, out_dir=tmp_path / "crash")
    crash_dir = run_dir_of(crash)
    kill_after_recorded_steps(crash, crash_dir, 7, timeout=300)  # checkpoint at 5
    assert not (crash_dir / "synthetic.npz").exists()

    resumed = dpsynth("--resume", str(crash_dir), out_dir=tmp_path)
    assert resumed.wait(timeout=300) == 0, resumed.stderr.read()
    assert PrivacyLedger.load(crash_dir / "ledger.json") == PrivacyLedger.load(clean_dir / "ledger.json")
    assert json.loads((crash_dir / "privacy.json").read_text()) == json.loads((clean_dir / "privacy.json").read_text())
    with np.load(crash_dir / "synthetic.npz") as a, np.load(clean_dir / "synthetic.npz") as b:
        assert np.array_equal(a["images"], b["images"])  # same state, same RNG: the same release
