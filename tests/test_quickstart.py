"""The newcomer's first run (docs/quickstart.md): its commands, as the page shows them, run in a fresh copy of the
repository with an empty home directory, leave a release, and keep the page's promise of two minutes."""
from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest
from page_commands import BLOCK, commands  # tests/, beside this file

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "quickstart.md"
PROMISED_SECONDS = 120  # the page's title: "A first run in two minutes"


def quickstart_commands() -> list[list[str]]:
    """The commands of the page's shell blocks that are not marked long, split as a shell would."""
    return [shlex.split(command) for block in BLOCK.finditer(PAGE.read_text())
            if block["language"] == "bash" and block["why"] is None for command in commands(block["code"])]


def fresh_copy(destination: Path) -> Path:
    """The repository's tracked files (what a clone holds, with the working tree's edits) under ``destination``."""
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    for name in filter(None, listed.decode().split("\0")):
        source, target = ROOT / name, destination / name
        if source.is_file():
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(source.read_bytes())
    return destination


def test_the_page_shows_one_run_of_dpsynth():
    commands = quickstart_commands()
    assert [command[:2] for command in commands] == [["dpsynth", "run"]], commands


@pytest.mark.alone
def test_the_first_run_leaves_a_release_within_two_minutes_from_a_fresh_copy(tmp_path):
    clone = fresh_copy(tmp_path / "dpsynth")
    environment = {**os.environ, "HOME": str(tmp_path / "home"), "XDG_CACHE_HOME": str(tmp_path / "home" / ".cache")}
    started = time.monotonic()
    for command in quickstart_commands():
        done = subprocess.run([sys.executable, "-m", "dpsynth", *command[1:]], cwd=clone, env=environment,
                              capture_output=True, text=True, timeout=10 * PROMISED_SECONDS)
        assert done.returncode == 0, done.stderr[-2000:]
    seconds = time.monotonic() - started
    [run] = (clone / "runs").iterdir()
    release = run / "release"
    assert {"synthetic.npz", "samples.png", "privacy.json", "README.md"} <= {path.name for path in release.iterdir()}
    report = json.loads((release / "privacy.json").read_text())
    assert report["dp_guarantee"] and report["epsilon"] <= report["target_epsilon"] == 10
    assert seconds <= PROMISED_SECONDS, f"the first run took {seconds:.0f} s; the page promises two minutes"
