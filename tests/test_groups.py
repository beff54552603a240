"""One person, several images: groups in the data, a split that keeps them whole, DP-SGD over groups."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from conftest import dpsynth_main, finished_run
from PIL import Image
from torch import nn

from dpsynth.api import dataset_from_config, plan_budget_for, resolve_config
from dpsynth.data import load_dataset
from dpsynth.errors import ConfigError, DataError
from dpsynth.privacy import PrivacyLedger
from dpsynth.privacy.audit import AUDITS, run_audit
from dpsynth.privacy.dpsgd import DPSGD, DpsgdSettings, Groups
from dpsynth.privacy.randomness import SecretStream


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


def test_group_dpsgd_audit_finds_nothing_above_the_claim():
    result = run_audit("dp-sgd-group-step", AUDITS["dp-sgd-group-step"](), 1000, 1e-5, 0)
    assert result.lower_bound <= result.claimed_epsilon


def test_methods_that_bound_single_images_refuse_groups(tmp_path):
    grouped_npz(tmp_path / "scans.npz")
    config = resolve_config("dp-feta", dataset="npz", data_dir=str(tmp_path / "scans.npz"), epsilon=8,
                            preset="cpu", overrides=["privacy.dataset_size=60"])
    with pytest.raises(ConfigError, match="dp-feta bounds what one image contributes, not one group"):
        plan_budget_for(config, dataset_from_config(config).info)


def test_a_grouped_run_releases_with_one_group_as_the_unit(tmp_path):
    grouped_npz(tmp_path / "scans.npz")
    tiny = ["model.block_channels=[8, 16]", "model.norm_groups=4", "dpsgd.batch_size=8", "dpsgd.epochs=1",
            "sampling.num_samples=4", "diffusion.sample_steps=2", "evaluation.enabled=false",
            "privacy.dataset_size=60", "privacy.max_images_per_group=2", f"run.out_dir={tmp_path}"]
    run = finished_run("dpdm", "--dataset", "npz", "--data-dir", str(tmp_path / "scans.npz"), "--epsilon", "8",
                       *[arg for pair in tiny for arg in ("--set", pair)])
    privacy = json.loads((run / "release" / "privacy.json").read_text())
    assert privacy["unit"].startswith("one group of images") and "at most 2 of a group's images" in privacy["unit"]
    assert privacy["dataset_size"] == 48 and privacy["dataset_size_rule"] == "declared"  # 60 people less 2 x 10 %
    steps = privacy["stages"][0]["mechanisms"][0]
    assert steps["sample_rate"] == pytest.approx(8 / 48)
    logged = [json.loads(line) for line in (run / "log.jsonl").read_text().splitlines()]
    assert next(e for e in logged if e["event"] == "groups") == {**next(e for e in logged if e["event"] == "groups"),
                                                                 "train_groups": 48, "capped": 48, "cap": 2}
    assert dpsynth_main("audit", "dp-sgd-group-step", "--trials", "200").code == 0
