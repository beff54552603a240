"""``dpsynth bench``: every method x dataset x epsilon in one resumable directory, evaluated alike, tabulated.

Layout of the bench directory::

    runs/<method>-<dataset>-eps<epsilon>/   an ordinary run directory (resume, evaluate and inspect it as one);
                                            ``-s<k>`` after it for the k-th synthesis of the cell (``--syntheses``)
        bench.jsonl                         one record per child process: phase, wall and CPU time, peak memory
        bench.out                           the child processes' output
    public/<method>-<dataset>/              the public model a method that needs one starts from, when the bench
                                            pre-trained it (``dpsynth pretrain`` on glyphs, shared by its cells)
    results.csv, results.md                 one row per cell, rewritten after every cell
    fid.png, accuracy.png                   per method and epsilon
    samples-<dataset>-eps<epsilon>.png      the methods' sample grids side by side

Each cell runs in child processes (``dpsynth run --resume``, then ``dpsynth evaluate``), so its peak memory
and CPU time are its own; a cell whose child fails is recorded and the bench goes on with the next one.
Rerunning the same command continues where it stopped: finished phases are never repeated. An
interrupted bench (Ctrl-C, SIGTERM) stops its child, records the child's cost and rewrites the results
before it exits.
"""
from __future__ import annotations

import fcntl
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from ..api import dataset_from_config, plan_budget_for, resolve_config
from ..config import (
    BASE_CONFIG,
    Config,
    EvaluationSection,
    flat_keys,
    get_value,
    method_name,
    preset_name,
    section_defaults,
    set_value,
)
from ..diffusion.pretrain import finished_pretraining
from ..errors import ConfigError, DpsynthError
from ..evaluation import METRICS
from ..methods import METHODS, get_method, run_config_of
from ..runs import CONFIG, PRIVACY, RunDirectory
from .results import ATTEMPTS, OUTPUT, machine_type, write_results

__all__ = ["Cell", "BenchSpec", "run_bench"]

INTERRUPT_GRACE_S = 5.0
ABSENT = "<absent>"
LOCATION_KEYS = ("run.out_dir",)  # where the bench lives, however spelt (relative, absolute, moved): not a setting
# compared only between methods whose release has soft labels
SOFT_LABEL_KEYS = ("evaluation.soft_label_epochs", "evaluation.distillation_temperature")
PUBLIC = "glyphs"  # the public set the bench pre-trains on for a method that needs a public model


@dataclass(frozen=True)
class Cell:
    """One method on one dataset at one target epsilon; ``synthesis`` counts independent repeats of it."""

    method: str
    dataset: str
    epsilon: float
    synthesis: int = 1

    @property
    def name(self) -> str:
        repeat = f"-s{self.synthesis}" if self.synthesis > 1 else ""
        return f"{self.method}-{self.dataset}-eps{self.epsilon:g}{repeat}"


@dataclass(frozen=True)
class BenchSpec:
    """What to run: the grid, its preset and its ``key=value`` overrides (``method:key=value`` for one method)."""

    methods: Sequence[str]
    datasets: Sequence[str]
    epsilons: Sequence[float]
    preset: str | None = None
    overrides: Sequence[str] = ()
    data_dir: str | None = None
    device: str | None = None
    public_iterations: int = 2000  # of the public model the bench pre-trains for a method that needs one
    syntheses: int = 1  # independent syntheses of each cell (the spread between them is the measure's own)

    def cells(self) -> list[Cell]:
        """Every cell's first synthesis, then every cell's second, and so on."""
        return [Cell(m, d, e, s) for s in range(1, self.syntheses + 1) for d in self.datasets for e in self.epsilons
                for m in self.methods]


def run_bench(spec: BenchSpec, out: str | Path) -> list[str]:
    """Run every cell of ``spec`` not yet finished under ``out``; returns the names of cells that failed.

    Every config is resolved and every budget planned before the first child starts, so bad input stops
    the bench before any compute.
    """
    out = Path(out)
    configs = _configs(spec, out)
    _check_comparable(configs)
    preset = ", ".join(sorted({c["preset"] for c in configs.values()}))
    failed = []
    try:
        for cell, config in configs.items():
            run = _open_cell(out / "runs" / cell.name, config)
            print(f"[bench] {cell.name}: {_status(run)}", flush=True)
            if not _public_model(run, spec, out) or not _finish(run):
                failed.append(cell.name)
            write_results(out, list(configs), preset)
    except KeyboardInterrupt:
        write_results(out, list(configs), preset)
        raise
    return failed


def _configs(spec: BenchSpec, out: Path) -> dict[Cell, Config]:
    """Each cell's resolved config (evaluation in its own child, so not inside the run), budgets planned; a
    method that needs a public model and is given none starts from the bench's (``public/``)."""
    _check_spec(spec)
    shared, scoped = _split_overrides(spec)
    direct = [f"run.out_dir={out / 'runs'}", "evaluation.enabled=false"] + ([f"run.device={spec.device}"]
                                                                             if spec.device else [])
    configs = {}
    for cell in spec.cells():
        try:
            config = resolve_config(cell.method, dataset=cell.dataset, epsilon=cell.epsilon, preset=spec.preset,
                                    data_dir=spec.data_dir, overrides=[*shared, *scoped.get(cell.method, []), *direct])
        except ConfigError as exc:
            raise ConfigError(f"{cell.name}: {exc}") from None
        method = METHODS[cell.method]
        if method.needs_public_model and not method.settings(config, "model").init_from:
            set_value(config, "model.init_from", str(_public_dir(out) / f"{cell.method}-{cell.dataset}"), cell.name)
        configs[cell] = config
    infos = {name: dataset_from_config(next(c for cell, c in configs.items() if cell.dataset == name)).info
             for name in spec.datasets}
    for cell, config in configs.items():
        plan_budget_for(config, infos[cell.dataset])
    return configs


def _check_spec(spec: BenchSpec) -> None:
    for what, values in (("--methods", spec.methods), ("--datasets", spec.datasets),
                         ("--epsilons", spec.epsilons)):
        if not values:
            raise ConfigError(f"{what}: give at least one")
        if len(set(values)) != len(values):
            raise ConfigError(f"{what}: {list(values)} names one twice")
    unknown = [m for m in spec.methods if m not in METHODS]
    if unknown:
        raise ConfigError(f"--methods: unknown {', '.join(unknown)}; known: {', '.join(sorted(METHODS))}")
    if spec.syntheses < 1:
        raise ConfigError(f"--syntheses must be a whole number above 0, got {spec.syntheses}")
    if spec.data_dir and len(spec.datasets) > 1:
        raise ConfigError("--data-dir names one dataset's files; give one dataset with it")


def _split_overrides(spec: BenchSpec) -> tuple[list[str], dict[str, list[str]]]:
    """``key=value`` for every method, ``method:key=value`` for one."""
    shared: list[str] = []
    scoped: dict[str, list[str]] = {}
    for item in spec.overrides:
        method, colon, _ = item.partition("=")[0].partition(":")
        if not colon:
            shared.append(item)
        elif method not in spec.methods:
            raise ConfigError(f"--set {item!r}: {method!r} is not one of the bench's methods "
                              f"({', '.join(spec.methods)})")
        else:
            scoped.setdefault(method, []).append(item.split(":", 1)[1])
    return shared, scoped


def _check_comparable(configs: dict[Cell, Config]) -> None:
    """Every cell releases as many images and is evaluated with the same settings (the students of soft-label
    releases have their own epochs and temperature, the same for every such cell)."""
    for key in ("sampling.num_samples", *(f"evaluation.{spec.name}" for spec in fields(EvaluationSection)
                                          if spec.name != "enabled")):
        values = {cell.name: get_value(config, key) for cell, config in configs.items()
                  if key not in SOFT_LABEL_KEYS or METHODS[cell.method].releases_soft_labels}
        if len({repr(v) for v in values.values()}) > 1:
            shown = ", ".join(f"{name}: {value!r}" for name, value in values.items())
            raise ConfigError(f"{key} differs between cells ({shown}); a bench compares methods on equal terms: "
                              f"set it once for all (--set {key}=...)")


def _open_cell(path: Path, config: Config) -> RunDirectory:
    """The cell's run directory: created on first use, else checked to hold the same config."""
    if not path.exists():
        return RunDirectory.create(run_config_of(config), path.parent, path.name)
    run = RunDirectory.open(path)
    differences = _differences(run.config(), config)
    if differences:
        raise ConfigError(f"{path / CONFIG}: this cell was started with another config ({'; '.join(differences)}); "
                          "rerun with the same options, or use another --out, or delete the cell's directory")
    return run


def _differences(stored: Config, wanted: Config, shown: int = 3) -> list[str]:
    """``key: old there, new now`` for every flat key whose value differs (``<absent>`` where missing); a key
    the stored config lacks (a cell made before the key existed) matches its default value; the run's records (of
    its hardware, of what it drew, of what its plan found) and :data:`LOCATION_KEYS` are not compared."""
    keys = sorted(key for key in set(flat_keys(stored)) | set(flat_keys(wanted))
                  if not key.startswith(("hardware.", "drawn.", "derived.")) and key not in LOCATION_KEYS)
    pairs = {key: (_get_or(stored, key), _get_or(wanted, key)) for key in keys}
    found = [f"{key}: {old!r} there, {new!r} now" for key, (old, new) in pairs.items()
             if old != new and not (old == ABSENT and new == _default(key, wanted.get("method")))]
    return found[:shown] + ([f"and {len(found) - shown} more"] if len(found) > shown else [])


def _default(key: str, method: str | None) -> Any:
    """What a config made before ``key`` existed had in its place: the default of ``method``'s section, or the
    shared one (config.yaml files are migrated as they are read, dpsynth.config.migrate)."""
    section = key.split(".")[0]
    kind = METHODS[method].sections.get(section) if method is not None and method in METHODS else None
    return _get_or({section: section_defaults(kind)} if kind else BASE_CONFIG, key)


def _get_or(config: Config, key: str) -> Any:
    try:
        return get_value(config, key)
    except (KeyError, TypeError):
        return ABSENT


def _status(run: RunDirectory) -> str:
    if run.file(METRICS).exists():
        return "done"
    return "evaluating" if run.file(PRIVACY).exists() else "synthesising"


def _public_dir(out: Path) -> Path:
    """Where the bench keeps the public models it pre-trains (an absolute path: the cells' configs name it)."""
    return (out / "public").resolve()


def _public_model(run: RunDirectory, spec: BenchSpec, out: Path) -> bool:
    """Pre-train the public model the cell starts from when it is the bench's and not yet finished (a child
    process recorded in the cell's bench.jsonl as phase ``public``); False if that fails."""
    config = run.config()
    method = get_method(method_name(config))
    start = method.settings(config, "model").init_from if "model" in method.sections else None
    directory = Path(start) if start else None
    if directory is None or directory.parent != _public_dir(out) or run.file(PRIVACY).exists() \
            or finished_pretraining(directory):
        return True
    shutil.rmtree(directory, ignore_errors=True)  # an interrupted pre-training starts again: public data, no budget
    info = dataset_from_config(config).info
    shape = [f"{section}.{key}={json.dumps(value)}" for section in ("model", "diffusion")
             for key, value in asdict(method.settings(config, section)).items()
             if key not in ("init_from", "class_start")]
    settings = [f"dataset.resolution={info.height}", f"dataset.channels={info.channels}", *shape]
    device = ["--device", spec.device] if spec.device else []
    command = [sys.executable, "-m", "dpsynth", "pretrain", "--for", method_name(config), "--preset",
               preset_name(config), "--dataset", PUBLIC, "--out", str(directory), "--iterations",
               str(spec.public_iterations),
               *[arg for item in settings for arg in ("--set", item)], *device]
    returncode = _child(run, "public", command)
    if returncode != 0:
        print(f"[bench] {run.path.name}: public pre-training failed (exit status {returncode}); "
              f"see {run.path / OUTPUT}", flush=True)
    return returncode == 0


def _finish(run: RunDirectory) -> bool:
    """Run the cell's remaining phases in child processes; False if one fails."""
    phases = [("synthesis", ["run", "--resume"]), ("evaluation", ["evaluate"])]
    done = {"synthesis": run.file(PRIVACY).exists(), "evaluation": run.file(METRICS).exists()}
    for phase, command in phases:
        if done[phase]:
            continue
        returncode = _child(run, phase, [sys.executable, "-m", "dpsynth", *command, str(run.path)])
        if returncode != 0:
            print(f"[bench] {run.path.name}: {phase} failed (exit status {returncode}); "
                  f"see {run.path / OUTPUT}", flush=True)
            return False
    return True


def _child(run: RunDirectory, phase: str, command: list[str]) -> int:
    """Run ``command`` with the cell locked (the lock passes to the child), record its cost in bench.jsonl."""
    with (run.path / ".bench.lock").open("w") as lock, (run.path / OUTPUT).open("a") as output:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise DpsynthError(f"{run.path}: another process is running this cell; wait for it or stop it") from None
        run.log("bench", phase=phase, command=command[3:])
        output.write(f"\n=== {time.strftime('%Y-%m-%dT%H:%M:%S')} {phase}: {' '.join(command)}\n")
        output.flush()
        started = time.perf_counter()
        child = subprocess.Popen(command, stdout=output, stderr=subprocess.STDOUT, pass_fds=(lock.fileno(),),
                                 env={**os.environ, "PYTHONUNBUFFERED": "1"})
        status, usage, stopped = _wait(child)
        returncode = os.waitstatus_to_exitcode(status)
        interrupted = stopped and returncode != 0  # a child that finished as the stop came is a finished attempt
        _append_attempt(run, {"phase": phase, "returncode": returncode,
                              "wall_s": round(time.perf_counter() - started, 1),
                              "cpu_s": round(usage.ru_utime + usage.ru_stime, 1),
                              "max_rss_bytes": usage.ru_maxrss * 1024} | ({"interrupted": True} if interrupted else {}))
    if stopped:
        raise KeyboardInterrupt
    return returncode


def _wait(child: subprocess.Popen[bytes]) -> tuple[int, resource.struct_rusage, bool]:
    """Reap ``child``: its status, its resource usage, and whether the bench was asked to stop meanwhile.

    While the child runs, Ctrl-C (unless ignored, as in a background job) and SIGTERM only note the stop: an
    exception raised between the reaping and its record would lose the child's status. Ctrl-C in a terminal
    reaches the child too, so it gets ``INTERRUPT_GRACE_S`` to end on its own; the stop is then passed on as
    SIGTERM, on which every dpsynth command stops as on Ctrl-C.
    """
    stops: list[float] = []
    watched = [signal.SIGTERM] + ([signal.SIGINT] if signal.getsignal(signal.SIGINT) != signal.SIG_IGN else [])
    previous = {signum: signal.signal(signum, lambda *_: stops.append(time.monotonic())) for signum in watched}
    try:
        passed_on = False
        while True:
            pid, status, usage = os.wait4(child.pid, os.WNOHANG)
            if pid:
                return status, usage, bool(stops)
            if stops and not passed_on and time.monotonic() - stops[0] > INTERRUPT_GRACE_S:
                child.send_signal(signal.SIGTERM)
                passed_on = True
            time.sleep(0.1)
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def _append_attempt(run: RunDirectory, record: dict[str, Any]) -> None:
    with (run.path / ATTEMPTS).open("a") as handle:
        handle.write(json.dumps({"time": time.strftime("%Y-%m-%dT%H:%M:%S"), "machine": machine_type(), **record})
                     + "\n")


ALL_METHODS = ["dpdm", "dp-feta", "feta-pro", "pe", "dp-sad", "dp-imgsyn"]  # the baseline first, then by paper


def method_list(text: Iterable[str]) -> list[str]:
    """``all`` expands to every registered method."""
    names = list(text)
    if names != ["all"]:
        return names
    return [m for m in ALL_METHODS if m in METHODS] + sorted(set(METHODS) - set(ALL_METHODS))
