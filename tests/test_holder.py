"""The holder's side of a release: every release from one data set in the holder's ledger, composed and capped, and
the datasheet an officer signs."""
from __future__ import annotations

import json
import re
import time
import warnings
from pathlib import Path

import pytest
from conftest import MERF, shown_in_browser, smoke, write_patients

from dpsynth.api import resolve_config
from dpsynth.cli import main
from dpsynth.datasheet import SCALE_WORDS, certainty_after, epsilon_verdict, percent
from dpsynth.errors import ConfigError
from dpsynth.officer import near_chance
from dpsynth.pipeline import start
from dpsynth.privacy import Accountant, PrivacyLedger
from dpsynth.privacy.progress import PrivacyProgress
from dpsynth.privacy.releases import HolderLedger, store_path
from dpsynth.training.context import seconds_after


def settings(tmp_path) -> list[str]:
    return [*MERF, f"run.out_dir={tmp_path / 'runs'}", "privacy.dataset_size=12", "dataset.val_size=1",
            "dataset.test_size=1", "dataset.resolution=28", "dataset.channels=1"]


def release(tmp_path, *extra: str):
    config = resolve_config("dp-merf", dataset="folder", data_dir=str(tmp_path / "scans"), epsilon=2.0, preset="cpu",
                            overrides=[*settings(tmp_path), *extra])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the tiny configuration's own warnings
        return start(config)


def test_a_folder_released_twice_shows_both_and_their_composed_epsilon_and_a_cap_refuses_the_third(tmp_path, capsys):
    write_patients(tmp_path / "scans")
    first, second = release(tmp_path), release(tmp_path)
    held = HolderLedger().releases()
    assert store_path().name == "releases.json" and [entry.run for entry in held] == [
        str(first.path.resolve()), str(second.path.resolve())]
    assert {entry.status for entry in held} == {"released"} and {entry.unit for entry in held} == {"person"}
    assert oct(store_path().stat().st_mode & 0o777) == "0o600"
    ledgers = [PrivacyLedger.load(run.file("ledger.json")) for run in (first, second)]
    delta = min(json.loads(run.file("release/privacy.json").read_text())["delta"] for run in (first, second))
    together = Accountant("rdp").epsilon([*ledgers[0].events(), *ledgers[1].events()], delta)
    report = json.loads(second.file("release/privacy.json").read_text())["releases"]
    assert report["number"] == 2 and report["counted"] == 2 and report["epsilon"] == pytest.approx(together)
    assert 2.0 < together < 4.0  # composed, not summed: below 2 x 2
    assert "release 2 of 2 from this data" in second.file("release/README.md").read_text()

    assert main(["budget", str(tmp_path / "scans")]) == 0
    shown = capsys.readouterr().out
    assert shown.count("released") >= 2 and f"2 counted (shared), all 2 together: ε = {together:.4f}" in shown
    plan = ["privacy", "dp-merf", "--dataset", "folder", "--data-dir", str(tmp_path / "scans"), "--epsilon", "2",
            "--preset", "cpu", *(arg for item in settings(tmp_path) for arg in ("--set", item))]
    assert main(plan) == 0  # before a third: what all three would spend
    assert "with the 2 earlier release(s) from this data (dpsynth budget), all 3 together: ε = " in \
        capsys.readouterr().out

    before = len(HolderLedger().releases())
    with pytest.raises(ConfigError, match=r"privacy.total_epsilon = 4: .* 2 earlier release\(s\)"):
        release(tmp_path, "privacy.total_epsilon=4")
    assert len(HolderLedger().releases()) == before and len(list((tmp_path / "runs").iterdir())) == 2

    assert main(["budget", "--not-shared", str(first.path)]) == 0  # the first never left the hospital
    third = release(tmp_path, "privacy.total_epsilon=4")
    assert len(HolderLedger().releases()) == 3 and not HolderLedger().releases()[0].shared
    assert json.loads(third.file("release/privacy.json").read_text())["releases"]["counted"] == 2


def test_the_datasheet_of_a_folder_run_gives_the_officer_the_verdict_the_public_facts_and_who_answers(tmp_path,
                                                                                                   capsys):
    write_patients(tmp_path / "scans")
    run = release(tmp_path, "dataset.owner=St Elsewhere radiology", "release.purpose=teaching a triage model",
                  "privacy.epsilon_reason=agreed with the ethics board", "dataset.unit_name=patient")
    sheet = run.file("release/README.md").read_text()
    report = json.loads(run.file("release/privacy.json").read_text())
    for said in ("| Data owner | St Elsewhere radiology |", "| Purpose | teaching a triage model |",
                 "| Why this ε | agreed with the ethics board |", "release 1 of 1 from this data",
                 f"**In one line: ε = {report['epsilon']:.2f} per patient is a moderate promise**",
                 "An attacker 50 % sure that a given patient is in the data ends at most 88",
                 "Synthetic images imitating `scans`", "the chance that this bound fails",
                 "for N = 10 patients", "(`privacy.max_images_per_group`, declared by the data holder)",
                 "declared by the data holder (`dataset.resolution`, `dataset.channels`)",
                 "No private image, file name, folder name or patient identifier, and no DICOM header",
                 "it spends ε = 1 more on those images"):
        assert said in sheet, said
    assert "docs/" not in sheet and "a person, say" not in sheet and "(a patient" not in report["unit"]
    assert report["unit"].startswith("one patient (all of a patient's images, from a sub-folder per person)")
    small = ["--set", "evaluation.num_synthetic=20", "--set", "evaluation.num_real=10", "--set",
             "evaluation.classifiers=[cnn]", "--set", "evaluation.classifier_epochs=1", "--set",
             "evaluation.classifier_seeds=1", "--set", "evaluation.kid_subset_size=5", "--set",
             "evaluation.kid_subsets=2", "--set", f"evaluation.cache_dir={tmp_path / 'cache'}", "--device", "cpu"]
    assert main(["evaluate", str(run.path), *small]) == 0
    accuracy = json.loads(run.file("metrics.json").read_text())["accuracy"]["cnn"]["test_accuracy"]
    assert ("near chance (50.0 %)" in capsys.readouterr().err) == near_chance(accuracy, 2)  # 2 test images of noise
    shown = shown_in_browser(run.file("officer.html"))["text"]
    for said in ("Data owner", "St Elsewhere radiology", "per patient is a moderate promise", "Treated as public",
                 "For the data holder only: the release's evaluation", f"scores {100 * accuracy:.1f} % on 2 real test",
                 "FID", "Sign-off", "Choosing the classifiers on the private validation images spent ε = 0.94"):
        assert said in shown, said
    assert ("Near chance:" in shown) == near_chance(accuracy, 2)
    assert main(["officer", str(run.path), "--pdf", str(tmp_path / "signed" / "officer.pdf")]) == 0
    assert (tmp_path / "signed" / "officer.pdf").read_bytes().startswith(b"%PDF")
    assert "For the data holder only" not in sheet


def test_the_datasheets_verdict_is_the_guides_scale():
    guide = (Path(__file__).parents[1] / "docs/guides/epsilon.md").read_text()
    rows = re.findall(r"^\| (up to 1|above [\d, up to]+) \| (\w+(?: \w+)?) \| (.+) \|$", guide, re.MULTILINE)
    assert [(f"a {promise} promise", words) for _, promise, words in rows] == list(SCALE_WORDS.items())
    assert [epsilon_verdict(epsilon) for epsilon in (0.5, 1, 1.01, 4, 8, 10, 10.5)] == [
        "a strong promise", "a strong promise", "a moderate promise", "a moderate promise", "a weak promise",
        "a weak promise", "a very weak promise"]
    assert certainty_after(10, 0.5) == pytest.approx(0.99995, abs=1e-5)
    assert percent(0.99995) == "99.995 %" and percent(0.881) == "88.1 %"
    assert [near_chance(accuracy, 10) for accuracy in (0.1, 0.18, 0.19)] == [True, True, False]
    assert [near_chance(accuracy, 2) for accuracy in (0.5, 0.54, 0.56)] == [True, True, False]


def test_a_time_limit_stops_training_and_releases_what_was_trained_at_the_epsilon_it_spent(tmp_path):
    overrides = [*smoke("dpdm"), f"run.out_dir={tmp_path / 'runs'}",
                 "dpsgd.epochs=100", "dpsgd.checkpoint_every=100", "run.time_limit=6s"]
    config = resolve_config("dpdm", dataset="digits", epsilon=5.0, preset="cpu", overrides=overrides)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the tiny configuration's own warnings
        run = start(config)
    report = json.loads(run.file("release/privacy.json").read_text())
    stopped = report["stopped_early"]["dp-sgd"]
    assert stopped["steps"] < stopped["planned"] and report["epsilon"] < report["target_epsilon"]
    ran = PrivacyLedger.load(run.file("ledger.json")).stages()
    assert sum(event.steps for event in ran.get("dp-sgd", [])) == stopped["steps"]
    assert f"dp-sgd ran {stopped['steps']:,} of its {stopped['planned']:,} planned steps" in \
        run.file("release/README.md").read_text()
    assert HolderLedger().releases()[-1].epsilon == pytest.approx(report["epsilon"])
    with pytest.raises(ConfigError, match="run.time_limit must be a duration"):
        resolve_config("dpdm", dataset="digits", preset="cpu", overrides=["run.time_limit=soon"])


def test_the_progress_bar_says_when_the_whole_run_ends_from_what_the_plan_expects_after_training():
    expected = {"startup": 20.0, "teacher (teacher)": 600.0, "student (student)": 300.0, "sampling": 120.0,
                "evaluation": 60.0, "total": 1100.0}
    assert [seconds_after(expected, stage) for stage in ("teacher", "student", "dp-sgd")] == [480.0, 180.0, None]
    bar = PrivacyProgress(10, PrivacyLedger(), Accountant("rdp"), 1e-5, "teacher", after_seconds=3600.0)
    bar.update()
    ends = bar.bar.postfix.split("run ends=")[1][:5]
    assert re.fullmatch(r"\d\d:\d\d", ends) and ends == time.strftime("%H:%M", time.localtime(time.time() + 3600)) \
        or ends == time.strftime("%H:%M", time.localtime(time.time() + 3540))  # a minute turning over
    bar.close()
