"""Every choice the private data makes is paid for: a folder's shape by a DP vote in the ledger, a standard set's
size by its name, run-written keys refused, a noisy count clamped (over groups too), a derived plan read from the
noisy count, releases without local paths (audits that fail: test_audit.py and test_groups.py)."""
from __future__ import annotations

import json
import re
import warnings

import numpy as np
import pytest
import torch
from conftest import MERF, absolute_paths, dpsynth_main, write_idx_set
from PIL import Image

from dpsynth.api import dataset_from_config, plan_privacy, resolve_config
from dpsynth.config import with_drawn
from dpsynth.data import load_dataset
from dpsynth.data.folder import FOLDER_SIDES, ShapeVotes, folder_votes
from dpsynth.data.sources import LoadOptions
from dpsynth.errors import ConfigError, PrivacyWarning
from dpsynth.methods import run_config_of
from dpsynth.pipeline import start
from dpsynth.planning import planned_config, resolve_delta, with_public_size
from dpsynth.privacy import GaussianMechanism, PrivacyLedger
from dpsynth.privacy.dataset_facts import SHAPE, SIZE, least_total, noisy_total, with_noisy_shape
from dpsynth.privacy.mechanisms import noisy_count
from dpsynth.privacy.randomness import SecretStream, stream_key


def seeded(config: dict, seed: int) -> dict:
    """``config`` with ``run.seed``: its noise recomputable, for tests only."""
    return {**config, "run": {**config["run"], "seed": seed}}


def write_folder(root, short_sides: list[int], groups: list[str] | None = None, colour: int = 0) -> None:
    """Two class folders of grey PNGs whose short sides are ``short_sides`` (in turn), the first ``colour`` of them
    coloured; with ``groups``, a groups.csv naming each image's group."""
    rng, rows = np.random.default_rng(0), ["file,group"]
    for index, side in enumerate(short_sides):
        folder = root / ("a" if index % 2 == 0 else "b")
        folder.mkdir(parents=True, exist_ok=True)
        pixels = np.repeat(rng.integers(0, 256, (side, side + 3, 1), dtype=np.uint8), 3, axis=2)
        if index < colour:
            pixels[..., 0] = 255 - pixels[..., 0]
        Image.fromarray(pixels).save(folder / f"{index}.png")
        if groups is not None:
            rows.append(f"{folder.name}/{index}.png,{groups[index]}")
    if groups is not None:
        (root / "groups.csv").write_text("\n".join(rows) + "\n")


def test_one_image_moves_the_shape_votes_by_at_most_one_though_it_flips_the_exact_decision(tmp_path):
    write_folder(tmp_path / "less", [40, 70])
    write_folder(tmp_path / "more", [40, 70, 70])
    less, more = (folder_votes(LoadOptions(tmp_path / name)) for name in ("less", "more"))
    assert less.decide() == (32, 1) and more.decide() == (64, 1)  # the exact median: one image decides it
    for votes in ("by_side", "by_colour", "by_low", "by_high"):
        assert np.linalg.norm(getattr(more, votes) - getattr(less, votes)) <= 1.0
    assert less.by_side.shape == (len(FOLDER_SIDES),) and less.total() == 2 and less.sensitivity == 2.0
    declared = folder_votes(LoadOptions(tmp_path / "less", resolution=48))
    assert declared.sides == (48,) and len(declared.by_side) == 0 and declared.sensitivity == np.sqrt(3)


def test_a_group_votes_once_however_many_images_it_holds(tmp_path):
    people = ["p1", "p2", "p3"] + ["big"] * 6
    write_folder(tmp_path / "all", [40, 40, 40] + [70] * 6, people)
    write_folder(tmp_path / "without", [40, 40, 40], people[:3])
    votes, without = (folder_votes(LoadOptions(tmp_path / name)) for name in ("all", "without"))
    assert votes.total() == pytest.approx(4)  # four people, though nine images
    assert votes.decide() == (32, 1)  # three of four people are 40 px, though six of nine images are 70 px
    assert np.linalg.norm(votes.by_side - without.by_side) == pytest.approx(1.0)
    assert np.linalg.norm(votes.by_colour - without.by_colour) == pytest.approx(1.0)


def test_one_colour_image_among_grey_ones_leaves_the_release_grey():
    sides = np.array([0, 0, 1000.0, 0])
    assert ShapeVotes(FOLDER_SIDES, (1, 3), sides, np.array([999.0, 1.0])).decide() == (64, 1)
    assert ShapeVotes(FOLDER_SIDES, (1, 3), sides, np.array([400.0, 600.0])).decide() == (64, 3)
    assert ShapeVotes((48,), (1, 3), np.zeros(0), np.array([10.0, 0.0])).decide() == (48, 1)
    assert ShapeVotes(FOLDER_SIDES, (3,), np.array([5.0, 1, 0, 0]), np.zeros(0)).decide() == (28, 3)


def test_a_dp_vote_decides_alike_on_neighbouring_folders(tmp_path):
    write_folder(tmp_path / "less", [40, 70])
    write_folder(tmp_path / "more", [40, 70, 70])
    shares = {}
    for name in ("less", "more"):
        config = resolve_config("dp-merf", dataset="folder", data_dir=str(tmp_path / name), epsilon=1.0)
        with pytest.warns(UserWarning, match="so few images vote that the noise decides more than they do"):
            drawn = [with_noisy_shape(run_config_of(seeded(config, seed))).drawn.shape for seed in range(300)]
        shares[name] = {shape: drawn.count(shape) / len(drawn) for shape in set(drawn)}
    for shape in set(shares["less"]) | set(shares["more"]):
        assert abs(shares["less"].get(shape, 0) - shares["more"].get(shape, 0)) < 0.1, shape


def folder_run(tmp_path, folder: str, *extra: str):
    config = resolve_config("dp-merf", dataset="folder", data_dir=str(tmp_path / folder), epsilon=5.0, preset="cpu",
                            overrides=[*MERF, f"run.out_dir={tmp_path / 'runs'}", "privacy.dataset_size=40",
                                       "dataset.val_size=1", "dataset.test_size=1", *extra])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the tiny configuration's own warnings
        return start(config)


def test_neighbouring_folders_both_pay_for_their_shape_and_a_declared_one_pays_nothing(tmp_path):
    write_folder(tmp_path / "less", [40, 70] * 3)
    write_folder(tmp_path / "more", [40, 70] * 3 + [70], colour=1)
    for folder in ("less", "more"):
        run = folder_run(tmp_path, folder, "dataset.resolution=28")  # the channels alone are voted on: cheap runs
        report = json.loads(run.file("release/privacy.json").read_text())
        assert report["stages"][0]["name"] == SHAPE.stage
        assert report["stages"][0]["mechanisms"][0]["noise_multiplier"] == SHAPE.noise
        assert PrivacyLedger.load(run.file("ledger.json")).stages()[SHAPE.stage] == [GaussianMechanism(SHAPE.noise)]
        channels, side = run.config()["drawn"]["shape"]
        with np.load(run.file("release/synthetic.npz")) as release:
            assert release["images"].shape[1:] == (channels, side, side)
        assert run.config()["dataset"]["channels"] == "auto" and side == 28  # the draw kept apart from the setting
        assert f"x 28 x 28): a noisy vote of the images, released as the stage {SHAPE.stage}" in \
            run.file("release/README.md").read_text()
    declared = folder_run(tmp_path, "more", "dataset.resolution=28", "dataset.channels=1")
    report = json.loads(declared.file("release/privacy.json").read_text())
    assert SHAPE.stage not in [stage["name"] for stage in report["stages"]]
    assert "drawn" not in declared.config()
    assert "(1 x 28 x 28): declared by the data holder" in declared.file("release/README.md").read_text()


def test_data_info_and_the_plan_say_how_a_folders_shape_is_chosen(tmp_path):
    write_folder(tmp_path, [40, 70] * 5)
    done = dpsynth_main("data", "info", "folder", "--data-dir", str(tmp_path))
    assert "decided:  1 x 32 x 32 by the exact vote of the images, private: a run decides it by a DP vote" in done.out
    done = dpsynth_main("data", "info", "folder", "--data-dir", str(tmp_path), "--set", "dataset.resolution=16",
                        "--set", "dataset.channels=1")
    assert "decided:  as declared (dataset.resolution, dataset.channels): public, no epsilon spent" in done.out
    done = dpsynth_main("privacy", "dp-merf", "--dataset", "folder", "--data-dir", str(tmp_path), "--epsilon", "5",
                        "--preset", "cpu")
    assert done.code == 0 and re.search(rf"^{SHAPE.stage}\s+gaussian\s+{SHAPE.noise:.4f}", done.out, re.MULTILINE)
    done = dpsynth_main("privacy", "dp-merf", "--dataset", "folder", "--data-dir", str(tmp_path), "--epsilon", "5",
                        "--preset", "cpu", "--set", "dataset.resolution=32", "--set", "dataset.channels=1")
    assert done.code == 0 and SHAPE.stage not in done.out


def test_two_npz_files_that_differ_by_a_group_have_one_shape_and_no_shape_stage(tmp_path):
    rng = np.random.default_rng(0)
    images, groups = rng.integers(0, 256, (30, 1, 12, 12), dtype=np.uint8), np.arange(30) // 3
    for name, keep in (("all", groups >= 0), ("less", groups != 4)):
        np.savez(tmp_path / f"{name}.npz", images=images[keep], labels=(np.arange(30) % 2)[keep],
                 class_names=np.array(["x", "y"]), groups=groups[keep])
    shapes = {name: load_dataset("npz", tmp_path / f"{name}.npz").info.shape for name in ("all", "less")}
    assert shapes == {"all": (1, 12, 12), "less": (1, 12, 12)}
    config = resolve_config("dp-merf", dataset="npz", data_dir=str(tmp_path / "less.npz"), epsilon=5.0)
    assert SHAPE.stage not in [stage["name"] for stage in
                               plan_privacy(config, dataset_from_config(config).info)["stages"]]


def test_a_standard_set_one_image_short_follows_the_published_rule(tmp_path):
    write_idx_set(tmp_path / "full", n_train=60_000, n_test=10, compress=False)
    write_idx_set(tmp_path / "short", n_train=59_999, n_test=10, compress=False)
    plans = {}
    for name in ("full", "short"):
        config = resolve_config("dpdm", dataset="fashion-mnist", data_dir=str(tmp_path / name), epsilon=10.0,
                                preset="cpu")
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            info = dataset_from_config(config).info
        assert [str(w.message) for w in caught if "published" in str(w.message)] == ([] if name == "full" else [
            "dataset 'fashion-mnist' holds 59,999 training images, the published set 60,000: planning uses the "
            "published size; for another set load it as npz or folder (its size is then released as a noisy count) "
            "or declare its size (privacy.dataset_size=N)"])
        assert (info.size_rule, info.num_train) == ("published", 55_000)
        plans[name] = plan_privacy(config, info)
    assert plans["full"] == plans["short"] and SIZE.stage not in [stage["name"] for stage in plans["short"]["stages"]]


@pytest.mark.parametrize("key, value", [("drawn.dataset_size", 1797), ("drawn.shape", [1, 28])])
def test_only_a_run_writes_what_its_mechanisms_drew(tmp_path, key, value):
    done = dpsynth_main("privacy", "dp-merf", "--dataset", "digits", "--epsilon", "5", "--set",
                        f"{key}={json.dumps(value)}")
    assert done.code == 2 and f"--set {key}: only a run writes this key" in done.err
    config = resolve_config("dp-merf", dataset="digits", epsilon=5.0, overrides=[f"run.out_dir={tmp_path}"])
    config["drawn"] = {key.split(".")[1]: value}  # a config edited by hand, given to the Python API
    with pytest.raises(ConfigError, match=f"a new run's config: {key}: only a run writes this key"):
        start(config)
    assert not list(tmp_path.iterdir())  # refused before a run directory exists


def small_npz(tmp_path, groups: np.ndarray | None = None) -> str:
    count = len(groups) if groups is not None else 8
    arrays = {"images": np.random.default_rng(0).integers(0, 256, (count, 1, 8, 8), dtype=np.uint8),
              "labels": np.arange(count) % 2, "class_names": np.array(["x", "y"])}
    np.savez(tmp_path / "small.npz", **arrays, **({} if groups is None else {"groups": groups}))
    return str(tmp_path / "small.npz")


def test_a_noisy_count_below_what_the_splits_need_is_clamped_not_refused(tmp_path):
    config = resolve_config("dp-merf", dataset="npz", data_dir=small_npz(tmp_path), epsilon=5.0,
                            overrides=["dataset.val_size=2", "dataset.test_size=2"])
    dataset = dataset_from_config(config)
    assert least_total(2, 2, False) == 6  # two training records: the fewest delta = 1 / (N ln N) takes
    with pytest.warns(PrivacyWarning, match="too small for a count with noise of std 50; declare its size"):
        totals = [noisy_total(dataset, seeded(config, seed)) for seed in range(20)]
    assert min(totals) == 6 and max(totals) > 6  # about half the draws fall below 6, and are raised to it
    for total in set(totals):
        drawn = with_drawn(run_config_of(config), dataset_size=total)
        assert with_public_size(drawn, dataset).info.num_train == total - 4
        assert resolve_delta(drawn, with_public_size(drawn, dataset).info.num_train) > 0


def test_a_noisy_count_over_groups_counts_groups(tmp_path):
    groups = np.repeat(np.arange(30), 3)  # 30 people, 90 images
    config = resolve_config("dp-merf", dataset="npz", data_dir=small_npz(tmp_path, groups), epsilon=5.0)
    dataset = dataset_from_config(config)
    for seed in range(5):
        expected = max(noisy_count(30, SIZE.noise, SecretStream(stream_key(seed, SIZE.stage))), 2)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", PrivacyWarning)  # a draw below 2 is raised, with a warning
            assert noisy_total(dataset, seeded(config, seed)) == expected


def test_a_derived_plan_on_own_data_reads_the_noisy_count_not_the_exact_size(tmp_path):
    digits = load_dataset("digits")
    images = torch.cat([digits.train.images, digits.val.images, digits.test.images])
    np.savez(tmp_path / "own.npz", images=images.numpy(),
             labels=torch.cat([digits.train.labels, digits.val.labels, digits.test.labels]).numpy(),
             class_names=np.asarray(digits.info.class_names))
    config = resolve_config("dpdm", dataset="npz", data_dir=str(tmp_path / "own.npz"), epsilon=10.0,
                            overrides=["run.seed=3", "plan.time_budget=3m", "evaluation.enabled=false"])
    exact = dataset_from_config(config)
    planned, public = planned_config(run_config_of(config), exact, torch.device("cpu"), draw_size=True)
    noisy = planned.drawn.dataset_size
    assert public.info.size_rule == "noisy" and public.info.num_train == noisy - 2 * round(0.1 * noisy)
    assert public.info.num_train != exact.info.split_sizes["train"]
    batch, epochs = planned["dpsgd"]["batch_size"], planned["dpsgd"]["epochs"]
    steps = epochs * public.info.num_train / batch - 0.5  # the plan's epochs are (steps + 1/2) batches of the noisy N
    assert steps >= 200 and abs(steps - round(steps)) < 1e-3 * steps


def test_no_release_file_names_a_local_path(tmp_path):
    write_folder(tmp_path / "scans", [40, 70] * 6)
    run = folder_run(tmp_path, "scans", "dataset.resolution=28")
    for path in [*run.file("release").glob("*.json"), *run.file("release").glob("*.md")]:
        text = path.read_text()
        assert not absolute_paths(text) and str(tmp_path) not in text, path
    small = [f"evaluation.{key}" for key in ("num_synthetic=20", "num_real=10", "classifiers=[]", "kid_subset_size=5",
                                             "kid_subsets=2", f"cache_dir={tmp_path / 'cache'}")]
    done = dpsynth_main("evaluate", str(run.file("release/synthetic.npz")), "--dataset", "folder", "--data-dir",
                        str(tmp_path / "scans"), "--device", "cpu", *[arg for key in small for arg in ("--set", key)])
    assert done.code == 0, done.err  # the real images are read at the release's shape, not at their own vote's
