"""Plans that know when they will not learn (the recorded (sigma/B, T) outcomes refuse a plan before anything is
spent, unless forced, and the release says so), and a release made smaller than its data and lifted by an
upscaler trained on public images only (named by SHA-256 in privacy.json, checked to hold no private image)."""
from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import dpsynth_main

from dpsynth.api import resolve_config
from dpsynth.autoplan.recipes import Recipe, recommend, recorded_recipes
from dpsynth.autoplan.regime import Outcome, PlannedTraining, assess, recorded_outcomes
from dpsynth.bench.recipes import recipes
from dpsynth.bench.regime import outcomes
from dpsynth.data import DatasetInfo
from dpsynth.errors import ConfigError
from dpsynth.methods import run_config_of
from dpsynth.models.upscaler import SavedUpscaler
from dpsynth.planning import training_info
from dpsynth.utils.io import sha256

RESULTS = Path(__file__).resolve().parents[1] / "benchmarks" / "results"


def outcome(noise: float, steps: int, accuracy: float, side: int = 28, start: str = "random") -> Outcome:
    return Outcome(f"r-{noise}-{steps}-{side}", "dpdm", "toy", side, start, 1000, 100.0, steps, noise * 100,
                   accuracy, 0.1, "a CPU", "2026-12-02")


def plan(noise: float, steps: int, side: int = 28, start: str = "random") -> PlannedTraining:
    return PlannedTraining("dp-sgd", noise * 100, 100.0, steps, side, start)


def test_a_failure_with_more_signal_refuses_and_a_success_with_more_noise_vouches():
    records = (outcome(0.04, 800, 0.11), outcome(0.01, 800, 0.85))
    assert assess(plan(0.05, 500), records).verdict == "fails"  # more noise, fewer steps than a failure
    assert assess(plan(0.05, 900), records).verdict == "fails"  # a few more steps cannot make up 25 % more noise
    assert assess(plan(0.042, 900), records).verdict == "untested"  # they can make up 5 %: more signal than it
    assert assess(plan(0.07, 1700), records).verdict == "untested"  # less signal, but over twice its steps
    assert assess(plan(0.008, 900), records).verdict == "learns"  # less noise, more steps than a success
    assert assess(plan(0.02, 800), records).verdict == "untested"  # between the two
    assert assess(plan(0.05, 500, side=16), records).verdict == "untested"  # a failure at 28 px says nothing at 16
    assert assess(plan(0.008, 900, side=64), records).verdict == "untested"  # nor a success at 28 px at 64
    assert assess(plan(0.05, 500, start="public model"), records).verdict == "untested"  # another kind of start
    failing = assess(plan(0.05, 500), records)
    assert failing.deciding == (records[0],) and "will NOT learn" in failing.lines()[0]


def test_the_shipped_outcomes_are_what_the_committed_records_say():
    assert tuple(outcomes(RESULTS)) == recorded_outcomes(), "run: python benchmarks/regime_records.py --write"
    scans = [found for found in recorded_outcomes() if found.data == "scans-64"]
    assert scans and all(found.learned_nothing for found in scans)  # the record the refusal stands on


def recipe(method: str, units: int, accuracy: float, epsilon: float = 10, budget: float = 60,
           side: int = 64, channels: int = 1) -> Recipe:
    return Recipe(f"{method}-{units}-{epsilon}", method, "toy", units, side, side, channels, epsilon, budget, budget,
                  accuracy, 0.1, 0.9, 150.0, "a CPU", "2026-12-02")


def test_the_recommendation_is_the_best_of_the_nearest_measured_cell_within_the_budget():
    measured = (recipe("dpdm", 1000, 0.40), recipe("dp-merf", 900, 0.55), recipe("dpdm", 3000, 0.80),
                recipe("dp-merf", 300, 0.11), recipe("dpdm", 1000, 0.85, budget=120), recipe("dpdm", 1000, 0.2, 1))
    chosen = recommend(1000, 64, 1, 10, 60, measured)
    assert chosen.chosen is measured[1] and set(chosen.considered) == {measured[0], measured[1]}
    assert "recommended method for N = 1,000 at 64 px" in chosen.lines()[0] and "dp-merf" in chosen.lines()[0]
    assert recommend(1000, 64, 1, 10, 120, measured).chosen is measured[4]  # a longer budget reaches the longer run
    assert recommend(3200, 64, 1, 10, 60, measured).chosen is measured[2]
    assert recommend(1000, 64, 1, 1, 60, measured).chosen is measured[5]  # the epsilon counts as much as N
    nothing = recommend(300, 64, 1, 10, 60, measured)
    assert nothing.chosen is measured[3] and "none measured learned anything" in nothing.lines()[0]
    far = recommend(1000, 64, 1, 1, 60, measured[:5])  # only epsilon = 10 measured: no recommendation at epsilon 1
    assert far.chosen is None and far.considered and "none measured near this N and epsilon" in far.lines()[0]
    assert recommend(1000, 128, 1, 10, 60, measured).chosen is None  # no recipe at another side
    photographs = (*measured, recipe("dpdm", 1000, 0.95, channels=3))  # an easier task, in colour
    assert recommend(1000, 64, 1, 10, 60, photographs).chosen is measured[1]
    assert recommend(1000, 64, 3, 10, 60, photographs).chosen is photographs[-1]
    assert "at 64 px RGB" in recommend(1000, 64, 3, 10, 60, photographs).lines()[0]


def test_the_shipped_recipes_are_what_the_committed_records_say():
    assert tuple(recipes(RESULTS)) == recorded_recipes(), "run: python benchmarks/regime_records.py --write"
    assert all(found.side >= 64 for found in recorded_recipes())


def test_training_reads_at_most_the_data_side():
    info = DatasetInfo("toy", 1, 64, 64, ["a", "b"], "here")
    assert training_info(resolve_config("dpdm", overrides=["dataset.train_resolution=32"]), info).release_side == 64
    with pytest.raises(ConfigError, match="dataset.train_resolution 128: above the data's side, 64 px"):
        training_info(resolve_config("dpdm", overrides=["dataset.train_resolution=128"]), info)


def bars(path: Path, count: int = 60, side: int = 64) -> Path:
    """``count`` grey images of ``side`` px, two classes (a bar on the left or on the right), as an .npz."""
    labels = np.arange(count) % 2
    images = np.zeros((count, 1, side, side), np.uint8)
    for index, label in enumerate(labels):
        images[index, 0, side // 4: 3 * side // 4, (side // 8 if label else side // 2):][:, : 3 * side // 8] = 200
        images[index, 0, 0, index % side] = 100  # every image distinct
    np.savez(path, images=images, labels=labels, class_names=np.array(["left", "right"]))
    return path


TINY = ["privacy.dataset_size=60", "dpsgd.batch_size=8", "dpsgd.physical_batch_size=8", "dpsgd.epochs=0.5",
        "sampling.num_samples=4", "diffusion.sample_steps=2", "evaluation.enabled=false"]


def run_args(data: Path, out: Path, *extra: str) -> list[str]:
    pairs = [*TINY, f"run.out_dir={out}", *extra]
    return ["run", "dpdm", "--dataset", "npz", "--data-dir", str(data), "--epsilon", "8", "--preset", "cpu",
            *sum((["--set", pair] for pair in pairs), [])]


def test_a_plan_where_every_record_learned_nothing_is_refused_before_a_ledger_entry(tmp_path):
    data = bars(tmp_path / "bars.npz")  # 64 px, 3 steps of 8 at sigma/B ~ 0.05: below the scans-64 record
    refused = dpsynth_main(*run_args(data, tmp_path / "runs"))
    assert refused.code != 0
    assert "will NOT learn" in refused.err and "scans-64" in refused.err and "plan.force=true" in refused.err
    assert "nothing was spent" in refused.err
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())  # no run, no ledger
    shown = dpsynth_main("privacy", "dpdm", "--dataset", "npz", "--data-dir", str(data), "--epsilon", "8", "--preset",
                         "cpu", *sum((["--set", pair] for pair in TINY), []))
    assert shown.code == 0 and "will NOT learn" in shown.out and "dpsynth run refuses this plan" in shown.out
    assert re.search(r"recommended method for N = \d+ at 64 px grey, epsilon 8, --time-budget 30m: ", shown.out)
    forced = dpsynth_main(*run_args(data, tmp_path / "runs", "plan.force=true"))
    assert forced.code == 0, forced.err
    run = next((tmp_path / "runs").iterdir())
    regime = json.loads((run / "release" / "privacy.json").read_text())["training_regime"]
    assert regime[0]["verdict"] == "fails" and regime[0]["forced"] and regime[0]["noise_per_example"] > 0.039
    assert "The data holder forced it (`plan.force`)" in (run / "release" / "README.md").read_text()


def test_a_release_made_smaller_is_lifted_by_an_upscaler_that_saw_only_public_images(tmp_path):
    upscaler = tmp_path / "upscaler"
    trained = dpsynth_main("pretrain", "--upscaler", "--dataset", "glyphs", "--out", str(upscaler), "--iterations",
                           "20", "--set", "dataset.resolution=64", "--set", "dataset.num_images=124")
    assert trained.code == 0, trained.err
    data = bars(tmp_path / "bars.npz")
    evaluated = ["sampling.num_samples=40", "evaluation.enabled=true", "evaluation.num_synthetic=40",
                 "evaluation.num_real=40", "evaluation.classifiers=[cnn]", "evaluation.classifier_seeds=1",
                 "evaluation.classifier_epochs=1"]
    done = dpsynth_main(*run_args(data, tmp_path / "runs", "plan.force=true", "dataset.train_resolution=32",
                                  f"release.upscaler={upscaler}", *evaluated))
    assert done.code == 0, done.err
    run = next((tmp_path / "runs").iterdir())
    with np.load(run / "release" / "synthetic.npz") as release:
        assert release["images"].shape == (40, 1, 64, 64)  # trained at 32 px, released at the data's 64
    metrics = json.loads((run / "metrics.json").read_text())  # evaluated against the real images at 64 px
    assert metrics["images"]["synthetic"] == 40 and "cnn" in metrics["accuracy"]
    report = json.loads((run / "release" / "privacy.json").read_text())
    lifted = report["upscaling"]
    assert (lifted["private_side"], lifted["release_side"], lifted["private_images_seen"]) == (32, 64, 0)
    assert lifted["upscaler"] == "upscaler" and lifted["upscaler_sha256"] == sha256(upscaler / SavedUpscaler.files()[0])
    assert any(name.startswith("release.upscaler") for name in report["public_data"])
    assert report["training_regime"][0]["side"] == 32
    assert "lifted to 64 x 64 by the upscaler `upscaler`" in (run / "release" / "README.md").read_text()


def test_an_upscaler_trained_on_a_private_image_is_refused(tmp_path):
    data = bars(tmp_path / "bars.npz")
    with np.load(data) as arrays:  # a "public" set that holds the private images
        np.savez(tmp_path / "leaky.npz", images=arrays["images"], labels=arrays["labels"],
                 class_names=arrays["class_names"])
    upscaler = tmp_path / "leaky-upscaler"
    assert dpsynth_main("pretrain", "--upscaler", "--dataset", "npz", "--data-dir", str(tmp_path / "leaky.npz"),
                        "--out", str(upscaler), "--iterations", "5").code == 0
    refused = dpsynth_main(*run_args(data, tmp_path / "runs", "plan.force=true", "dataset.train_resolution=32",
                                     f"release.upscaler={upscaler}"))
    assert refused.code != 0 and "release.upscaler 'leaky-upscaler' is not disjoint" in refused.err


def people(path: Path, persons: int) -> Path:
    """An .npz of 8 x 8 images of ``persons`` people with 1 to 5 images each (3 on average), two classes."""
    counts = np.arange(persons) % 5 + 1
    groups = np.repeat(np.arange(persons), counts)
    labels = groups % 2
    images = np.random.default_rng(0).integers(0, 256, (len(groups), 1, 8, 8), dtype=np.uint8)
    np.savez(path, images=images, labels=labels, groups=groups, class_names=np.array(["a", "b"]))
    return path


def test_a_persons_share_of_a_step_is_priced_by_a_noisy_mean_of_their_images(tmp_path):
    from dpsynth.api import dataset_from_config, plan_budget_for
    from dpsynth.planning import dataset_stages, planned_config
    from dpsynth.privacy.dataset_facts import IMAGES_PER_GROUP, noisy_images_per_group

    config = resolve_config("dpdm", dataset="npz", data_dir=str(people(tmp_path / "many.npz", 4000)),
                            overrides=["privacy.dataset_size=4000"])
    assert 2.0 < noisy_images_per_group(dataset_from_config(config), config) < 4.0  # 3 a person, noise 50 x 16 / N
    config = resolve_config("dpdm", dataset="npz", data_dir=str(people(tmp_path / "few.npz", 300)),
                            overrides=["privacy.dataset_size=300", "plan.time_budget=60m", "plan.force=true",
                                       "evaluation.enabled=false"])
    planned, dataset = planned_config(run_config_of(config), dataset_from_config(config), torch.device("cpu"),
                                      draw_size=True)
    price = planned.drawn.images_per_group
    assert 1.0 <= price <= 16.0 and any("noisy mean of their images" in line for line in planned.derived.decisions)
    assert IMAGES_PER_GROUP.stage in plan_budget_for(planned, dataset.info).stages  # paid for in the ledger's plan
    capped = resolve_config("dpdm", dataset="npz", data_dir=str(tmp_path / "few.npz"),
                            overrides=["privacy.dataset_size=300", "privacy.max_images_per_group=5"])
    assert IMAGES_PER_GROUP.stage not in [stage.name for stage in dataset_stages(capped, dataset.info)]  # declared cap
