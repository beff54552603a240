"""Private Evolution: DP nearest-neighbour histograms, APIs (text simulator, diffusers model), accounting, runs."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from conftest import TINY_PE, assert_killed_run_resumes_to, dpsynth_main, finished_run, privacy_report, secret_stream
from diffusers import DDPMPipeline, DDPMScheduler
from scipy.optimize import brentq
from scipy.stats import norm

from dpsynth.api import dataset_from_config, resolve_config
from dpsynth.data import DatasetInfo, ImageSet
from dpsynth.data.fingerprints import fingerprints
from dpsynth.data.glyphs import find_fonts
from dpsynth.diffusion.pretrain import PretrainSettings, pretrain
from dpsynth.errors import ConfigError, DataError
from dpsynth.methods.pe import apis
from dpsynth.methods.pe.apis import ApiSettings, DiffusionAPI, DrawTextAPI, Samples, register_api
from dpsynth.methods.pe.embeddings import PixelEmbedding
from dpsynth.methods.pe.method import PrivateEvolution, apportion
from dpsynth.methods.pe.population import PrivateVotes
from dpsynth.models import build_unet
from dpsynth.pipeline import start
from dpsynth.privacy import Accountant, GaussianMechanism, PrivacyLedger
from dpsynth.privacy.nearest_neighbours import dp_histograms, nearest_neighbour_votes
from dpsynth.runs import RunDirectory

DIGITS = DatasetInfo("digits", 1, 28, 28, [str(d) for d in range(10)], "test")

def test_votes_equal_brute_force_nearest_neighbours():
    generator = torch.Generator().manual_seed(0)
    private, synthetic = torch.randn(500, 6, generator=generator), torch.randn(37, 6, generator=generator)
    expected = torch.zeros(37, dtype=torch.float64)
    for row in private:
        distances = [float((row - s).pow(2).sum()) for s in synthetic]
        expected[int(np.argmin(distances))] += 1
    assert torch.equal(nearest_neighbour_votes(private, synthetic, torch.ones(500), chunk=64), expected)


def test_mismatched_embeddings_are_refused():
    with pytest.raises(ValueError, match="same d"):
        nearest_neighbour_votes(torch.zeros(3, 4), torch.zeros(2, 5), torch.ones(3))


def test_histograms_get_gaussian_noise_then_the_threshold_and_one_ledger_entry():
    votes = [torch.tensor([0.0, 5.0, 40.0]), torch.tensor([12.0, 0.0])]
    ledger = PrivacyLedger()
    noisy = dp_histograms(votes, 2.0, 4.0, ledger, "histograms", secret_stream(3))
    noise = secret_stream(3).normal(5) * 2.0
    expected = ((torch.cat(votes) + noise).round() - 4.0).clamp_min(0)  # counts rounded before the threshold
    assert torch.allclose(torch.cat(noisy), expected.float())
    assert [len(h) for h in noisy] == [3, 2]
    assert ledger.stages() == {"histograms": [GaussianMechanism(2.0)]}


def test_each_class_votes_only_in_its_own_histogram():
    images = torch.rand(30, 1, 4, 4, generator=torch.Generator().manual_seed(1))
    labels = torch.tensor([0, 1, 2] * 10)
    labels[:4] = 2
    private = PrivateVotes.of(ImageSet(images, labels), torch.ones(30), 3, PixelEmbedding(), 1.0, 0.0, "histograms")
    for label, embedded in enumerate(private.private):
        assert torch.equal(embedded, images[labels == label].flatten(1))
        votes = nearest_neighbour_votes(embedded, torch.rand(5, 16), torch.ones(len(embedded)))
        assert votes.sum() == (labels == label).sum()


def test_pe_composes_like_the_closed_form_gaussian_dp_value():
    """The pe library's CIFAR-10 example: sigma = 5 sqrt(2), T = 20, delta = 1e-5 gives epsilon ~ 2.59."""
    sigma, iterations, delta = 5 * 2 ** 0.5, 20, 1e-5
    mu = iterations ** 0.5 / sigma

    def gdp_delta(epsilon: float) -> float:
        return norm.cdf(-epsilon / mu + mu / 2) - np.exp(epsilon) * norm.cdf(-epsilon / mu - mu / 2) - delta

    closed_form = brentq(gdp_delta, 0.01, 20)
    accounted = Accountant("pld").epsilon([GaussianMechanism(sigma, iterations)], delta)
    assert closed_form == pytest.approx(2.59, abs=0.01)
    assert accounted == pytest.approx(closed_form, abs=0.01)


def test_drawtext_renders_each_class_character_and_small_degrees_vary_little():
    api = DrawTextAPI(DIGITS, "0123456789", find_fonts())
    generator = torch.Generator().manual_seed(0)
    samples = api.random_api(7, 16, generator)
    assert samples.images.shape == (16, 1, 28, 28) and samples.params.shape == (16, 6)
    assert samples.images.min() >= 0 and samples.images.max() <= 1 and samples.images.mean() > 0.05
    near, far = (api.variation_api(samples, 7, degree, generator) for degree in (0.05, 1.0))
    assert (near.images - samples.images).abs().mean() < (far.images - samples.images).abs().mean()
    moved = [(varied.params[:, 1:] - samples.params[:, 1:]).abs().max() for varied in (near, far)]
    assert moved[0] < moved[1]


def test_drawtext_needs_one_character_per_class_and_some_fonts(tmp_path):
    with pytest.raises(ValueError, match="one character per class"):
        DrawTextAPI(DIGITS, "01", find_fonts())
    method = PrivateEvolution(resolve_config("pe", dataset="digits", overrides=["api.characters=ab"]))
    with pytest.raises(ConfigError, match=r"api.characters: 2 characters \('ab'\) for 10 classes"):
        method.built_api(DIGITS, torch.device("cpu"))
    with pytest.raises(ConfigError, match=str(tmp_path)):
        find_fonts([str(tmp_path)])


def save_random_model(path, num_classes=None) -> None:
    unet = build_unet(1, 8, num_classes, [8, 8], norm_groups=4, attention=False)
    DDPMPipeline(unet=unet, scheduler=DDPMScheduler(num_train_timesteps=50)).save_pretrained(path)


def test_the_diffusion_api_loads_a_saved_diffusers_model_and_returns_private_shaped_images(tmp_path):
    save_random_model(tmp_path / "model")
    api = DiffusionAPI(str(tmp_path / "model"), DIGITS, steps=4, batch_size=3, device=torch.device("cpu"))
    generator = torch.Generator().manual_seed(0)
    samples = api.random_api(0, 5, generator)
    assert samples.images.shape == (5, 1, 28, 28) and samples.params is None
    assert 0 <= samples.images.min() and samples.images.max() <= 1
    varied = api.variation_api(samples, 0, 0.5, generator)
    assert varied.images.shape == samples.images.shape and not torch.equal(varied.images, samples.images)
    with pytest.raises(ValueError, match=r"\(0, 1\]"):
        api.variation_api(samples, 0, 1.5, generator)


def test_the_diffusion_api_rejects_a_missing_or_class_conditional_model(tmp_path):
    with pytest.raises(DataError, match="not a diffusers model directory"):
        DiffusionAPI(str(tmp_path), DIGITS, 4, 4, torch.device("cpu"))
    save_random_model(tmp_path / "conditional", num_classes=10)
    with pytest.raises(DataError, match="class-conditional"):
        DiffusionAPI(str(tmp_path / "conditional"), DIGITS, 4, 4, torch.device("cpu"))
    method = PrivateEvolution(resolve_config("pe", dataset="digits", overrides=[
        "api.name=diffusion", f"api.model={tmp_path / 'conditional'}"]))
    with pytest.raises(ConfigError, match="api.model: .* is class-conditional"):
        method.built_api(DIGITS, torch.device("cpu"))


def test_pretrain_writes_a_model_the_diffusion_api_loads(tmp_path):
    data = ImageSet(torch.rand(20, 1, 8, 8), torch.zeros(20, dtype=torch.long))
    settings = PretrainSettings(iterations=3, batch_size=4, block_channels=(8, 8), checkpoint_every=2)
    out = pretrain(data, tmp_path / "public", settings, torch.device("cpu"))
    assert json.loads((out / "pretraining.json").read_text())["step"] == 3
    api = DiffusionAPI(str(out), DIGITS, steps=2, batch_size=4, device=torch.device("cpu"))
    assert api.random_api(0, 2, torch.Generator().manual_seed(0)).images.shape == (2, 1, 28, 28)
    with pytest.raises(ConfigError, match="not empty"):
        pretrain(data, out, settings, torch.device("cpu"))



@pytest.mark.slow
def test_pe_runs_with_drawtext_and_a_run_killed_after_an_iteration_resumes_to_the_clean_result(tmp_path):
    clean_dir = finished_run(*TINY_PE, "--set", f"run.out_dir={tmp_path / 'clean'}")
    privacy = privacy_report(clean_dir)
    assert [stage["name"] for stage in privacy["stages"]] == ["class-counts", "histograms"]
    assert privacy["stages"][1]["mechanisms"][0]["steps"] == 3 and privacy["epsilon"] <= 10.0
    assert "not_covered_by_epsilon" not in privacy
    assert sorted(p.name for p in (clean_dir / "iterations").iterdir()) == [f"iteration-00{t}.png" for t in range(4)]
    counts = RunDirectory.open(clean_dir).last_checkpoint().released["class-counts"]  # noisy class counts
    sizes = apportion(40, counts.clamp_min(1))
    assert sum(sizes) == 40 and min(sizes) >= 1
    with np.load(clean_dir / "release" / "synthetic.npz") as release:
        assert release["images"].shape == (60, 1, 28, 28)
        assert np.bincount(release["labels"], minlength=10).tolist() == apportion(60, torch.tensor(sizes).double())

    assert_killed_run_resumes_to(clean_dir, [*TINY_PE, "--set", f"run.out_dir={tmp_path / 'crash'}"],
                                 lambda e: e.get("event") == "pe-iteration" and e["iteration"] >= 1)


def test_bad_pe_settings_are_config_errors(tmp_path):
    for extra, message in ((["--set", "pe.degrees=[0.5,1.5,0.3]"], "pe.degrees"), (["--api", "dalle"], "api.name"),
                           (["--set", "pe.class_counts=public"], "pe.class_counts")):
        done = dpsynth_main("run", *TINY_PE, *extra, "--set", f"run.out_dir={tmp_path}")
        assert done.code != 0 and message in done.err and "Traceback" not in done.err, done.err


def test_pe_reads_mnist_from_any_idx_directory(idx_dir, tmp_path):
    run = finished_run("pe", "--api", "drawtext", "--dataset", "mnist", "--data-dir", str(idx_dir), "--epsilon", "10",
                       "--set", "dataset.val_size=20", "--set", "privacy.dataset_size=120",
                       "--set", "pe.population=20", "--set", "pe.iterations=1", "--set", "pe.lookahead=0",
                       "--set", "evaluation.enabled=false", "--set", "sampling.num_samples=30",
                       "--set", f"run.out_dir={tmp_path}")
    with np.load(run / "release" / "synthetic.npz") as release:
        assert release["images"].shape == (30, 1, 28, 28)


def test_the_nonprivate_debug_distance_is_logged_only_on_request_and_flagged_in_the_privacy_report(tmp_path):
    done = dpsynth_main("run", *TINY_PE, "--set", "pe.iterations=2", "--set", "pe.debug_nonprivate_fd=true",
                        "--set", f"run.out_dir={tmp_path}")
    assert done.code == 0, done.err
    run = next(tmp_path.iterdir())
    debug = [e for e in map(json.loads, (run / "log.jsonl").read_text().splitlines())
             if e["event"] == "pe-debug-NONPRIVATE"]
    assert [e["iteration"] for e in debug] == [0, 1, 2] and all(e["frechet_distance"] > 0 for e in debug)
    (caveat,) = privacy_report(run)["not_covered_by_epsilon"]
    assert "log.jsonl" in caveat and "pe.debug_nonprivate_fd is on" in done.err


class SquaresAPI:
    """A user's own API: class c is a bright square whose corner its parameters place (varied by moving it); it
    says which images its model was trained on."""

    def __init__(self, info: DatasetInfo, trained_on: np.ndarray | None) -> None:
        self.info, self.trained_on = info, trained_on

    def random_api(self, label: int, n: int, generator: torch.Generator) -> Samples:
        return self._drawn(torch.rand(n, 2, generator=generator, dtype=torch.float64))

    def variation_api(self, samples: Samples, label: int, degree: float, generator: torch.Generator) -> Samples:
        step = torch.randn(samples.params.shape, generator=generator, dtype=torch.float64) * degree / 4
        return self._drawn((samples.params + step).clamp(0, 1))

    def training_fingerprints(self) -> np.ndarray | None:
        return self.trained_on

    def _drawn(self, corners: torch.Tensor) -> Samples:
        images = torch.zeros(len(corners), *self.info.shape)
        side = self.info.height // 3
        for image, (row, column) in zip(images, (corners * (self.info.height - side)).long().tolist(), strict=True):
            image[:, row:row + side, column:column + side] = 1.0
        return Samples(images, corners)


@pytest.fixture
def squares_api(monkeypatch: pytest.MonkeyPatch) -> dict[str, np.ndarray | None]:
    """The ``squares`` API registered for one test (its training images' fingerprints set through the dict)."""
    trained: dict[str, np.ndarray | None] = {"on": None}
    monkeypatch.setitem(apis._FACTORIES, "squares", None)  # removed again after the test
    register_api("squares")(lambda settings, info, device: SquaresAPI(info, trained["on"]))
    return trained


def test_a_users_own_api_plugs_in_by_name_and_its_training_data_is_checked(squares_api, tmp_path, monkeypatch):
    seen: list[tuple[int, int, bool, int]] = []  # a callback of the user's: each generation after its checkpoint

    def watched(self, context, votes, embed):
        def watch(context, generation):
            sizes = sum(len(samples) for samples in generation.population.classes)
            kept = context.run.last_checkpoint().step
            seen.append((generation.iteration, sizes, generation.histograms is None, kept))
        return [*own_callbacks(self, context, votes, embed), watch]

    own_callbacks = PrivateEvolution.callbacks
    monkeypatch.setattr(PrivateEvolution, "callbacks", watched)  # as a subclass extends it
    config = resolve_config("pe", dataset="digits", epsilon=5.0, preset="cpu", overrides=[
        "api.name=squares", "pe.population=40", "pe.iterations=2", "pe.lookahead=1", "sampling.num_samples=30",
        "evaluation.enabled=false", f"run.out_dir={tmp_path}"])
    squares_api["on"] = fingerprints(dataset_from_config(config).train.images[:5])  # trained on private images
    with pytest.raises(DataError, match="the training data of the API api.name 'squares' is not disjoint"):
        start(config)
    squares_api["on"] = np.zeros(0, "<u8")  # trained on none of them
    run = start(config)
    report = json.loads(run.file("release/privacy.json").read_text())
    assert [stage["name"] for stage in report["stages"]] == ["class-counts", "histograms"]
    assert report["public_data"]["the training data of the API api.name 'squares'"]["distinct_images"] == 0
    with np.load(run.file("release/synthetic.npz")) as release:  # every image one of the API's squares
        assert set(np.unique(release["images"])) == {0, 255} and len(release["labels"]) == 30
    assert seen == [(0, 40, True, 0), (1, 40, False, 1), (2, 40, False, 2)]


def test_an_api_name_no_one_registered_is_a_config_error_naming_the_known_ones(squares_api):
    with pytest.raises(ConfigError, match="api.name must be one of drawtext, diffusion, squares .*got 'dalle'"):
        PrivateEvolution(resolve_config("pe", dataset="digits", overrides=["api.name=dalle"]))
    assert ApiSettings().name == "drawtext"
