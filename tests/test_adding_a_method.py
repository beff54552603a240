"""A method added in one file (tests/toy_method.py) is found by name, planned, and passes ``dpsynth doctor``."""
from __future__ import annotations

import importlib
import re
import sys
from collections.abc import Iterator
from dataclasses import replace

import pytest

from dpsynth.api import plan_privacy, resolve_config
from dpsynth.cli import main
from dpsynth.data import load_dataset
from dpsynth.methods import METHODS, REGISTERED


@pytest.fixture
def toy() -> Iterator[str]:
    """The toy method registered (by importing its file), unregistered afterwards."""
    module = importlib.import_module("toy_method")
    yield module.NoisyClassMeans.declaration.name
    REGISTERED.pop(module.NoisyClassMeans.declaration.name)
    sys.modules.pop("toy_method")


def test_a_method_in_one_file_is_found_and_planned(toy: str):
    assert toy in METHODS and list(METHODS)[-1] == toy
    config = resolve_config(toy, dataset="digits", epsilon=2)
    plan = plan_privacy(config, load_dataset("digits").info)
    assert [stage["name"] for stage in plan["stages"]] == ["class-means"]
    assert plan["epsilon"] == pytest.approx(2, rel=1e-3)


def test_a_method_in_one_file_brings_its_command_line_options(toy: str, capsys: pytest.CaptureFixture[str]):
    assert main(["privacy", toy, "--dataset", "digits", "--epsilon", "2", "--clip", "2.5", "--json"]) == 0
    assert '"name": "class-means"' in capsys.readouterr().out
    assert resolve_config(toy, overrides=["means.clip=2.5"])["means"]["clip"] == 2.5


def test_a_method_in_one_file_passes_the_doctor(toy: str, capsys: pytest.CaptureFixture[str]):
    assert main(["doctor", "--device", "cpu", "--methods", toy]) == 0
    assert re.search(rf"^{toy} +ok .*resumed, epsilon [0-9.]+ <= 8", capsys.readouterr().out, re.MULTILINE)


def test_the_doctor_says_which_method_failed_and_why(toy: str, monkeypatch: pytest.MonkeyPatch,
                                                     capsys: pytest.CaptureFixture[str]):
    monkeypatch.setattr(METHODS[toy], "declaration", replace(METHODS[toy].declaration, smoke=("means.clip=-1",)))
    assert main(["doctor", "--device", "cpu", "--methods", toy, "pe"]) == 2
    out, err = capsys.readouterr()
    assert re.search(rf"^{toy} +FAIL .*means.clip must be a number above 0", out, re.MULTILINE)
    assert re.search(r"^pe +ok ", out, re.MULTILINE)
    assert f"1 of 2 methods failed on this device: {toy}" in err
    assert main(["doctor", "--device", "cpu", "--methods", "nope"]) == 2
    assert "unknown method(s) nope" in capsys.readouterr().err
