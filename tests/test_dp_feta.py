"""DP-FETA: the central-image queries' sensitivity and semantics, and a tiny run end to end with resume."""
from __future__ import annotations

import pytest
import torch
from conftest import (
    TINY_DP_FETA,
    assert_killed_run_resumes_to,
    finished_run,
    privacy_report,
    secret_stream,
    warmup_step_logged,
)
from kornia.augmentation.auto import RandAugment

from dpsynth.data import ImageSet
from dpsynth.errors import ConfigError
from dpsynth.privacy import ParallelComposition, PrivacyLedger, SubsampledGaussianMechanism
from dpsynth.privacy.central_images import (
    CentralQuery,
    central_images,
    mean_image,
    mode_image,
    pixel_histogram,
    pooled,
)
from dpsynth.training.warmup import AUGMENTATIONS, augmented


def query(kind: str, noise: float = 0.0, bins: int = 2, clip: float = 100.0, downsample: int = 1,
          denoise: bool = False) -> CentralQuery:
    return CentralQuery(kind, count=3, sample_rate=1.0, noise=noise, clip=clip, bins=bins, count_noise=1e-9,
                        downsample=downsample, denoise=denoise)


def test_mode_of_the_papers_pixel_set():
    pixels = torch.tensor([1.0, 3.0, 3.0, 4.0]).view(4, 1, 1, 1) / 4  # {1, 3, 3, 4} with p_max = 4
    generator = secret_stream()
    ones = torch.ones(4)
    assert pixel_histogram(pixels, 2, ones).tolist() == [[1, 3]]
    assert float(mode_image(pixels, ones, query("mode", bins=2), generator)) * 4 == 3.0  # centre of bin [2, 4]
    assert float(mode_image(pixels, ones, query("mode", bins=4), generator)) * 4 == 3.5  # centre of bin [3, 4]


@pytest.mark.parametrize("downsample", [1, 2, 3])
def test_neighbouring_datasets_move_the_clipped_mean_by_at_most_c_over_f_b(downsample):
    images, extra = torch.rand(20, 1, 6, 6) * 3, torch.ones(1, 1, 6, 6) * 3  # norms above the clip
    generator = secret_stream()
    clip, size = 2.0, 20.0
    settings = query("mean", clip=clip, downsample=downsample)
    without = mean_image(pooled(images, downsample), torch.ones(20), settings, size, generator)
    with_extra = mean_image(pooled(torch.cat([images, extra]), downsample), torch.ones(21), settings, size, generator)
    assert without.shape == (1, 6 // downsample, 6 // downsample)
    assert (with_extra - without).norm() == pytest.approx(clip / downsample / size, rel=1e-5)


@pytest.mark.parametrize("downsample", [1, 2])
def test_neighbouring_datasets_move_the_histogram_by_sqrt_p_over_f(downsample):
    images, extra = torch.rand(20, 3, 4, 4), torch.rand(1, 3, 4, 4)
    change = (pixel_histogram(pooled(torch.cat([images, extra]), downsample), 5, torch.ones(21))
              - pixel_histogram(pooled(images, downsample), 5, torch.ones(20)))
    assert change.float().norm() == pytest.approx((3 * 4 * 4) ** 0.5 / downsample)


def test_a_downsample_that_does_not_divide_the_image_is_refused():
    with pytest.raises(ConfigError, match="central.downsample = 3 must divide"):
        pooled(torch.rand(2, 1, 4, 4), 3)


@pytest.mark.parametrize("kind", ["mean", "mode"])
def test_downsampled_denoised_central_images_come_back_at_full_size(tmp_path, kind):
    labels = torch.tensor([0] * 40 + [1] * 40)
    images = torch.zeros(80, 1, 8, 8)
    images[:40, :, 2:6, 2:6] = 1.0  # class 0: a bright square; class 1: black
    central = central_images(ImageSet(images, labels), 2, query(kind, noise=1e-9, downsample=2, denoise=True),
                             PrivacyLedger(tmp_path / "ledger.json"), "central", secret_stream())
    assert central.images.shape == (6, 1, 8, 8) and central.images.min() >= 0 and central.images.max() <= 1
    square = central.images[0, 0]
    assert square[3:5, 3:5].min() > 0.55 and square[0, 0] < 0.3 and central.images[3:].max() < 0.3


@pytest.mark.parametrize("kind, expected", [("mode", (0.25, 0.75)), ("mean", (0.1, 0.9))])
def test_per_class_queries_read_only_their_class(tmp_path, kind, expected):
    labels = torch.tensor([0] * 30 + [1] * 30)
    images = torch.where(labels.view(-1, 1, 1, 1) == 0, 0.1, 0.9).expand(-1, 1, 5, 5).clone()
    ledger = PrivacyLedger(tmp_path / "ledger.json")
    central = central_images(ImageSet(images, labels), 2, query(kind, noise=1e-9), ledger, "central",
                             secret_stream())
    assert central.labels.tolist() == [0, 0, 0, 1, 1, 1]
    for label, value in enumerate(expected):
        assert torch.allclose(central.images[central.labels == label], torch.tensor(value), atol=1e-4)
    (event,) = ledger.events()
    assert isinstance(event, ParallelComposition) and set(event.parts) == {"0", "1"}
    assert event.parts["0"][0] == SubsampledGaussianMechanism(1e-9, 1.0, 3)
    grouped = ImageSet(images, labels, torch.arange(60) // 3)  # one label per group: the same images come back
    ledger = PrivacyLedger(tmp_path / "grouped.json")
    central = central_images(grouped, 2, query(kind, noise=1e-9), ledger, "central", secret_stream())
    for label, value in enumerate(expected):
        assert torch.allclose(central.images[central.labels == label], torch.tensor(value), atol=1e-4)
    assert ledger.events()[0] == SubsampledGaussianMechanism(1e-9, 1.0, 3)  # one mechanism for all classes


def test_bad_central_settings_are_config_errors():
    with pytest.raises(ConfigError, match="central.kind must be one of mean, mode"):
        query("median")
    with pytest.raises(ConfigError, match="central.batch_size"):
        CentralQuery("mean", 1, 1.5, 1.0, 1.0, 2, 1.0)



@pytest.mark.slow
def test_dp_feta_runs_and_a_run_killed_in_warm_up_resumes_to_the_clean_result(tmp_path):
    clean_dir = finished_run(*TINY_DP_FETA, "--set", f"run.out_dir={tmp_path / 'clean'}")
    report = privacy_report(clean_dir)
    assert [stage["name"] for stage in report["stages"]] == ["central-images", "dp-sgd"]
    assert report["epsilon"] <= 8.0 and report["stages"][0]["partitions"] == 10
    central = {part["mechanism"]: part for part in report["stages"][0]["mechanisms"]}
    assert central["subsampled_gaussian"]["steps"] == 2 and central["gaussian"]["steps"] == 1  # + class size
    assert (clean_dir / "central_images.png").exists()

    assert_killed_run_resumes_to(clean_dir, [*TINY_DP_FETA, "--set", f"run.out_dir={tmp_path / 'crash'}"],
                                 warmup_step_logged(4, "warmup"))


@pytest.mark.parametrize("channels", [1, 3])
@pytest.mark.parametrize("operation", [op[0][0] for op in AUGMENTATIONS])
def test_every_warmup_augmentation_works_on_grey_and_colour_images(channels, operation):
    images = torch.rand(4, channels, 12, 12)
    policy = [op for op in AUGMENTATIONS if op[0][0] == operation]
    out = augmented(RandAugment(1, 10, policy=policy), images)
    assert out.shape == images.shape and out.min() >= 0 and out.max() <= 1
