"""DP-SAD: both stages in the ledger, a non-private teacher yields no epsilon anywhere, resume, the next-step map."""
from __future__ import annotations

import json
import math

import pytest
import torch
from conftest import (
    assert_killed_run_resumes_to,
    assert_report_matches,
    dpsynth_main,
    finished_run,
    privacy_report,
    tiny_dp_sad,
)
from diffusers import DDPMScheduler

from dpsynth.diffusion import Diffusion
from dpsynth.methods.dp_sad.distillation import Discriminator, discriminator_loss
from dpsynth.privacy import NonPrivateAccess, PrivacyLedger, SubsampledGaussianMechanism


def epsilons(report: object) -> list[object]:
    """Every value under a key that mentions epsilon, anywhere in a JSON document."""
    if isinstance(report, dict):
        found = [v for k, v in report.items() if "epsilon" in k and not isinstance(v, (dict, list))]
        return found + [x for v in report.values() for x in epsilons(v)]
    return [x for v in report for x in epsilons(v)] if isinstance(report, list) else []


def test_default_run_accounts_teacher_and_student_then_resumes_from_the_student_phase(tmp_path):
    run = finished_run(*tiny_dp_sad(tmp_path / "clean"))
    ledger = PrivacyLedger.load(run / "ledger.json")
    stages = ledger.stages()
    assert list(stages) == ["teacher", "student"]
    (teacher,), (student,) = stages["teacher"], stages["student"]
    assert isinstance(teacher, SubsampledGaussianMechanism) and isinstance(student, SubsampledGaussianMechanism)
    assert teacher.noise_multiplier == student.noise_multiplier  # one calibrated sigma
    assert teacher.steps == student.steps == 11  # half an epoch each of 1,437 records at batch 64
    report = privacy_report(run)
    assert report["dp_guarantee"] is True and 7.9 < report["epsilon"] <= 8.0
    assert (run / "teacher_pool.png").is_file()
    assert_killed_run_resumes_to(run, tiny_dp_sad(tmp_path / "crash"),
                                 lambda e: e.get("event") == "student" and e["step"] >= 6)


def test_non_private_teacher_needs_the_flag_and_then_yields_no_epsilon_anywhere(tmp_path):
    refused = dpsynth_main("run", *tiny_dp_sad(tmp_path, "--set", "teacher.training=non-private"))
    assert refused.code == 2
    assert "teacher of dp-sad use the private data without noise" in refused.err
    assert "--allow-non-private" in refused.err and not list(tmp_path.glob("*"))

    done = dpsynth_main("run", "--allow-non-private", *tiny_dp_sad(tmp_path, "--set", "teacher.training=non-private"))
    assert done.code == 0, done.err
    assert "NO differential-privacy guarantee" in done.err  # the warning
    assert "released 30 images with NO differential-privacy guarantee" in done.out
    (run,) = tmp_path.glob("dp-sad-digits-nodp-*")
    report = privacy_report(run)
    assert report["dp_guarantee"] is False and "teacher" in report["no_guarantee"]
    assert set(epsilons(report)) == {None}
    released = [json.loads(line) for line in (run / "log.jsonl").read_text().splitlines()][-1]
    assert released["event"] == "released" and released["epsilon"] is None
    stages = PrivacyLedger.load(run / "ledger.json").stages()
    assert stages["teacher"] == [NonPrivateAccess(11)]
    assert isinstance(stages["student"][0], SubsampledGaussianMechanism)
    shown = assert_report_matches(run)  # its page says so too, and draws no epsilon chart
    assert "NO differential-privacy guarantee: ε = none." in shown["text"]
    assert "epsilon per stage" not in [image["alt"] for image in shown["images"]]


@pytest.mark.parametrize("prediction", ["epsilon", "v"])
def test_the_next_step_image_is_diffusers_noise_free_ddpm_step(prediction, monkeypatch):
    diffusion = Diffusion(1000, "linear", prediction)
    images, times = torch.rand(5, 1, 8, 8), torch.tensor([0, 1, 40, 500, 999])
    noisy, target = diffusion.noisy(images, times, torch.randn(5, 1, 8, 8))
    output = torch.randn(5, 1, 8, 8)
    scheduler = DDPMScheduler.from_config(diffusion.train_scheduler.config, clip_sample=False)
    monkeypatch.setattr("diffusers.schedulers.scheduling_ddpm.randn_tensor", lambda shape, **_: torch.zeros(shape))
    expected = torch.cat([scheduler.step(output[i:i + 1], int(times[i]), noisy[i:i + 1]).prev_sample
                          for i in range(5)])
    assert torch.allclose(diffusion.previous_mean(output, noisy, times), expected, atol=1e-5)
    # the exact prediction gives the forward process's posterior mean, x_0 itself at t = 0
    assert torch.allclose(diffusion.previous_mean(target, noisy, times)[0], images[0] * 2 - 1, atol=1e-5)
    # and the next-step image determines the denoised image the output predicts (what the discriminator sees)
    recovered = diffusion.clean_from_previous(diffusion.previous_mean(output, noisy, times), noisy, times)
    assert torch.allclose(recovered, diffusion.predicted_clean(output, noisy, times), atol=2e-3)


def test_the_discriminator_learns_to_tell_two_clearly_different_next_step_distributions():
    """Teacher and student next-step images at the same x_t, from bright-top vs bright-bottom denoised images:
    at most t they differ by a fraction of a percent, yet the discriminator's loss must fall well below ln 2."""
    torch.manual_seed(0)
    diffusion = Diffusion(1000, "linear", "v")
    discriminator = Discriminator(1, 16, diffusion)
    optimizer = torch.optim.Adam(discriminator.parameters(), lr=2e-3, betas=(0.5, 0.999))

    def batch(n: int = 64) -> tuple[torch.Tensor, ...]:
        rows = torch.arange(16).view(1, 1, 16, 1).expand(n, 1, 16, 16)
        top, bottom = (rows < 8).float(), (rows >= 8).float()
        jitter = 0.3 * torch.rand(n, 1, 16, 16)
        teacher_clean, student_clean = (top + jitter) * 1.4 - 1, (bottom + jitter) * 1.4 - 1
        times = torch.randint(0, 1000, (n,))
        noisy, _ = diffusion.noisy(torch.rand(n, 1, 16, 16), times, torch.randn(n, 1, 16, 16))
        clean_weight, noisy_weight = diffusion.posterior_weights(times, noisy)
        teacher_next, student_next = (clean_weight * clean + noisy_weight * noisy for clean in (teacher_clean,
                                                                                                student_clean))
        return teacher_next, student_next, noisy, times

    first = discriminator_loss(discriminator, *batch()).item()
    for _ in range(100):
        loss = discriminator_loss(discriminator, *batch())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    with torch.no_grad():
        last = discriminator_loss(discriminator, *batch(256)).item()
    assert abs(first - math.log(2)) < 0.05 and last < 0.2
