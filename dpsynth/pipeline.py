"""Running a method end to end in a run directory: plan, fit, check the budget, release."""
from __future__ import annotations

from typing import Any

import torch

from .api import dataset_from_config, plan_budget_for
from .config import Config
from .errors import ConfigError, PrivacyError
from .methods import get_method
from .methods.base import RunContext
from .privacy import Accountant, PrivacyLedger, budget_report, ledger_report
from .runs import RunDirectory


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
    """Create a run directory for ``config`` and execute it."""
    run = RunDirectory.create(config)
    print(f"run directory: {run.path}")
    return execute(run)


def resume(path: str) -> RunDirectory:
    """Continue the run in ``path`` from its last checkpoint (ledger and RNG included)."""
    return execute(RunDirectory.open(path))


def execute(run: RunDirectory) -> RunDirectory:
    """Plan the budget, fit, refuse to release over budget, write synthetic.npz, samples.png, privacy.json."""
    config = run.config()
    dataset = dataset_from_config(config)
    method = get_method(config["method"])(config)
    budget = plan_budget_for(config, dataset.info)
    accountant, delta, target, plan = budget.accountant, budget.delta, budget.target, budget.stages
    state, ledger = run.restore()
    run.log("start" if state is None else "resume", plan=budget_report(plan, accountant, delta)["stages"])
    torch.manual_seed(config["run"]["seed"])  # model initialisation
    generator = torch.Generator().manual_seed(config["run"]["seed"])
    context = RunContext(dataset, run, plan, ledger, accountant, delta, pick_device(config["run"]["device"]),
                         generator, state)
    method.fit(context)
    report = _privacy_report(ledger, accountant, delta, target, dataset.info.num_train)
    images, labels, soft = method.generate(config["sampling"]["num_samples"], torch.Generator().manual_seed(
        config["run"]["seed"] + 1))
    run.save_release(images, labels, dataset.info.class_names, soft)
    run.write_privacy_report(report)
    run.log("released", epsilon=report["epsilon"], samples=len(labels))
    print(f"released {len(labels)} images at epsilon = {report['epsilon']:.4f} (delta = {delta:.3g}): {run.path}")
    return run


def _privacy_report(ledger: PrivacyLedger, accountant: Accountant, delta: float, target: float,
                    num_train: int) -> dict[str, Any]:
    report = ledger_report(ledger, accountant, delta)
    if report["epsilon"] > target * (1 + 1e-6):
        raise PrivacyError(f"the ledger spends epsilon = {report['epsilon']:.4f}, over the target {target:g}: "
                           "nothing is released")
    return {"target_epsilon": target, "dataset_size": num_train, **report}
