"""Shared by the benchmarks that re-sample a finished run: its method rebuilt with the run's EMA weights."""
from __future__ import annotations

import copy
from typing import Any

import torch

from dpsynth.data import DatasetInfo
from dpsynth.methods import get_method
from dpsynth.methods.base import Method
from dpsynth.privacy.dpsgd import EMA
from dpsynth.runs import CHECKPOINT, RunDirectory


def final_state(run: RunDirectory) -> dict[str, Any]:
    """The last checkpoint's training state of ``run`` (private: read it where the run is)."""
    return torch.load(run.file(CHECKPOINT), map_location="cpu", weights_only=False)["state"]


def trained_method(config: dict[str, Any], state: dict[str, Any], info: DatasetInfo, **diffusion: Any) -> Method:
    """The run's DPDM-family method holding its EMA weights, sampling with ``diffusion`` settings changed
    (e.g. ``sampler``, ``sample_steps``, ``guidance``)."""
    config = copy.deepcopy(config)
    config["diffusion"].update(diffusion)
    method = get_method(config["method"])(config)
    model = method._build(info, torch.device("cpu"))
    ema = EMA(model, 0.0)
    ema.load_state_dict(state["ema"])
    ema.copy_to(model)
    method.model, method.info = model, info
    return method
