"""Derived plans (--preset auto): the sizing rules, the time estimate, the fixed presets' refusal, the CLI."""
from __future__ import annotations

import itertools
import json
import logging
import time

import numpy as np
import pytest
import torch
import yaml
from conftest import finished_run

from dpsynth.api import dataset_from_config, resolve_config
from dpsynth.autoplan.memory import USABLE, probe_memory
from dpsynth.autoplan.plan import (
    SUSTAINED_FIXED,
    SUSTAINED_SHARE,
    budget_held,
    check_preset_fits,
    chunked,
    deepened,
    method_shape,
    plan_inputs,
    sustained,
    uncut_evaluation,
)
from dpsynth.autoplan.probe import StepCost, Throughput, probe_engine, probe_step
from dpsynth.autoplan.rules import (
    MAX_SAMPLE_RATE,
    MIN_STEPS,
    PlanInputs,
    derive,
    dpsgd_steps,
    estimate_seconds,
    evaluation_seconds,
    held_evaluation,
    parse_duration,
    size_dpsgd,
)
from dpsynth.cli import main
from dpsynth.config import RunConfig
from dpsynth.data import DatasetInfo
from dpsynth.errors import ConfigError
from dpsynth.hardware import COMPILED_SAMPLING, compiled_sampling
from dpsynth.methods import METHODS, get_method
from dpsynth.pipeline import start
from dpsynth.planning import planned_config


# A throughput as a probe records it (the AVX-512 Xeon's, rounded): the rules are tested on its numbers.
def typed(config: dict) -> RunConfig:
    """``config`` as the plan reads it: a RunConfig of its method."""
    return get_method(config["method"]).run_config(config)


DPDM_SETTINGS = get_method("dpdm").settings  # a DPDM config's section through its settings class
XEON = Throughput("cpu", {"dpsgd": StepCost(0.12, 0.0031)}, 6e-4, 4e-4, {"cnn": {"train": 4.9e-4, "test": 1.9e-4}},
                  0.036, 8.0)
SLOW = Throughput("cpu", {"dpsgd": StepCost(0.3, 0.0066)}, 1.5e-3, 1e-3, {"cnn": {"train": 1.2e-3, "test": 4e-4}},
                  0.3, 20.0)


@pytest.mark.parametrize("text, seconds", [("45m", 2700), ("1h30m", 5400), ("90s", 90), ("2h", 7200), (45, 2700),
                                           ("1.5h", 5400), ("10 min", 600)])
def test_durations_read_as_users_write_them(text, seconds):
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["soon", "", "-5m", "0s", "5 minutes"])
def test_a_bad_duration_names_the_key(text):
    with pytest.raises(ConfigError, match="plan.time_budget must be a"):
        parse_duration(text)


@pytest.mark.parametrize("num_train, seconds, cost", list(itertools.product(
    [500, 1437, 5000, 10_000, 55_000, 200_000], [30, 300, 1200, 7200],
    [StepCost(0.12, 0.0031), StepCost(0.3, 0.0066), StepCost(0.005, 1e-5)])))
def test_dpsgd_sizing_keeps_its_rules(num_train, seconds, cost):
    size = size_dpsgd(seconds, cost, num_train, batch_cap=512, multiplicity_cap=1)
    assert size.steps >= MIN_STEPS and size.noise_multiplicity == 1
    assert 1 <= size.batch_size <= min(512, num_train * MAX_SAMPLE_RATE)
    expected = size.steps * cost.seconds(size.batch_size)
    assert expected <= seconds * 1.01 or size.steps == MIN_STEPS  # within the time, unless the floor forced more


def test_a_fast_device_grows_the_batch_then_the_noise_multiplicity():
    gpu = StepCost(0.01, 2e-6)
    size = size_dpsgd(1800, gpu, 55_000, batch_cap=4096, multiplicity_cap=32)
    assert size.batch_size == 4096 and size.noise_multiplicity > 1 and size.steps >= 600
    assert size_dpsgd(1800, gpu, 55_000, batch_cap=4096, multiplicity_cap=1).noise_multiplicity == 1


def test_at_the_base_presets_batch_the_steps_stop_at_its_own():
    config = typed(resolve_config("dpdm", preset="auto"))
    base = resolve_config("dpdm", preset="cpu")
    inputs = PlanInputs(55_000, (1, 28, 28), 10, 5000, 10_000, "cpu")
    overrides, decisions = derive(config, method_shape(get_method("dpdm")), inputs, XEON, 3 * 3600)
    planned = config.replaced(overrides, "the plan")
    assert planned["dpsgd"]["batch_size"] == base["dpsgd"]["batch_size"]
    assert dpsgd_steps(DPDM_SETTINGS(planned, "dpsgd"), 55_000) == dpsgd_steps(DPDM_SETTINGS(base, "dpsgd"), 55_000)
    assert any("stay unspent" in decision for decision in decisions)
    small = size_dpsgd(3 * 3600, XEON.dpsgd["dpsgd"], 1437, batch_cap=512, multiplicity_cap=1, step_cap=600)
    assert small.batch_size < 512 and small.steps > 600  # below the preset's batch, the time still buys steps


def test_a_budget_just_short_of_the_step_target_trims_the_batch_not_halves_it():
    cost = XEON.dpsgd["dpsgd"]
    size = size_dpsgd(590 * cost.seconds(512), cost, 55_000, batch_cap=512, multiplicity_cap=1)
    assert 480 <= size.batch_size < 512 and size.batch_size % 16 == 0 and size.steps >= 600


def test_small_data_gets_small_batches_and_at_least_200_steps():
    config = typed(resolve_config("dpdm", preset="auto"))
    for num_train in (500, 1437, 5000):
        inputs = PlanInputs(num_train, (1, 28, 28), 10, num_train // 8, num_train // 8, "cpu")
        overrides, _ = derive(config, method_shape(get_method("dpdm")), inputs, XEON, 1800)
        planned = config.replaced(overrides, "the plan")
        assert dpsgd_steps(DPDM_SETTINGS(planned, "dpsgd"), num_train) >= MIN_STEPS
        assert overrides["dpsgd"]["batch_size"] <= num_train * MAX_SAMPLE_RATE


@pytest.mark.parametrize("throughput", [XEON, SLOW])
def test_the_derived_plan_fits_the_budget(throughput):
    config = typed(resolve_config("dpdm", preset="auto"))
    shape = method_shape(get_method("dpdm"))
    inputs = PlanInputs(55_000, (1, 28, 28), 10, 5000, 10_000, "cpu")
    overrides, decisions = derive(config, shape, inputs, throughput, 1800)
    planned = config.replaced(overrides, "the plan")
    expected = estimate_seconds(planned, shape, inputs, throughput, compiled=False)
    capped = dpsgd_steps(DPDM_SETTINGS(planned, "dpsgd"), 55_000) == dpsgd_steps(DPDM_SETTINGS(config, "dpsgd"),
                                                                                 55_000)
    assert expected["total"] <= 1800 * 1.05 and (capped or expected["total"] == pytest.approx(1800, rel=0.05))
    assert expected["sampling"] + expected["evaluation"] <= 0.4 * 1800 or planned["sampling"]["num_samples"] == 5000
    assert any(decision.startswith("dpsgd: ") for decision in decisions)


def test_a_compiled_release_is_priced_at_the_share_measured_at_its_side():
    config = typed(resolve_config("dpdm", preset="auto"))
    shape = method_shape(get_method("dpdm"))
    for side, rows in ((28, 500), (64, 500), (64, 125), (128, 25)):
        inputs = PlanInputs(5000, (1, side, side), 10, 500, 1000, "cpu")
        chunked_config = config.replaced({"sampling": {"batch_size": rows}}, "chunks")
        eager = estimate_seconds(chunked_config, shape, inputs, XEON, compiled=False)["sampling"]
        compiled = estimate_seconds(chunked_config, shape, inputs, XEON, compiled=True)["sampling"]
        measured = COMPILED_SAMPLING[side, rows]
        assert compiled_sampling(side, rows) == measured
        assert compiled == pytest.approx(measured.share * eager + measured.compile_seconds)
    assert compiled_sampling(31, 400) == COMPILED_SAMPLING[32, 500]
    assert compiled_sampling(100, 20) == COMPILED_SAMPLING[128, 25]


# DP-MERF's phases as the AVX2 EPYC measured them at 64 px (seconds per private image, per generator iteration).
MERF_64 = Throughput("cpu", {}, 0.0, 0.0, {"cnn": {"train": 4e-3, "test": 1.2e-3}}, 0.3, 5.0,
                     {"fourier features": 3e-3, "generator": 1.1})


@pytest.mark.parametrize("budget", [900, 1800, 3600])
def test_dp_merf_is_priced_and_its_generator_sized_to_the_budget(budget):
    config = typed(resolve_config("dp-merf", preset="auto"))
    shape = method_shape(get_method("dp-merf"))
    inputs = PlanInputs(3200, (1, 64, 64), 10, 400, 400, "cpu")
    overrides, decisions = derive(config, shape, inputs, MERF_64, budget)
    planned = config.replaced(overrides, "the plan")
    expected = estimate_seconds(planned, shape, inputs, MERF_64, compiled=False)
    iterations = planned["generator"]["iterations_per_epoch"]
    assert expected["fourier features"] == pytest.approx(3200 * 3e-3)
    assert expected["generator"] == pytest.approx(planned["generator"]["epochs"] * iterations * 1.1)
    assert expected["total"] <= budget * 1.02 and iterations < config["generator"]["iterations_per_epoch"]
    assert any(decision.startswith("generator: generator.iterations_per_epoch") for decision in decisions)


def test_a_budget_below_dp_merfs_floor_is_refused_with_the_budget_that_holds_it():
    config = typed(resolve_config("dp-merf", preset="auto"))
    inputs = PlanInputs(3200, (1, 64, 64), 10, 400, 400, "cpu")
    with pytest.raises(ConfigError, match="the generator at 10% of its iterations"):
        derive(config, method_shape(get_method("dp-merf")), inputs, MERF_64, 120)


def test_the_probe_times_dp_merfs_phases_on_public_tensors():
    config = resolve_config("dp-merf", preset="auto", overrides=["frequency.features=200", "generator.batch_size=20"])
    probes = get_method("dp-merf")(config).throughput_probes((1, 16, 16), 3, torch.device("cpu"))
    seconds = {phase: per_unit() for phase, per_unit in probes.phases.items()}
    assert set(seconds) == {"fourier features", "generator"} and all(value > 0 for value in seconds.values())
    units = get_method("dp-merf").phase_units(config, 500)
    assert units == {"fourier features": 500, "generator": 5 * 550}
    feta = get_method("feta-pro").phase_units(resolve_config("feta-pro", preset="cpu"), 500)
    assert feta == {"fourier features": 500, "auxiliary generator": 3 * 200}


@pytest.mark.parametrize("name", sorted(METHODS))
def test_every_method_prices_every_phase_its_run_has(name):
    """What a run does besides DP-SGD, public training and the evaluation is timed by a probe and counted by the
    method: every phase it counts has a probe, and a release with work to do has a rate."""
    method = get_method(name)
    config = resolve_config(name, preset="cpu", overrides=list(method.declaration.smoke))
    probes = method(config).throughput_probes((1, 8, 8), 10, torch.device("cpu"))
    units = method.phase_units(config, 100)
    assert set(units) == set(probes.phases)
    assert method.release_units(config) == 0 or probes.sampling is not None
    for phase in units:
        assert probes.phases[phase]() > 0, phase


def test_pe_counts_its_api_calls_embeddings_and_votes_and_a_release_past_the_population():
    config = resolve_config("pe", preset="cpu")  # population 2,000, 8 iterations, lookahead 2; 20,000 released
    units = get_method("pe").phase_units(config, 1000)
    assert units == {"random API": 2000, "variation API": 8 * 3 * 2000, "embedding": 1000 + 8 * 2 * 2000,
                     "votes": 8 * 1000}
    assert get_method("pe").release_units(config) == 20_000 - 2000
    assert get_method("pe").phase_units(resolve_config("pe", preset="cpu", overrides=["pe.lookahead=0"]),
                                        1000)["embedding"] == 1000 + 8 * 2000


# PE with the Inception embedding, as a CPU times it: 0.055 s an image (1.4 s a vote among 5,000 at 2,048 dims).
PE_INCEPTION = Throughput("cpu", {}, 4e-4, 0.0, {"cnn": {"train": 1e-3, "test": 3e-4}}, 0.05, 5.0,
                          {"random API": 4e-4, "variation API": 4e-4, "embedding": 0.055, "votes": 2.4e-5})


def test_a_pe_plan_whose_phases_outrun_the_budget_is_refused_with_the_budget_that_holds_them():
    config = typed(resolve_config("pe", preset="auto", overrides=["pe.embedding=inception"]))
    inputs = PlanInputs(1437, (1, 28, 28), 10, 180, 180, "cpu")
    shape = method_shape(get_method("pe"))
    with pytest.raises(ConfigError, match="start-up and its phases as configured") as refusal:
        derive(config, shape, inputs, PE_INCEPTION, 1800)
    needed = float(str(refusal.value).split("give --time-budget ")[1].split("m")[0])
    assert needed * 60 >= 0.055 * (1437 + 8 * 2 * 2000)
    overrides, _ = derive(config, shape, inputs, PE_INCEPTION, needed * 60 * 2)  # room for a release of 20,000
    planned = config.replaced(overrides, "the plan")
    expected = estimate_seconds(planned, shape, inputs, PE_INCEPTION, compiled=False)
    assert expected["embedding"] == pytest.approx(0.055 * (1437 + 8 * 2 * 2000))
    assert expected["sampling"] == pytest.approx(4e-4 * (20_000 - 2000))


def test_dp_sads_student_step_is_probed_with_the_teacher_and_the_discriminator_it_runs():
    method = get_method("dp-sad")
    config = resolve_config("dp-sad", preset="cpu", overrides=list(method.declaration.smoke))
    probes = method(config).throughput_probes((1, 8, 8), 10, torch.device("cpu"))
    student, teacher = probes.dpsgd["student"][0], probes.dpsgd["teacher"][0]
    assert student.after_step is not None and teacher.after_step is None
    batch = student.make_batch(torch.arange(4))
    assert len(batch) == 5 and batch[3].shape == batch[4].shape == (4, 1, 8, 8)  # x_t, t, labels, two next steps
    engine = probe_engine(student, torch.device("cpu"), 100)
    before = [param.clone() for param in engine.model.parameters()]
    _, seconds = probe_step(engine, student, 4, torch.device("cpu"))
    assert seconds > 0 and any(not torch.equal(a, b) for a, b in zip(before, engine.model.parameters(), strict=True))
    assert method.phase_units(config, 100) == {"teacher pool": 20 * 2}


def test_dp_imgsyn_prices_its_alignment_as_the_release():
    config = resolve_config("dp-imgsyn", preset="cpu")
    assert get_method("dp-imgsyn").release_units(config) == config["sampling"]["num_samples"] * 10
    assert get_method("dp-imgsyn").phase_units(config, 1000) == {"statistics": 1000}


def test_privacy_prices_dp_merf_by_its_probe(capsys):
    code = main(["privacy", "dp-merf", "--dataset", "digits", "--epsilon", "10", "--time-budget", "10m",
                 "--set", "frequency.features=200"])
    out, _ = capsys.readouterr()
    assert code == 0 and "generator: generator.iterations_per_epoch" in out and "not timed by the probe" not in out
    assert "fourier features" in out.split("expected wall time:")[1]


def test_the_slow_cpu_releases_fewer_images_than_the_fast_one():
    config = typed(resolve_config("dpdm", preset="auto"))
    shape, inputs = method_shape(get_method("dpdm")), PlanInputs(55_000, (1, 28, 28), 10, 5000, 10_000, "cpu")
    fast, _ = derive(config, shape, inputs, XEON, 1800)
    slow, _ = derive(config, shape, inputs, SLOW, 1800)
    assert slow["sampling"]["num_samples"] < fast["sampling"]["num_samples"]
    assert slow["dpsgd"]["batch_size"] * slow["dpsgd"]["epochs"] < fast["dpsgd"]["batch_size"] * fast["dpsgd"]["epochs"]


def test_plans_read_only_public_sizes():
    config = resolve_config("dpdm", dataset="digits", preset="auto", overrides=["privacy.dataset_size=noisy"])
    dataset = dataset_from_config(config)
    inputs = plan_inputs(dataset.info, torch.device("cpu"))
    assert inputs.num_val == inputs.num_test == inputs.num_train // 8  # not the private split's exact size


@pytest.mark.parametrize("preset, message", [("cpu", r"plans 16 DP-SGD steps \(dpsgd\) on the 1,437 training images"),
                                             ("paper", r"samples batches of 4,096 \(dpsgd.batch_size\), more than")])
def test_a_fixed_preset_too_big_for_the_data_refuses_with_the_fix(preset, message):
    config = resolve_config("dpdm", dataset="digits", epsilon=10, preset=preset)
    info = dataset_from_config(config).info
    with pytest.raises(ConfigError, match=message) as refused:
        check_preset_fits(get_method("dpdm"), typed(config), info)
    assert "use --preset auto (the default)" in str(refused.value)
    own = resolve_config("dpdm", dataset="digits", epsilon=10, preset=preset, overrides=["dpsgd.batch_size=64"])
    check_preset_fits(get_method("dpdm"), typed(own), info)  # the user's own batch is not second-guessed


@pytest.mark.parametrize("channels, side", [(1, 28), (3, 32), (3, 64), (3, 128)])
def test_a_gpu_plan_chunk_fits_the_card(channels, side):
    config = resolve_config("dpdm", preset="paper", overrides=["dpsgd.noise_multiplicity=4"])
    probes = get_method("dpdm")(config).throughput_probes((channels, side, side), 10, torch.device("cpu"))
    memory = probe_memory(probes.dpsgd["dpsgd"][0])
    for card in (24 * 2 ** 30, 80 * 2 ** 30):
        examples = memory.largest_fitting(card)
        assert examples >= 1 and memory.bytes(examples) <= USABLE * card < memory.bytes(examples + 1)


def test_privacy_prints_the_derived_plan_and_its_time(capsys):
    code = main(["privacy", "dpdm", "--dataset", "digits", "--epsilon", "10", "--time-budget", "20m"])
    out, _ = capsys.readouterr()
    assert code == 0
    assert "derived plan (--preset auto, from the cpu preset) for a time budget of 20m on cpu" in out
    assert "expected wall time:" in out and "preset auto" in out
    steps = int(out.split("subsampled_gaussian")[1].split()[2])
    assert steps >= MIN_STEPS


def test_a_derived_config_records_its_probe_and_keeps_what_the_user_set():
    config = resolve_config("dpdm", dataset="digits", epsilon=10, overrides=["dpsgd.batch_size=32"])
    planned, _ = planned_config(typed(config), dataset_from_config(config), torch.device("cpu"))
    found = planned.derived  # what the plan found: a record beside the sections
    assert planned["dpsgd"]["batch_size"] == 32 and "dpsgd.batch_size" in planned["plan"]["user_keys"]
    assert found.base == "cpu" and found.probe["dpsgd"]["dpsgd"]["per_row"] > 0
    assert planned["diffusion"]["noise_levels"] == "log-normal"  # the cpu preset's winning lever, kept by the plan
    assert found.expected_seconds["total"] > found.expected_seconds["dp-sgd (dpsgd)"] > 0
    assert any(decision.startswith("DP-SGD steps priced sustained") for decision in found.decisions)


def test_cpu_steps_are_priced_as_a_run_sustains_them():
    priced, words = sustained(XEON, torch.device("cpu"))
    timed = XEON.dpsgd["dpsgd"].seconds(512)
    assert priced.dpsgd["dpsgd"].seconds(512) == pytest.approx(SUSTAINED_SHARE * timed + SUSTAINED_FIXED)
    assert words and sustained(XEON, torch.device("cuda")) == (XEON, [])


def test_an_overrun_cuts_the_evaluation_in_the_plans_order_down_to_the_minimum():
    config = typed(resolve_config("dpdm", preset="auto"))
    inputs = PlanInputs(55_000, (1, 28, 28), 10, 5000, 10_000, "cpu")
    planned = evaluation_seconds(config, inputs, XEON, False)
    assert held_evaluation(config, inputs, XEON, False, planned, 1.0) == ({}, pytest.approx(planned))
    near_miss = held_evaluation(config, inputs, XEON, False, 0.97 * planned, 1.0, slack=0.05 * planned)
    assert near_miss == ({}, pytest.approx(planned))  # not worth a cut
    cuts, seconds = held_evaluation(config, inputs, XEON, False, planned, 1.5)  # a host 1.5x slower than probed
    assert cuts == {"evaluation.classifier_seeds": 1} and seconds <= planned
    minimum = {"evaluation.classifier_seeds": 1, "evaluation.num_synthetic": 250, "evaluation.num_real": 250,
               "evaluation.classifier_epochs": 3}
    cuts, seconds = held_evaluation(config, inputs, XEON, False, 0.0, 1.0)
    assert cuts == minimum and seconds > 0  # kept, however little is left
    kept, _ = held_evaluation(config, inputs, XEON, False, 0.0, 1.0, kept=("evaluation.num_real",))
    assert "evaluation.num_real" not in kept
    smaller = config.replaced({"evaluation": {"num_synthetic": 100, "classifier_epochs": 2}}, "smaller")
    cut, _ = held_evaluation(smaller, inputs, XEON, False, 0.0, 1.0)
    assert "evaluation.num_synthetic" not in cut and "evaluation.classifier_epochs" not in cut  # never raised


def test_a_run_ahead_of_its_plan_restores_the_evaluation_the_plan_cut_where_it_fits():
    config = typed(resolve_config("dpdm", preset="auto"))
    inputs = PlanInputs(55_000, (1, 28, 28), 10, 5000, 10_000, "cpu")
    uncut = uncut_evaluation(get_method("dpdm"), "cpu")
    assert uncut["evaluation.classifier_seeds"] == 3
    cut = config.replaced({"evaluation": {"classifier_seeds": 1, "num_synthetic": 1000, "num_real": 1000}}, "cut")
    full = evaluation_seconds(config, inputs, XEON, False)
    restored, seconds = held_evaluation(cut, inputs, XEON, False, full, 1.0, uncut=uncut)
    assert restored == {"evaluation.classifier_seeds": 3, "evaluation.num_synthetic": 2000,
                        "evaluation.num_real": 2000} and seconds == pytest.approx(full)
    one_seed = evaluation_seconds(config.replaced({"evaluation": {"classifier_seeds": 1}}, "one seed"), inputs, XEON,
                                  False)
    partly, _ = held_evaluation(cut, inputs, XEON, False, one_seed, 1.0, uncut=uncut)
    assert partly == {"evaluation.num_synthetic": 2000, "evaluation.num_real": 2000}  # the last cut undone first
    kept, _ = held_evaluation(cut, inputs, XEON, False, full, 1.0, kept=("evaluation.classifier_seeds",), uncut=uncut)
    assert "evaluation.classifier_seeds" not in kept
    planned = evaluation_seconds(cut, inputs, XEON, False)
    assert held_evaluation(cut, inputs, XEON, False, planned, 1.0, uncut=uncut) == ({}, pytest.approx(planned))
    info = DatasetInfo("fashion", 1, 28, 28, [str(c) for c in range(10)], "test",
                       {"train": 55_000, "val": 5000, "test": 10_000}, 55_000, "published")
    derived = cut.to_dict()  # as a derived plan records what it found
    derived["plan"]["time_budget"] = "30m"
    derived["derived"] = {"base": "cpu", "probe": XEON.to_dict(), "expected_seconds": {
        "startup": 20.0, "dp-sgd (dpsgd)": 1200.0, "evaluation": planned, "total": 1220.0 + planned}}
    changes, words = budget_held(typed(derived), info, torch.device("cpu"), elapsed=600.0, fitted=580.0)  # 2x as fast
    assert changes["evaluation.classifier_seeds"] == 3 and words.startswith(
        "evaluation restored within plan.time_budget 30m: training and the release took 9.7 min, 0.48x their plan")


def test_a_run_past_its_budget_keeps_the_minimum_evaluation_and_says_so(tmp_path, caplog):
    tiny = ["dpsgd.batch_size=16", "dpsgd.epochs=0.05", "sampling.num_samples=40", "diffusion.sample_steps=2",
            "evaluation.num_real=40", "evaluation.classifiers=[cnn]", f"run.out_dir={tmp_path}", "plan.force=true",
            "plan.time_budget=5m"]
    config = resolve_config("dpdm", dataset="digits", epsilon=10, overrides=tiny)
    with caplog.at_level(logging.INFO, logger="dpsynth"):
        run = start(config, began=time.perf_counter() - 3600)  # the command began an hour ago: its budget is spent
    told = [record.getMessage() for record in caplog.records
            if getattr(record, "event", None) == "evaluation held to the budget"]
    assert len(told) == 1 and "evaluation cut to hold plan.time_budget 5m" in told[0]
    held = [entry for entry in map(json.loads, run.file("log.jsonl").read_text().splitlines())
            if entry["event"] == "evaluation held to the budget"]
    assert held and held[0]["cuts"] == {"evaluation.classifier_seeds": 1, "evaluation.num_synthetic": 250,
                                        "evaluation.classifier_epochs": 3}  # the user's num_real stays as set
    accuracy = json.loads(run.file("metrics.json").read_text())["accuracy"]["cnn"]
    assert accuracy["epochs"] == 3 and len(accuracy["seeds"]) == 1


def test_run_requires_epsilon_and_help_shows_defaults(capsys):
    assert main(["run", "dpdm", "--dataset", "digits"]) == 2
    assert "dpsynth run needs --epsilon" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["audit", "--help"])
    assert "(default: 1e-05)" in capsys.readouterr().out


@pytest.mark.parametrize("side, widths", [(28, [16, 32, 32]), (32, [16, 32, 32]), (64, [16, 32, 32, 64]),
                                          (128, [16, 32, 32, 64, 128])])
def test_the_unet_gets_a_level_per_halving_of_the_side(side, widths):
    config = typed(resolve_config("dpdm", preset="auto"))
    deeper, decisions = deepened(get_method("dpdm"), config, side, [])
    assert deeper["model"]["block_channels"] == widths and bool(decisions) == (side > 32)
    own = typed(resolve_config("dpdm", preset="auto", overrides=["model.block_channels=[8, 16]"]))
    assert deepened(get_method("dpdm"), own, side, own["plan"]["user_keys"])[0]["model"]["block_channels"] == [8, 16]


@pytest.mark.parametrize("side, physical, sampling", [(32, 128, 500), (64, 32, 125), (128, 8, 25)])
def test_on_a_cpu_larger_images_come_in_chunks_of_about_the_base_presets_pixels(side, physical, sampling):
    config = typed(resolve_config("dpdm", preset="auto"))
    smaller, decisions = chunked(get_method("dpdm"), config, side, torch.device("cpu"), [], [])
    assert (smaller["dpsgd"]["physical_batch_size"], smaller["sampling"]["batch_size"]) == (physical, sampling)
    assert bool(decisions) == (side > 32) and 20_000 % sampling == 0  # a chunk divides the release
    own = typed(resolve_config("dpdm", preset="auto", overrides=["dpsgd.physical_batch_size=64"]))
    assert chunked(get_method("dpdm"), own, side, torch.device("cpu"), own["plan"]["user_keys"], [])[0]["dpsgd"][
        "physical_batch_size"] == 64
    # a GPU's chunks follow its memory
    assert chunked(get_method("dpdm"), config, side, torch.device("cuda"), [], [])[0] == config


@pytest.mark.parametrize("side", [64, 128])
def test_large_rgb_images_run_end_to_end(tmp_path, side):
    rng = np.random.default_rng(0)
    path = tmp_path / "rgb.npz"
    np.savez(path, images=rng.integers(0, 256, (40, 3, side, side), dtype=np.uint8), labels=np.arange(40) % 2,
             class_names=np.array(["a", "b"]))
    tiny = ["dpsgd.batch_size=8", "dpsgd.physical_batch_size=8", "dpsgd.epochs=0.5", "sampling.num_samples=4",
            "diffusion.sample_steps=2", "evaluation.enabled=false",
            "privacy.dataset_size=40", f"run.out_dir={tmp_path}", f"dataset.train_resolution={side}",
            "plan.force=true"]  # at the data's side; two steps of 8: no record says that learns
    run = finished_run("dpdm", "--dataset", "npz", "--data-dir", str(path), "--epsilon", "8", "--time-budget", "2m",
                       *[arg for pair in tiny for arg in ("--set", pair)])
    with np.load(run / "release" / "synthetic.npz") as release:
        assert release["images"].shape == (4, 3, side, side)
    config = yaml.safe_load((run / "config.yaml").read_text())
    assert config["derived"]["probe"]["dpsgd"]["dpsgd"]["per_row"] > 0
    assert len(config["model"]["block_channels"]) == {64: 4, 128: 5}[side]  # the UNet follows the resolution
