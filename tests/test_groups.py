"""One person, several images: groups in the data, a split that keeps them whole, every mechanism over groups."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from conftest import dpsynth_main, finished_run, secret_stream
from PIL import Image
from sklearn.datasets import load_digits
from torch import nn

from dpsynth.api import resolve_config
from dpsynth.audit import AUDITS, run_audit
from dpsynth.data import ImageSet, load_dataset
from dpsynth.doctor import COMMON
from dpsynth.errors import DataError
from dpsynth.evaluation.downstream import correct_predictions, correct_units
from dpsynth.methods import METHODS
from dpsynth.models import group_norm_resnet
from dpsynth.pipeline import start
from dpsynth.privacy import GaussianMechanism, PrivacyLedger, SubsampledGaussianMechanism
from dpsynth.privacy.batch_statistics import MomentScaling, clipped_moment_sum, layer_widths
from dpsynth.privacy.central_images import CentralQuery, central_images, mean_image, pixel_histogram
from dpsynth.privacy.dpsgd import DPSGD, DpsgdSettings, Groups
from dpsynth.privacy.fourier_features import (
    FrequencyQuery,
    RandomFourierFeatures,
    class_feature_sums,
    noisy_class_means,
)
from dpsynth.privacy.nearest_neighbours import nearest_neighbour_votes
from dpsynth.privacy.randomness import SecretStream
from dpsynth.privacy.semantic_histogram import semantic_counts


def grouped_npz(path, people: int = 60, per_person: int = 3, side: int = 8) -> np.ndarray:
    rng = np.random.default_rng(0)
    count = people * per_person
    groups = np.repeat([f"patient-{i:03d}" for i in range(people)], per_person)
    np.savez(path, images=rng.integers(0, 256, (count, 1, side, side), dtype=np.uint8), labels=np.arange(count) % 2,
             class_names=np.array(["benign", "malignant"]), groups=groups)
    return groups


def sides(dataset) -> list[set[int]]:
    return [set(dataset.split(name).groups.tolist()) for name in ("train", "val", "test")]


def test_a_group_never_straddles_the_split(tmp_path):
    grouped_npz(tmp_path / "scans.npz")
    dataset = load_dataset("npz", tmp_path / "scans.npz", val_size=0.2, test_size=0.2, split_seed=3)
    train, val, test = sides(dataset)
    assert not train & val and not train & test and not val & test
    assert dataset.info.group_counts == {"train": 36, "val": 12, "test": 12} and dataset.info.unit == "group"
    assert dataset.info.num_train == 36 and len(dataset.train) == 108  # N counts people, not images


def test_a_folder_names_its_groups_in_groups_csv(tmp_path):
    rows = ["file,group"]
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        for i in range(10):
            Image.fromarray(np.full((8, 8), 20 * i, dtype=np.uint8)).save(tmp_path / name / f"{i}.png")
            rows.append(f"{name}/{i}.png,person-{i // 2}")
    (tmp_path / "groups.csv").write_text("\n".join(rows) + "\n")
    dataset = load_dataset("folder", tmp_path, val_size=1, test_size=1)
    train, val, test = sides(dataset)
    assert len(train | val | test) == 5 and not (train & val or train & test or val & test)
    (tmp_path / "groups.csv").write_text("\n".join(rows[:-1]) + "\n")
    with pytest.raises(DataError, match=r"groups.csv: no group for 1 image\(s\), e.g. b/9.png"):
        load_dataset("folder", tmp_path)


def test_bad_groups_get_a_clear_error(tmp_path):
    path = tmp_path / "bad.npz"
    np.savez(path, images=np.zeros((4, 1, 8, 8), dtype=np.uint8), labels=np.zeros(4, dtype=np.int64),
             class_names=np.array(["x"]), groups=np.array([1, 2, 3]))
    with pytest.raises(DataError, match=r"bad.npz: 'groups' must give one group per image \(4\)"):
        load_dataset("npz", path)


def one_step(data: torch.Tensor, groups: torch.Tensor, clip: float = 1.0) -> torch.Tensor:
    """The summed clipped contributions of one (near) noiseless DP-SGD step over groups (q = 1) on a linear model whose
    per-example gradient is the example."""
    units = Groups.of(groups, cap=16)
    model = nn.Linear(data.shape[1], 1, bias=False)
    nn.init.zeros_(model.weight)
    engine = DPSGD(model, torch.optim.SGD(model.parameters(), lr=1.0), lambda forward, x: forward(x[None]).sum(),
                   settings=DpsgdSettings(1e-9, clip, 1.0, 5), num_records=len(units), ledger=PrivacyLedger(),
                   stage="test", noise=SecretStream.fresh(), groups=units)
    engine.step(lambda indices: (data[indices],))
    return -model.weight.detach()[0] * len(units)


def test_adding_a_whole_group_moves_the_sum_by_at_most_the_clipping_norm():
    rng = torch.Generator().manual_seed(0)
    data = torch.randn(30, 6, generator=rng)
    groups = torch.arange(30) // 3
    base = one_step(data, groups)
    for size in (1, 4, 12):  # one person's images, however many, chunked with the others or alone
        person = 50 * torch.randn(size, 6, generator=rng)
        added = one_step(torch.cat([data, person]), torch.cat([groups, torch.full((size,), 99)]))
        assert float((added - base).norm()) <= 1.0 + 1e-5
    assert one_step(data, groups).allclose(base)  # chunks of whole groups: the same sum however they fall


# At delta = 0.1 the claim of a sigma = 1 step is 1.16, and a step that clips a group's two images one by one (twice
# the sensitivity) leaks about 3.3: 800 trials certify 2.0-2.2 of it (seeds 0-2) while the sound step stays at
# 0.1-0.5. At delta = 1e-5 the same power would take tens of thousands of trials.
GROUP_AUDIT_TRIALS, GROUP_AUDIT_DELTA = 800, 0.1


def test_the_group_dpsgd_audit_finds_nothing_above_the_claim_and_catches_twice_the_sensitivity():
    sound = run_audit("dp-sgd-group-step", AUDITS["dp-sgd-group-step"](), GROUP_AUDIT_TRIALS, GROUP_AUDIT_DELTA)
    assert 0.3 <= sound.lower_bound <= sound.claimed_epsilon
    broken = run_audit("broken-group-step", AUDITS["broken-group-step"](), GROUP_AUDIT_TRIALS, GROUP_AUDIT_DELTA)
    assert broken.claimed_epsilon == sound.claimed_epsilon and broken.lower_bound > broken.claimed_epsilon + 0.5


def test_a_groups_images_weigh_one_together():
    data = ImageSet(torch.rand(6, 1, 4, 4), torch.zeros(6, dtype=torch.long), torch.tensor([7, 7, 7, 2, 9, 9]))
    assert data.unit_weights().tolist() == pytest.approx([1 / 3] * 3 + [1.0] + [0.5] * 2)
    assert data.unit_index().tolist() == [1, 1, 1, 0, 2, 2] and data.num_units == 3
    assert ImageSet(data.images, data.labels).unit_weights().tolist() == [1.0] * 6


RFF = RandomFourierFeatures(16, 64, 2.0, seed=0)


def central_sums(data: ImageSet, kind: str) -> torch.Tensor:
    """Each class's central-image statistic before noise (q = 1), the classes side by side: clipped weighted sums
    (clip 2) or weighted pixel histograms (4 bins)."""
    query = CentralQuery(kind, 1, 1.0, 0.0, 2.0, 4, 1.0)
    weights = data.unit_weights()
    parts = []
    for label in range(3):
        chosen = data.labels == label
        parts.append(mean_image(data.images[chosen], weights[chosen], query, 1e6, secret_stream()) * 1e6
                     if kind == "mean" else pixel_histogram(data.images[chosen], 4, weights[chosen]))
    return torch.cat([part.flatten().double() for part in parts])


def pe_votes(data: ImageSet) -> torch.Tensor:
    synthetic = torch.rand(5, 16, generator=torch.Generator().manual_seed(1))
    weights = data.unit_weights()
    return torch.cat([nearest_neighbour_votes(data.images[data.labels == c].flatten(1), synthetic,
                                              weights[data.labels == c]) for c in range(3)])


def privimage_counts(data: ImageSet) -> torch.Tensor:
    """The semantic histogram's counts when each image names k = 2 distinct classes of 4."""
    first = (data.images.flatten(1)[:, 0] * 4).long().clamp(0, 3)
    top = torch.stack([first, (first + 1) % 4], dim=1)
    return semantic_counts(top, data.labels, data.unit_weights(), 3, 4).flatten()


torch.manual_seed(0)
TEACHER = group_norm_resnet(1, 3, [1], [8], 4)


def imgsyn_moments(data: ImageSet) -> torch.Tensor:
    scaling = MomentScaling(torch.ones(2 * sum(layer_widths(TEACHER))), 0.5)
    return clipped_moment_sum(TEACHER, data.images, data.unit_weights(), scaling, 4, torch.device("cpu"))


# each mechanism's input before noise, and the L2 bound its noise is calibrated to
STATISTICS = {
    "central mean images (clip 2)": (lambda data: central_sums(data, "mean"), 2.0),
    "central mode images (16 pixels)": (lambda data: central_sums(data, "mode"), 4.0),
    "Fourier-feature sums": (lambda data: class_feature_sums(data, 3, RFF)[0].flatten(), 1.0),
    "class sizes": (lambda data: class_feature_sums(data, 3, RFF)[1], 1.0),
    "PE votes": (pe_votes, 1.0),
    "PrivImage histogram (k = 2)": (privimage_counts, 2 ** 0.5),
    "DP-ImgSyn moments (clip 0.5)": (imgsyn_moments, 0.5),
}


@pytest.mark.parametrize("name", list(STATISTICS))
def test_adding_a_whole_group_moves_each_mechanism_by_at_most_its_bound(name):
    statistic, bound = STATISTICS[name]
    generator = torch.Generator().manual_seed(2)
    base = ImageSet(torch.rand(30, 1, 4, 4, generator=generator), torch.arange(30) % 3, torch.arange(30) // 2)
    for size in (1, 5, 12):  # one person's images, of every class, pushed towards the clip or one corner
        person = ImageSet(torch.ones(size, 1, 4, 4) * 0.9, torch.arange(size) % 3, torch.full((size,), 99))
        joined = base.joined(person)
        change = float((statistic(joined) - statistic(base)).norm())
        assert 0 < change <= bound * (1 + 1e-6)


def test_model_selection_counts_a_group_at_most_once():
    model = nn.Sequential(nn.Flatten(), nn.Linear(16, 2))
    images, labels = torch.rand(12, 1, 4, 4), torch.zeros(12, dtype=torch.long)
    correct = correct_predictions(model, images, labels, torch.device("cpu")).double()
    grouped = ImageSet(images, labels, torch.tensor([0] * 8 + [1] * 4))
    assert correct_units(model, grouped, torch.device("cpu")) == pytest.approx(
        float(correct[:8].mean() + correct[8:].mean()))


def test_grouped_central_images_and_features_are_one_mechanism_for_all_classes(tmp_path):
    base = ImageSet(torch.rand(30, 1, 4, 4), torch.arange(30) % 3, torch.arange(30) // 3)
    ledger = PrivacyLedger(tmp_path / "ledger.json")
    central_images(base, 3, CentralQuery("mean", 2, 0.5, 3.0, 2.0, 4, 50.0), ledger, "central", secret_stream())
    noisy_class_means(base, 3, RFF, FrequencyQuery(4.0, 50.0), ledger, "frequency", secret_stream())
    assert ledger.events() == [SubsampledGaussianMechanism(3.0, 0.5, 2), GaussianMechanism(50.0),
                               GaussianMechanism(4.0), GaussianMechanism(50.0)]


def test_a_grouped_run_releases_with_one_group_as_the_unit(tmp_path):
    grouped_npz(tmp_path / "scans.npz")
    tiny = ["model.block_channels=[8, 16]", "model.norm_groups=4", "dpsgd.batch_size=8", "dpsgd.epochs=1",
            "sampling.num_samples=4", "diffusion.sample_steps=2", "evaluation.enabled=false",
            "privacy.dataset_size=60", "privacy.max_images_per_group=2", f"run.out_dir={tmp_path}"]
    run = finished_run("dpdm", "--dataset", "npz", "--data-dir", str(tmp_path / "scans.npz"), "--epsilon", "8",
                       *[arg for pair in tiny for arg in ("--set", pair)])
    privacy = json.loads((run / "release" / "privacy.json").read_text())
    assert privacy["unit"].startswith("one person (") and "at most 2 of a person's images" in privacy["unit"]
    assert privacy["dataset_size"] == 48 and privacy["dataset_size_rule"] == "declared"  # 60 people less 2 x 10 %
    steps = privacy["stages"][0]["mechanisms"][0]
    assert steps["sample_rate"] == pytest.approx(8 / 48)
    logged = [json.loads(line) for line in (run / "log.jsonl").read_text().splitlines()]
    assert next(e for e in logged if e["event"] == "groups") == {**next(e for e in logged if e["event"] == "groups"),
                                                                 "train_groups": 48, "capped": 48, "cap": 2}
    report = (run / "report.html").read_text()
    assert "Groups: the training split holds 48, the largest 3 images; 48 hold more than the 2" in report
    assert dpsynth_main("audit", "dp-sgd-group-step", "--trials", "200").code == 0


@pytest.mark.parametrize("method", ["dp-feta", "feta-pro", "dp-merf", "pe", "privimage", "dp-imgsyn", "dp-sad"])
def test_every_mechanism_runs_over_groups_spanning_classes(tmp_path, method):
    digits = load_digits()
    np.savez(tmp_path / "digits.npz", images=(digits.images[:, None] * 255 / 16).astype(np.uint8),
             labels=digits.target, class_names=np.array([str(d) for d in range(10)]),
             groups=np.arange(len(digits.target)) // 3)  # three consecutive digits per person: classes mixed
    config = resolve_config(method, dataset="npz", data_dir=str(tmp_path / "digits.npz"), epsilon=8, preset="cpu",
                            overrides=[*METHODS[method].declaration.smoke, *COMMON, "privacy.dataset_size=599",
                                       f"run.out_dir={tmp_path}"])
    run = start(config).path  # the Python API
    privacy = json.loads((run / "release" / "privacy.json").read_text())
    assert privacy["unit"].startswith("one person (") and privacy["epsilon"] <= 8
    ledger = json.loads((run / "ledger.json").read_text())
    assert "parallel" not in json.dumps(ledger)  # a group's images may be of several classes
