"""The command line: data listing, the privacy planner and its errors."""
from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from dataclasses import replace
from functools import cache
from importlib.metadata import EntryPoint
from pathlib import Path

import pytest
from conftest import dpsynth_main
from opacus.accountants.utils import get_noise_multiplier

from dpsynth import __version__
from dpsynth.api import resolve_config
from dpsynth.cli import build_parser, main
from dpsynth.config import BASE_CONFIG, flat_keys, has_key
from dpsynth.errors import ConfigError
from dpsynth.methods import METHODS, declarations, get_method, shortcuts
from dpsynth.methods.templates import DiffusionMethod
from dpsynth.privacy import default_delta
from dpsynth.provenance import source_commit


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_data_list_and_info(capsys):
    code, out, _ = run_cli(capsys, "data", "list")
    assert code == 0 and "fashion-mnist" in out and "mnist-5k" in out and "cifar10" in out
    code, out, _ = run_cli(capsys, "data", "info", "fashion-mnist")
    assert code == 0
    assert "1 x 28 x 28" in out and "train 55000, val 5000, test 10000" in out
    assert "/usr/share/datasets/fashion-mnist" in out and "Ankle boot" in out
    code, out, _ = run_cli(capsys, "data", "info", "mnist-5k", "--set", "dataset.val_size=1000")
    assert "train 3500, val 1000, test 500" in out


@pytest.mark.parametrize("epsilon", [1.0, 10.0])
def test_privacy_plan_json_matches_opacus_for_the_paper_preset(capsys, epsilon):
    code, out, _ = run_cli(capsys, "privacy", "dpdm", "--dataset", "fashion-mnist", "--epsilon", str(epsilon),
                           "--preset", "paper", "--json")
    assert code == 0
    plan = json.loads(out)
    assert {"epsilon", "delta", "accountant", "stages"} <= set(plan)
    assert plan["accountant"] == "rdp" and plan["delta"] == pytest.approx(default_delta(55000))
    (stage,) = plan["stages"]
    assert {"name", "mechanisms", "epsilon_share"} <= set(stage)
    (part,) = stage["mechanisms"]
    assert part["sample_rate"] == pytest.approx(4096 / 55000) and part["steps"] == 2014
    expected = get_noise_multiplier(target_epsilon=epsilon, target_delta=plan["delta"],
                                    sample_rate=part["sample_rate"], steps=part["steps"], accountant="rdp")
    assert part["noise_multiplier"] == pytest.approx(expected, rel=5e-3)
    assert plan["epsilon"] <= epsilon and stage["epsilon_share"] == pytest.approx(plan["epsilon"])


def test_privacy_plan_human_readable(capsys):
    code, out, _ = run_cli(capsys, "privacy", "dpdm", "--dataset", "mnist-5k", "--epsilon", "5")
    assert code == 0 and "dp-sgd" in out and "total epsilon = " in out and "(N = 4000, published size)" in out


def test_privacy_takes_the_options_run_takes_and_public_images_cost_nothing(capsys):
    plan = ["privacy", "dp-imgsyn", "--dataset", "digits", "--epsilon", "1", "--json",
            "--set", "privacy.accountant=rdp"]
    code, natural, _ = run_cli(capsys, *plan)
    assert code == 0
    code, digits, err = run_cli(capsys, *plan, "--public", "mnist-5k")
    natural_plan, digits_plan = json.loads(natural), json.loads(digits)
    assert code == 0 and err == ""
    assert natural_plan.pop("derived")["decisions"] == digits_plan.pop("derived")["decisions"]
    assert digits_plan == natural_plan


@pytest.mark.parametrize("argv, message", [
    (["privacy", "dpdm", "--epsilon", "0"], "epsilon must be a positive number"),
    (["privacy", "dpdm", "--epsilon", "-1"], "epsilon must be a positive number"),
    (["privacy", "dpdm", "--set", "privacy.delta=1.5"], "delta must lie strictly between 0 and 1"),
    (["privacy", "dpdm", "--set", "dpsgd.batchsize=3"], "unknown config key 'dpsgd.batchsize'; did you mean "
                                                        "dpsgd.batch_size"),
    (["privacy", "dpdm", "--set", "dpsgd.batch_size=big"], "--set: dpsgd.batch_size must be a whole number, got 'big'"),
    (["privacy", "dpdm", "--set", "privacy.accountant=moments"], "privacy.accountant must be one of pld, rdp"),
    (["privacy", "pe", "--set", "api.name=dalle"], "api.name must be one of drawtext, diffusion (or an API registered"),
    (["privacy", "dp-sad", "--set", "teacher.training=public"], "teacher.training must be one of dp, non-private"),
    (["privacy", "dp-imgsyn", "--set", "alignment.init=zeros"], "alignment.init must be one of public, noise"),
    (["privacy", "dpdm", "--set", "dpsgd"], "--set expects key=value"),
    (["privacy", "gan"], "unknown method 'gan'; known methods: dp-feta, dp-imgsyn, dp-ldm, dp-merf, dp-sad, dpdm"),
    (["privacy", "dpdm", "--dataset", "imagenet"], "unknown dataset 'imagenet'; known datasets: fashion-mnist"),
    (["privacy", "dpdm", "--preset", "gpu"], "no preset 'gpu'; presets: auto, paper, cpu"),
    (["privacy", "dpdm", "--dataset", "mnist-5k", "--set", "dpsgd.batch_size=9000"], "batch_size must lie in"),
    (["data", "info", "cifar10"], "dataset 'cifar10' needs a directory"),
    (["privacy", "dp-feta", "--set", "warmup.iterations=0"], "warmup.iterations must be a whole number above 0, got 0"),
    (["privacy", "pe", "--set", "pe.lookahead=-1"], "pe.lookahead must be a whole number of at least 0, got -1"),
    (["privacy", "dp-imgsyn", "--set", "statistics.clip=big"], "statistics.clip must be a number above 0 or auto"),
    (["privacy", "dp-sad", "--set", "student.output_clip=0"], "student.output_clip must be a number above 0"),
])
def test_errors_are_one_clear_line(capsys, argv, message):
    code, out, err = run_cli(capsys, *argv)
    assert code == 2 and out == ""
    assert err.startswith("dpsynth: error: ") and message in err and "Traceback" not in err


def test_large_delta_warns(capsys):
    code, _, err = run_cli(capsys, "privacy", "dpdm", "--dataset", "mnist-5k", "--set", "privacy.delta=0.01")
    assert code == 0 and "dpsynth: warning: delta = 0.01 is not below 1/N" in err


def test_resolved_config_applies_preset_then_overrides():
    config = resolve_config("dpdm", preset="paper", overrides=["dpsgd.lr=1e-3", "dpsgd.epochs=10"])
    assert config["privacy"]["accountant"] == "rdp" and config["dpsgd"]["lr"] == 1e-3
    assert config["dpsgd"]["epochs"] == 10.0 and isinstance(config["dpsgd"]["epochs"], float)
    assert config["preset"] == "paper" and config["method"] == "dpdm"
    with pytest.raises(ConfigError, match="unknown config key 'method'"):
        resolve_config("dpdm", overrides=["method=pe"])


def test_console_script_and_module_entry_points():
    script = Path(sys.executable).with_name("dpsynth")
    listed = subprocess.run([str(script), "data", "list"], capture_output=True, text=True, check=True)
    assert "fashion-mnist" in listed.stdout
    failed = subprocess.run([sys.executable, "-m", "dpsynth", "privacy", "dpdm", "--epsilon", "-2"],
                            capture_output=True, text=True)
    assert failed.returncode == 2
    assert failed.stderr.strip() == "dpsynth: error: epsilon must be a positive number, got -2.0"


def test_help_and_a_bad_argument_are_answered_without_importing_torch():
    probe = ("import sys\nfrom dpsynth.cli import main\n"
             "for argv in (['--help'], ['run', '--help'], ['pretrain', '--help'], ['run', '--nproc', 'two']):\n"
             "    try:\n        main(argv)\n    except SystemExit:\n        pass\n"
             "heavy = ('torch', 'numpy', 'diffusers', 'dp_accounting')\n"
             "print('imported:', sorted(m for m in heavy if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert "usage: dpsynth run" in done.stdout and "--iterations ITERATIONS" in done.stdout
    assert "--init-from DIR" in done.stdout and "--api API" in done.stdout  # the methods' declared options
    assert "argument --nproc: invalid int value: 'two'" in done.stderr
    assert done.stdout.splitlines()[-1] == "imported: []"


def test_the_pipeline_and_the_methods_without_a_diffusion_model_import_no_diffusers():
    probe = ("import sys\nimport dpsynth.pipeline\nfrom dpsynth.methods import METHODS\n"
             "[METHODS[name] for name in ('dp-merf', 'pe', 'dp-imgsyn')]\nprint('diffusers' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False"  # imported where a UNet, autoencoder or scheduler is made: seconds saved


def test_version_names_the_release_and_the_commit():
    done = dpsynth_main("--version")
    assert done.code == 0 and done.out.strip() == f"dpsynth {__version__} (commit {source_commit()})"
    assert source_commit()  # the tests run from a git checkout


def set_example(*command: str) -> str:
    """The KEY=VALUE example of ``--set`` in ``dpsynth COMMAND --help``."""
    action = next(action for action in subcommand(build_parser(), command)._actions if "--set" in action.option_strings)
    return re.search(r"e\.g\. --set (\S+)", action.help)[1]


def subcommand(parser: argparse.ArgumentParser, names: tuple[str, ...]) -> argparse.ArgumentParser:
    for name in names:
        parser = next(action for action in parser._actions if isinstance(action, argparse._SubParsersAction)
                      ).choices[name]
    return parser


def test_every_set_example_in_the_help_fits_its_command():
    for command in (("run",), ("privacy",)):
        for method in METHODS:
            resolve_config(method, overrides=[set_example(*command)])
    for command in (("data", "info"), ("pretrain",)):  # pretrain passes dataset.* keys to its public dataset
        assert dpsynth_main("data", "info", "digits", "--set", set_example(*command)).code == 0
    section, key = set_example("evaluate").split("=")[0].split(".")
    assert section == "evaluation" and key in BASE_CONFIG["evaluation"]


def test_every_method_package_is_found_by_its_declaration_and_its_class_carries_it():
    assert list(METHODS) == ["dp-feta", "dp-imgsyn", "dp-ldm", "dp-merf", "dp-sad", "dpdm", "feta-pro",
                             "pdp-diffusion", "pe", "privimage"]
    assert all(METHODS[name].declaration is declarations()[name] for name in METHODS)


def test_each_methods_declared_options_name_its_keys_and_every_diffusion_method_takes_init_from():
    for name, declaration in declarations().items():
        config = resolve_config(name)
        assert all(has_key(config, key) for key, _, _ in declaration.shortcuts.values()), name
    assert {name for name in METHODS if issubclass(METHODS[name], DiffusionMethod)} == {
        name for name, declaration in declarations().items() if "--init-from" in declaration.shortcuts}
    assert shortcuts()["--api"][0] == "api.name" and shortcuts()["--public"][0] == "alignment.public"


def test_an_entry_point_module_that_declares_no_method_is_named_by_the_command_line(monkeypatch: pytest.MonkeyPatch):
    point = EntryPoint("mislaid", "dpsynth.errors", "dpsynth.methods")
    monkeypatch.setattr("dpsynth.methods.entry_points", lambda group: [point] if group == "dpsynth.methods" else [])
    monkeypatch.setattr("dpsynth.methods.declarations", cache(declarations.__wrapped__))
    done = dpsynth_main("privacy", "--help")
    assert done.code == 2 and done.err.strip() == (
        "dpsynth: error: module dpsynth.errors declares no method: a method's package sets DECLARATION = "
        "Declaration(...) (dpsynth.methods.declaration)")


def test_a_declaration_whose_class_does_not_carry_it_is_refused_by_name(monkeypatch: pytest.MonkeyPatch):
    wrong = replace(declarations()["dpdm"], name="mislaid", implementation="dpsynth.methods.dpdm.method:DPDM")
    monkeypatch.setattr("dpsynth.methods.declarations", lambda: {**declarations(), "mislaid": wrong})
    with pytest.raises(ConfigError, match="dpsynth.methods.dpdm.method:DPDM: no method class whose declaration is "
                                          "'mislaid'"):
        get_method("mislaid")


def test_every_key_of_every_method_section_is_checked_when_the_method_is_made():
    for name in METHODS:
        method = get_method(name)
        for key in flat_keys(method.defaults()):
            config = resolve_config(name)
            section, leaf = key.split(".")
            config[section][leaf] = {"not": "a setting"}
            with pytest.raises(ConfigError, match=re.escape(key)):
                method(config)
