"""Shared by the benchmarks that re-sample a finished run: its method rebuilt with the run's EMA weights."""
from __future__ import annotations

import copy
import statistics
from typing import Any

import torch

from dpsynth.api import dataset_from_config
from dpsynth.data import Dataset, DatasetInfo
from dpsynth.methods import create_method
from dpsynth.methods.base import Method
from dpsynth.privacy.dpsgd import EMA
from dpsynth.runs import Checkpoint, RunDirectory


def finished_run(path: str) -> tuple[dict[str, Any], Dataset, Checkpoint]:
    """The config, dataset and last checkpoint's training state of the run at ``path``."""
    run = RunDirectory(path)
    config = run.config()
    return config, dataset_from_config(config), final_state(run)


def mean_spread(scores: list[float]) -> str:
    """``mean ± sample standard deviation`` (0 for one score), one decimal."""
    spread = statistics.stdev(scores) if len(scores) > 1 else 0.0
    return f"{statistics.mean(scores):.1f} ± {spread:.1f}"


def final_state(run: RunDirectory) -> Checkpoint:
    """The last checkpoint's training state of ``run`` (private: read it where the run is)."""
    return run.last_checkpoint()


def trained_method(config: dict[str, Any], state: Checkpoint, info: DatasetInfo, **diffusion: Any) -> Method:
    """The run's DPDM-family method holding its EMA weights, sampling with ``diffusion`` settings changed
    (e.g. ``sampler``, ``sample_steps``, ``guidance``)."""
    config = copy.deepcopy(config)
    config["diffusion"].update(diffusion)
    method = create_method(config)
    model = method._build(info, torch.device("cpu"))
    ema = EMA(model, 0.0)
    ema.load_state_dict(state.parts["ema"])
    ema.copy_to(model)
    method.model, method.info = model, info
    return method
