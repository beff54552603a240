"""Running a method end to end in a run directory: plan, fit, check the budget, release."""
from __future__ import annotations

import copy
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch

from .api import BudgetPlan, dataset_from_config, plan_budget_for, resolve_delta
from .config import BASE_CONFIG, Config, build_config, set_value
from .data import Dataset
from .errors import ConfigError, DpsynthError, PrivacyError
from .evaluation import EvaluationSettings, evaluate_release, load_release
from .methods import get_method
from .methods.base import Method, RunContext
from .privacy import Accountant, PrivacyLedger, budget_report, ledger_report, non_private_stages
from .runs import LOG, PRIVACY, SYNTHETIC, RunDirectory


def pick_device(name: str) -> torch.device:
    """``auto`` is CUDA when present, else the CPU; ``cpu`` / ``cuda[:N]`` as given."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise ConfigError(f"run.device: unknown device {name!r}; use auto, cpu or cuda") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError("run.device: cuda requested but no CUDA device is available")
    return device


def start(config: Config) -> RunDirectory:
    """Load the data and plan the budget (config errors leave nothing behind), then create a run directory
    for ``config`` and execute it."""
    dataset = dataset_from_config(config)
    budget = plan_budget_for(config, dataset.info)
    run = RunDirectory.create(config)
    print(f"run directory: {run.path}")
    return execute(run, dataset, budget)


def resume(path: str) -> RunDirectory:
    """Continue the run in ``path`` from its last checkpoint (ledger and RNG included)."""
    run = RunDirectory.open(path)
    if run.file(PRIVACY).exists():
        raise DpsynthError(f"{run.path}: this run already released its synthetic set; nothing to resume "
                           f"(dpsynth evaluate {run.path} evaluates it)")
    return execute(run)


def execute(run: RunDirectory, dataset: Dataset | None = None, budget: BudgetPlan | None = None) -> RunDirectory:
    """Plan the budget (unless given), fit, refuse to release over budget, write synthetic.npz, samples.png,
    privacy.json."""
    config = run.config()
    dataset = dataset or dataset_from_config(config)
    method = get_method(config["method"])(config)
    budget = budget or plan_budget_for(config, dataset.info)
    accountant, delta, target, plan = budget.accountant, budget.delta, budget.target, budget.stages
    state, ledger = run.restore()
    run.log("start" if state is None else "resume", plan=budget_report(plan, accountant, delta)["stages"])
    torch.manual_seed(config["run"]["seed"])  # model initialisation
    generator = torch.Generator().manual_seed(config["run"]["seed"])
    context = RunContext(dataset, run, plan, ledger, accountant, delta, pick_device(config["run"]["device"]),
                         generator, state)
    method.fit(context)
    report = _privacy_report(ledger, accountant, delta, target, dataset.info.num_train, method)
    images, labels, soft = method.generate(config["sampling"]["num_samples"], torch.Generator().manual_seed(
        config["run"]["seed"] + 1))
    run.save_release(images, labels, dataset.info.class_names, soft, method.soft_label_temperature())
    run.write_privacy_report(report)
    run.log("released", epsilon=report["epsilon"], samples=len(labels), **_cuda_peak(context.device))
    guarantee = (f"at epsilon = {report['epsilon']:.4f} (delta = {delta:.3g})" if report["dp_guarantee"] else
                 "with NO differential-privacy guarantee (see privacy.json)")
    print(f"released {len(labels)} images {guarantee}: {run.path}")
    if config["evaluation"]["enabled"]:
        evaluate_run(run, dataset=dataset, device=context.device)
    return run


def _cuda_peak(device: torch.device) -> dict[str, int]:
    """The process's peak CUDA memory allocated on ``device`` (nothing on the CPU), for the log."""
    return {"cuda_peak_bytes": torch.cuda.max_memory_allocated(device)} if device.type == "cuda" else {}


def _evaluation_config(config: Config, overrides: Iterable[tuple[str, Any]]) -> Config:
    """``config`` with every evaluation key (defaults for runs made before a key existed), then ``overrides``."""
    config = copy.deepcopy(config)
    config["evaluation"] = {**copy.deepcopy(BASE_CONFIG["evaluation"]), **config.get("evaluation", {})}
    for key, value in overrides:
        if not key.startswith(("evaluation.", "run.device")):
            raise ConfigError(f"--set {key}: evaluating a run can change evaluation.* and run.device only")
        set_value(config, key, value)
    return config


def evaluate_run(run: RunDirectory, overrides: Iterable[tuple[str, Any]] = (), dataset: Dataset | None = None,
                 device: torch.device | None = None) -> dict[str, Any]:
    """Evaluate a run's release into its directory; model selection is added to its ledger and privacy.json."""
    if not run.file(SYNTHETIC).is_file():
        raise DpsynthError(f"{run.path}: no {SYNTHETIC} yet; finish the run first (dpsynth run --resume {run.path})")
    config = _evaluation_config(run.config(), overrides)
    dataset = dataset or dataset_from_config(config)
    accountant, delta = Accountant(config["privacy"]["accountant"]), resolve_delta(config, dataset.info.num_train)
    ledger = run.ledger()
    metrics = evaluate_release(load_release(run.file(SYNTHETIC), dataset.info),
                               dataset, EvaluationSettings.from_config(config["evaluation"]), ledger, accountant,
                               delta, run.path, device or pick_device(config["run"]["device"]), run.file(LOG),
                               run.method_metrics())
    report = _privacy_report(ledger, accountant, delta, float(config["privacy"]["epsilon"]), dataset.info.num_train,
                             get_method(config["method"])(config))
    run.write_privacy_report(report)
    run.log("evaluated", **{key: metrics[key] for key in ("fid", "precision", "recall")},
            **_cuda_peak(device or pick_device(config["run"]["device"])))
    return metrics


def evaluate_file(path: str | Path, overrides: Iterable[tuple[str, Any]], out_dir: str | Path | None = None
                  ) -> tuple[dict[str, Any], Path]:
    """Evaluate a synthetic .npz against ``dataset.*`` from ``overrides``; outputs go to ``out_dir``.

    The default ``out_dir`` is ``<file stem>-evaluation`` beside the file; its ``ledger.json`` holds the
    model-selection mechanisms (evaluation budget), and accumulates over repeated evaluations.
    """
    path = Path(path)
    config = build_config({}, {}, "none", overrides)
    dataset = dataset_from_config(config)
    out = Path(out_dir) if out_dir is not None else path.with_name(f"{path.stem}-evaluation")
    ledger_path = out / "ledger.json"
    ledger = PrivacyLedger.load(ledger_path) if ledger_path.exists() else PrivacyLedger(ledger_path)
    accountant, delta = Accountant(config["privacy"]["accountant"]), resolve_delta(config, dataset.info.num_train)
    metrics = evaluate_release(load_release(path, dataset.info), dataset,
                               EvaluationSettings.from_config(config["evaluation"]), ledger, accountant, delta, out,
                               pick_device(config["run"]["device"]))
    return metrics, out


def _privacy_report(ledger: PrivacyLedger, accountant: Accountant, delta: float, target: float,
                    num_train: int, method: Method) -> dict[str, Any]:
    """The ledger's epsilon (PrivacyError over ``target``), plus any outputs the method says it does not cover."""
    report = ledger_report(ledger, accountant, delta)
    if not report["dp_guarantee"]:  # allowed by run.allow_non_private when planned
        unprotected = ", ".join(non_private_stages(ledger.stages()))
        return {"target_epsilon": None, "dataset_size": num_train, **report,
                "no_guarantee": f"stage(s) {unprotected} used the private data without noise: no epsilon covers "
                                "this release, whatever noise the other stages added"}
    if report["epsilon"] > target * (1 + 1e-6):
        raise PrivacyError(f"the ledger spends epsilon = {report['epsilon']:.4f}, over the target {target:g}: "
                           "nothing is released")
    uncovered = {"not_covered_by_epsilon": method.non_private_outputs()} if method.non_private_outputs() else {}
    return {"target_epsilon": target, "dataset_size": num_train, **report, **uncovered}
