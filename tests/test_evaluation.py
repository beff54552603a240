"""Evaluation on the real TF-FID Inception network and real data, at small sample counts."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from conftest import secret_stream
from scipy import linalg

from dpsynth.cli import main
from dpsynth.config import BASE_CONFIG
from dpsynth.data import load_dataset
from dpsynth.errors import ConfigError, DpsynthError
from dpsynth.evaluation import InceptionFeatures, Moments, fid, fid_infinity, kid, precision_recall
from dpsynth.evaluation.cache import FeatureCache
from dpsynth.evaluation.downstream import TrainingSettings, correct_predictions, train_epochs
from dpsynth.evaluation.evaluate import EvaluationSettings
from dpsynth.evaluation.fidelity import feature_fid
from dpsynth.evaluation.inception import chosen_path, preprocess
from dpsynth.hardware import Choice
from dpsynth.models.classifiers import build_classifier, channels_last
from dpsynth.privacy import PrivacyLedger, ReportNoisyMax
from dpsynth.privacy.mechanisms import report_noisy_max

PATH, _ = chosen_path("auto")  # the Inception path a run takes on this CPU


@pytest.fixture(scope="module")
def digits() -> np.ndarray:
    """120 sklearn digits as uint8 1 x 8 x 8 images."""
    dataset = load_dataset("digits")
    return dataset.train.images[:120].numpy()


@pytest.fixture(scope="module")
def features(digits: np.ndarray) -> dict[str, np.ndarray]:
    """Inception features of two disjoint clean sets of 40 digits and of the second with noise added."""
    extractor = InceptionFeatures("cpu", PATH)
    rng = np.random.default_rng(0)
    clean_a, clean_b = digits[:40], digits[40:80]
    out = {"a": extractor(clean_a), "b": extractor(clean_b)}
    for level in (40, 120):
        noisy = np.clip(clean_b + rng.normal(0, level, clean_b.shape), 0, 255).astype(np.uint8)
        out[f"b+{level}"] = extractor(noisy)
    return out


def test_the_fused_fp32_path_gives_the_shipped_networks_features(digits):
    shipped = InceptionFeatures("cpu", "fp32")(digits[:4])
    fused = InceptionFeatures("cpu", "fp32-fused")(digits[:4])
    assert np.abs(fused - shipped).max() < 1e-3 * np.abs(shipped).max()
    with pytest.raises(DpsynthError, match="Inception path must be one of fp32, fp32-fused, bf16-fused, got 'fp16'"):
        InceptionFeatures("cpu", "fp16")


def test_auto_runs_inception_in_fused_fp32_on_every_cpu_and_true_forces_bf16():
    assert PATH == "fp32-fused" and chosen_path(False)[0] == "fp32-fused"  # bf16 moved FID too far to be eligible
    assert chosen_path(True) == ("bf16-fused", Choice(True, "set in the config"))
    with pytest.raises(ConfigError, match="evaluation.fast_inception must be auto, true or false, got 'bf16'"):
        chosen_path("bf16")


def test_preprocessing_matches_the_network_input_range():
    images = np.array([[[[0, 255]]]], dtype=np.uint8).repeat(2, axis=2)
    batch = preprocess(images)
    assert batch.shape == (1, 3, 299, 299)
    assert batch.min() == -1 and batch.max() == pytest.approx(0.9921875)
    with pytest.raises(DpsynthError, match="uint8 images"):
        preprocess(images.astype(np.float32))


def test_fid_of_a_set_against_itself_is_zero(features):
    moments = Moments.of(features["a"])
    assert abs(fid(moments, moments)) < 1e-3
    assert fid(moments, Moments.of(features["b"])) > 1


def test_fid_matches_the_reference_formula_with_a_general_matrix_square_root():
    rng = np.random.default_rng(1)
    a, b = Moments.of(rng.normal(size=(300, 50))), Moments.of(rng.normal(size=(300, 50)) * 1.5 + 0.3)
    reference = (a.mean - b.mean) @ (a.mean - b.mean) + np.trace(a.cov + b.cov - 2 * linalg.sqrtm(a.cov @ b.cov).real)
    assert fid(a, b) == pytest.approx(reference, rel=1e-8)


def test_fid_infinity_removes_the_small_sample_bias():
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(800, 40)), rng.normal(size=(800, 40))
    shift = np.zeros(40)
    shift[0] = 2.0  # true FID between N(0, I) and N(shift, I) is |shift|^2 = 4
    assert fid(Moments.of(x), Moments.of(y)) > 1.0  # biased: the true value is 0
    assert abs(fid_infinity(x, y)) < 0.3
    assert fid_infinity(x, y + shift) == pytest.approx(4.0, abs=0.75)  # the mean estimates are noisy


def test_fid_and_kid_grow_with_noise(features):
    a = features["a"]
    fids = [fid(Moments.of(a), Moments.of(features[key])) for key in ("b", "b+40", "b+120")]
    kids = [kid(a, features[key], subsets=20, subset_size=30)[0] for key in ("b", "b+40", "b+120")]
    assert fids[0] < fids[1] < fids[2]
    assert kids[0] < kids[1] < kids[2]


def test_precision_drops_when_half_the_synthetic_set_is_noise(features):
    real, synthetic = features["a"], features["b"]
    half_noise = np.concatenate([synthetic[:20], features["b+120"][20:]])
    clean_precision, _ = precision_recall(real, synthetic, k=4)
    noisy_precision, _ = precision_recall(real, half_noise, k=4)
    assert noisy_precision < clean_precision - 0.2


def test_cache_hit_does_not_call_the_network(tmp_path, digits):
    extractor = InceptionFeatures("cpu", PATH)
    cache = FeatureCache(tmp_path)
    first = cache.get(digits[:4], extractor.preprocessing, extractor)

    def network_must_not_run(images: np.ndarray) -> np.ndarray:
        raise AssertionError("the cached features should have been read")

    again = cache.get(digits[:4], extractor.preprocessing, network_must_not_run)
    assert np.array_equal(first, again)
    with pytest.raises(AssertionError, match="cached"):  # other images (or preprocessing) miss the cache
        cache.get(digits[4:8], extractor.preprocessing, network_must_not_run)


def test_report_noisy_max_with_tiny_epsilon_ignores_the_counts(tmp_path):
    counts = torch.tensor([1000] + [0] * 49)
    ledger = PrivacyLedger(tmp_path / "ledger.json")
    generator = secret_stream()
    noisy = [report_noisy_max(counts, 1e-4, ledger, "model-selection", generator, budget="evaluation")
             for _ in range(20)]
    exact = report_noisy_max(counts, 100.0, ledger, "model-selection", generator, budget="evaluation")
    assert exact == 0 and sum(choice != 0 for choice in noisy) >= 15
    assert ledger.events("evaluation") == [ReportNoisyMax(1e4, count=20), ReportNoisyMax(0.01)]
    assert ledger.events("synthesis") == []


def test_settings_reject_unknown_classifiers_and_bad_counts():
    section = dict(BASE_CONFIG["evaluation"])
    with pytest.raises(ConfigError, match="unknown classifier 'vgg'"):
        EvaluationSettings.from_config({**section, "classifiers": ["vgg"]})
    with pytest.raises(ConfigError, match="evaluation.num_real"):
        EvaluationSettings.from_config({**section, "num_real": 0})


def test_soft_label_epochs_set_the_schedule_of_students_of_a_soft_label_release_only():
    settings = EvaluationSettings.from_config({**BASE_CONFIG["evaluation"], "soft_label_epochs": 30})
    assert settings.training(True).epochs == 30 and settings.training(False).epochs == 10
    assert EvaluationSettings.from_config(BASE_CONFIG["evaluation"]).training(True).epochs == 10
    with pytest.raises(ConfigError, match="evaluation.soft_label_epochs must be a whole number above 0, got 0"):
        EvaluationSettings.from_config({**BASE_CONFIG["evaluation"], "soft_label_epochs": 0})


def test_a_soft_label_release_is_re_tempered_to_the_distillation_temperature():
    from dpsynth.evaluation.release import Release

    logits = torch.randn(5, 10, dtype=torch.float64) * 8
    release = Release(np.zeros((5, 1, 8, 8), np.uint8), logits.argmax(1).numpy(),
                      torch.softmax(logits / 100, 1).float().numpy(), soft_label_temperature=100.0)
    assert torch.allclose(release.soft_label_tensor(4.0), torch.softmax(logits / 4, 1).float(), atol=1e-5)
    assert torch.equal(release.soft_label_tensor(), release.soft_label_tensor(100.0))
    with pytest.raises(ConfigError, match="evaluation.distillation_temperature must be a number above 0, got 0"):
        EvaluationSettings.from_config({**BASE_CONFIG["evaluation"], "distillation_temperature": 0})


def test_the_dpimagebench_protocol_fixes_its_settings_and_refuses_a_release_under_60k(tmp_path, digits, capsys):

    section = {**BASE_CONFIG["evaluation"], "protocol": "dpimagebench", "classifiers": ["cnn"], "num_synthetic": 10}
    settings = EvaluationSettings.from_config(section)
    assert settings.classifiers == ("wrn-28-10", "resnet164") and settings.num_synthetic == 60000
    assert settings.training(False) == TrainingSettings(50, 256, 0.01, "step", 0.9999)
    with pytest.raises(ConfigError, match="evaluation.protocol must be one of dpsynth, dpimagebench"):
        EvaluationSettings.from_config({**section, "protocol": "dpimage"})
    with pytest.raises(ConfigError, match="evaluation.classifier_schedule"):
        EvaluationSettings.from_config({**BASE_CONFIG["evaluation"], "classifier_schedule": "linear"})
    np.savez(tmp_path / "small.npz", images=digits[:40], labels=np.arange(40) % 10)
    assert main(["evaluate", str(tmp_path / "small.npz"), "--dataset", "digits", "--device", "cpu",
                 "--set", "evaluation.protocol=dpimagebench"]) == 2
    assert "the release has 40: release 60000 (sampling.num_samples=60000)" in capsys.readouterr().err


def test_a_classifier_ema_changes_what_is_scored_not_how_the_weights_train(digits):
    images, labels = torch.from_numpy(digits[:64]).float() / 255, torch.arange(64) % 10
    scored, final = [], []
    for ema in (0.0, 0.9):
        torch.manual_seed(0)
        model = build_classifier("cnn", 1, 10)
        train_epochs(model, images, labels, TrainingSettings(2, 16, 1e-2, "step", ema), torch.device("cpu"),
                     torch.Generator().manual_seed(0), lambda m: scored.append(m[0].weight.detach().clone()), "cnn")
        final.append(model[0].weight.detach().clone())
    assert torch.equal(final[0], final[1])  # the trained weights are restored after each scoring
    assert not torch.allclose(scored[1], scored[3]) and torch.equal(scored[1], final[0])


def test_a_channels_last_classifier_trains_and_predicts_as_the_default_layout_does(digits):
    images, labels = torch.from_numpy(digits[:64]).float() / 255, torch.arange(64) % 10
    trained = []
    for layout in (lambda model: model, channels_last):
        torch.manual_seed(0)
        model = layout(build_classifier("cnn", 1, 10))
        train_epochs(model, images, labels, TrainingSettings(2, 16, 1e-2), torch.device("cpu"),
                     torch.Generator().manual_seed(0), lambda m: None, "cnn")
        trained.append(model)
    assert trained[1][0].weight.is_contiguous(memory_format=torch.channels_last)
    torch.testing.assert_close(trained[1][0].weight, trained[0][0].weight, rtol=1e-3, atol=1e-4)
    assert torch.equal(correct_predictions(trained[0], images, labels, torch.device("cpu")),
                       correct_predictions(trained[1], images, labels, torch.device("cpu")))


def test_classifier_augment_trains_on_shifted_images_and_must_be_a_bool(digits):
    images, labels = torch.from_numpy(digits[:64]).float() / 255, torch.arange(64) % 10
    final = []
    for augment in (False, True):
        torch.manual_seed(0)
        model = build_classifier("cnn", 1, 10)
        train_epochs(model, images, labels, TrainingSettings(1, 16, 1e-2, augment=augment), torch.device("cpu"),
                     torch.Generator().manual_seed(0), lambda m: None, "cnn")
        final.append(model[0].weight.detach().clone())
    assert not torch.equal(final[0], final[1])
    assert EvaluationSettings.from_config({**BASE_CONFIG["evaluation"], "classifier_augment": True}).training(
        False).augment
    with pytest.raises(ConfigError, match="evaluation.classifier_augment must be true or false, got 'yes'"):
        EvaluationSettings.from_config({**BASE_CONFIG["evaluation"], "classifier_augment": "yes"})


def test_fast_inception_must_be_auto_true_or_false_when_the_settings_are_read():
    with pytest.raises(ConfigError, match="evaluation.fast_inception must be auto, true or false, got 'fast'"):
        EvaluationSettings.from_config({**BASE_CONFIG["evaluation"], "fast_inception": "fast"})


def test_evaluate_an_npz_from_the_command_line(tmp_path, digits, capsys, evaluation_ledgers):
    labels = np.arange(40) % 10
    np.savez(tmp_path / "fake.npz", images=digits[:40], labels=labels)
    code = main(["evaluate", str(tmp_path / "fake.npz"), "--dataset", "digits", "--device", "cpu",
                 "--set", "evaluation.num_synthetic=40", "--set", "evaluation.num_real=40",
                 "--set", "evaluation.classifiers=[cnn, resnet]", "--set", "evaluation.classifier_epochs=1",
                 "--set", "evaluation.classifier_seeds=2",
                 "--set", "evaluation.kid_subset_size=20", "--set", "evaluation.kid_subsets=5",
                 "--set", f"evaluation.cache_dir={tmp_path / 'cache'}"])
    printed = capsys.readouterr().out
    assert code == 0, printed
    assert "FID" in printed and "40 synthetic vs 40 real" in printed and "accuracy  resnet" in printed
    out = tmp_path / "fake-evaluation"
    metrics = json.loads((out / "metrics.json").read_text())
    assert set(metrics["accuracy"]) == {"cnn", "resnet"}
    cnn = metrics["accuracy"]["cnn"]
    scores = [run["test_accuracy"] for run in cnn["seeds"]]
    assert [run["seed"] for run in cnn["seeds"]] == [0, 1] and cnn["test_accuracy"] == pytest.approx(np.mean(scores))
    assert cnn["test_accuracy_std"] == pytest.approx(np.std(scores, ddof=1))
    for run in cnn["seeds"]:  # one epoch: the chosen weights are the last ones
        assert run["selected_epoch"] == 1 and run["test_accuracy"] == run["last_epoch_test_accuracy"]
    assert "+-" in printed and "2 seed(s)" in printed
    assert metrics["evaluation_privacy"]["epsilon"] == pytest.approx(1.0, abs=1e-3)  # four selections at 0.25
    assert cnn["selection_epsilon"] == pytest.approx(0.5)
    (ledger,) = evaluation_ledgers.iterdir()  # the release's own ledger, named by its hash
    assert len(PrivacyLedger.load(ledger).events("evaluation")) == 1  # merged: same noise
    assert (out / "samples.png").exists() and (out / "nearest_neighbours.png").exists()


@pytest.mark.parametrize("make, message", [
    (lambda p: np.savez(p, images=np.zeros((4, 1, 28, 28), np.uint8), labels=np.zeros(4, np.int64)),
     "images are (1, 28, 28)"),
    (lambda p: np.savez(p, images=np.zeros((4, 1, 8, 8), np.uint8), labels=np.zeros(4, np.int64),
                        soft_labels=np.ones((4, 10))), "soft_labels"),
    (lambda p: p.write_bytes(b"not a zip"), "not a readable .npz"),
])
def test_bad_release_files_get_one_clear_error(tmp_path, capsys, make, message):
    path = tmp_path / "bad.npz"
    make(path)
    assert main(["evaluate", str(path), "--dataset", "digits"]) == 2
    error = capsys.readouterr().err
    assert message in error and str(path) in error and "Traceback" not in error


def test_evaluate_a_missing_path_or_a_run_without_release(tmp_path, capsys):
    assert main(["evaluate", str(tmp_path / "nowhere")]) == 2
    assert "no such run directory or .npz file" in capsys.readouterr().err
    (tmp_path / "run").mkdir()
    assert main(["evaluate", str(tmp_path / "run")]) == 2
    assert "not a dpsynth run directory" in capsys.readouterr().err


def test_the_low_rank_fid_equals_the_covariance_fid():
    rng = np.random.default_rng(0)
    x, y = rng.normal(0, 1, (30, 200)), rng.normal(0.3, 2, (40, 200)) @ rng.normal(0, 0.2, (200, 200))
    assert feature_fid(x, y) == pytest.approx(fid(Moments.of(x), Moments.of(y)), rel=1e-7)
    assert feature_fid(x, x) == pytest.approx(0, abs=1e-6)
    wide, other = rng.normal(0, 1, (300, 200)), rng.normal(0, 1, (150, 200))  # over half the dimensions each:
    assert feature_fid(wide, other) == fid(Moments.of(wide), Moments.of(other))  # the covariance route itself
