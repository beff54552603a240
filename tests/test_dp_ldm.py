"""DP-LDM (DP-SGD on a public autoencoder's latents) end to end, its autoencoder, and the rehearsal at zero epsilon."""
from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import dpsynth_main, run_directory, smoke

from dpsynth.api import dataset_from_config, plan_budget_for, resolve_config
from dpsynth.autoplan.plan import plan_inputs
from dpsynth.data import load_dataset
from dpsynth.errors import ConfigError, DataError, DpsynthError
from dpsynth.models.autoencoder import AutoencoderShape, load_autoencoder
from dpsynth.pipeline import resume, start
from dpsynth.privacy import PrivacyLedger
from dpsynth.rehearsal import priced_as_private, rehearsal_release, rehearse, stand_in_config
from dpsynth.training.autoencoder import AutoencoderTraining, _crops, default_autoencoder, train_autoencoder
from dpsynth.utils.io import sha256

SMOKE = smoke("dp-ldm")
TINY_SHAPE = AutoencoderShape(block_channels=(8, 16), norm_groups=4)


def glyphs(side: int, count: int = 64):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return load_dataset("glyphs", resolution=side, channels=1, num_images=count).train


def test_the_autoencoder_maps_each_image_alone_pads_an_odd_side_and_keeps_its_public_fingerprints(tmp_path):
    public = glyphs(28)
    saved = train_autoencoder([public], tmp_path / "ae", AutoencoderTraining(iterations=3, batch_size=8), TINY_SHAPE,
                              torch.device("cpu"), "tiny", "glyphs")
    assert saved.latent_shape() == (4, 16, 16)  # 28 px padded to 32, halved once
    images = public.images[:6].float() / 255
    latents = saved.encode(images, torch.device("cpu"), chunk=4)
    alone = torch.cat([saved.encode(image[None], torch.device("cpu")) for image in images])
    assert latents.shape == (6, 4, 16, 16) and torch.allclose(latents, alone, atol=1e-5)
    assert torch.allclose(saved.encode(public.images[:6], torch.device("cpu")), latents, atol=1e-5)  # uint8 as loaded
    assert 0 <= latents.min() and latents.max() <= 1
    decoded = saved.decode(latents, torch.device("cpu"))
    assert decoded.shape == (6, 1, 28, 28) and 0 <= decoded.min() and decoded.max() <= 1
    again = load_autoencoder(tmp_path / "ae")
    assert again.weights_sha256 == sha256(tmp_path / "ae" / "autoencoder.safetensors") == saved.weights_sha256
    assert again.record["private_images"] == 0 and len(again.fingerprints()) == again.record["fingerprints"] > 0
    (tmp_path / "ae" / "autoencoder.json").write_text("{")
    with pytest.raises(ConfigError, match="autoencoder.path: .*autoencoder.json or autoencoder.safetensors is dama"):
        load_autoencoder(tmp_path / "ae")
    with pytest.raises(ConfigError, match="holds no autoencoder"):
        load_autoencoder(tmp_path)


def test_an_autoencoder_trains_on_random_crops_and_encodes_whole_images(tmp_path):
    images = torch.arange(2 * 8 * 8, dtype=torch.float32).view(2, 1, 8, 8)
    crops = _crops(images, 4, torch.Generator().manual_seed(0))
    assert crops.shape == (2, 1, 4, 4)
    for image, crop in zip(images, crops, strict=True):  # each crop is a window of its own image
        top, left = divmod(int(crop[0, 0, 0]) - int(image[0, 0, 0]), 8)
        assert torch.equal(crop, image[:, top:top + 4, left:left + 4])
    assert _crops(images, 8, torch.Generator()) is images
    saved = train_autoencoder([glyphs(32)], tmp_path / "ae", AutoencoderTraining(iterations=2, batch_size=4, crop=15),
                              TINY_SHAPE, torch.device("cpu"), "cropped", "glyphs")
    assert saved.record["training"]["crop"] == 15 and saved.latent_shape() == (4, 16, 16)
    assert saved.encode(glyphs(32).images[:3], torch.device("cpu")).shape == (3, 4, 16, 16)


def test_the_default_colour_autoencoder_trains_on_the_grey_glyphs_beside_the_photographs(tmp_path):
    training = AutoencoderTraining(iterations=1, batch_size=4)
    saved = default_autoencoder(16, 3, torch.device("cpu"), cache_dir=str(tmp_path), training=training)
    assert saved.channels == 3 and saved.record["images"] == 2592  # the training splits (0.8) of both
    assert saved.decode(saved.encode(torch.rand(2, 3, 16, 16), torch.device("cpu")), torch.device("cpu")).shape == (
        2, 3, 16, 16)
    grey = default_autoencoder(16, 1, torch.device("cpu"), cache_dir=str(tmp_path), training=training)
    assert grey.channels == 1 and grey.folder != saved.folder


@pytest.mark.slow
def test_dp_ldm_runs_through_the_cli_and_names_its_autoencoder_in_privacy_json(tmp_path):
    sets = [arg for pair in [*SMOKE, f"run.out_dir={tmp_path}"] for arg in ("--set", pair)]
    done = dpsynth_main("run", "dp-ldm", "--dataset", "digits", "--epsilon", "6", "--preset", "cpu", *sets)
    assert done.code == 0, done.err
    run = run_directory(done.out)
    report = json.loads((run / "release" / "privacy.json").read_text())
    latent = report["latent_space"]
    assert report["epsilon"] <= 6 and latent["private_images_seen"] == 0 and latent["latent_shape"] == [4, 4, 4]
    (name,) = [key for key in report["public_data"] if key.startswith("autoencoder.path")]
    assert latent["autoencoder"] in name and report["public_data"][name]["distinct_images"] > 0
    cached = Path("~/.cache/dpsynth/autoencoders").expanduser() / latent["autoencoder"]
    assert latent["autoencoder_sha256"] == sha256(cached / "autoencoder.safetensors")
    (event,) = PrivacyLedger.load(run / "ledger.json").events()
    assert event.steps == int(0.2 / (64 / 1437))  # DPDM's DP-SGD, over the 1,437 training latents
    with np.load(run / "release" / "synthetic.npz") as release:
        assert release["images"].shape == (20, 1, 8, 8)  # decoded to the data's shape
    assert "autoencoder.path" in (run / "release" / "README.md").read_text()


def test_an_autoencoder_trained_on_the_private_images_or_for_another_shape_is_refused(tmp_path):
    done = dpsynth_main("pretrain", "--autoencoder", "--dataset", "digits", "--out", str(tmp_path / "private-ae"),
                        "--iterations", "2", "--batch-size", "8", "--device", "cpu")
    assert done.code == 0 and "autoencoder.path=" in done.out, done.err
    private_ae = f"autoencoder.path={tmp_path / 'private-ae'}"
    config = resolve_config("dp-ldm", dataset="digits", epsilon=6.0, preset="cpu",
                            overrides=[*SMOKE, f"run.out_dir={tmp_path}", private_ae])
    with pytest.raises(DataError, match="autoencoder.path 'private-ae'.* private"):
        start(config)
    assert not list(tmp_path.glob("dp-ldm-*"))  # refused before a run directory
    other = train_autoencoder([glyphs(16)], tmp_path / "ae-16", AutoencoderTraining(iterations=1, batch_size=4),
                              TINY_SHAPE, torch.device("cpu"), "ae-16", "glyphs")
    config["autoencoder"]["path"] = str(other.folder)
    with pytest.raises(ConfigError, match=r"encodes 1 x 16 x 16 images, but training reads 1 x 8 x 8"):
        start(config)
    both = dpsynth_main("pretrain", "--autoencoder", "--upscaler", "--dataset", "glyphs", "--out", str(tmp_path / "x"))
    assert both.code == 2 and "not both" in both.err


def stand_in_overrides(tmp_path: Path, *extra: str) -> list[str]:
    return [*SMOKE, f"run.out_dir={tmp_path / 'runs'}", "dataset.resolution=8", "dataset.channels=1",
            "privacy.dataset_size=600", *extra]


def test_a_rehearsal_reads_no_private_image_and_spends_nothing(tmp_path):
    private = tmp_path / "scans"
    for index in range(3):  # images that cannot be read: a read would stop the run
        (private / "a" / f"{index}.png").parent.mkdir(parents=True, exist_ok=True)
        (private / "a" / f"{index}.png").write_bytes(b"not an image")
    config = resolve_config("dp-ldm", dataset="folder", data_dir=str(private), epsilon=6.0, preset="cpu",
                            overrides=stand_in_overrides(tmp_path, "dpsgd.epochs=0.5", "privacy.accountant=pld"))
    run = rehearse(config, "glyphs", shrink=4, classes=10)
    plan = json.loads(run.file("rehearsal.json").read_text())
    planned, rehearsed = plan["planned"]["dp-sgd"], plan["rehearsed"]["dp-sgd"]
    stand_in = stand_in_config(config, "glyphs", None, 10)  # the private run's plan: its own (PLD) accountant
    (real,) = plan_budget_for(stand_in, dataset_from_config(stand_in).info).stages["dp-sgd"]
    assert planned["noise_multiplier"] == pytest.approx(real.noise_multiplier)
    assert plan["private_images_read"] == 0 and plan["stand_in"] == "glyphs" and plan["private_data"] == "folder"
    assert rehearsed["steps"] == planned["steps"] and rehearsed["expected_batch"] == planned["expected_batch"] / 4
    assert rehearsed["sigma_over_batch"] == pytest.approx(planned["sigma_over_batch"])
    (event,) = PrivacyLedger.load(run.file("ledger.json")).events()
    assert event.noise_multiplier == pytest.approx(planned["noise_multiplier"] / 4) and event.steps == planned["steps"]
    report = json.loads(run.file("release/privacy.json").read_text())
    assert report["rehearsal"]["shrink"] == 4 and "releases" not in report
    assert not Path(__import__("os").environ["DPSYNTH_RELEASES"]).exists()  # no holder's ledger entry
    sheet = run.file("release/README.md").read_text()
    assert sheet.startswith("# Rehearsal on glyphs") and "a rehearsal, not a release of private data" in sheet
    with np.load(run.file("release/synthetic.npz")) as release:
        assert release["images"].shape[1:] == (1, 8, 8) and set(release["labels"].tolist()) <= set(range(10))
    with pytest.raises(DpsynthError, match="a rehearsal does not resume"):
        resume(str(run.path))


def test_a_rehearsal_prices_a_step_by_the_person_where_a_person_has_several_images(tmp_path):
    def stand_in(*extra: str):
        config = resolve_config("dp-ldm", dataset="folder", data_dir=str(tmp_path), epsilon=6.0, preset="auto",
                                overrides=stand_in_overrides(tmp_path, *extra))
        return config, dataset_from_config(stand_in_config(config, "glyphs", None, 10))

    config, images = stand_in()
    assert priced_as_private(images, config) is images and images.info.unit == "image"
    config, images = stand_in("privacy.max_images_per_group=5")  # declared: the private data has groups
    priced = priced_as_private(images, config)
    assert priced.info.unit == "group" and priced.info.num_train == images.info.num_train
    assert priced.train is images.train and priced.train.groups is None  # the stand-in itself is unchanged
    assert plan_inputs(priced.info, torch.device("cpu"), 5).images_per_unit == 5


def test_a_rehearsal_releases_a_shrink_th_of_the_plans_images_within_its_bounds():
    assert [rehearsal_release(planned, 4) for planned in (500, 2000, 5000, 20_000, 60_000)] == [
        500, 1000, 1250, 5000, 5000]
    assert rehearsal_release(5000, 1) == 5000


def test_a_rehearsal_needs_the_shape_and_size_declared_and_a_stand_in_as_large(tmp_path):
    config = resolve_config("dp-ldm", dataset="folder", data_dir=str(tmp_path), epsilon=6.0, preset="cpu",
                            overrides=[*SMOKE, f"run.out_dir={tmp_path / 'runs'}"])
    with pytest.raises(ConfigError, match=r"--set dataset.channels=\.\.\. --set dataset.resolution=\.\.\. --set "
                                          r"privacy.dataset_size=\.\.\."):
        rehearse(config)
    config = resolve_config("dp-ldm", dataset="folder", data_dir=str(tmp_path), epsilon=6.0, preset="cpu",
                            overrides=stand_in_overrides(tmp_path, "privacy.dataset_size=5000"))
    with pytest.raises(DataError, match="stand-in digits: 1,797 images, fewer than the 5,000"):
        rehearse(config, "digits")
    config = resolve_config("dp-ldm", dataset="folder", data_dir=str(tmp_path), epsilon=6.0, preset="cpu",
                            overrides=[*stand_in_overrides(tmp_path), "dataset.channels=3"])
    with pytest.raises(DataError, match="stand-in digits: images of 1 channel.*dataset.channels=3"):
        rehearse(config, "digits")
    assert dataset_from_config(stand_in_config(config, "glyphs", None, 10)).info.channels == 3  # grey, repeated
    done = dpsynth_main("rehearse", "dp-ldm", "--dataset", "folder", "--data-dir", str(tmp_path), "--epsilon", "6",
                        "--shrink", "0")
    assert done.code == 2 and "--shrink" in done.err
    assert not (tmp_path / "runs").exists()


@pytest.mark.slow
def test_dp_ldm_trains_the_attention_of_a_public_latent_model_and_refuses_a_pixel_one(tmp_path):
    common = ["--dataset", "glyphs", "--iterations", "3", "--batch-size", "8", "--device", "cpu",
              "--set", "dataset.resolution=8", "--set", "dataset.channels=1", "--set", "dataset.num_images=124"]
    smoke = [arg for pair in [*SMOKE, f"run.out_dir={tmp_path / 'runs'}"] for arg in ("--set", pair)]
    for method, sections in (("dp-ldm", ("model.", "diffusion.", "autoencoder.")), ("dpdm", ("model.", "diffusion."))):
        shaped = [arg for pair in SMOKE if pair.startswith(sections) for arg in ("--set", pair)]
        done = dpsynth_main("pretrain", "--for", method, "--preset", "cpu", "--out", str(tmp_path / method), *common,
                            *shaped)
        assert done.code == 0, done.err
    run = ["run", "dp-ldm", "--dataset", "digits", "--epsilon", "6", "--preset", "cpu", *smoke]
    pixel = dpsynth_main(*run, "--init-from", str(tmp_path / "dpdm"))
    assert pixel.code == 2 and "was not trained on the latents of this run's autoencoder" in pixel.err
    done = dpsynth_main(*run, "--init-from", str(tmp_path / "dp-ldm"), "--set", "model.trainable=[attention]")
    assert done.code == 0, done.err
    log = (run_directory(done.out) / "log.jsonl").read_text()
    trainable = json.loads(next(line for line in log.splitlines() if '"trainable"' in line))
    assert trainable["groups"] == ["attention"] and 0 < trainable["parameters"] < trainable["of"] / 2


def test_a_rehearsal_shrinks_each_dp_sgd_stage_and_keeps_the_other_mechanisms_as_planned(tmp_path):
    config = resolve_config("feta-pro", dataset="folder", data_dir=str(tmp_path), epsilon=6.0, preset="cpu",
                            overrides=[*smoke("feta-pro"),
                                       f"run.out_dir={tmp_path / 'runs'}", "dataset.resolution=8",
                                       "dataset.channels=1", "privacy.dataset_size=600"])
    runs = {shrink: rehearse(config, classes=10, shrink=shrink) for shrink in (1, 2)}  # 1: the run's own plan
    plan = json.loads(runs[2].file("rehearsal.json").read_text())
    assert set(plan["rehearsed"]) == set(plan["planned"]) == {"dp-sgd"}
    ledgers = {shrink: PrivacyLedger.load(run.file("ledger.json")).stages() for shrink, run in runs.items()}
    assert set(ledgers[2]) == {"central-images", "frequency-features", "dp-sgd"}
    (planned,), (event,) = ledgers[1]["dp-sgd"], ledgers[2]["dp-sgd"]
    assert event.noise_multiplier == pytest.approx(planned.noise_multiplier / 2) and event.steps == planned.steps
    for stage in ("central-images", "frequency-features"):
        assert repr(ledgers[2][stage]) == repr(ledgers[1][stage])  # as planned, not shrunk
