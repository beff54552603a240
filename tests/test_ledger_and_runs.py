"""The ledger's save / load / append cycle, mechanisms' noise and records, the run directory and resume."""
from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import kill_after_recorded_steps, secret_stream, smoke, stopped_smoke_run

from dpsynth.api import resolve_config
from dpsynth.errors import DpsynthError, PrivacyError
from dpsynth.methods import run_config_of
from dpsynth.methods.base import Method
from dpsynth.pipeline import Run
from dpsynth.privacy import (
    Accountant,
    GaussianMechanism,
    LaplaceMechanism,
    ParallelComposition,
    PrivacyLedger,
    SubsampledGaussianMechanism,
    ledger_report,
)
from dpsynth.privacy.mechanisms import clip_rows, release_gaussian, release_subsampled_mean
from dpsynth.privacy.releases import HolderLedger
from dpsynth.runs import RunDirectory

JOB = Path(__file__).with_name("resumable_job.py")


def test_ledger_merges_repeated_steps_and_survives_save_load_append(tmp_path):
    path = tmp_path / "ledger.json"
    ledger = PrivacyLedger(path)
    per_class = ParallelComposition("label", {"0": (GaussianMechanism(5.0, 50),), "1": (GaussianMechanism(5.0, 50),)})
    ledger.record("central-images", per_class)
    for _ in range(3):
        ledger.record("dp-sgd", SubsampledGaussianMechanism(1.2, 0.01))
    assert len(ledger) == 2 and ledger.events()[-1].steps == 3
    assert PrivacyLedger.load(path) == ledger  # saved on every record

    reloaded = PrivacyLedger.load(path)
    reloaded.record("dp-sgd", SubsampledGaussianMechanism(1.2, 0.01))
    reloaded.record("model-selection", LaplaceMechanism(2.0), budget="evaluation")
    again = PrivacyLedger.load(path)
    assert again.events()[-1] == SubsampledGaussianMechanism(1.2, 0.01, steps=4)
    assert again.events("evaluation") == [LaplaceMechanism(2.0)]
    assert list(again.stages()) == ["central-images", "dp-sgd"]


def test_ledger_rejects_damaged_files(tmp_path):
    path = tmp_path / "ledger.json"
    path.write_text("{not json")
    with pytest.raises(PrivacyError, match="ledger.json: privacy ledger is not valid JSON"):
        PrivacyLedger.load(path)
    path.write_text(json.dumps({"version": 1, "entries": [{"stage": "x", "budget": "synthesis",
                                                           "event": {"kind": "exponential"}}]}))
    with pytest.raises(PrivacyError, match="unknown privacy event kind 'exponential'"):
        PrivacyLedger.load(path)


def test_ledger_report_separates_evaluation_budget():
    ledger = PrivacyLedger()
    ledger.record("central-images", GaussianMechanism(4.0))
    ledger.record("dp-sgd", SubsampledGaussianMechanism(1.0, 0.02, 300))
    ledger.record("model-selection", LaplaceMechanism(10.0), budget="evaluation")
    report = ledger_report(ledger, Accountant("pld"), 1e-5)
    shares = [stage["epsilon_share"] for stage in report["stages"]]
    assert [stage["name"] for stage in report["stages"]] == ["central-images", "dp-sgd"]
    assert sum(shares) == pytest.approx(report["epsilon"])
    assert report["stages"][1]["mechanisms"] == [
        {"mechanism": "subsampled_gaussian", "noise_multiplier": 1.0, "sample_rate": 0.02, "steps": 300}]
    assert report["evaluation"]["epsilon"] == pytest.approx(0.1, rel=1e-3)


def test_gaussian_release_noise_std_and_record():
    ledger = PrivacyLedger()
    noisy = release_gaussian(torch.zeros(200_000), 0.5, 3.0, ledger, "stat", secret_stream())
    assert noisy.std().item() == pytest.approx(1.5, rel=0.01)
    assert ledger.events() == [GaussianMechanism(3.0)]


def test_clipping_bounds_every_norm_and_keeps_small_records():
    records = torch.randn(64, 3, 5, 5) * torch.logspace(-2, 2, 64).view(-1, 1, 1, 1)
    clipped = clip_rows(records, 1.0)
    norms = clipped.flatten(1).norm(dim=1)
    assert norms.max() <= 1.0 + 1e-6
    small = records.flatten(1).norm(dim=1) <= 1.0
    assert torch.allclose(clipped[small], records[small])


def test_subsampled_mean_noise_and_sensitivity():
    """Removing one record changes the clipped sum by at most C; noise std of the mean is sigma C / (q N)."""
    noise = secret_stream()
    records = torch.randn(1000, 20) * 10
    ledger = PrivacyLedger()
    draws = torch.stack([release_subsampled_mean(torch.zeros(1000, 20), 0.1, 2.0, 4.0, ledger, "m", noise)
                         for _ in range(500)])
    assert draws.std().item() == pytest.approx(4.0 * 2.0 / (0.1 * 1000), rel=0.05)
    assert ledger.events() == [SubsampledGaussianMechanism(4.0, 0.1, 500)]
    clipped = clip_rows(records, 2.0)
    assert (clipped.sum(0) - clipped[1:].sum(0)).norm() <= 2.0 + 1e-5


def test_run_directory_layout_and_release(tmp_path):
    config = resolve_config("dpdm", dataset="mnist-5k", epsilon=2.5)
    run = RunDirectory.create(run_config_of(config), tmp_path)
    second = RunDirectory.create(run_config_of(config), tmp_path)
    assert run.path.name.startswith("dpdm-mnist-5k-eps2.5-") and second.path != run.path
    assert RunDirectory.open(run.path).config() == config and config["run"]["seed"] is None  # no seed written
    chosen = RunDirectory.create(run_config_of(resolve_config("dpdm", overrides=["run.seed=7"])), tmp_path)
    assert chosen.config()["run"]["seed"] == 7  # a seed the user sets is kept (and is known: tests only)
    images, labels = torch.rand(30, 1, 28, 28), torch.arange(30) % 10
    run.save_release(images, labels, [str(c) for c in range(10)])
    with np.load(run.file("release/synthetic.npz")) as saved:
        assert saved["images"].dtype == np.uint8 and saved["images"].shape == (30, 1, 28, 28)
        assert np.abs(saved["images"] / 255.0 - images.numpy()).max() <= 0.5 / 255 + 1e-6
        assert saved["labels"].tolist() == labels.tolist()
    assert run.file("release/samples.png").stat().st_size > 0
    run.log("step", loss=torch.tensor(0.5), step=1)
    assert json.loads(run.file("log.jsonl").read_text())["loss"] == 0.5
    with pytest.raises(Exception, match="not a dpsynth run directory"):
        RunDirectory.open(tmp_path)


def test_a_checkpoint_in_the_layout_before_checkpoint_is_refused_with_what_to_do(tmp_path):
    run = RunDirectory.create(run_config_of(resolve_config("dpdm", dataset="mnist-5k")), tmp_path)
    old = {"phase": "dp-sgd", "step": 5, "model": {}, "rng": {}}  # a method's own layout, as dpsynth 0.1.0 wrote
    torch.save({"state": old, "ledger": PrivacyLedger(None).to_dict(), "settings": {}}, run.file("checkpoint.pt"))
    with pytest.raises(DpsynthError, match=r"checkpoint.pt: checkpoint layout 1, written by an older dpsynth; .* "
                                           r"cannot resume the run: finish it with the dpsynth that began it"):
        run.restore()


def _job(*args: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path.cwd()), os.environ.get("PYTHONPATH", "")])}
    return subprocess.Popen([sys.executable, str(JOB), *args], stdout=subprocess.PIPE, text=True, env=env)


def test_sigkill_then_resume_ends_with_the_clean_runs_ledger(tmp_path):
    clean = _job(str(tmp_path / "clean"), "30")
    clean_dir = Path(clean.stdout.readline().strip())
    assert clean.wait(timeout=120) == 0

    crashing = _job(str(tmp_path / "crash"), "30", "--sleep", "0.1")
    crash_dir = Path(crashing.stdout.readline().strip())
    kill_after_recorded_steps(crashing, crash_dir, 12, timeout=120)  # between the checkpoints at 10 and 15
    assert not (crash_dir / "release" / "privacy.json").exists()
    assert PrivacyLedger.load(crash_dir / "ledger.json").events()[0].steps > 10

    assert _job(str(crash_dir), "30", "--resume").wait(timeout=120) == 0
    assert PrivacyLedger.load(crash_dir / "ledger.json") == PrivacyLedger.load(clean_dir / "ledger.json")
    assert PrivacyLedger.load(crash_dir / "ledger.json").events()[0].steps == 30
    assert torch.equal(torch.load(crash_dir / "total.pt"), torch.load(clean_dir / "total.pt"))
    report = json.loads((crash_dir / "release" / "privacy.json").read_text())
    assert report == json.loads((clean_dir / "release" / "privacy.json").read_text())
    assert "ledger_rewound" in (crash_dir / "log.jsonl").read_text()


def test_progress_bar_reports_the_ledgers_epsilon():
    from dpsynth.privacy.progress import PrivacyProgress

    ledger, accountant = PrivacyLedger(), Accountant("pld")
    progress = PrivacyProgress(total=5, ledger=ledger, accountant=accountant, delta=1e-5, desc="test")
    for _ in range(5):
        ledger.record("dp-sgd", SubsampledGaussianMechanism(1.0, 0.1))
        progress.update({"loss": 0.1})
    assert progress.close() == pytest.approx(accountant.epsilon([SubsampledGaussianMechanism(1.0, 0.1, 5)], 1e-5))


def test_class_grid_puts_each_class_on_its_row():
    from dpsynth.utils.images import class_grid

    images = np.stack([np.full((1, 4, 4), 10 * label, np.uint8) for label in (2, 0, 2, 1)])
    grid = class_grid(images, np.array([2, 0, 2, 1]), num_classes=3, per_class=2, pad=1)
    assert grid.shape == (3 * 5 + 1, 2 * 5 + 1, 1)
    assert grid[1, 1, 0] == 0 and grid[6, 1, 0] == 10 and grid[11, 1, 0] == 20 and grid[11, 6, 0] == 20
    assert grid[1, 6, 0] == 255  # class 0 has one image: the second cell stays blank


def test_a_run_through_the_api_is_prepared_before_it_spends_builds_its_method_once_and_prints_nothing(
        tmp_path, capsys, caplog, monkeypatch):
    config = resolve_config("dp-merf", dataset="digits", epsilon=5.0, preset="cpu",
                            overrides=[*smoke("dp-merf"), f"run.out_dir={tmp_path}"])
    built, init = [], Method.__init__
    monkeypatch.setattr(Method, "__init__",
                        lambda self, config: (built.append(self.declaration.name), init(self, config))[1])
    with caplog.at_level(logging.INFO, logger="dpsynth"):
        prepared = Run.prepare(config)
        assert prepared.directory is None and not list(tmp_path.iterdir())  # planned: nothing written, nothing spent
        assert not HolderLedger(Path(os.environ["DPSYNTH_RELEASES"])).releases()
        run = prepared.execute()
    assert built == ["dp-merf"]  # planned, checked, fitted and released by one method object
    spent = json.loads(run.file("release/privacy.json").read_text())["stages"]
    assert [stage["name"] for stage in spent] == list(prepared.budget.stages)
    assert capsys.readouterr().out == ""
    told = {record.event: record for record in caplog.records if record.name == "dpsynth"}
    assert {"run directory", "unit of privacy", "released"} <= set(told)
    assert told["run directory"].fields["path"] == str(run.path)
    assert told["released"].fields["epsilon"] == json.loads(run.file("release/privacy.json").read_text())["epsilon"]


def test_a_resumed_run_builds_its_method_once_and_fits_the_budget_it_reopened_with(tmp_path, monkeypatch):
    stopped = stopped_smoke_run("dp-merf", tmp_path)
    built, init = [], Method.__init__
    monkeypatch.setattr(Method, "__init__",
                        lambda self, config: (built.append(self.declaration.name), init(self, config))[1])
    reopened = Run.reopen(str(stopped.path))
    assert reopened.directory is not None and reopened.directory.path == stopped.path
    run = reopened.execute()
    assert built == ["dp-merf"]  # reopened, checked, fitted and released by one method object
    spent = json.loads(run.file("release/privacy.json").read_text())["stages"]
    assert [stage["name"] for stage in spent] == list(reopened.budget.stages)
    assert [json.loads(line)["event"] for line in run.file("log.jsonl").read_text().splitlines()].count("resume") == 1
