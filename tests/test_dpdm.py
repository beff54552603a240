"""DPDM end to end on a tiny model (run, release, privacy report, evaluation, SIGKILL-then-resume); the sampler."""
from __future__ import annotations

import json
import re
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import yaml
from conftest import (
    RDP,
    TINY_DPDM,
    assert_report_matches,
    dpsynth_main,
    dpsynth_run,
    finished_run,
    kill_after_recorded_steps,
    run_directory,
    started,
)

from dpsynth.api import resolve_config
from dpsynth.config import SamplingSettings
from dpsynth.diffusion import Diffusion
from dpsynth.diffusion.ddpm import PREDICTIONS as PREDICTION_TYPES
from dpsynth.diffusion.ddpm import SAMPLERS, NoiseLevels
from dpsynth.diffusion.inference import sampling_inputs, sampling_model
from dpsynth.diffusion.settings import PREDICTIONS, SAMPLER_NAMES
from dpsynth.errors import ConfigError
from dpsynth.models import build_unet
from dpsynth.privacy import NonPrivateAccess, PrivacyLedger


@pytest.fixture(scope="module")
def evaluated(tmp_path_factory: pytest.TempPathFactory) -> SimpleNamespace:
    """A tiny DPDM run that releases and evaluates (its ledgers in its own folder), and what it printed."""
    root = tmp_path_factory.mktemp("evaluated")
    evaluation = ["evaluation.enabled=true", "evaluation.num_synthetic=30", "evaluation.num_real=30",
                  "evaluation.classifiers=[cnn]", "evaluation.classifier_epochs=2", "evaluation.classifier_seeds=1",
                  "evaluation.kid_subsets=5",
                  "evaluation.kid_subset_size=10", f"evaluation.cache_dir={root / 'cache'}"]
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("DPSYNTH_LEDGER_DIR", str(root / "evaluation-ledgers"))
        patch.setenv("DPSYNTH_RELEASES", str(root / "releases.json"))
        done = dpsynth_main("run", "dpdm", *TINY_DPDM, *[arg for pair in [*evaluation, f"run.out_dir={root}"]
                                                    for arg in ("--set", pair)])
    assert done.code == 0, done.err
    return SimpleNamespace(run=run_directory(done.out), printed=done.out)


def test_dpdm_releases_within_its_budget_the_steps_its_ledger_holds(evaluated):
    run = evaluated.run
    report = json.loads((run / "release" / "privacy.json").read_text())
    assert report["epsilon"] <= 8.0 and report["target_epsilon"] == 8.0
    (stage,) = report["stages"]
    (part,) = stage["mechanisms"]
    assert stage["name"] == "dp-sgd" and part["steps"] == int(1 / (64 / 1437))
    assert PrivacyLedger.load(run / "ledger.json").events()[0].steps == part["steps"]
    with np.load(run / "release" / "synthetic.npz") as release:
        assert release["images"].shape == (30, 1, 8, 8) and release["images"].dtype == np.uint8
        assert sorted(set(release["labels"].tolist())) == list(range(10))
    assert (run / "release" / "samples.png").exists() and (run / "config.yaml").exists()
    assert "evaluation" not in report  # the evaluation writes nothing into release/


def test_dpdm_is_evaluated_on_the_fast_inception_path_it_chose_with_its_selection_charged(evaluated):
    run = evaluated.run
    assert "FID " in evaluated.printed and "[30 synthetic vs 30 real (train split)]" in evaluated.printed
    assert "accuracy  cnn" in evaluated.printed
    metrics = json.loads((run / "metrics.json").read_text())
    fast = yaml.safe_load((run / "config.yaml").read_text())["hardware"]["choices"]["evaluation.fast_inception"]
    assert fast == {"value": False, "why": "auto: fp32 (bf16 features moved FID by more than two draws of one model "
                                           "differ)"}
    assert metrics["images"] == {"synthetic": 30, "real": 30, "real_split": "train", "inception_path": "fp32-fused",
                                 "inception": "uint8-gray3-bilinear299-div128m1-fused"}
    assert metrics["fid"] > 0 and 0 <= metrics["precision"] <= 1 and 0 <= metrics["accuracy"]["cnn"]["test_accuracy"]
    assert metrics["evaluation_privacy"]["stages"][0]["name"] == "model-selection"
    assert metrics["evaluation_privacy"]["epsilon"] == pytest.approx(1.0, abs=1e-3)


def test_dpdm_report_is_rewritten_with_the_evaluation(evaluated):
    run = evaluated.run
    assert (run / "nearest_neighbours.png").exists() and (run / "training_curves.png").exists()
    shown = assert_report_matches(run)
    assert [image["alt"] for image in shown["images"]][-2:] == [
        "synthetic images above their nearest real training images", "training curves"]
    assert "30 synthetic vs 30 real (train split)" in shown["text"] and "Not evaluated yet" not in shown["text"]
    assert re.search(r"accuracy, cnn\s+[\d.]+ ± 0.00 %\s+trained on 30 synthetic, tested on \d+ real test",
                     shown["text"])


@pytest.mark.slow
def test_an_infinite_epsilon_trains_without_noise_only_when_allowed_and_claims_no_epsilon(tmp_path):
    args = ["dpdm", *TINY_DPDM, "--epsilon", "inf", "--set", "dpsgd.epochs=0.2", "--set", f"run.out_dir={tmp_path}"]
    refused = dpsynth_main("run", *args)
    assert refused.code == 2 and "privacy.epsilon inf trains without noise" in refused.err
    assert "--allow-non-private" in refused.err and not list(tmp_path.glob("*"))
    done = dpsynth_main("run", "--allow-non-private", *args)
    assert done.code == 0, done.err
    run = run_directory(done.out)
    assert PrivacyLedger.load(run / "ledger.json").events() == [NonPrivateAccess(int(0.2 / (64 / 1437)))]
    report = json.loads((run / "release" / "privacy.json").read_text())
    assert report["dp_guarantee"] is False and report["epsilon"] is None and run.name.startswith("dpdm-digits-nodp")
    pe = dpsynth_main("privacy", "pe", "--epsilon", "inf", "--allow-non-private")
    assert pe.code == 2 and "stage 'histograms' cannot run without noise" in pe.err


def test_sigkill_during_training_then_resume_matches_a_clean_run(tmp_path):
    clean_dir = finished_run("dpdm", *TINY_DPDM, *RDP, "--set", f"run.out_dir={tmp_path / 'clean'}")
    crash = dpsynth_run("dpdm", *TINY_DPDM, *RDP, "--set", f"run.out_dir={tmp_path / 'crash'}")
    crash_dir = started(crash)
    kill_after_recorded_steps(crash, crash_dir, 7, timeout=300)  # checkpoint at 5
    assert not (crash_dir / "release" / "synthetic.npz").exists()

    resumed = dpsynth_main("run", "--resume", str(crash_dir))
    assert resumed.code == 0, resumed.err
    assert "ledger_rewound" in (crash_dir / "log.jsonl").read_text()  # 7 steps recorded, the checkpoint held 5
    assert PrivacyLedger.load(crash_dir / "ledger.json") == PrivacyLedger.load(clean_dir / "ledger.json")
    reports = [json.loads((run / "release" / "privacy.json").read_text()) for run in (crash_dir, clean_dir)]
    assert (reports[0].pop("releases")["number"], reports[1].pop("releases")["number"]) == (2, 1)  # once each
    for report in reports:  # the datasheets say which release of the two each is; the rest is the same
        del report["release_files"]["README.md"]
    assert reports[0] == reports[1]
    with np.load(crash_dir / "release" / "synthetic.npz") as a, np.load(clean_dir / "release" / "synthetic.npz") as b:
        assert np.array_equal(a["images"], b["images"])  # same state, same RNG: the same release


class _Oracle(torch.nn.Module):
    """The exact denoiser of a one-image data distribution, in the parameterisation ``prediction``."""

    def __init__(self, diffusion: Diffusion, image: torch.Tensor) -> None:
        super().__init__()
        self.abar, self.x0 = diffusion.alphas_cumprod, image * 2 - 1
        self.prediction = diffusion.prediction
        self.unused = torch.nn.Parameter(torch.zeros(1))

    def forward(self, x: torch.Tensor, t: torch.Tensor, class_labels: torch.Tensor) -> SimpleNamespace:
        abar = self.abar[t].view(-1, 1, 1, 1)
        eps = (x - abar.sqrt() * self.x0) / (1 - abar).sqrt()
        out = eps if self.prediction == "epsilon" else abar.sqrt() * eps - (1 - abar).sqrt() * self.x0
        return SimpleNamespace(sample=out)


@pytest.mark.parametrize("sampler", list(SAMPLERS))
@pytest.mark.parametrize("prediction", ["epsilon", "v"])
def test_every_sampler_with_the_exact_denoiser_returns_the_data_and_its_loss_is_zero(prediction, sampler):
    diffusion = Diffusion(prediction=prediction)
    image = torch.rand(1, 6, 6)
    oracle = _Oracle(diffusion, image)
    samples = diffusion.sample(oracle, torch.zeros(3, dtype=torch.long), (1, 6, 6), null_label=1, steps=10,
                               generator=torch.Generator().manual_seed(0), sampler=sampler,
                               device=torch.device("cpu"))
    assert torch.allclose(samples, image.expand(3, -1, -1, -1), atol=1e-3)
    times, noise = diffusion.training_inputs(1, 4, (1, 6, 6), torch.Generator().manual_seed(0))
    assert diffusion.example_loss(oracle, image, torch.tensor(0), times[0], noise[0]) < 1e-8


def test_a_compiled_sampling_model_draws_what_the_eager_one_draws_without_compiling_again(
        monkeypatch: pytest.MonkeyPatch):
    torch.manual_seed(0)
    model, diffusion = build_unet(1, 8, 3, [8, 16], norm_groups=4).eval(), Diffusion(timesteps=100)
    labels = torch.arange(4) % 3
    monkeypatch.setattr(torch._dynamo.config, "error_on_recompile", True)  # the example must match real calls
    samples = []
    for compiled in (False, True):
        with sampling_model(model, SamplingSettings(bf16=False, compile=compiled), 16,
                            sampling_inputs(4, (1, 8, 8), diffusion.timesteps)) as chosen:
            samples.append(diffusion.sample(chosen.model, labels, (1, 8, 8), 3, 3,
                                            generator=torch.Generator().manual_seed(0), device=chosen.device))
        assert chosen.report() == {"sampling_bf16": False, "sampling_compiled": compiled,
                                   "sampling_compile_seconds": round(chosen.compile_seconds, 1)}
    assert chosen.compile_seconds > 0
    assert torch.allclose(samples[0], samples[1], atol=1e-4)


@pytest.mark.parametrize("override, message", [
    ("diffusion.prediction=x0", "diffusion.prediction must be one of epsilon, v, got 'x0'"),
    ("diffusion.noise_levels=edm", "diffusion.noise_levels must be one of uniform, log-normal, got 'edm'"),
    ("diffusion.noise_level_std=0", "diffusion.noise_level_std must be a number above 0, got 0.0"),
    ("diffusion.sampler=euler", r"diffusion.sampler must be one of dpm-solver\+\+, ddim, unipc, got 'euler'"),
])
def test_unknown_prediction_or_sampler_is_a_config_error(override, message):
    assert set(SAMPLER_NAMES) == set(SAMPLERS) and set(PREDICTIONS) == set(PREDICTION_TYPES)
    with pytest.raises(ConfigError, match=message):  # when the config is built, before any run
        resolve_config("dpdm", dataset="digits", overrides=[override])


def test_log_normal_noise_levels_draw_times_whose_log_sigma_has_the_asked_mean_and_spread():
    uniform = Diffusion(prediction="v")
    times, _ = uniform.training_inputs(4000, 2, (1, 2, 2), torch.Generator().manual_seed(0))
    assert times.shape == (4000, 2) and abs(times.float().mean().item() - 499.5) < 15
    shifted = Diffusion(prediction="v", levels=NoiseLevels("log-normal", mean=0.5, std=1.2))
    times, noise = shifted.training_inputs(4000, 2, (1, 2, 2), torch.Generator().manual_seed(0))
    assert noise.shape == (4000, 2, 1, 2, 2) and 0 <= times.min() and times.max() <= 999
    log_sigma = shifted.log_sigmas[times]  # each draw's step is the first whose sigma reaches it: up to one step high
    assert abs(log_sigma.mean().item() - 0.5) < 0.06 and abs(log_sigma.std().item() - 1.2) < 0.06
    assert times.median() < 400 < 500  # mass moved off the pure-noise end that uniform t spends a fifth on
    with pytest.raises(ValueError, match="noise levels must be one of uniform, log-normal"):
        NoiseLevels("edm")


def test_guidance_acts_only_inside_its_interval_of_the_trajectory():
    torch.manual_seed(0)
    model, diffusion = build_unet(1, 8, 3, [8, 16], norm_groups=4).eval(), Diffusion(timesteps=100)
    labels = torch.arange(4) % 3

    def draw(guidance: float, interval: tuple[float, float]) -> torch.Tensor:
        return diffusion.sample(model, labels, (1, 8, 8), 3, 5, guidance, torch.Generator().manual_seed(0),
                                guidance_interval=interval)

    unguided, guided = draw(0.0, (0.0, 1.0)), draw(3.0, (0.0, 1.0))
    assert torch.equal(draw(3.0, (0.999, 1.0)), unguided)  # no step of 5 lies at t / T >= 0.999
    partly = draw(3.0, (0.5, 1.0))
    assert not torch.allclose(partly, unguided) and not torch.allclose(partly, guided)


@pytest.mark.parametrize("interval", [[0.6, 0.2], [0.0, 1.5], [0.5]])
def test_a_bad_guidance_interval_is_refused_before_the_run_starts(interval):
    with pytest.raises(ConfigError, match="diffusion.guidance_interval must be"):
        resolve_config("dpdm", dataset="digits", overrides=[f"diffusion.guidance_interval={interval}"])
