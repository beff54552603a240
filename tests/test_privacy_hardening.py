"""Issue 25: secret noise streams, public data checked against the private data, nothing private outside the ledger."""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import warnings

import numpy as np
import pytest
import torch
from conftest import MERF, idx_bytes, secret_stream, write_idx_set, write_patients
from torch import nn

from dpsynth.api import dataset_from_config, plan_budget_for, resolve_config
from dpsynth.audit import AUDITS
from dpsynth.autoplan.plan import plan_inputs
from dpsynth.cli import main
from dpsynth.data import load_dataset
from dpsynth.data.fingerprints import FINGERPRINTS, check_disjoint, fingerprints
from dpsynth.data.folder import load_folder
from dpsynth.data.sources import LoadOptions
from dpsynth.diffusion.pretrain import PretrainSettings, pretrain
from dpsynth.errors import DataError, DpsynthError, PrivacyError, PrivacyWarning
from dpsynth.methods import get_method, run_config_of
from dpsynth.pipeline import resume, start, user_seed
from dpsynth.planning import planned_config
from dpsynth.privacy import (
    Accountant,
    GaussianMechanism,
    LedgerPlan,
    NonPrivateAccess,
    PrivacyLedger,
    SubsampledGaussianMechanism,
    check_within_plan,
)
from dpsynth.privacy.dataset_facts import SHAPE
from dpsynth.privacy.dpsgd import DPSGD, DpsgdSettings, clipped_sum
from dpsynth.privacy.mechanisms import poisson_sample
from dpsynth.privacy.randomness import SecretStream, derived_key, secret_generator, stream_key
from dpsynth.runs import RunDirectory
from dpsynth.training.context import RunContext


def test_seeds_that_agree_in_their_low_32_bits_give_different_noise():
    low = 12345
    assert torch.equal(torch.randn(4, generator=torch.Generator().manual_seed(low)),
                       torch.randn(4, generator=torch.Generator().manual_seed(low + 2 ** 32)))  # torch keeps 32 bits
    for seed in (low + 2 ** 32, low + 2 ** 40):
        assert not torch.equal(SecretStream(derived_key(low, "noise")).normal(4),
                               SecretStream(derived_key(seed, "noise")).normal(4))
        assert not torch.equal(torch.randn(4, generator=secret_generator(derived_key(low, "training"))),
                               torch.randn(4, generator=secret_generator(derived_key(seed, "training"))))


def test_unseeded_streams_take_fresh_256_bit_keys_and_the_release_stream_is_not_the_noise_stream():
    keys = {stream_key(None, purpose) for purpose in ("noise", "noise", "training", "release")}
    assert len(keys) == 4 and all(len(key) == 32 for key in keys)
    seeded = {purpose: stream_key(0, purpose) for purpose in ("noise", "training", "init", "release")}
    assert len(set(seeded.values())) == 4  # each purpose its own key, even from one user seed
    release = torch.randn(1000, generator=secret_generator(seeded["release"]), dtype=torch.float64)
    noise = SecretStream(seeded["noise"]).normal(1000)
    assert abs(float(torch.corrcoef(torch.stack([release, noise]))[0, 1])) < 0.15
    assert "key" not in repr(SecretStream(seeded["noise"]))


def test_a_stream_resumes_from_its_state_and_draws_52_bit_uniforms():
    stream = secret_stream(1)
    stream.normal(10)
    state = stream.get_state()
    again = SecretStream(b"\0" * 32)
    again.set_state(state)
    assert torch.equal(stream.uniform(100), again.uniform(100))
    uniforms = secret_stream(2).uniform(10_000)
    assert ((uniforms * 2 ** 24) % 1 != 0).float().mean() > 0.99  # finer than float32's 2^-24 grid
    assert 0 < float(uniforms.min()) and float(uniforms.max()) < 1


def test_poisson_sampling_compares_float64_uniforms_with_the_rate():
    rate = 0.3  # float32(0.3) = 0.30000001192...: a float32 comparison samples slightly more
    chosen = poisson_sample(50_000, rate, secret_stream(3))
    assert torch.equal(chosen, torch.nonzero(secret_stream(3).uniform(50_000) < rate).flatten())


def test_a_user_set_seed_warns_and_a_secret_run_says_so_in_its_report(tmp_path):
    config = resolve_config("pe", dataset="digits", epsilon=5.0, preset="cpu", overrides=[
        "pe.population=20", "pe.iterations=1", "pe.lookahead=0", "sampling.num_samples=20",
        "evaluation.enabled=false", f"run.out_dir={tmp_path}", "run.device=cpu"])
    with pytest.warns(PrivacyWarning, match="run.seed = 3 is set"):
        assert user_seed({**config, "run": {**config["run"], "seed": 3}}) == 3
    with warnings.catch_warnings():
        warnings.simplefilter("error", PrivacyWarning)
        assert user_seed(config) is None
    run = start(config)
    report = json.loads(run.file("release/privacy.json").read_text())
    assert report["noise_seed"] == "secret" and report["dp_guarantee"]
    assert run.config()["run"]["seed"] is None  # no seed in config.yaml: the keys live in the checkpoint only
    saved = torch.load(run.file("checkpoint.pt"), weights_only=True)["state"]["rng"]
    assert set(saved["noise"]) == {"draws"}  # released: the noise key is gone from the checkpoint
    assert sorted(p.name for p in run.file("release").iterdir()) == ["README.md", "privacy.json", "samples.png",
                                                                     "synthetic.npz"]


def test_public_images_that_are_private_images_are_refused(tmp_path):
    """mnist-5k as DP-ImgSyn's public set beside a private MNIST built from the same digits."""
    digits = load_dataset("mnist-5k")
    images = torch.cat([digits.train.images, digits.val.images])
    labels = torch.cat([digits.train.labels, digits.val.labels])
    pixels = images[:, 0].numpy()
    for prefix, part in (("train", slice(0, 4000)), ("t10k", slice(4000, 4500))):
        (tmp_path / f"{prefix}-images-idx3-ubyte").write_bytes(idx_bytes(pixels[part]))
        (tmp_path / f"{prefix}-labels-idx1-ubyte").write_bytes(idx_bytes(labels[part].numpy()))
    config = resolve_config("dp-imgsyn", dataset="mnist", data_dir=str(tmp_path), epsilon=5.0,
                            overrides=["dataset.val_size=500", "alignment.public=mnist-5k",
                                       f"run.out_dir={tmp_path / 'runs'}"])
    with pytest.raises(DataError, match="alignment.public 'mnist-5k' is not disjoint.*3500 of the 3500 train images"):
        start(config)
    assert not (tmp_path / "runs").exists()  # refused before anything ran
    private = load_dataset("fashion-mnist")
    check_disjoint({"mnist-5k": fingerprints(images)}, private)  # a disjoint set passes
    grey_rgb = images[:10].expand(-1, 3, -1, -1)
    assert np.array_equal(fingerprints(grey_rgb), fingerprints(images[:10]))  # an RGB copy is the same image


def test_pretrain_records_its_data_and_pe_refuses_a_model_trained_on_the_private_set(tmp_path):
    digits = load_dataset("digits")
    model = pretrain(digits.train, tmp_path / "model", PretrainSettings(1, 4, block_channels=(8, 8),
                                                                        checkpoint_every=1), torch.device("cpu"))
    assert np.array_equal(np.load(model / FINGERPRINTS), fingerprints(digits.train.images))
    config = resolve_config("pe", dataset="digits", epsilon=5.0, overrides=[
        "api.name=diffusion", f"api.model={model}", f"run.out_dir={tmp_path / 'runs'}"])
    with pytest.raises(DataError, match=r"training data of api.model 'model' \(its unet/ SHA-256 [0-9a-f]{64}\) is "
                                        "not disjoint"):
        start(config)
    (model / FINGERPRINTS).unlink()
    with pytest.warns(PrivacyWarning, match="cannot be checked"):
        assert get_method("pe")(config).public_data(digits.info) == {}


def test_the_ledger_stops_a_mechanism_beyond_the_plan():
    plan = {"dp-sgd": [SubsampledGaussianMechanism(2.0, 0.1, 3)]}
    ledger = PrivacyLedger(plan=LedgerPlan(plan))
    for _ in range(3):
        ledger.record("dp-sgd", SubsampledGaussianMechanism(2.0, 0.1))
    check_within_plan(ledger.stages(), plan, False, complete=True)
    with pytest.raises(PrivacyError, match="beyond its plan"):
        ledger.record("dp-sgd", SubsampledGaussianMechanism(2.0, 0.1))
    with pytest.raises(PrivacyError, match="does not hold"):
        ledger.record("extra", GaussianMechanism(5.0))
    with pytest.raises(PrivacyError, match="without noise"):
        check_within_plan({"dp-sgd": [NonPrivateAccess(1)]}, {"dp-sgd": [NonPrivateAccess(3)]}, False)
    with pytest.raises(PrivacyError, match="did not run as planned"):
        check_within_plan({}, plan, False, complete=True)
    assert ledger.events() == [SubsampledGaussianMechanism(2.0, 0.1, 3)]  # refused entries were not written


def test_a_plan_event_of_another_type_stops_the_method(tmp_path):
    dataset = load_dataset("digits")
    plan = {"dp-sgd": [NonPrivateAccess(5)]}

    def context(ledger: PrivacyLedger) -> RunContext:
        return RunContext(dataset=dataset, run=RunDirectory(tmp_path), ledger=ledger, accountant=Accountant("pld"),
                          delta=1e-5, device=torch.device("cpu"), generator=torch.Generator(), noise=secret_stream())

    with pytest.raises(PrivacyError, match="not one SubsampledGaussianMechanism"):
        context(PrivacyLedger(plan=LedgerPlan(plan))).planned_event("dp-sgd", SubsampledGaussianMechanism,
                                                                    NonPrivateAccess)  # DPDM without noise
    allowed = context(PrivacyLedger(plan=LedgerPlan(plan, allow_non_private=True)))
    assert allowed.planned_event("dp-sgd", SubsampledGaussianMechanism, NonPrivateAccess) == NonPrivateAccess(5)
    with pytest.raises(PrivacyError, match="must carry its privacy plan"):
        context(PrivacyLedger())  # a run's ledger without its plan: nothing would stop a mechanism beyond it
    ran_ahead = PrivacyLedger()  # a ledger without a plan records whatever it is given (an audit's, a script's)
    for _ in range(2):
        ran_ahead.record("s", GaussianMechanism(1.0))
    with pytest.raises(PrivacyError, match="beyond its plan"):  # restored with a plan it ran ahead of
        PrivacyLedger(entries=list(ran_ahead), plan=LedgerPlan({"s": [GaussianMechanism(1.0)]}))


def test_a_non_finite_per_example_gradient_is_dropped_not_spread():
    grads = {"w": torch.tensor([[3.0, 4.0], [float("nan"), 1.0], [float("inf"), 0.0]])}
    summed, norms = clipped_sum(grads, 1.0)
    assert torch.allclose(summed["w"], torch.tensor([0.6, 0.8]))
    assert torch.isfinite(norms).tolist() == [True, False, False]
    model = nn.Linear(2, 1, bias=False)
    nn.init.zeros_(model.weight)
    engine = DPSGD(model, torch.optim.SGD(model.parameters(), lr=1.0), lambda forward, x: forward(x[None]).sum(),
                   settings=DpsgdSettings(1e-6, 1.0, 1.0), num_records=3, ledger=PrivacyLedger(), stage="dp-sgd",
                   noise=secret_stream())
    stats = engine.step(lambda indices: (torch.tensor([[3.0, 4.0], [float("nan"), 0.0], [1e39, 1.0]])[indices],))
    assert torch.isfinite(model.weight).all() and stats["nonfinite_dropped"] == 2.0


def test_a_run_that_trained_at_the_exact_images_shape_is_not_resumed_and_a_fresh_cell_draws_the_vote(tmp_path):
    write_patients(tmp_path / "scans")
    config = resolve_config("dp-merf", dataset="folder", data_dir=str(tmp_path / "scans"), epsilon=2.0, preset="cpu",
                            overrides=[*MERF, f"run.out_dir={tmp_path / 'runs'}", "privacy.dataset_size=12",
                                       "dataset.val_size=1", "dataset.test_size=1", "dataset.channels=1"])
    fresh = RunDirectory.create(run_config_of(config))  # as a bench cell starts: nothing drawn, nothing run
    resume(str(fresh.path))
    assert fresh.config()["drawn"]["shape"] is not None
    assert SHAPE.stage in PrivacyLedger.load(fresh.file("ledger.json")).stages()
    old = RunDirectory.create(run_config_of(config))  # as a dpsynth before the vote: trained at the exact shape
    old.file("checkpoint.pt").write_bytes(b"")
    with pytest.raises(DpsynthError, match="shape its exact images chose.*start it again"):
        resume(str(old.path))
    assert "drawn" not in old.config()


def test_a_fixed_preset_plans_with_the_noisy_count_drawn_before_it(own_npz):
    config = resolve_config("dpdm", dataset="npz", data_dir=own_npz, epsilon=5.0, preset="cpu",
                            overrides=["run.device=cpu", "dpsgd.batch_size=64"])
    planned, dataset = planned_config(run_config_of(config), dataset_from_config(config), torch.device("cpu"),
                                      draw_size=True)
    assert planned.drawn.dataset_size is not None and dataset.info.size_rule == "noisy"
    assert plan_budget_for(planned, dataset.info).size == dataset.info.public_train


def test_a_standard_set_plans_with_its_published_held_out_sizes_not_its_files(tmp_path):
    write_idx_set(tmp_path / "idx", n_train=120, n_test=30)
    info = load_dataset("mnist", tmp_path / "idx", val_size=0.1).info
    assert info.split_sizes == {"train": 108, "val": 12, "test": 30} and info.size_rule == "published"
    inputs = plan_inputs(info, torch.device("cpu"))
    assert (inputs.num_train, inputs.num_val, inputs.num_test) == (54000, 6000, 10000)


def test_the_cache_of_decoded_images_forgets_a_removed_person_and_refuses_links_and_others_folders(tmp_path):
    write_patients(tmp_path / "scans")
    cache = tmp_path / "cache"
    options = LoadOptions(tmp_path / "scans", 28, 1, cache_dir=str(cache))
    before = load_folder(options).images
    assert [path.stat().st_mode & 0o777 for path in cache.iterdir()] == [0o600]
    shutil.rmtree(tmp_path / "scans" / "sick" / "patient-000")  # the patient asked to be removed
    after = load_folder(options).images
    assert len(after) == len(before) - 2 and len(list(cache.iterdir())) == 1
    cache.chmod(0o777)
    shutil.rmtree(tmp_path / "scans" / "sick" / "patient-002")
    load_folder(options)
    assert cache.stat().st_mode & 0o777 == 0o700
    (tmp_path / "elsewhere").mkdir()
    linked = tmp_path / "linked"
    linked.symlink_to(tmp_path / "elsewhere")
    with pytest.raises(DataError, match="must be a folder of your own, not a link"):
        load_folder(LoadOptions(tmp_path / "scans", 28, 1, cache_dir=str(linked)))
    if os.getuid() == 0:  # only root can hand a folder to another user
        theirs = tmp_path / "theirs"
        theirs.mkdir()
        os.chown(theirs, 65534, 65534)
        with pytest.raises(DataError, match="another user's folder"):
            load_folder(LoadOptions(tmp_path / "scans", 28, 1, cache_dir=str(theirs)))


def test_dpsynth_clean_leaves_no_private_pixels_after_a_run_killed_mid_decode(tmp_path):
    write_patients(tmp_path / "scans", patients=400, scans=3, side=96)
    cache = tmp_path / "cache"
    decoding = subprocess.Popen([sys.executable, "-m", "dpsynth", "data", "info", "folder", "--data-dir",
                                 str(tmp_path / "scans"), "--set", "dataset.resolution=64", "--set",
                                 f"dataset.cache_dir={cache}"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while not list(cache.glob("*.partial")) and decoding.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    decoding.send_signal(signal.SIGKILL)
    decoding.wait()
    assert list(cache.glob("*.partial")), "the decode finished before it could be killed"
    done = subprocess.run([sys.executable, "-m", "dpsynth", "clean", "--cache-dir", str(cache)], capture_output=True,
                          text=True, env={**os.environ, "HOME": str(tmp_path / "home")})
    assert done.returncode == 0 and f"{cache}: removed 1 file(s)" in done.stdout, done.stderr
    assert [path for path in cache.rglob("*") if path.is_file()] == []


def test_an_audit_that_crashes_exits_apart_from_one_that_finds_a_leak(monkeypatch, capsys):
    def crashing() -> None:
        raise RuntimeError("no such kernel")

    monkeypatch.setitem(AUDITS, "crashing", crashing)
    assert main(["audit", "crashing", "--trials", "10"]) == 3
    assert "audit of crashing crashed before it could find or rule out a leak: RuntimeError: no such kernel" in \
        capsys.readouterr().err
