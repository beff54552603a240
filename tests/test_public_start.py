"""Public pre-training: the glyphs dataset, `dpsynth pretrain --for`, starting DP-SGD methods from a public model
(model.init_from, PDP-Diffusion), and DP-MERF."""
from __future__ import annotations

import json
import warnings

import numpy as np
import pytest
import torch
from conftest import absolute_paths, privacy_report, secret_stream
from safetensors.torch import load_file

from dpsynth.api import resolve_config
from dpsynth.bench import Cell
from dpsynth.bench.results import cell_row
from dpsynth.cli import main
from dpsynth.data import load_dataset
from dpsynth.data.fingerprints import fingerprints
from dpsynth.data.glyphs import GLYPH_CLASSES
from dpsynth.diffusion import Diffusion
from dpsynth.diffusion.pretrain import PretrainSettings, init_from_public, pretrain, spread_rows, spread_start
from dpsynth.diffusion.settings import TRAINABLE_GROUPS
from dpsynth.errors import ConfigError, DataError
from dpsynth.methods import base as methods_base
from dpsynth.methods import get_method, run_config_of
from dpsynth.models import build_unet
from dpsynth.models.unet import PARAMETER_GROUPS, train_only
from dpsynth.pipeline import start
from dpsynth.privacy import Accountant, GaussianMechanism, PrivacyLedger
from dpsynth.privacy.semantic_histogram import semantic_histogram
from dpsynth.utils.images import as_floats
from dpsynth.utils.io import directory_sha256

UNET = ["model.block_channels=[8, 16]", "model.norm_groups=4", "diffusion.sample_steps=2"]
DPSGD = ["dpsgd.batch_size=64", "dpsgd.epochs=0.2", "dpsgd.checkpoint_every=10"]
RUN = ["sampling.num_samples=20", "evaluation.enabled=false", "privacy.accountant=rdp"]


def glyphs(resolution: int = 8, count: int = 124):
    return load_dataset("glyphs", resolution=resolution, num_images=count)


def public_model(tmp_path, method: str = "dpdm", overrides: tuple[str, ...] = (), data=None):
    config = run_config_of(resolve_config(method, preset="cpu", overrides=[*UNET, *overrides]))
    data = data if data is not None else glyphs()
    return pretrain(data.train, tmp_path / "public", PretrainSettings.for_method(config, iterations=3, batch_size=8),
                    torch.device("cpu"), data.info.class_names, data.info.name)


def run_on_digits(tmp_path, method: str, *overrides: str, tiny: tuple[str, ...] = (*UNET, *DPSGD)):
    config = resolve_config(method, dataset="digits", epsilon=8.0, preset="cpu",
                            overrides=[*tiny, *RUN, f"run.out_dir={tmp_path}", *overrides])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the tiny configuration's small-batch warnings
        return start(config).path


def test_glyphs_are_62_balanced_classes_rendered_the_same_every_time():
    first, again = glyphs(count=248), glyphs(count=248)
    assert first.info.class_names == list(GLYPH_CLASSES) and first.info.shape == (1, 8, 8)
    everything = torch.cat([first.train.labels, first.val.labels, first.test.labels])
    assert torch.bincount(everything).tolist() == [4] * 62
    assert np.array_equal(fingerprints(first.train.images), fingerprints(again.train.images))
    assert as_floats(first.train.images).std() > 0.1
    with pytest.raises(DataError, match="dataset.num_images: glyphs needs a whole number >= 62"):
        glyphs(count=10)


def test_a_started_model_predicts_what_the_public_model_predicts_unconditionally(tmp_path):
    out = public_model(tmp_path)
    record = json.loads((out / "pretraining.json").read_text())
    assert record["class_names"] == list(GLYPH_CLASSES) and record["settings"]["prediction"] == "v"
    assert (out / "fingerprints.npy").exists()
    private = build_unet(1, 8, 10, [8, 16], 1, True, 4)
    done = init_from_public(private, out, [str(d) for d in range(10)], Diffusion(prediction="v"))
    assert done["class_embedding"].startswith("the public null class")
    from diffusers import UNet2DModel
    public = UNet2DModel.from_pretrained(out, subfolder="unet").eval()
    x, t = torch.randn(4, 1, 8, 8), torch.tensor([10, 200, 500, 900])
    with torch.no_grad():
        expected = public(x, t, class_labels=torch.full((4,), 62)).sample
        for labels in (torch.tensor([0, 3, 9, 10]), torch.full((4,), 10)):
            assert torch.allclose(private.eval()(x, t, class_labels=labels).sample, expected, atol=1e-5)


def test_spread_starts_each_private_class_at_its_own_public_class_row_chosen_farthest_apart(tmp_path):
    out = public_model(tmp_path)
    private = build_unet(1, 8, 10, [8, 16], 1, True, 4)
    done = init_from_public(private, out, [str(d) for d in range(10)], Diffusion(prediction="v"), class_start="spread")
    assert done["class_embedding"].startswith("public class rows spread apart")
    from diffusers import UNet2DModel
    public = UNet2DModel.from_pretrained(out, subfolder="unet").class_embedding.weight.detach()
    started = private.class_embedding.weight.detach()
    chosen = spread_rows(public[:-1], 10)
    assert len(set(chosen.tolist())) == 10 and torch.equal(started[:10], public[chosen])
    assert torch.equal(started[10], public[-1])  # the null row from the public null row
    spread = torch.pdist(started[:10]).min()
    assert spread >= torch.pdist(public[:10]).min()  # no closer than the first ten public classes
    three = spread_rows(public[:3], 3).tolist()
    assert spread_rows(public[:3], 5).tolist() == three + three[:2]  # fewer public rows: reused in turn
    two = public[:2]  # e.g. photo-patches' two photographs: the reused rows are moved apart by the rows' spread
    started = spread_start(two, 5)
    assert torch.equal(started[:2], two[spread_rows(two, 2)]) and torch.pdist(started).min() > 0.1 * torch.pdist(two)
    moved = (started[2:] - two[spread_rows(two, 5)[2:]]).abs().mean(0)
    assert torch.allclose(moved.mean(), (0.8 * two.std(0)).mean(), rtol=0.5)  # E|N(0, s^2)| = 0.8 s


def test_a_public_model_of_another_shape_or_diffusion_is_refused_by_name(tmp_path):
    out = public_model(tmp_path)
    with pytest.raises(ConfigError, match=r"model.block_channels: \[8, 32\] here, \[8, 16\] there"):
        init_from_public(build_unet(1, 8, 10, [8, 32], 1, True, 4), out, [], Diffusion(prediction="v"))
    with pytest.raises(ConfigError, match="diffusion.prediction is 'epsilon' here, 'v' there"):
        init_from_public(build_unet(1, 8, 10, [8, 16], 1, True, 4), out, [], Diffusion(prediction="epsilon"))
    with pytest.raises(ConfigError, match="is not a model written by dpsynth pretrain"):
        init_from_public(build_unet(1, 8, 10, [8, 16], 1, True, 4), tmp_path, [], Diffusion(prediction="v"))


def test_a_run_from_a_public_model_spends_what_a_run_from_scratch_spends(tmp_path):
    out = public_model(tmp_path)
    scratch = run_on_digits(tmp_path / "scratch", "dpdm")
    started = run_on_digits(tmp_path / "started", "pdp-diffusion", f"model.init_from={out}")
    assert PrivacyLedger.load(started / "ledger.json") == PrivacyLedger.load(scratch / "ledger.json")
    assert privacy_report(started)["epsilon"] == privacy_report(scratch)["epsilon"]
    (named,) = privacy_report(started)["public_data"]  # by the model's folder name and weights, not where it lies
    weights = directory_sha256(out / "unet")
    assert named == f"the training data of model.init_from 'public' (its unet/ SHA-256 {weights})"
    for path in [*(started / "release").glob("*.json"), *(started / "release").glob("*.md")]:
        assert not absolute_paths(path.read_text()), path
    log = [json.loads(line) for line in (started / "log.jsonl").read_text().splitlines()]
    (entry,) = [e for e in log if e["event"] == "public model"]
    assert entry["dataset"] == "glyphs" and entry["directory"] == str(out)
    record = json.loads((out / "pretraining.json").read_text())
    public_cost = {path: cell_row(path, Cell("dpdm", "digits", 8.0))["public_pretraining_min"]
                   for path in (scratch, started)}
    assert public_cost == {scratch: None, started: round(record["seconds"] / 60, 2)}


def test_a_public_start_may_dp_train_some_parameter_groups_and_the_rest_stay_the_public_models(tmp_path):
    out = public_model(tmp_path)
    run = run_on_digits(tmp_path / "part", "pdp-diffusion", f"model.init_from={out}", "release.model=true",
                        "model.trainable=[norms, class_embedding]")
    released = load_file(run / "release" / "model.safetensors")
    public = load_file(out / "unet" / "diffusion_pytorch_model.safetensors")
    trained = {name for name in released if PARAMETER_GROUPS["norms"](name) or name.startswith("class_embedding.")}
    assert trained and all(torch.equal(released[name], public[name]) for name in public if name not in trained)
    assert any(not torch.equal(released[name], public[name]) for name in trained if name in public)
    log = [json.loads(line) for line in (run / "log.jsonl").read_text().splitlines()]
    (entry,) = [e for e in log if e["event"] == "trainable"]
    model = build_unet(1, 8, 10, [8, 16], 1, True, 4)
    assert entry["parameters"] == train_only(model, ["norms", "class_embedding"])[0] < entry["of"] / 10
    with pytest.raises(ConfigError, match=r"model.trainable \['norms'\] DP-trains part of a UNet that starts at"):
        run_on_digits(tmp_path / "scratch", "dpdm", "model.trainable=[norms]")
    with pytest.raises(ConfigError, match="model.trainable: dp-sad DP-trains its teacher and its student whole"):
        get_method("dp-sad")(resolve_config("dp-sad", dataset="digits", overrides=["model.trainable=[norms]"]))
    with pytest.raises(ConfigError, match=r"model.trainable must be \[all\] or a list of norms, biases"):
        get_method("dpdm")(resolve_config("dpdm", dataset="digits", overrides=["model.trainable=[all, norms]"]))
    assert set(TRAINABLE_GROUPS) == set(PARAMETER_GROUPS)


def test_pdp_diffusion_needs_a_public_model_that_holds_no_private_image(tmp_path, capsys):
    assert main(["privacy", "pdp-diffusion", "--dataset", "digits"]) == 2
    assert "--init-from DIR (model.init_from)" in capsys.readouterr().err
    digits = load_dataset("digits")
    out = public_model(tmp_path, data=digits)
    with pytest.raises(DataError, match="model.init_from .* is not disjoint from the private dataset 'digits'"):
        run_on_digits(tmp_path / "runs", "dpdm", f"model.init_from={out}")
    (out / "fingerprints.npy").unlink()
    with pytest.raises(DataError, match="holds no fingerprints.npy"):
        run_on_digits(tmp_path / "runs", "dpdm", f"model.init_from={out}")


def test_pretrain_for_a_method_prints_how_to_start_from_it(tmp_path, capsys):
    out = tmp_path / "public"
    assert main(["pretrain", "--dataset", "glyphs", "--for", "dp-feta", "--out", str(out), "--iterations", "1",
                 "--batch-size", "4", "--set", "dataset.resolution=8", "--set", "dataset.num_images=62",
                 "--set", "model.block_channels=[8, 16]", "--set", "model.norm_groups=4", "--device", "cpu"]) == 0
    assert f"dpsynth run dp-feta --init-from {out}" in capsys.readouterr().out
    assert json.loads((out / "pretraining.json").read_text())["settings"]["block_channels"] == [8, 16]
    assert main(["pretrain", "--dataset", "glyphs", "--for", "pe", "--out", str(tmp_path / "x")]) == 2
    assert "methods that do: dp-feta, dp-ldm, dp-sad, dpdm, feta-pro, pdp-diffusion" in capsys.readouterr().err


def test_dp_merf_releases_its_means_once_with_the_calibrated_noise(tmp_path):
    run = run_on_digits(tmp_path, "dp-merf", tiny=("frequency.features=100", "generator.epochs=1",
                                                   "generator.iterations_per_epoch=3", "generator.latent=8",
                                                   "generator.width=16"))
    (event,) = PrivacyLedger.load(run / "ledger.json").events()
    assert isinstance(event, GaussianMechanism) and event.count == 1
    delta = privacy_report(run)["delta"]
    assert Accountant("rdp").epsilon([event], delta) == pytest.approx(8.0, rel=1e-3)
    with np.load(run / "release" / "synthetic.npz") as release:
        assert release["images"].shape == (20, 1, 8, 8) and set(release["labels"].tolist()) == set(range(10))


def test_privimage_pretrains_on_the_classes_its_dp_histogram_selects_then_spends_the_rest_on_dp_sgd(tmp_path,
                                                                                                      monkeypatch):
    loads, load = [], methods_base.load_public
    monkeypatch.setattr(methods_base, "load_public", lambda *args: (loads.append(args[0]), load(*args))[1])
    run = run_on_digits(tmp_path, "privimage", "selection.public_num_images=124", "selection.top_k=2",
                        "selection.classifier_epochs=1", "selection.ratio=0.1", "public_pretrain.iterations=2",
                        "public_pretrain.batch_size=8")
    histogram, dpsgd = PrivacyLedger.load(run / "ledger.json").events()
    assert histogram == GaussianMechanism(50.0) and dpsgd.steps == int(0.2 / (64 / 1437))
    assert privacy_report(run)["epsilon"] == pytest.approx(8.0, abs=0.01)
    log = [json.loads(line) for line in (run / "log.jsonl").read_text().splitlines()]
    (selection,) = [e for e in log if e["event"] == "public selection"]
    assert len(selection["classes"]) == 6 and set(selection["classes"]) <= set(GLYPH_CLASSES)
    # model.class_start matched: six of the ten digits get a chosen glyph class each, the other four none
    assert sorted(selection["matched"].values()) == sorted(selection["classes"])
    assert set(selection["matched"]) < set(map(str, range(10)))
    assert [e["phase"] for e in log if e["event"] == "warm-up"] == ["pretrain-public"]
    assert loads == ["glyphs"]  # the public set read once: the run's check of it and the fit share it


def test_the_semantic_histogram_counts_each_private_class_in_its_own_row_at_the_cost_of_one():
    ledger, top, labels = PrivacyLedger(), torch.tensor([[0, 1], [1, 2], [2, 3]]), torch.tensor([0, 0, 1])
    noisy = semantic_histogram(top, labels, torch.ones(3), 2, 4, 1e-6, ledger, "histogram", secret_stream(1))
    assert noisy.tolist() == [[1, 2, 1, 0], [0, 0, 1, 1]]
    assert ledger.events() == [GaussianMechanism(1e-6)]  # noise std 1e-6 x sqrt(2): one record's k = 2 counts


def test_privimage_refuses_a_class_start_it_does_not_implement():
    for method, wrong, allowed in [("privimage", "spread", "matched, shared"), ("dpdm", "matched", "shared, spread")]:
        config = resolve_config(method, overrides=[f"model.class_start={wrong}"])
        with pytest.raises(ConfigError, match=f"class_start must be one of {allowed} for {method}, got '{wrong}'"):
            get_method(method)(config)
