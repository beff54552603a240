"""What a release may show and what the substrate must not leak: release/ written only by the release step, the
public size of the training set, per-example gradients that never mix examples, the noise grid, rounded counts,
checkpoints without noise keys, resumes that keep their plan, checked fingerprints, one selection ledger per
validation split."""
from __future__ import annotations

import json
import math
import re

import numpy as np
import pytest
import torch
import yaml
from conftest import MERF, secret_stream, stopped_smoke_run
from torch import nn

from dpsynth import __version__
from dpsynth.api import dataset_from_config, plan_privacy, resolve_config, synthetic_dataset
from dpsynth.cli import main
from dpsynth.data import load_dataset
from dpsynth.data.fingerprints import FINGERPRINTS, load_fingerprints
from dpsynth.errors import DataError, DpsynthError, PrivacyWarning
from dpsynth.evaluation import selection_ledger
from dpsynth.methods.dp_merf.method import DPMERF
from dpsynth.pipeline import resume, start
from dpsynth.privacy import GaussianMechanism, PrivacyLedger, ReportNoisyMax, default_delta
from dpsynth.privacy.dataset_facts import SIZE
from dpsynth.privacy.dpsgd import DPSGD, DpsgdSettings
from dpsynth.privacy.mechanisms import release_gaussian
from dpsynth.privacy.per_example import BatchedGradients, unsupported
from dpsynth.privacy.randomness import normals, uniforms
from dpsynth.privacy.semantic_histogram import semantic_histogram
from dpsynth.provenance import source_commit
from dpsynth.report import write_run_report
from dpsynth.runs import RunDirectory


def tiny_run(tmp_path, dataset: str = "digits", data_dir: str | None = None, *extra: str) -> RunDirectory:
    """A finished DP-MERF run (the cheapest method) on ``dataset``."""
    config = resolve_config("dp-merf", dataset=dataset, data_dir=data_dir, epsilon=5.0, preset="cpu",
                            overrides=[*MERF, f"run.out_dir={tmp_path / 'runs'}", *extra])
    return start(config)


def numbers(value: object) -> list[float]:
    """Every number in a JSON value."""
    if isinstance(value, dict):
        return [n for item in value.values() for n in numbers(item)]
    if isinstance(value, list):
        return [n for item in value for n in numbers(item)]
    return [value] if isinstance(value, (int, float)) and not isinstance(value, bool) else []


def test_evaluating_a_released_file_writes_nothing_into_release_and_the_report_marks_only_the_manifest(tmp_path):
    run = tiny_run(tmp_path)
    release = run.file("release")
    before = sorted(path.name for path in release.iterdir())
    npz = release / "synthetic.npz"
    small = ["--set", "evaluation.num_synthetic=20", "--set", "evaluation.num_real=20", "--set",
             "evaluation.classifiers=[]", "--set", "evaluation.kid_subset_size=10", "--set", "evaluation.kid_subsets=2",
             "--set", f"evaluation.cache_dir={tmp_path / 'cache'}", "--device", "cpu"]
    assert main(["evaluate", str(npz), "--dataset", "digits", "--out", str(release / "mine"), *small]) == 2
    assert main(["evaluate", str(npz), "--dataset", "digits", *small]) == 0
    assert sorted(path.name for path in release.iterdir()) == before  # nothing new inside release/
    assert (run.path / "synthetic-evaluation" / "nearest_neighbours.png").is_file()  # on the private side
    manifest = json.loads(run.file("release/privacy.json").read_text())["release_files"]
    assert set(manifest) == {"synthetic.npz", "samples.png", "README.md"}
    (release / "stray.png").write_bytes(b"not the release step's")
    assert run.released_files() == {release / name for name in ("privacy.json", *manifest)}
    rows = dict(re.findall(r"<code>(release/[^<]+)</code></td><td[^>]*>[^<]*</td><td>(.*?)</td>",
                           write_run_report(run).read_text()))
    assert rows["release/stray.png"] == "private" and "release: may be shared" in rows["release/synthetic.npz"]
    (release / "samples.png").write_bytes(b"changed since")
    assert release / "samples.png" not in run.released_files()


def test_a_release_carries_its_datasheet_and_provenance_and_loads_as_a_torch_dataset(tmp_path):
    run = tiny_run(tmp_path)
    report = json.loads(run.file("release/privacy.json").read_text())
    sheet = run.file("release/README.md").read_text()
    assert report["dpsynth"] == {"version": __version__, "commit": source_commit()} and report["public_data"] == {}
    assert f"(ε, δ) = ({report['epsilon']:.4f}, {report['delta']:.3g})" in sheet
    assert DPMERF.declaration.paper.url in sheet and f"commit {report['dpsynth']['commit']}" in sheet
    assert "of one image" in sheet and "No public image set was read" in sheet and "NOT private" not in sheet
    labels = np.load(run.file("release/synthetic.npz"))["labels"]
    per_class = dict(re.findall(r"^\| (\d) \| ([\d,]+) \|$", sheet, re.MULTILINE))
    assert per_class == {str(c): f"{n:,}" for c, n in enumerate(np.bincount(labels, minlength=10))}
    dataset = synthetic_dataset(run.file("release/synthetic.npz"))
    image, label = dataset[3]
    assert len(dataset) == len(labels) and image.shape == (1, 8, 8) and image.dtype == torch.float32
    assert 0 <= image.min() <= image.max() <= 1 and label == labels[3]
    with pytest.raises(DataError, match="config.yaml: not a readable .npz"):
        synthetic_dataset(run.file("config.yaml"))


def test_a_standard_set_releases_its_published_size_and_own_data_a_noisy_count(tmp_path, own_npz):
    published = tiny_run(tmp_path)
    report = json.loads(published.file("release/privacy.json").read_text())
    assert (report["neighbouring"], report["dataset_size_rule"], report["dataset_size"]) == ("add-remove",
                                                                                             "published", 1437)
    assert SIZE.stage not in [stage["name"] for stage in report["stages"]]

    with pytest.warns(PrivacyWarning):  # a seeded run, so that its noisy count is known to differ from the truth
        own = tiny_run(tmp_path, "npz", own_npz, "run.seed=1")
    report = json.loads(own.file("release/privacy.json").read_text())
    exact = load_dataset("npz", own_npz).info.split_sizes["train"]
    noisy_total = own.config()["drawn"]["dataset_size"]
    assert abs(noisy_total - 1797) < 6 * SIZE.noise and noisy_total != 1797
    assert report["dataset_size_rule"] == "noisy" and report["dataset_size"] == noisy_total - 2 * round(
        0.1 * noisy_total)
    assert report["stages"][0]["name"] == SIZE.stage
    assert report["stages"][0]["mechanisms"][0]["noise_multiplier"] == SIZE.noise
    assert report["delta"] == pytest.approx(default_delta(report["dataset_size"]))  # delta from the public size
    sample_rate = report["stages"][1]["mechanisms"][0]["sample_rate"]
    assert sample_rate == 1.0  # DP-MERF's one release: no size in it either
    for path in own.file("release").glob("*.json"):  # the exact size is nowhere in the release
        assert not {exact, 1797} & set(numbers(json.loads(path.read_text())))
    sheet = own.file("release/README.md").read_text()
    assert f"{report['dataset_size']:,}" in sheet  # the datasheet names the public size ...
    assert not {exact, 1797} & {int(n.replace(",", "")) for n in re.findall(r"\d[\d,]*", sheet)}  # ... only
    ledger = PrivacyLedger.load(own.file("ledger.json"))
    assert ledger.stages()[SIZE.stage] == [GaussianMechanism(SIZE.noise)]

    declared = tiny_run(tmp_path, "npz", own_npz, "privacy.dataset_size=1800", "dataset.title=Digits of 2026",
                        "dataset.description=Scanned by the clinic; for training triage models.")
    report = json.loads(declared.file("release/privacy.json").read_text())
    assert (report["dataset_size_rule"], report["dataset_size"]) == ("declared", 1800 - 180 - 180)
    assert SIZE.stage not in [stage["name"] for stage in report["stages"]]
    sheet = declared.file("release/README.md").read_text()
    assert sheet.startswith("# Digits of 2026\n\nScanned by the clinic; for training triage models.\n")
    assert f"at most e^ε = {math.exp(report['epsilon']):,.0f} times" in sheet
    assert f"times smaller than 1/N = {1 / 1440:.3g} for N = 1,440 images" in sheet
    assert "The unit is one image. A person with k images" in sheet and "facts about the population" in sheet
    assert "the same number of images of every class (up to one)" in sheet and "not a proof of privacy" in sheet


def test_a_plan_for_own_data_samples_at_the_public_rate_and_its_noisy_size_costs_dp_sgd_almost_nothing(own_npz):
    config = resolve_config("dpdm", dataset="npz", data_dir=own_npz, epsilon=1.0, preset="cpu",
                            overrides=["dpsgd.batch_size=64", "privacy.dataset_size=2000"])
    assert plan_privacy(config, dataset_from_config(config).info)["stages"][0]["mechanisms"][0]["sample_rate"] == \
        pytest.approx(64 / 1600)
    config["privacy"]["dataset_size"] = 1797  # the true size, declared public
    (declared,) = plan_privacy(config, dataset_from_config(config).info)["stages"]
    config["privacy"]["dataset_size"] = "auto"  # not public: a noisy count, planned at the exact size until drawn
    size, noisy = plan_privacy(config, dataset_from_config(config).info)["stages"]
    assert size["name"] == SIZE.stage and size["mechanisms"][0]["noise_multiplier"] == SIZE.noise
    sigma, sigma_declared = noisy["mechanisms"][0]["noise_multiplier"], declared["mechanisms"][0]["noise_multiplier"]
    assert sigma_declared < sigma < 1.003 * sigma_declared  # measured: 1.8957 -> 1.8987 at epsilon = 1


def batch_mixing() -> nn.Module:
    """Conv -> BatchNorm without parameters or running statistics -> Linear: the batch's statistics mix examples."""
    return nn.Sequential(nn.Conv2d(1, 4, 3), nn.BatchNorm2d(4, affine=False, track_running_stats=False), nn.Flatten(),
                         nn.Linear(144, 1))


def test_an_operation_across_the_batch_takes_vmap_and_one_record_moves_the_clipped_sum_by_at_most_c():
    torch.manual_seed(0)
    model = batch_mixing()
    assert "1 is a BatchNorm2d, not on the batched engine's allow-list" in unsupported(model)
    data = torch.randn(16, 1, 8, 8)

    def clipped_sum(records: torch.Tensor) -> torch.Tensor:
        copy = batch_mixing()
        copy.load_state_dict(model.state_dict())
        engine = DPSGD(copy, torch.optim.SGD(copy.parameters(), lr=1.0), lambda f, x: f(x[None]).sum(),
                       settings=DpsgdSettings(1e-9, 1.0, 1.0, 16), num_records=len(records), ledger=PrivacyLedger(),
                       stage="dp-sgd", noise=secret_stream(),
                       batch_loss=lambda f, x: f(x).squeeze(1))
        before = torch.cat([p.detach().flatten() for p in copy.parameters()])
        engine.step(lambda index: (records[index],))  # SGD at rate 1: the step is the noisy sum / N
        assert engine.engine is not None and engine.engine["per_example"] == "vmap"
        return (before - torch.cat([p.detach().flatten() for p in copy.parameters()])) * len(records)

    assert float((clipped_sum(data) - clipped_sum(data[1:])).norm()) <= 1.0 + 1e-3


def test_the_probe_finds_a_loss_that_mixes_examples_in_an_allowed_model():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(1, 2, 3), nn.Flatten(), nn.Linear(72, 1))
    assert unsupported(model) is None
    params = dict(model.named_parameters())
    batch, others = [torch.rand(8, 1, 8, 8)], [torch.rand(8, 1, 8, 8)]
    alone = BatchedGradients(model, lambda f, x: f(x).squeeze(1) ** 2, params)
    def centred(forward, x: torch.Tensor) -> torch.Tensor:  # each loss less the batch's mean: mixes examples
        out = forward(x).squeeze(1)
        return (out - out.mean()) ** 2

    normalised = BatchedGradients(model, centred, params)
    assert alone.independent(batch, others) and not normalised.independent(batch, others)


def test_the_noise_grid_is_open_and_symmetric():
    words = np.array([0, 2 ** 64 - 1, 2 ** 63 - 1, 2 ** 63, 2 ** 52 - 1, 2 ** 63 + 2 ** 52 - 1], dtype=np.uint64)
    u, z = uniforms(words), normals(words)
    assert 0 < float(u.min()) and float(u.max()) < 1 and float(u[0] + u[1]) == 1.0
    assert torch.isfinite(z).all() and float(z[0]) == -float(z[3]) == pytest.approx(8.2924, abs=1e-4)
    draws = secret_stream(5).normal(200_000)
    assert abs(float(draws.mean())) < 0.01 and abs(float(draws.std()) - 1) < 0.01


def reachable(output: float, count: float, std: float, rounded: bool) -> bool:
    """Whether ``count`` plus a normal of the stream's grid times ``std`` (rounded or not) can equal ``output``
    exactly: the float64 lattice test a neighbour's count must pass (Mironov 2012)."""
    if rounded and output != round(output):
        return False  # a rounded release is a whole number
    target = (output - count) / std
    sign = 1.0 if target <= 0 else -1.0
    p = float(torch.special.ndtr(torch.tensor(sign * target, dtype=torch.float64)))
    spacing = std * 2.0 ** -53 / max(float(torch.exp(torch.tensor(-target ** 2 / 2))) * 0.3989, 1e-300)
    if spacing < (1.0 if rounded else float(np.spacing(abs(output)))):
        return True  # the grid is finer than the output's resolution there: every output is reached
    width = int(np.spacing(abs(output)) / spacing) + 4
    k = np.arange(max(0, int(p * 2.0 ** 53) - width), int(p * 2.0 ** 53) + width, dtype=np.uint64)
    z = sign * torch.special.ndtri(torch.from_numpy((k.astype(np.float64) + 0.5) * 2.0 ** -53))
    values = torch.tensor(count, dtype=torch.float64) + z * std
    return bool(((values.round() if rounded else values) == output).any())


def test_released_counts_are_whole_numbers_a_neighbour_can_always_reach():
    counts, std = torch.full((2000,), 10_000.0, dtype=torch.float64), 300.0
    raw = release_gaussian(counts, 1.0, std, PrivacyLedger(), "histogram", secret_stream(6))
    assert all(reachable(float(y), 10_000.0, std, False) for y in raw[:200])  # the checker accepts the truth
    ruled_out = sum(not reachable(float(y), 10_001.0, std, False) for y in raw)
    assert ruled_out > 0  # a float64 release can exclude the neighbour's count
    top = torch.randint(0, 40, (10_000, 4))
    noisy = semantic_histogram(top, torch.zeros(10_000, dtype=torch.long), torch.ones(10_000), 1, 40, std,
                               PrivacyLedger(), "histogram", secret_stream(7))[0]
    assert torch.equal(noisy, noisy.round())
    exact = torch.bincount(top.flatten(), minlength=40).double()
    assert all(reachable(float(y), float(c) + 1, std * 2, True) for y, c in zip(noisy, exact, strict=True))
    unrounded = release_gaussian(exact, 1.0, std, PrivacyLedger(), "histogram", secret_stream(8))
    assert not any(reachable(float(y), float(c), std, True) for y, c in zip(unrounded, exact, strict=True))


def test_a_release_strips_the_noise_key_and_a_resume_refuses_an_edited_config(tmp_path):
    run = stopped_smoke_run("dp-merf", tmp_path)
    saved = torch.load(run.file("checkpoint.pt"), weights_only=True)
    assert len(bytes.fromhex(saved["state"]["rng"]["noise"]["key"])) == 32  # resumable: the key is there
    edited = yaml.safe_load(run.file("config.yaml").read_text())
    edited["dataset"]["split_seed"] = 1
    run.file("config.yaml").write_text(yaml.safe_dump(edited))
    with pytest.raises(DpsynthError, match="dataset.split_seed is 1, but the run's checkpoint was made with 0"):
        resume(str(run.path))
    edited["dataset"]["split_seed"] = 0
    run.file("config.yaml").write_text(yaml.safe_dump(edited))
    resume(str(run.path))
    saved = torch.load(run.file("checkpoint.pt"), weights_only=True)
    assert saved["state"]["rng"]["noise"] == {"draws": saved["state"]["rng"]["noise"]["draws"]}  # key gone


def test_fingerprints_that_cannot_cover_the_training_images_are_refused(tmp_path):
    np.save(tmp_path / FINGERPRINTS, np.zeros(0, np.uint64))
    with pytest.raises(DataError, match="holds 0 fingerprints"):
        load_fingerprints(tmp_path)
    np.save(tmp_path / FINGERPRINTS, np.arange(3, dtype=np.uint64))
    with pytest.raises(DataError, match="holds 3 fingerprints, expected 9920"):
        load_fingerprints(tmp_path, expected=9920)
    with pytest.raises(DataError, match="expected 1 to 2"):
        load_fingerprints(tmp_path, at_most=2)
    assert len(load_fingerprints(tmp_path, expected=3)) == 3


def test_model_selection_on_one_validation_split_adds_up_whatever_release_or_folder():
    digits = load_dataset("digits")
    selection_ledger(digits, 0).record("model-selection", ReportNoisyMax(4.0), "evaluation")
    selection_ledger(load_dataset("digits"), 0).record("model-selection", ReportNoisyMax(2.0), "evaluation")
    assert len(selection_ledger(digits, 0).events("evaluation")) == 2
    assert len(selection_ledger(load_dataset("digits", split_seed=1), 1).events("evaluation")) == 0
