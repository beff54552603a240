"""One typed, versioned configuration: shared sections as dataclasses holding the one default, ``schema`` in every
config.yaml, older files migrated by one function and newer ones refused with the fix."""
from __future__ import annotations

import copy
import json
from dataclasses import MISSING, fields

import pytest
import torch
from conftest import stopped_smoke_run

from dpsynth.api import resolve_config, stored_config, validate_config
from dpsynth.cli import main
from dpsynth.config import (
    BASE_CONFIG,
    SCHEMA,
    Drawn,
    PrivacySettings,
    RunSettings,
    build_config,
    dump_config,
    get_value,
    load_config,
    migrated_settings,
    section_settings,
)
from dpsynth.diffusion.settings import DiffusionSettings, UNetSettings
from dpsynth.errors import ConfigError
from dpsynth.methods import METHODS, get_method
from dpsynth.pipeline import Run
from dpsynth.training.private import DiffusionDpsgdSection


def test_a_config_names_its_schema_first_and_reads_back_the_same():
    for method in METHODS:
        config = resolve_config(method, preset="cpu")
        text = dump_config(config)
        assert text.startswith(f"schema: {SCHEMA}\n")
        assert load_config(text, "config.yaml") == config


def test_a_file_written_before_the_schema_is_migrated_with_the_behaviour_of_its_time():
    config = resolve_config("dpdm", dataset="digits", preset="cpu")
    old = copy.deepcopy(config)
    del old["schema"], old["model"]["init_from"], old["model"]["class_start"], old["dataset"]["num_images"]
    del old["diffusion"]["sampler"], old["diffusion"]["guidance_interval"], old["evaluation"]["enabled"]
    del old["privacy"]["max_images_per_group"], old["plan"]
    migrated = load_config(dump_config(old), "config.yaml")
    stored_config(migrated, "config.yaml")
    assert migrated["schema"] == SCHEMA and list(migrated)[0] == "schema"
    assert section_settings(UNetSettings, migrated, "model").class_start == "shared"  # as such runs started
    diffusion = section_settings(DiffusionSettings, migrated, "diffusion")
    assert (diffusion.sampler, diffusion.guidance_interval) == ("ddim", (0.0, 1.0))  # DDIM throughout, as then
    assert migrated["model"]["init_from"] is None and migrated["dataset"]["num_images"] is None
    assert migrated["evaluation"]["enabled"] is True and migrated["plan"] == BASE_CONFIG["plan"]
    assert PrivacySettings.of(migrated).max_images_per_group == 16
    derived = copy.deepcopy(migrated)
    derived["derived"] = {"probe": {"device": "cpu", "dpsgd": {}}, "expected_seconds": {"total": 60.0}}
    stored_config(derived, "config.yaml")  # a derived plan's mappings hold the keys they replace
    del migrated["model"]["attention"]  # a method key added since: its default
    attention = METHODS["dpdm"].defaults()["model"]["attention"]
    assert stored_config(migrated, "config.yaml")["model"]["attention"] == attention


def test_a_schema_1_file_reads_as_it_ran_its_16_bit_window_at_the_default():
    config = resolve_config("dp-merf", dataset="folder", preset="cpu")
    old = copy.deepcopy(config)
    old["schema"] = 1
    for section, key in (("dataset", "window"), ("dataset", "cache_dir"), ("dataset", "title"),
                         ("dataset", "description")):
        del old[section][key]
    migrated = load_config(dump_config(old), "config.yaml")
    stored_config(migrated, "config.yaml")
    assert migrated == config and list(migrated)[0] == "schema"


def test_a_schema_2_file_reads_as_it_ran_releasing_no_model():
    config = resolve_config("dpdm", dataset="digits", preset="cpu")
    old = {**copy.deepcopy(config), "schema": 2}
    del old["release"]
    migrated = load_config(dump_config(old), "config.yaml")
    stored_config(migrated, "config.yaml")
    assert migrated == config and migrated["release"] == {"model": False, "upscaler": "default", "purpose": None}


def test_a_schema_3_file_reads_as_it_ran_at_the_data_side_unforced():
    config = resolve_config("dpdm", dataset="digits", preset="cpu")
    old = {**copy.deepcopy(config), "schema": 3}
    for section, key in (("plan", "force"), ("dataset", "train_resolution"), ("release", "upscaler")):
        del old[section][key]
    migrated = load_config(dump_config(old), "config.yaml")
    stored_config(migrated, "config.yaml")
    assert migrated == config and migrated["plan"]["force"] is False
    assert migrated["dataset"]["train_resolution"] == "auto"


def test_a_schema_4_file_reads_as_it_ran_with_no_holder_fields_and_no_cap():
    config = resolve_config("dpdm", dataset="digits", preset="cpu")
    old = {**copy.deepcopy(config), "schema": 4}
    holder = (("dataset", "owner"), ("dataset", "unit_name"), ("release", "purpose"), ("privacy", "epsilon_reason"),
              ("privacy", "total_epsilon"), ("privacy", "holder_ledger"), ("run", "time_limit"))
    for section, key in holder:
        del old[section][key]
    migrated = load_config(dump_config(old), "config.yaml")
    stored_config(migrated, "config.yaml")
    assert migrated == config and all(migrated[section][key] is None for section, key in holder)


def test_a_schema_5_file_keeps_what_its_run_drew_in_the_drawn_record_not_in_its_privacy_section():
    config = resolve_config("dpdm", dataset="folder", preset="cpu")
    old = {**copy.deepcopy(config), "schema": 5}
    old["privacy"] |= {"noisy_dataset_size": 1700, "noisy_shape": [1, 28], "noisy_window": None,
                       "noisy_images_per_group": None}
    migrated = load_config(dump_config(old), "config.yaml")
    stored_config(migrated, "config.yaml")
    assert migrated == {**config, "drawn": {"dataset_size": 1700, "shape": [1, 28]}}
    assert get_method("dpdm").run_config(migrated).drawn == Drawn(dataset_size=1700, shape=(1, 28))
    checkpointed = {"privacy.noisy_shape": [1, 28], "privacy.noisy_window": None, "privacy.epsilon": 10.0}
    assert migrated_settings(checkpointed) == {"drawn.shape": [1, 28], "privacy.epsilon": 10.0}


def test_a_schema_6_file_keeps_what_its_plan_found_in_the_derived_record_not_in_its_plan_section():
    config = resolve_config("dpdm", dataset="digits", preset="cpu")
    old = {**copy.deepcopy(config), "schema": 6}
    old["plan"] |= {"base": "cpu", "probe": {"device": "cpu"}, "decisions": ["UNet widths"], "expected_seconds": None}
    migrated = load_config(dump_config(old), "config.yaml")
    assert migrated == {**config, "derived": {"base": "cpu", "probe": {"device": "cpu"}, "decisions": ["UNet widths"]}}
    checkpointed = {"plan.probe.device": "cpu", "plan.base": None, "plan.time_budget": "30m"}
    assert migrated_settings(checkpointed) == {"derived.probe.device": "cpu", "plan.time_budget": "30m"}


def test_a_file_without_what_a_run_is_is_refused_not_filled_in():
    config = resolve_config("dpdm", dataset="digits", preset="cpu")
    del config["privacy"]["epsilon"], config["dataset"]["name"]
    with pytest.raises(ConfigError, match="runs/x/config.yaml: missing dataset.name, privacy.epsilon: not a config "
                                          "dpsynth wrote"):
        load_config(dump_config(config), "runs/x/config.yaml")


def test_a_newer_schema_is_refused_with_the_fix():
    text = dump_config({**resolve_config("pe", preset="cpu"), "schema": SCHEMA + 1})
    with pytest.raises(ConfigError, match=f"runs/x/config.yaml: schema {SCHEMA + 1}, but this dpsynth reads schema "
                                          f"{SCHEMA} and older; read it with the dpsynth that wrote it, or upgrade"):
        load_config(text, "runs/x/config.yaml")
    config = resolve_config("pe", preset="cpu")
    del config["schema"]
    with pytest.raises(ConfigError, match=f"schema must be {SCHEMA} .*load_config read: it migrates older .*got None"):
        validate_config(config)  # a config made by hand for the Python API


@pytest.mark.parametrize(("key", "value", "message"), [
    ("dataset.resolution", "big", "dataset.resolution must be a whole number or auto, got 'big'"),
    ("dataset.channels", 0, "dataset.channels must be a whole number above 0, got 0"),
    ("privacy.dataset_size", "many", "privacy.dataset_size must be a whole number or auto or noisy, got 'many'"),
    ("privacy.max_images_per_group", 0, "privacy.max_images_per_group must be a whole number above 0, got 0"),
    ("run.threads", True, "run.threads must be a whole number or auto, got True"),
    ("run.threads", 0, "run.threads must be auto or a positive integer, got 0"),
    ("sampling.num_samples", 0, "sampling.num_samples must be a whole number above 0, got 0"),
    ("release.model", "yes", "release.model must be true or false, got 'yes'"),
])
def test_a_shared_key_is_checked_by_its_field_and_named(key: str, value: object, message: str):
    config = resolve_config("dp-merf", preset="cpu")
    section, leaf = key.split(".")
    config[section][leaf] = value
    with pytest.raises(ConfigError, match=message):
        stored_config(config, "config.yaml")
    assert RunSettings.of(resolve_config("dp-merf", preset="cpu", overrides=["run.threads=2"])).threads == 2


def test_one_rule_checks_a_value_set_by_a_preset_by_set_and_on_read():
    kinds = {"dpsgd": DiffusionDpsgdSection}
    config = build_config(kinds, {"dpsgd": {"epochs": 6}}, "mine", [("dpsgd.noise_multiplicity", 4)])
    assert config["dpsgd"]["epochs"] == 6.0 and isinstance(config["dpsgd"]["epochs"], float)  # as the field reads it
    with pytest.raises(ConfigError, match=r"^preset 'mine': dpsgd.batch_size must be a whole number above 0, got 0$"):
        build_config(kinds, {"dpsgd": {"batch_size": 0}}, "mine")
    with pytest.raises(ConfigError, match=r"^--set: privacy.accountant must be one of pld, rdp, got 'moments'$"):
        build_config(kinds, {}, "mine", [("privacy.accountant", "moments")])
    stored = resolve_config("dpdm", preset="cpu")
    stored["dpsgd"]["noise_multiplicity"] = 0  # a file edited by hand: the same rule refuses it when read
    with pytest.raises(ConfigError, match="dpsgd.noise_multiplicity must be a whole number above 0, got 0"):
        stored_config(stored, "config.yaml")


def test_a_run_config_is_read_only_parses_each_section_once_and_is_replaced_not_changed():
    dpdm = METHODS["dpdm"]
    config = dpdm.run_config(resolve_config("dpdm", preset="cpu"))
    assert config.section("dpsgd") is dpdm.settings(config, "dpsgd") is section_settings(
        DiffusionDpsgdSection, config, "dpsgd")  # read once, then kept
    with pytest.raises(TypeError):
        config["dpsgd"]["batch_size"] = 64  # type: ignore[index]
    wider = config.replaced({"dpsgd": {"batch_size": 64}}, "a plan")
    assert (config.section("dpsgd").batch_size, wider.section("dpsgd").batch_size) == (512, 64)
    assert load_config(dump_config(wider.to_dict()), "config.yaml") == wider.to_dict()
    with pytest.raises(ConfigError, match="a plan: unknown config key 'dpsgd.batch'"):
        config.replaced({"dpsgd": {"batch": 64}}, "a plan")


def test_a_method_section_is_a_dataclass_whose_fields_hold_every_default():
    for name, method in METHODS.items():
        defaults = method.defaults()
        for section, kind in method.sections.items():
            keys = [spec for spec in fields(kind) if not spec.metadata.get("not_a_key")]
            assert all(spec.default is not MISSING for spec in keys), (name, section)
            assert [spec.name for spec in keys] == list(defaults[section])
            assert section_settings(kind, {}, section) == section_settings(kind, defaults, section)
    with pytest.raises(ConfigError, match="frequency.noise_multiplier"):  # FETA-Pro's key, not DP-MERF's
        resolve_config("dp-merf", overrides=["frequency.noise_multiplier=3"])
    assert resolve_config("feta-pro")["frequency"]["noise_multiplier"] is None


def test_a_run_written_before_a_key_existed_resumes_with_the_key_at_its_default(tmp_path):
    run = stopped_smoke_run("dp-merf", tmp_path)
    config = run.config()
    newer = ("generator.lr_decay", "release.purpose")  # as if each were added after the run was written
    written = run.config()
    for key in newer:
        section, leaf = key.split(".")
        del written[section][leaf]
    drawn_in_privacy = {"noisy_dataset_size": None, "noisy_shape": None, "noisy_window": None,
                        "noisy_images_per_group": None}  # where schema 5 kept what a run drew
    written["schema"], written["privacy"] = 5, {**written["privacy"], **drawn_in_privacy}
    run.file("config.yaml").write_text(dump_config(written))
    saved = torch.load(run.file("checkpoint.pt"), weights_only=True)
    saved["settings"] = {key: value for key, value in saved["settings"].items() if key not in newer}
    saved["settings"] |= {f"privacy.{key}": value for key, value in drawn_in_privacy.items()}
    torch.save(saved, run.file("checkpoint.pt"))
    assert main(["run", "--resume", str(run.path)]) == 0
    assert [get_value(run.config(), key) for key in newer] == [get_value(config, key) for key in newer]
    assert (run.path / "release" / "synthetic.npz").is_file()
    completed = [json.loads(line) for line in run.file("log.jsonl").read_text().splitlines()
                 if '"config completed"' in line]
    assert len(completed) == 1 and set(newer) <= set(completed[0]["added"])


def test_a_key_nothing_reads_is_refused_by_name_in_a_dict_a_new_run_and_a_run_directory(tmp_path):
    config = resolve_config("dp-merf", dataset="digits", epsilon=5.0, preset="cpu",
                            overrides=[f"run.out_dir={tmp_path / 'runs'}"])
    for typo, key in (({"privacy": {"epsilonn": 3}}, "'privacy.epsilonn'; did you mean privacy.epsilon"),
                      ({"generatr": {}}, "'generatr'; did you mean generator"),
                      ({"drawn": {"size": 9}}, "'drawn.size'")):
        mistyped = copy.deepcopy(config)
        for section, values in typo.items():
            mistyped[section] = {**mistyped.get(section, {}), **values}
        with pytest.raises(ConfigError, match=f"unknown config key {key}"):
            validate_config(mistyped)
    mistyped = copy.deepcopy(config)
    mistyped["frequency"]["no_such_key"] = 3
    with pytest.raises(ConfigError, match="frequency.no_such_key"):
        Run.prepare(mistyped)  # a dict a Python user edited: refused before anything is written
    assert not (tmp_path / "runs").exists()
    run = stopped_smoke_run("dp-merf", tmp_path)
    written = run.config()
    written["generator"]["lr_decayy"] = 0.5
    run.file("config.yaml").write_text(dump_config(written))
    with pytest.raises(ConfigError, match=r"config\.yaml: unknown config key 'generator.lr_decayy'"):
        Run.reopen(str(run.path))
