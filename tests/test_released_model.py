"""The released generator (``release.model``): the weights a run sampled with, listed in privacy.json, loaded in this
or a fresh process to draw the same images again or any number more, holding nothing else; methods without a
generator refuse the option before they run."""
from __future__ import annotations

import csv
import json
import shutil
import subprocess
import sys
from pathlib import Path

import diffusers
import numpy as np
import pytest
import torch
from conftest import dpsynth_main, smoke, stopped_smoke_run
from PIL import Image
from safetensors.torch import load_file

from dpsynth.api import load_generator, resolve_config
from dpsynth.config import SamplingSettings
from dpsynth.errors import ConfigError, DpsynthError, PrivacyWarning
from dpsynth.export import class_folders
from dpsynth.generators import DiffusionGenerator, LatentDiffusionGenerator, OneStepGenerator
from dpsynth.methods import METHODS
from dpsynth.methods.base import Method
from dpsynth.pipeline import start
from dpsynth.privacy.randomness import secret_generator, stream_key
from dpsynth.privacy.releases import HolderLedger
from dpsynth.runs import RunDirectory
from dpsynth.utils.images import to_uint8

SEED = 3  # the runs' user seed: their release stream can then be drawn again here (such a release is not private)


def released_run(root: Path, method: str, *extra: str) -> RunDirectory:
    """A finished smoke run of ``method`` on sklearn's digits that releases its model, its noise seeded."""
    config = resolve_config(method, dataset="digits", epsilon=5.0, preset="cpu",
                            overrides=[*smoke(method), f"run.out_dir={root}",
                                       "release.model=true", f"run.seed={SEED}", *extra])
    with pytest.warns(PrivacyWarning, match="run.seed"):
        return start(config)


@pytest.fixture(scope="module")
def dpdm_run(tmp_path_factory: pytest.TempPathFactory) -> RunDirectory:
    return released_run(tmp_path_factory.mktemp("runs"), "dpdm")


def test_a_module_fixtures_run_enters_the_sessions_holder_ledger_never_the_users(dpdm_run, monkeypatch):
    run = str(dpdm_run.path.resolve())
    monkeypatch.delenv("DPSYNTH_RELEASES")
    assert run not in {entry.run for entry in HolderLedger().releases()}  # ~/.local/share/dpsynth/releases.json
    assert json.loads(dpdm_run.file("release/privacy.json").read_text())["releases"]["number"] == 1


def test_every_method_either_gives_its_generator_or_says_why_not():
    for name, method in METHODS.items():
        gives = method.trained_generator is not Method.trained_generator
        assert gives == (method.no_generator is None), name
    assert {name for name, method in METHODS.items() if method.no_generator} == {"pe", "dp-imgsyn"}


@pytest.mark.parametrize("method", ["pe", "dp-imgsyn"])
def test_a_method_without_a_generator_refuses_release_model_before_it_runs(method):
    with pytest.raises(ConfigError, match=f"release.model: {method} trains no generator: its release is"):
        resolve_config(method, dataset="digits", preset="cpu", overrides=["release.model=true"])
    done = dpsynth_main("privacy", method, "--dataset", "digits", "--preset", "cpu", "--release-model")
    assert done.code == 2 and f"release.model: {method} trains no generator" in done.err


@pytest.mark.slow
@pytest.mark.parametrize("method, kind", [("dpdm", DiffusionGenerator), ("dp-sad", DiffusionGenerator),
                                          ("dp-ldm", LatentDiffusionGenerator), ("dp-merf", OneStepGenerator)])
def test_the_released_model_draws_the_release_again_and_holds_only_its_weights(tmp_path, dpdm_run, method, kind):
    run = dpdm_run if method == "dpdm" else released_run(tmp_path, method)
    release = run.file("release")
    report = json.loads((release / "privacy.json").read_text())
    assert {"model.safetensors", "model.json"} <= set(report["release_files"])
    generator = load_generator(run.path, "cpu")  # a run directory stands for its release folder
    assert isinstance(generator, kind) and generator.privacy["epsilon"] == report["epsilon"]
    assert "NOT private" in generator.describe()  # its noise was seeded by the user
    config = run.config()
    drawn = generator.sample(config["sampling"]["num_samples"], generator=secret_generator(stream_key(SEED, "release")),
                             settings=SamplingSettings.of(config))
    released = np.load(release / "synthetic.npz")
    assert np.array_equal(to_uint8(drawn.images), released["images"])  # the weights it sampled with (EMA, student)
    assert np.array_equal(drawn.labels.numpy(), released["labels"])
    tensors = load_file(release / "model.safetensors")
    assert set(tensors) == set(generator.module.state_dict())  # the module's parameters and buffers, nothing else
    assert all(value.dtype in (torch.float32, torch.int64) for value in tensors.values())
    assert not [name for name in tensors if any(word in name for word in ("optim", "exp_avg", "ema", "noise", "key"))]
    card = json.loads((release / "model.json").read_text())
    assert (card["kind"], card["method"], card["image_shape"]) == (kind.kind, method, [1, 8, 8])
    assert card["class_names"] == [str(digit) for digit in range(10)] and "init_from" not in json.dumps(card)
    datasheet = (release / "README.md").read_text()
    assert "## The model" in datasheet and f"(ε, δ) = ({report['epsilon']:.4f}" in datasheet
    exported = dpsynth_main("export", str(run.path), "--format", "diffusers", "--out", str(tmp_path / "diffusers"))
    if kind is DiffusionGenerator:
        assert exported.code == 0 and (tmp_path / "diffusers" / "unet" / "config.json").is_file()
    else:
        assert exported.code == 2 and "a diffusers folder holds a pixel diffusion model" in exported.err
        assert not (tmp_path / "diffusers").exists()


def test_a_generator_draws_counts_labels_and_classes_as_asked(dpdm_run):
    generator = load_generator(dpdm_run.file("release"), "cpu")
    assert generator.sample(13).labels.tolist() == [*range(10), 0, 1, 2]
    assert generator.sample(labels=[7, 7, 2]).images.shape == (3, 1, 8, 8)
    assert generator.sample(per_class={"3": 2, 9: 1}).labels.tolist() == [3, 3, 9]
    same = [generator.sample(4, generator=torch.Generator().manual_seed(5)).images for _ in range(2)]
    assert torch.equal(*same) and 0 <= same[0].min() and same[0].max() <= 1
    assert not torch.equal(same[0], generator.sample(4).images)  # fresh randomness by default
    fewer_steps = generator.with_sampler(sampler="ddim", sample_steps=3)
    assert fewer_steps.diffusion_settings.sample_steps == 3 and generator.diffusion_settings.sample_steps == 2
    for call, message in ((lambda: generator.sample(labels=[10]), "labels must be class indices 0 to 9"),
                          (lambda: generator.sample(3, labels=[1]), "3 images asked for, but the labels given make 1"),
                          (lambda: generator.sample(per_class={"cat": 2}), "no class 'cat'; the classes are 0, 1"),
                          (lambda: generator.sample(per_class={1: -1}), "count of class 1 must be a whole number"),
                          (lambda: generator.sample(0), "give a positive number of images"),
                          (lambda: generator.with_sampler(steps=3), "steps is no sampler setting"),
                          (lambda: generator.with_sampler(guidance=-1), "diffusion.guidance must be a number of at")):
        with pytest.raises(ConfigError, match=message):
            call()


@pytest.mark.slow
def test_dpsynth_sample_draws_in_a_fresh_process_and_refuses_what_it_must_not_write(dpdm_run, tmp_path):
    out = tmp_path / "more.npz"
    command = [sys.executable, "-m", "dpsynth", "sample", str(dpdm_run.file("release")), "--images", "25", "--seed",
               "4", "--device", "cpu"]
    done = subprocess.run([*command, "--out", str(out)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "dpdm diffusion generator of 1 x 8 x 8 images, 10 classes" in done.stdout
    assert "wrote 25 images, drawn in" in done.stdout and out.with_suffix(".png").is_file()
    drawn = np.load(out)
    assert drawn["images"].shape == (25, 1, 8, 8) and drawn["images"].dtype == np.uint8
    assert drawn["labels"].tolist() == [i % 10 for i in range(25)] and drawn["class_names"].tolist()[:2] == ["0", "1"]
    again = dpsynth_main(*command[3:], "--out", str(tmp_path / "again.npz"))
    assert again.code == 0 and np.array_equal(np.load(tmp_path / "again.npz")["images"], drawn["images"])
    picked = dpsynth_main(*command[3:5], "--per-class", "2=3,0=1", "--sampler", "ddim", "--sample-steps", "3",
                          "--out", str(tmp_path / "picked.npz"))
    assert picked.code == 0 and np.load(tmp_path / "picked.npz")["labels"].tolist() == [2, 2, 2, 0]
    (tmp_path / "taken.png").write_bytes(b"")  # a picture of the user's, where the grid would go
    refusals = {
        "taken.png exists; give another name": ["--images", "2", "--out", str(tmp_path / "taken.npz")],
        "inside a run's release/ folder": ["--images", "2", "--out", str(dpdm_run.file("release") / "x.npz")],
        "more.npz exists; give another name": ["--images", "2", "--out", str(out)],
        "needs --images N or --per-class": ["--out", str(tmp_path / "none.npz")],
        "--per-class expects CLASS=COUNT": ["--per-class", "seven", "--out", str(tmp_path / "bad.npz")],
    }
    for message, args in refusals.items():
        refused = dpsynth_main("sample", str(dpdm_run.file("release")), *args)
        assert refused.code == 2 and message in refused.err, refused.err
    assert sorted(path.name for path in dpdm_run.file("release").iterdir()) == [
        "README.md", "model.json", "model.safetensors", "privacy.json", "samples.png", "synthetic.npz"]


def test_a_stopped_run_may_resume_to_release_its_model(tmp_path):
    run = stopped_smoke_run("dp-merf", tmp_path)
    assert dpsynth_main("run", "--resume", str(run.path), "--release-model").code == 0
    assert run.config()["release"]["model"] is True
    assert load_generator(run.path, "cpu").sample(3).images.shape == (3, 1, 8, 8)


def test_a_model_that_is_not_the_released_one_is_refused(dpdm_run, tmp_path):
    copy = Path(shutil.copytree(dpdm_run.file("release"), tmp_path / "copy"))
    load_generator(copy, "cpu")  # a copy elsewhere is the release still
    weights = copy / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 1
    weights.write_bytes(bytes(data))
    with pytest.raises(DpsynthError, match="model.safetensors: .*privacy.json lists it with another SHA-256: no "
                                           "guarantee covers a model that differs"):
        load_generator(copy, "cpu")
    (copy / "privacy.json").unlink()
    with pytest.raises(DpsynthError, match="privacy.json: a released model is read from its release folder"):
        load_generator(copy, "cpu")
    with pytest.raises(DpsynthError, match="no released model .* --release-model"):
        load_generator(tmp_path, "cpu")


def test_a_released_diffusion_model_exported_for_diffusers_samples_as_the_run_did_with_diffusers_alone(dpdm_run,
                                                                                                       tmp_path):
    out = tmp_path / "diffusers"
    assert dpsynth_main("export", str(dpdm_run.path), "--format", "diffusers", "--out", str(out)).code == 0
    sampling = json.loads((out / "sampling.json").read_text())
    unet = diffusers.UNet2DModel.from_pretrained(out / "unet").eval()
    scheduler_class = json.loads((out / "scheduler" / "scheduler_config.json").read_text())["_class_name"]
    scheduler = getattr(diffusers, scheduler_class).from_pretrained(out / "scheduler")
    scheduler.set_timesteps(sampling["sample_steps"])
    labels, null = torch.tensor([0, 3, 7, 9]), torch.full((4,), sampling["null_class"])
    low, high = sampling["guidance_interval"]
    x = torch.randn((4, *sampling["image_shape"]), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        for t in scheduler.timesteps:
            weight = sampling["guidance"] if low <= int(t) / sampling["timesteps"] <= high else 0.0
            conditional = unet(x, t, class_labels=labels).sample
            out_t = conditional if not weight else \
                unet(x, t, class_labels=null).sample * -weight + conditional * (1 + weight)
            x = scheduler.step(out_t, t, x).prev_sample
    alone = ((x + 1) / 2).clamp(0, 1)
    generator = load_generator(dpdm_run.path, "cpu")
    settings = generator.diffusion_settings
    expected = generator.diffusion.sample(generator.module, labels, generator.shape, sampling["null_class"],
                                          settings.sample_steps, settings.guidance, torch.Generator().manual_seed(0),
                                          settings.sampler, guidance_interval=settings.guidance_interval)
    assert torch.allclose(alone, expected, atol=1e-4)
    assert sampling["class_names"] == generator.class_names
    release = dpdm_run.file("release")
    assert (out / "privacy.json").read_bytes() == (release / "privacy.json").read_bytes()
    record = json.loads((out / "export.json").read_text())
    assert record["made_from_sha256"] == json.loads((release / "privacy.json").read_text())["release_files"][
        "model.safetensors"]


def test_a_release_exports_as_an_image_folder_of_its_images_and_labels(dpdm_run, tmp_path):
    out = tmp_path / "images"
    assert dpsynth_main("export", str(dpdm_run.file("release")), "--format", "imagefolder", "--out", str(out)).code == 0
    released = np.load(dpdm_run.file("release") / "synthetic.npz")
    rows = list(csv.DictReader((out / "labels.csv").open()))
    assert [int(row["label"]) for row in rows] == released["labels"].tolist()
    for row, image in zip(rows[:5], released["images"], strict=False):
        assert row["file"].split("/")[0] == row["class_name"] == str(row["label"])
        assert np.array_equal(np.array(Image.open(out / row["file"])), image[0])  # grey 8 x 8, as released
    assert sorted(path.name for path in out.iterdir()) == [*(str(digit) for digit in range(10)), "README.md",
                                                           "export.json", "labels.csv", "privacy.json"]
    again = dpsynth_main("export", str(dpdm_run.path), "--format", "imagefolder", "--out", str(out))
    assert again.code == 2 and "already exists and is not an empty folder" in again.err
    inside = dpsynth_main("export", str(dpdm_run.path), "--format", "imagefolder", "--out",
                          str(dpdm_run.file("release") / "x"))
    assert inside.code == 2 and "inside a run's release/ folder" in inside.err
    assert class_folders(["T-shirt/top", "", "a", "a", ".hidden"]) == ["T-shirt-top", "class_1", "class_2", "class_3",
                                                                       "class_4"]
