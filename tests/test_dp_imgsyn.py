"""DP-ImgSyn: the statistics' sensitivity, alignment, the soft-label release, the ledger, distillation."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import (
    TINY_DP_IMGSYN,
    assert_killed_run_resumes_to,
    dpsynth_main,
    finished_run,
    privacy_report,
    secret_stream,
)

from dpsynth.api import dataset_from_config, synthetic_dataset
from dpsynth.errors import DataError
from dpsynth.evaluation.downstream import distillation_loss
from dpsynth.evaluation.release import load_release
from dpsynth.methods.dp_imgsyn.alignment import AlignmentSettings, align_batch, uniform_targets
from dpsynth.methods.dp_imgsyn.method import DPImgSyn
from dpsynth.models import group_norm_resnet
from dpsynth.privacy import GaussianMechanism, PrivacyLedger
from dpsynth.privacy.batch_statistics import (
    MomentScaling,
    batch_statistics,
    clipped_moment_sum,
    example_moments,
    layer_widths,
    norm_inputs,
    private_statistics,
    public_scaling,
)
from dpsynth.runs import RunDirectory

CPU = torch.device("cpu")

def tiny_teacher(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return group_norm_resnet(1, 10, [1, 1], [8, 16], groups=4).eval()


def unscaled(teacher: torch.nn.Module, clip: float) -> MomentScaling:
    return MomentScaling(torch.ones(2 * sum(layer_widths(teacher))), clip)


def test_unclipped_moments_give_the_batch_statistics_batchnorm_would_keep():
    teacher, images = tiny_teacher(), torch.randn(12, 1, 8, 8)
    scaling = public_scaling(teacher, torch.rand(20, 1, 8, 8), 1e9, 7, CPU)
    stats = batch_statistics(teacher, images, scaling)  # scaled, then unscaled: the same statistics
    with torch.no_grad(), norm_inputs(teacher) as captured:
        teacher(images)
    for inputs, mean, variance in zip(captured, stats.means, stats.variances, strict=True):
        assert torch.allclose(mean, inputs.mean(dim=(0, 2, 3)), atol=1e-5)
        assert torch.allclose(variance, inputs.var(dim=(0, 2, 3), unbiased=False), atol=1e-4)


def test_public_scaling_weighs_every_block_alike_and_sets_the_clip_from_public_images_only():
    teacher, public = tiny_teacher(), torch.rand(50, 1, 8, 8) * 2 - 1
    scaling = public_scaling(teacher, public, None, 16, CPU)
    with torch.no_grad():
        moments = example_moments(teacher, public)[1] * scaling.scale
    sizes = [w for width in layer_widths(teacher) for w in (width, width)]
    block_norms = torch.stack([block.norm(dim=1) for block in moments.split(sizes, dim=1)], dim=1).mean(dim=0)
    assert torch.allclose(block_norms, torch.full_like(block_norms, len(sizes) ** -0.5), rtol=1e-4)
    assert scaling.clip == pytest.approx(1.5 * float(moments.norm(dim=1).max()), rel=1e-4)
    assert public_scaling(teacher, public, 0.7, 16, CPU).clip == 0.7


def test_one_example_moves_the_scaled_clipped_moment_sum_by_at_most_the_clipping_norm():
    teacher = tiny_teacher()
    scaling = public_scaling(teacher, torch.rand(20, 1, 8, 8), 0.5, 7, CPU)  # a fixed scale, not the data's
    images = torch.randn(30, 1, 8, 8)
    outlier = torch.full((1, 1, 8, 8), 50.0)  # its scaled moment vector is far longer than the clipping norm
    with torch.no_grad():
        assert (example_moments(teacher, outlier)[1] * scaling.scale).norm() > 10 * scaling.clip
    base = clipped_moment_sum(teacher, images, torch.ones(30), scaling, 7, CPU)
    for neighbour in (torch.cat([images, outlier]), images[1:], torch.cat([images, images[:1] * 3])):
        change = (clipped_moment_sum(teacher, neighbour, torch.ones(len(neighbour)), scaling, 7, CPU) - base).norm()
        assert change <= scaling.clip * (1 + 1e-6)
    with_outlier = clipped_moment_sum(teacher, torch.cat([images, outlier]), torch.ones(31), scaling, 7, CPU)
    assert (with_outlier - base).norm() == pytest.approx(scaling.clip, rel=1e-6)  # the bound is attained


def test_private_statistics_are_one_gaussian_mechanism_with_the_clip_as_sensitivity(tmp_path):
    teacher, images = tiny_teacher(), torch.randn(40, 1, 8, 8)
    ledger = PrivacyLedger(tmp_path / "ledger.json")
    noiseless = private_statistics(teacher, images, torch.ones(40), unscaled(teacher, 2.0), 1e-9, 16, CPU, ledger,
                                   "statistics", secret_stream())
    with torch.no_grad():
        clipped = batch_statistics(teacher, images, unscaled(teacher, 2.0))
    assert all(torch.allclose(a, b, atol=1e-5) for a, b in zip(noiseless.means, clipped.means, strict=True))
    assert ledger.events() == [GaussianMechanism(1e-9)]
    noisy = private_statistics(teacher, images, torch.ones(40), unscaled(teacher, 2.0), 30.0, 16, CPU, ledger,
                               "statistics", secret_stream())
    error = torch.cat([a - b for a, b in zip(noisy.means, clipped.means, strict=True)])
    assert error.std() == pytest.approx(30.0 * 2.0 / 40, rel=0.3)  # sigma C / N per coordinate


def test_alignment_lowers_the_feature_loss():
    teacher = tiny_teacher()
    for param in teacher.parameters():
        param.requires_grad_(False)
    scaling = public_scaling(teacher, torch.rand(20, 1, 8, 8) * 2 - 1, 1e9, 7, CPU)
    private = batch_statistics(teacher, torch.rand(64, 1, 8, 8) * 2 - 1, scaling)
    settings = AlignmentSettings(iterations=30, lr=0.05, betas=(0.5, 0.99), batch_size=20, alpha_feature=10.0,
                                 alpha_class=1.0, alpha_tv=2.5e-5, alpha_l2=3e-8, public="photo-patches",
                                 public_data_dir=None, init="public", temperature=1.0)
    start = torch.zeros(20, 1, 8, 8) - 0.9  # far from the private statistics
    aligned, losses = align_batch(teacher, start, uniform_targets(20, 10), private, scaling, settings)
    assert losses["aligned_feature"] < 0.5 * losses["start_feature"]
    assert aligned.min() >= -1 and aligned.max() <= 1
    assert uniform_targets(20, 10).bincount().tolist() == [2] * 10


def test_distillation_is_temperature_scaled_kl_and_vanishes_at_the_teacher():
    teacher_logits, temperature = torch.randn(6, 10) * 3, 4.0
    soft = F.softmax(teacher_logits / temperature, dim=1)
    student = (teacher_logits + 5.0).requires_grad_(True)  # a constant shift: the same distribution
    loss = distillation_loss(student, soft, temperature)
    loss.backward()
    assert loss.abs() < 1e-5 and student.grad.abs().max() < 1e-5
    other = torch.zeros(6, 10)
    expected = temperature ** 2 * (soft * (soft.log() - F.log_softmax(other / temperature, 1))).sum(1).mean()
    assert distillation_loss(other, soft, temperature) == pytest.approx(float(expected), rel=1e-5)
    labels = torch.randint(10, (6,))
    assert distillation_loss(other, labels, temperature) == pytest.approx(float(F.cross_entropy(other, labels)))


@pytest.mark.slow
def test_a_run_releases_the_teachers_soft_labels_spends_only_on_private_data_and_resumes(tmp_path):
    public_run = finished_run(*TINY_DP_IMGSYN, "--public", "digits", "--set", f"run.out_dir={tmp_path / 'public'}")
    privacy = privacy_report(public_run)
    assert [stage["name"] for stage in privacy["stages"]] == ["teacher", "statistics"]
    assert privacy["epsilon"] <= 2.0
    run = RunDirectory.open(public_run)
    release = load_release(run.file("release/synthetic.npz"), dataset_from_config(run.config()).info)
    assert release.soft_label_temperature == 4.0 and len(release) == 60
    teacher = group_norm_resnet(1, 10, [1, 1, 1, 1], [16, 32, 64, 128], 8)
    teacher.load_state_dict(run.last_checkpoint().released["teacher"])
    with torch.no_grad():
        logits = teacher(torch.from_numpy(release.images).float() / 255 * 2 - 1)
    assert np.allclose(release.soft_labels, F.softmax(logits / 4.0, dim=1).numpy(), atol=1e-5)
    assert (release.labels == release.soft_labels.argmax(axis=1)).all()
    assert 0 < run.method_metrics()["teacher_test_accuracy"] <= 1
    assert (public_run / "alignment.png").is_file()
    digest = privacy["public_data"]["alignment.public 'digits'"]
    sheet = (public_run / "release" / "README.md").read_text()
    assert digest["distinct_images"] > 1000 and digest["fingerprints_sha256"] in sheet
    assert "`soft_labels`" in sheet and DPImgSyn.declaration.paper.url in sheet
    image, label, soft = synthetic_dataset(public_run / "release" / "synthetic.npz")[0]
    assert image.shape == (1, 28, 28) and soft.shape == (10,) and float(soft.sum()) == pytest.approx(1, abs=1e-4)
    crash = [*TINY_DP_IMGSYN, "--public", "digits", "--set", f"run.out_dir={tmp_path / 'crash'}"]
    assert_killed_run_resumes_to(public_run, crash, lambda e: e.get("event") == "teacher" and e["step"] >= 1)

    noise_run = finished_run(*TINY_DP_IMGSYN, "--set", "alignment.init=noise",
                             "--set", f"run.out_dir={tmp_path / 'noise'}")
    assert RunDirectory.open(noise_run).ledger() == run.ledger()  # the public images cost nothing


def test_the_private_dataset_cannot_be_its_own_public_set(tmp_path):
    done = dpsynth_main("run", *TINY_DP_IMGSYN, "--public", "mnist-5k", "--set", f"run.out_dir={tmp_path}")
    assert done.code != 0 and "alignment.public" in done.err and "Traceback" not in done.err, done.err



def test_a_release_with_a_bad_soft_label_temperature_is_a_clear_error(tmp_path):
    info = dataset_from_config({"dataset": {"name": "digits", "data_dir": None, "val_size": None, "test_size": None,
                                            "split_seed": 0, "resolution": 8, "channels": 1}}).info
    path = tmp_path / "release.npz"
    soft = np.full((4, 10), 0.1, np.float32)
    np.savez(path, images=np.zeros((4, 1, 8, 8), np.uint8), labels=np.arange(4), soft_labels=soft,
             soft_label_temperature=np.float64(-1.0))
    with pytest.raises(DataError, match="soft_label_temperature"):
        load_release(path, info)
