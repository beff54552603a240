"""``dpsynth.Synthesizer``: a method fitted on arrays held in memory, with the guarantee of the command line's run of
the same data and settings."""
from __future__ import annotations

import _thread
import json
import os
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import dpsynth_main, smoke
from sklearn.datasets import load_digits

import dpsynth
from dpsynth.api import dataset_from_config
from dpsynth.config import DatasetSettings, parse_overrides
from dpsynth.errors import ConfigError, DataError, DpsynthError, PrivacyWarning
from dpsynth.privacy import PrivacyLedger
from dpsynth.privacy.releases import HolderLedger

SETTINGS = [*smoke("dpdm"), "run.seed=3"]
NAMES = [str(digit) for digit in range(10)]


def test_a_synthesizer_fits_dpdm_on_a_tensor_in_memory_with_the_privacy_of_the_same_command_line_run(tmp_path):
    digits = load_digits()
    images = torch.from_numpy((digits.images / 16).astype(np.float32))  # N x 8 x 8 floats in [0, 1]
    labels = torch.from_numpy(digits.target)
    keywords = {key.replace(".", "__"): value for key, value in parse_overrides(SETTINGS)}
    synthesizer = dpsynth.Synthesizer("dpdm", epsilon=5.0, preset="cpu", out_dir=tmp_path / "api", **keywords)
    preview = synthesizer.plan(images, labels, class_names=NAMES)  # what fit would spend, before it does
    assert not preview.refused and not (tmp_path / "api").exists()
    with pytest.warns(PrivacyWarning, match="run.seed"):
        assert synthesizer.fit(images, labels, class_names=NAMES) is synthesizer
    np.savez(tmp_path / "digits.npz", images=images.numpy(), labels=labels.numpy(), class_names=np.array(NAMES))
    done = dpsynth_main("run", "dpdm", "--dataset", "npz", "--data-dir", str(tmp_path / "digits.npz"), "--epsilon",
                        "5", "--preset", "cpu", *(part for item in SETTINGS for part in ("--set", item)),
                        "--set", f"run.out_dir={tmp_path / 'cli'}")
    assert done.code == 0, done.err
    command_line = json.loads(next((tmp_path / "cli").glob("*/release/privacy.json")).read_text())
    for key in ("epsilon", "delta", "accountant", "stages", "dataset_size", "dataset_size_rule", "unit"):
        assert synthesizer.privacy[key] == command_line[key], key
    assert [stage["name"] for stage in preview.report["stages"]] == [stage["name"] for stage in command_line["stages"]]
    with pytest.raises(DataError, match="no arrays held"):  # a fit that ended lets its arrays go
        dataset_from_config(synthesizer.run.config())
    assert synthesizer.synthetic.images.shape == (20, 1, 8, 8) and synthesizer.synthetic.class_names == tuple(NAMES)
    assert synthesizer.sample(3).images.shape == (3, 1, 8, 8)  # the released model, at no further epsilon
    with pytest.raises(DpsynthError, match="the fit was not evaluated"):
        _ = synthesizer.metrics
    shared = synthesizer.release(tmp_path / "shared")
    assert (shared / "privacy.json").read_bytes() == (synthesizer.run_dir / "release" / "privacy.json").read_bytes()
    assert (synthesizer.release(tmp_path / "png", "imagefolder") / "labels.csv").is_file()
    with pytest.raises(DpsynthError, match="lies inside a run's release/ folder"):
        synthesizer.release(synthesizer.run_dir / "release" / "copy")


def test_a_synthesizer_fits_a_dataset_dpsynth_reads_with_the_privacy_of_the_same_command_line_run(tmp_path):
    settings = smoke("dp-merf")
    evaluation = ["evaluation.enabled=true", "evaluation.num_synthetic=20", "evaluation.num_real=20",
                  "evaluation.classifiers=[]", "evaluation.kid_subsets=2", "evaluation.kid_subset_size=10",
                  f"evaluation.cache_dir={tmp_path / 'cache'}"]
    keywords = {key.replace(".", "__"): value for key, value in parse_overrides([*settings, *evaluation])}
    synthesizer = dpsynth.Synthesizer("dp-merf", epsilon=5.0, preset="cpu", out_dir=tmp_path / "api", **keywords)
    preview = synthesizer.plan_dataset("digits")
    assert not (tmp_path / "api").exists()
    assert synthesizer.fit_dataset("digits") is synthesizer
    assert DatasetSettings.of(synthesizer.run.config()).name == "digits"
    done = dpsynth_main("run", "dp-merf", "--dataset", "digits", "--epsilon", "5", "--preset", "cpu",
                        *(part for item in settings for part in ("--set", item)), "--set", f"run.out_dir={tmp_path}")
    assert done.code == 0, done.err
    command_line = json.loads(next(tmp_path.glob("dp-merf*/release/privacy.json")).read_text())
    for key in ("epsilon", "delta", "accountant", "stages", "dataset_size", "dataset_size_rule", "unit"):
        assert synthesizer.privacy[key] == command_line[key], key
    assert [stage["name"] for stage in preview.report["stages"]] == [stage["name"] for stage in command_line["stages"]]
    assert synthesizer.sample(2).images.shape == (2, 1, 8, 8)
    assert {key: synthesizer.metrics["images"][key] for key in ("synthetic", "real")} == {"synthetic": 20, "real": 20}
    assert synthesizer.metrics["fid"] == json.loads((synthesizer.run_dir / "metrics.json").read_text())["fid"]
    with pytest.raises(DpsynthError, match=r"read dataset digits, which dpsynth reads again: resume\(\) without"):
        synthesizer.resume(np.zeros((2, 8, 8), np.uint8), np.zeros(2, int), class_names=NAMES,
                           run_dir=synthesizer.run_dir)


def test_a_synthesizer_names_a_bad_setting_or_array_before_it_trains(tmp_path):
    with pytest.raises(ConfigError, match="dpsgd.lrr"):
        dpsynth.Synthesizer("dpdm", epsilon=5.0, preset="cpu", dpsgd__lrr=0.1)
    synthesizer = dpsynth.Synthesizer("dpdm", epsilon=5.0, preset="cpu", out_dir=tmp_path)
    with pytest.raises(DpsynthError, match="not fitted yet"):
        _ = synthesizer.privacy
    images = np.zeros((30, 8, 8), np.uint8)
    for labels, names, message in ((np.zeros(29, int), NAMES, r"images \(30\) and labels \(29\) must be as many"),
                                   (np.zeros(30, int), None, "give class_names"),
                                   (np.full(30, 10), NAMES, r"labels must lie in 0 \.\. 9"),
                                   (np.zeros(30), NAMES, "labels must be a 1-D integer array")):
        with pytest.raises(DataError, match=message):
            synthesizer.fit(images, labels, class_names=names)
    with pytest.raises(DataError, match="images: 'images' must have 1 or 3 channels"):
        synthesizer.fit(np.zeros((30, 5, 8, 8), np.uint8), np.zeros(30, int), class_names=NAMES)
    assert not list(tmp_path.iterdir())  # nothing was run
    with pytest.raises(DpsynthError, match="pe releases a set of images, not a model"):
        dpsynth.Synthesizer("pe", epsilon=5.0, preset="cpu").sample(3)


def interrupt_after_recorded_steps(root: Path, steps: int) -> threading.Thread:
    """A thread that raises KeyboardInterrupt in the main thread (as Ctrl-C does) once the run under ``root`` has
    recorded ``steps`` mechanism steps and saved a checkpoint."""
    def watch() -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            for ledger in root.glob("*/ledger.json"):
                recorded = sum(getattr(event, "steps", 0) for event in PrivacyLedger.load(ledger).events())
                if recorded >= steps and (ledger.parent / "checkpoint.pt").exists():
                    _thread.interrupt_main()
                    return
            time.sleep(0.01)
    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    return watcher


def test_a_fit_stopped_by_ctrl_c_resumes_on_the_same_arrays_and_spends_once(tmp_path):
    digits = load_digits()
    images, labels = digits.images.astype(np.uint8) * 16, digits.target
    settings = [*smoke("dpdm"), "dpsgd.epochs=4"]  # about 90 steps
    keywords = {key.replace(".", "__"): value for key, value in parse_overrides(settings)}
    synthesizer = dpsynth.Synthesizer("dpdm", epsilon=5.0, preset="cpu", out_dir=tmp_path / "runs", **keywords)
    with pytest.raises(DpsynthError, match="no stopped fit to resume"):
        synthesizer.resume(images, labels, class_names=NAMES)
    watcher = interrupt_after_recorded_steps(tmp_path / "runs", steps=4)
    with pytest.raises(KeyboardInterrupt):
        synthesizer.fit(images, labels, class_names=NAMES)
    watcher.join()
    stopped = synthesizer.stopped
    assert stopped is not None and not (stopped / "release").exists()
    with pytest.raises(DpsynthError, match="not the ones the stopped fit read"):
        synthesizer.resume(images[:-1], labels[:-1], class_names=NAMES)
    assert synthesizer.resume(images, labels, class_names=NAMES).run_dir == stopped and synthesizer.stopped is None
    log = [json.loads(line) for line in (stopped / "log.jsonl").read_text().splitlines()]
    (plan,) = [event["plan"] for event in log if event["event"] == "start"]
    assert [event["event"] for event in log].count("resume") == 1
    assert [stage["mechanisms"] for stage in synthesizer.privacy["stages"]] == [stage["mechanisms"] for stage in plan]
    assert synthesizer.privacy["epsilon"] <= 5.0
    (entry,) = HolderLedger(Path(os.environ["DPSYNTH_RELEASES"])).releases()  # one release, not a second start
    assert entry.run == str(stopped.resolve()) and entry.status != "running"
