"""The recorded outcomes the planner's regime check reads (:mod:`dpsynth.autoplan.regime`), gathered from the
committed measurements: every run under ``benchmarks/results`` whose ledger holds the DP-SGD stage of a diffusion
model and whose evaluation has a CNN accuracy.

``python benchmarks/regime_records.py --write`` rewrites ``dpsynth/autoplan/outcomes.json`` from them; a test
checks that the shipped file is what the records say.
"""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from ..autoplan.regime import Outcome, Start
from ..config import Config, DatasetSettings, Drawn, load_config, method_name
from ..methods import create_method, get_method
from ..planning import TRAINING_STAGE
from ..runs import CONFIG, PRIVACY, REHEARSAL
from .frontier import RAN_ON, RELEASED_SHAPE

STAMP = re.compile(r"-(\d{4})(\d{2})(\d{2})-\d{6}$")
GENERATED = re.compile(r"^- generated (\d{4}-\d{2}-\d{2})", re.MULTILINE)
# Standard sets read as they are, and the .npz subsets of Fashion-MNIST (benchmarks/fashion_subset.py), by name.
NATIVE_SIDE = {"fashion-mnist": 28, "mnist": 28, "digits": 8, "photo-patches": 32, "fashion": 28}
SIDE_IN_NAME = re.compile(r"-(8|16|28|32|64|128|256)(?:\.npz)?$")  # digits-28.npz, scans-64
CLASSES = {"photo-patches": 2}  # sets recorded without a datasheet that do not have ten classes


def outcomes(results: Path) -> list[Outcome]:
    """One outcome per distinct measured point under ``results`` (the first record of each, by path)."""
    found: dict[tuple[Any, ...], Outcome] = {}
    for config_path in sorted(results.glob("**/config.yaml")):
        outcome = outcome_of(config_path.parent, results)
        if outcome is not None:
            key = (outcome.method, outcome.data, outcome.side, outcome.batch, outcome.steps, round(outcome.sigma, 4))
            found.setdefault(key, outcome)
    return sorted(found.values(), key=lambda o: (o.side, o.noise_per_example, o.steps))


def outcome_of(run: Path, results: Path) -> Outcome | None:
    """The outcome of the run in ``run``, or None when it has no evaluated CNN or no diffusion DP-SGD stage on
    pixels."""
    metrics_path, ledger_path = run / "metrics.json", run / "ledger.json"
    if not (metrics_path.is_file() and ledger_path.is_file()):
        return None
    cnn = json.loads(metrics_path.read_text()).get("accuracy", {}).get("cnn")
    events = [entry["event"] for entry in json.loads(ledger_path.read_text())["entries"]
              if entry["stage"] == TRAINING_STAGE and entry["event"].get("kind") == "subsampled_gaussian"]
    if cnn is None or len(events) != 1 or (run / REHEARSAL).is_file():  # a rehearsal forecasts; it records no plan
        return None
    config = recorded_config(run)
    if not get_method(method_name(config)).pixel_regime:  # DP-SGD on latents: not the pixel runs the regime reads
        return None
    event, units = events[0], public_units(run)
    machine, date = provenance(run, results)
    return Outcome(record=str(run.relative_to(results)), method=method_name(config), data=data_name(config),
                   side=trained_side(run, config), start=_start(config), units=units,
                   batch=event["sample_rate"] * units,
                   steps=int(event["steps"]), sigma=float(event["noise_multiplier"]),
                   accuracy=float(cnn["test_accuracy"]), chance=1 / class_count(run, config), machine=machine,
                   date=date)


def recorded_config(run: Path) -> Config:
    """The config of the recorded run in ``run``, as this dpsynth reads it (migrated)."""
    return load_config((run / CONFIG).read_text(), str(run / CONFIG))


def data_name(config: Config) -> str:
    """The data a run read: its folder's name, else the dataset's."""
    dataset = DatasetSettings.of(config)
    return Path(dataset.data_dir).name if dataset.data_dir else dataset.name


def trained_side(run: Path, config: Config) -> int:
    """The side the run trained at: declared, drawn by its shape vote, stated by its datasheet, or the set's own."""
    dataset, drawn = DatasetSettings.of(config), Drawn.of(config).shape
    if isinstance(dataset.train_resolution, int):  # read smaller than the data, the release lifted back
        return dataset.train_resolution
    if isinstance(dataset.resolution, int):
        return dataset.resolution
    if drawn:
        return int(drawn[1])
    readme = run / "release" / "README.md"
    found = RELEASED_SHAPE.search(readme.read_text()) if readme.is_file() else None
    if found:
        return int(found[2])
    named = SIDE_IN_NAME.search(data_name(config))
    return int(named[1]) if named else NATIVE_SIDE[re.split(r"[-.]", data_name(config))[0] if dataset.name == "npz"
                                                   else dataset.name]


def public_units(run: Path) -> int:
    """The training split's public size, as the release's privacy.json states it."""
    return int(json.loads((run / "release" / "privacy.json").read_text())["dataset_size"])


def class_count(run: Path, config: Config) -> int:
    """The number of classes, from the release's per-class table when it has a datasheet, else the set's own."""
    readme = run / "release" / "README.md"
    if readme.is_file():
        rows = re.findall(r"^\| (?!class |---).+ \| [\d,]+ \|$", readme.read_text(), re.MULTILINE)
        if rows:
            return len(rows)
    return CLASSES.get(DatasetSettings.of(config).name, 10)


def _start(config: Config) -> Start:
    method = create_method(config)
    return "public model" if method.starts_from_public_model() else "random"


def provenance(run: Path, results: Path) -> tuple[str, str]:
    """The machine and date of a measurement: machine.txt beside a measured plan and its run's time stamp, or a
    bench record's header and the day its cell released (the header's date is the table's, written again as each
    cell lands)."""
    for folder in (run.parent, run.parent.parent):
        if (folder / "machine.txt").is_file():
            stamp = STAMP.search(run.name)
            return (folder / "machine.txt").read_text().strip(), "-".join(stamp.groups()) if stamp else ""
        if (folder / "results.md").is_file():
            header = (folder / "results.md").read_text()
            machine, generated = RAN_ON.search(header), GENERATED.search(header)
            released = json.loads((run / PRIVACY).read_text()).get("released") if (run / PRIVACY).is_file() else None
            return (machine[1] if machine else ""), released or (generated[1] if generated else "")
    return "", ""


def shipped_text(found: list[Outcome]) -> str:
    """``outcomes.json``'s text for ``found``."""
    return json.dumps({"about": "written by benchmarks/regime_records.py from benchmarks/results; do not edit",
                       "outcomes": [outcome.to_dict() for outcome in found]}, indent=1) + "\n"
