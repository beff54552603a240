"""DPDM (Dockhorn et al. 2023): a diffusion model trained with DP-SGD; DP-FETA without its warm-up."""
from __future__ import annotations

from ..data import DatasetInfo
from ..privacy import DpsgdSchedule, PlannedStage
from .base import Method, register


@register
class DPDM(Method):
    """DP-SGD on a class-conditional diffusion model, with noise multiplicity K (DPDM's K draws of t)."""

    name = "dpdm"
    description = "diffusion model trained with DP-SGD (the baseline of every seed paper)"
    sections = {
        "dpsgd": {
            "batch_size": 4096,
            "epochs": 150.0,
            "noise_multiplicity": 32,
            "clip": 1.0,
            "lr": 3e-4,
            "ema": 0.999,
        },
    }
    presets = {
        # DPImageBench's DPDM settings, accounted with RDP as the paper reports; meant for a GPU.
        "paper": {"privacy": {"accountant": "rdp"}},
        # Provisional until the DP-SGD engine lands and is measured on this 2-core CPU (Foundation II).
        "cpu": {"dpsgd": {"batch_size": 1024, "epochs": 4.0, "noise_multiplicity": 1}},
    }

    def privacy_stages(self, info: DatasetInfo) -> list[PlannedStage]:
        settings = self.config["dpsgd"]
        schedule = DpsgdSchedule(settings["batch_size"], settings["epochs"], info.num_train)
        return [PlannedStage("dp-sgd", calibrated=schedule.event)]
