"""DPDM (Dockhorn et al. 2023): a diffusion model trained with DP-SGD; DP-FETA without its warm-up."""
from __future__ import annotations

from typing import Any

import torch
from tqdm.auto import tqdm

from ..data import DatasetInfo, ImageSet
from ..diffusion import Diffusion
from ..models import build_unet
from ..privacy import DpsgdSchedule, PlannedStage, SubsampledGaussianMechanism
from ..privacy.dpsgd import DPSGD, EMA, DpsgdSettings
from .base import Method, Release, RunContext, register


@register
class DPDM(Method):
    """DP-SGD on a class-conditional diffusion UNet, with noise multiplicity K (K draws of t per example)."""

    name = "dpdm"
    description = "diffusion model trained with DP-SGD (the baseline of every seed paper)"
    sections = {
        "model": {"block_channels": [32, 64, 64], "layers_per_block": 2, "attention": True, "norm_groups": 8},
        "diffusion": {"timesteps": 1000, "beta_schedule": "linear", "prediction": "v",
                      "label_dropout": 0.1,
                      "sample_steps": 50, "guidance": 0.0},
        "dpsgd": {
            "batch_size": 4096,
            "epochs": 150.0,
            "noise_multiplicity": 32,
            "clip": 1.0,
            "lr": 3e-4,
            "ema": 0.999,
            "physical_batch_size": 64,
            "checkpoint_every": 50,
            "bf16": False,
        },
    }
    presets = {
        # DPImageBench's DPDM settings, accounted with RDP as the paper reports; meant for a GPU.
        "paper": {"privacy": {"accountant": "rdp"}},
        # Sized for ~30 minutes of DP-SGD on a 2-core CPU (see the README's preset table).
        "cpu": {
            "model": {"block_channels": [16, 32, 32], "layers_per_block": 1},
            "diffusion": {"sample_steps": 25},
            "dpsgd": {"batch_size": 512, "epochs": 4.0, "noise_multiplicity": 1, "lr": 2e-3, "ema": 0.99,
                      "physical_batch_size": 128, "checkpoint_every": 25, "bf16": True},
            "sampling": {"num_samples": 5000},
        },
    }

    def __init__(self, config: dict[str, Any]) -> None:
        super().__init__(config)
        settings = config["diffusion"]
        self.diffusion = Diffusion(settings["timesteps"], settings["beta_schedule"], settings["prediction"])
        self.model: torch.nn.Module | None = None
        self.ema: EMA | None = None
        self.info: DatasetInfo | None = None

    def privacy_stages(self, info: DatasetInfo) -> list[PlannedStage]:
        settings = self.config["dpsgd"]
        schedule = DpsgdSchedule(settings["batch_size"], settings["epochs"], info.num_train)
        return [PlannedStage("dp-sgd", calibrated=schedule.event)]

    def _build(self, info: DatasetInfo, device: torch.device) -> torch.nn.Module:
        settings = self.config["model"]
        return build_unet(info.channels, info.height, info.num_classes, settings["block_channels"],
                          settings["layers_per_block"], settings["attention"], settings["norm_groups"]).to(device)

    def pretrain(self, context: RunContext, model: torch.nn.Module) -> None:
        """What runs before DP-SGD (nothing for DPDM; DP-FETA's central images and warm-up)."""

    def fit(self, context: RunContext) -> None:
        """Pre-training (a hook), then DP-SGD; checkpoints carry ``phase`` so a resume skips finished phases."""
        settings, info = self.config["dpsgd"], context.dataset.info
        (event,) = context.plan["dp-sgd"]
        assert isinstance(event, SubsampledGaussianMechanism)
        self.info, model = info, self._build(info, context.device)
        state = context.state if context.state is not None and context.state.get("phase") == "dp-sgd" else None
        if state is None:
            self.pretrain(context, model)
        optimizer = torch.optim.Adam(model.parameters(), lr=settings["lr"])
        ema = EMA(model, settings["ema"])
        step = 0
        if state is not None:
            model.load_state_dict(state["model"])
            optimizer.load_state_dict(state["optimizer"])
            ema.load_state_dict(state["ema"])
            context.generator.set_state(state["rng"])
            step = state["step"]
        engine = DPSGD(model, optimizer, self.diffusion.example_loss,
                       DpsgdSettings(event.noise_multiplier, settings["clip"], event.sample_rate,
                                     settings["physical_batch_size"], settings["bf16"]),
                       len(context.dataset.train), context.ledger, "dp-sgd", context.generator)
        make_batch = self._batch_maker(context)
        progress = context.progress(event.steps, "dp-sgd", initial=step)
        while step < event.steps:
            stats = engine.step(make_batch)
            ema.update(model)
            step += 1
            progress.update(stats)
            if step % settings["checkpoint_every"] == 0 or step == event.steps:
                context.checkpoint({"phase": "dp-sgd", "step": step, "model": model.state_dict(),
                                    "optimizer": optimizer.state_dict(), "ema": ema.state_dict(),
                                    "rng": context.generator.get_state()})
                context.log("dp-sgd", step=step, **stats)
        progress.close()
        ema.copy_to(model)
        self.model, self.ema = model, ema

    def _batch_maker(self, context: RunContext, data: ImageSet | None = None):  # noqa: ANN202 (a closure)
        """``make_batch(indices)`` of ``data`` (default the private train split): images, labels, times, noise."""
        train = data if data is not None else context.dataset.train
        device, generator = context.device, context.generator
        shape, k = context.dataset.info.shape, self.config["dpsgd"]["noise_multiplicity"]
        null, dropout = context.dataset.info.num_classes, self.config["diffusion"]["label_dropout"]

        def make_batch(indices: torch.Tensor) -> tuple[torch.Tensor, ...]:
            labels = train.labels[indices].clone()
            labels[torch.rand(len(indices), generator=generator) < dropout] = null
            times, noise = self.diffusion.training_inputs(len(indices), k, shape, generator)
            return tuple(t.to(device) for t in (train.images[indices], labels, times, noise))

        return make_batch

    def generate(self, num_samples: int, generator: torch.Generator) -> Release:
        if self.model is None or self.info is None:
            raise RuntimeError("generate() needs a fitted model: call fit() first")
        info, settings = self.info, self.config["diffusion"]
        labels = torch.arange(num_samples) % info.num_classes
        self.model.eval()
        chunks = labels.split(self.config["sampling"]["batch_size"])
        images = torch.cat([
            self.diffusion.sample(self.model, chunk, info.shape, info.num_classes, settings["sample_steps"],
                                  settings["guidance"], generator)
            for chunk in tqdm(chunks, desc="sampling", dynamic_ncols=True)
        ])
        return images, labels, None
