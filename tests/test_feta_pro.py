"""FETA-Pro: the frequency features' sensitivity, the auxiliary generator, the curriculum and its ledger."""
from __future__ import annotations

import pytest
import torch
from conftest import (
    TINY_FETA_PRO,
    assert_killed_run_resumes_to,
    finished_run,
    privacy_report,
    secret_stream,
    warmup_step_logged,
)

from dpsynth.api import resolve_config
from dpsynth.data import DatasetInfo, ImageSet, load_dataset
from dpsynth.diffusion import Diffusion
from dpsynth.errors import ConfigError
from dpsynth.methods.feta_pro.method import FETAPro, auto_noise
from dpsynth.models import build_unet
from dpsynth.models.generator import ConditionalGenerator
from dpsynth.privacy import GaussianMechanism, ParallelComposition, PrivacyLedger
from dpsynth.privacy.fourier_features import (
    FrequencyQuery,
    FrequencySettings,
    RandomFourierFeatures,
    noisy_class_means,
)
from dpsynth.training.feature_generator import GeneratorSettings, feature_matching_loss, fit_generator


def test_every_image_has_features_of_norm_one():
    rff = RandomFourierFeatures(3 * 4 * 4, 200, 105.0, seed=0)
    features = rff(torch.rand(50, 3, 4, 4) * 10)
    assert features.shape == (50, 200)
    assert torch.allclose(features.norm(dim=1), torch.ones(50), atol=1e-5)


def test_adding_one_image_moves_the_class_feature_sum_by_at_most_one():
    rff = RandomFourierFeatures(64, 500, 10.0, seed=1)
    images, extra = torch.rand(40, 1, 8, 8), torch.rand(5, 1, 8, 8)
    for image in extra:
        change = rff.summed(torch.cat([images, image[None]]), torch.ones(41)) - rff.summed(images, torch.ones(40))
        assert change.norm() == pytest.approx(1.0, abs=1e-5)  # ||phi(x)|| = 1: the bound is attained


def test_the_frequencies_are_public_a_fixed_seed_gives_the_same_features():
    images = torch.rand(3, 1, 8, 8)
    assert torch.equal(RandomFourierFeatures(64, 20, 5.0, 7)(images), RandomFourierFeatures(64, 20, 5.0, 7)(images))


def test_a_scaled_bandwidth_keeps_two_images_kernel_across_sides():
    """Under ``values`` scaling two pictures and their copies at twice the side (four times the values, four times
    the squared distance) are as near in the kernel as at the smaller side; unscaled they are not."""
    small, other = torch.rand(2, 1, 8, 8, generator=torch.Generator().manual_seed(0))
    large, other_large = (image.repeat_interleave(2, 1).repeat_interleave(2, 2) for image in (small, other))
    for scaling, same in (("values", True), ("none", False)):
        settings = FrequencySettings(features=20_000, bandwidth_scaling=scaling)
        kernels = []
        for a, b in ((small, other), (large, other_large)):
            rff = settings.features_of(DatasetInfo("probe", *a.shape, ["a", "b"], "test"))
            kernels.append(float(rff(a[None]) @ rff(b[None]).T))
        assert (kernels[1] == pytest.approx(kernels[0], abs=0.03)) is same


def test_class_means_read_only_their_class_and_record_one_parallel_release(tmp_path):
    labels = torch.tensor([0] * 30 + [1] * 20)
    images = torch.where(labels.view(-1, 1, 1, 1) == 0, 0.1, 0.9).expand(-1, 1, 4, 4).clone()
    rff = RandomFourierFeatures(16, 40, 2.0, seed=0)
    ledger = PrivacyLedger(tmp_path / "ledger.json")
    means = noisy_class_means(ImageSet(images, labels), 2, rff, FrequencyQuery(1e-9, 1e-9), ledger, "frequency",
                              secret_stream())
    assert torch.allclose(means[0], rff(images[:1])[0], atol=1e-5)
    assert torch.allclose(means[1], rff(images[-1:])[0], atol=1e-5)
    (event,) = ledger.events()
    assert isinstance(event, ParallelComposition) and set(event.parts) == {"0", "1"}
    assert event.parts["1"] == (GaussianMechanism(1e-9), GaussianMechanism(1e-9))  # feature sum, class size


def test_bad_frequency_settings_are_config_errors():
    with pytest.raises(ConfigError, match="frequency.features must be an even number"):
        FETAPro(resolve_config("feta-pro", dataset="digits", overrides=["frequency.features=7"]))
    with pytest.raises(ConfigError, match="frequency.bandwidth must be a number above 0, got 0"):
        FETAPro(resolve_config("feta-pro", dataset="digits", overrides=["frequency.bandwidth=0"]))
    with pytest.raises(ValueError, match="the number of features must be even"):
        RandomFourierFeatures(16, 7, 1.0, 0)
    with pytest.raises(ConfigError, match="curriculum.order must be one of"):
        FETAPro(resolve_config("feta-pro", dataset="digits", overrides=["curriculum.order=backwards"]))
    with pytest.raises(ConfigError, match="frequency.noise_multiplier must be a number above 0, got -1"):
        FETAPro(resolve_config("feta-pro", dataset="digits", overrides=["frequency.noise_multiplier=-1.0"]))


def test_auto_noise_is_dpimagebenchs_at_epsilon_1_and_10_and_falls_in_between():
    assert auto_noise("central", 1.0) == pytest.approx(20.0) and auto_noise("central", 10.0) == pytest.approx(5.0)
    assert auto_noise("frequency", 1.0) == pytest.approx(26.6)
    assert auto_noise("frequency", 10.0) == pytest.approx(7.4)
    assert 7.4 < auto_noise("frequency", 4.0) < 26.6


def test_the_auxiliary_generator_moves_its_features_toward_the_noisy_target(tmp_path):
    digits = load_dataset("digits", resolution=8, channels=1).train
    rff = RandomFourierFeatures(64, 400, 4.0, seed=0)
    targets = noisy_class_means(digits, 10, rff, FrequencyQuery(0.5, 1.0), PrivacyLedger(tmp_path / "l.json"),
                                "frequency", secret_stream())
    torch.manual_seed(0)
    generator = ConditionalGenerator(1, 8, 8, 10, latent=8, width_base=16)
    settings = GeneratorSettings(epochs=4, iterations_per_epoch=40, batch_size=200, lr=0.01, lr_decay=0.9, latent=60,
                                 width=64)
    losses = fit_generator(generator, targets, rff, settings, torch.device("cpu"), torch.Generator().manual_seed(0))
    assert losses[-1] < 0.5 * losses[0]


def test_the_diffusion_models_own_samples_are_differentiable_for_the_no_auxiliary_variant():
    torch.manual_seed(0)
    model = build_unet(1, 8, 10, [8, 16], 1, False, 4)
    labels = torch.arange(6) % 10
    images = Diffusion(100, "linear", "v").ddim(model, labels, (1, 8, 8), 10, steps=2,
                                                generator=torch.Generator().manual_seed(0))
    rff = RandomFourierFeatures(64, 40, 4.0, seed=0)
    feature_matching_loss(images, labels, torch.zeros(10, 40), rff).backward()
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad)


@pytest.mark.parametrize("order, stages, phases", [
    ("spatial-frequency", ["central-images", "frequency-features", "dp-sgd"], ["warmup-spatial", "warmup-frequency"]),
    ("frequency-spatial", ["central-images", "frequency-features", "dp-sgd"], ["warmup-frequency", "warmup-spatial"]),
    ("simultaneous", ["central-images", "frequency-features", "dp-sgd"], ["warmup-joint"]),
    ("frequency", ["frequency-features", "dp-sgd"], ["warmup-frequency"]),
    ("no-auxiliary", ["central-images", "frequency-features", "dp-sgd"], ["warmup-spatial", "warmup-frequency"]),
])
def test_each_curriculum_order_plans_its_stages_and_phases(order, stages, phases):
    method = FETAPro(resolve_config("feta-pro", dataset="digits",
                                    overrides=[f"curriculum.order={order}", "central.batch_size=300"]))
    info = load_dataset("digits", resolution=8, channels=1).info
    assert [stage.name for stage in method.privacy_stages(info)] == stages
    assert method.warmup_phases() == phases




@pytest.mark.slow
def test_feta_pro_runs_and_a_run_killed_in_the_frequency_warm_up_resumes_to_the_clean_result(tmp_path):
    clean_dir = finished_run(*TINY_FETA_PRO, "--set", f"run.out_dir={tmp_path / 'clean'}")
    stages = privacy_report(clean_dir)["stages"]
    assert [stage["name"] for stage in stages] == ["central-images", "frequency-features", "dp-sgd"]
    assert privacy_report(clean_dir)["epsilon"] <= 8.0
    assert (clean_dir / "central_images.png").exists() and (clean_dir / "auxiliary_images.png").exists()

    assert_killed_run_resumes_to(clean_dir, [*TINY_FETA_PRO, "--set", f"run.out_dir={tmp_path / 'crash'}"],
                                 warmup_step_logged(4, "warmup-frequency"))


@pytest.mark.slow
@pytest.mark.parametrize("order", ["simultaneous", "no-auxiliary"])
def test_the_other_curricula_run_end_to_end(tmp_path, order):
    run_dir = finished_run(*TINY_FETA_PRO, "--set", f"curriculum.order={order}", "--set", f"run.out_dir={tmp_path}")
    stages = [stage["name"] for stage in privacy_report(run_dir)["stages"]]
    assert stages == ["central-images", "frequency-features", "dp-sgd"]
    assert (run_dir / "auxiliary_images.png").exists() == (order != "no-auxiliary")
