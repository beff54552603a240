"""DP-FETA (Li et al.): DP central images warm up the diffusion model, then DP-SGD fine-tunes it.

With ``central.count = 0`` there is no warm-up and DP-FETA is DPDM. Stage I queries noisy mean or mode
images per class (parallel composition) with fixed noise; the DP-SGD noise of stage II is calibrated
afterwards so the whole run meets the target epsilon (the paper's three-step procedure).
"""
from __future__ import annotations

import copy
from typing import Any

import torch
from kornia.augmentation.auto import RandAugment
from kornia.augmentation.auto.rand_augment.rand_augment import default_policy
from tqdm.auto import tqdm

from ...data import DatasetInfo, ImageSet
from ...privacy import DpsgdSchedule, PlannedStage
from ...utils.images import class_grid, save_png, to_uint8
from ..base import RunContext, register
from ..dpdm import DPDM
from .central import CentralQuery, central_images

CENTRAL_IMAGES = "central_images.png"
# kornia's RandAugment operations without "invert": 14, as the paper's bag (inverted garments or digits
# are not images of the data).
AUGMENTATIONS = [subpolicy for subpolicy in default_policy if subpolicy[0][0] != "invert"]


def augmented(augment: RandAugment, images: torch.Tensor) -> torch.Tensor:
    """``images`` through ``augment``; grey images go through as RGB (the colour op needs three channels)."""
    if images.shape[1] != 1:
        return augment(images)
    return augment(images.expand(-1, 3, -1, -1))[:, :1]


def _merged(base: dict[str, dict[str, Any]], extra: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    merged = copy.deepcopy(base)
    for section, values in extra.items():
        merged.setdefault(section, {}).update(copy.deepcopy(values))
    return merged


@register
class DPFETA(DPDM):
    """Central images (mean or mode) and an augmented non-private warm-up before DPDM's DP-SGD."""

    name = "dp-feta"
    description = "DP central images warm up a diffusion model, then DP-SGD fine-tuning"
    sections = {
        **DPDM.sections,
        "central": {"kind": "mean", "count": 5, "batch_size": 6000, "noise_multiplier": 5.0, "clip": 28.0,
                    "bins": 2, "count_noise": 100.0, "downsample": 2, "denoise": True},
        "warmup": {"iterations": 2000, "batch_size": 64, "lr": 1e-4, "augment": True, "augment_ops": 2,
                   "augment_magnitude": 10, "checkpoint_every": 500},
    }
    presets = {
        # Tables VII-VIII for MNIST / F-MNIST; DP-SGD as DPDM's paper preset.
        "paper": DPDM.presets["paper"],
        # DPDM's cpu preset, with part of its DP-SGD time given to the warm-up (see the README).
        "cpu": _merged(DPDM.presets["cpu"], {
            "dpsgd": {"epochs": 3.25},
            "warmup": {"iterations": 1000, "lr": 1e-3, "checkpoint_every": 250},
        }),
    }

    def _query(self, info: DatasetInfo) -> CentralQuery:
        settings = self.config["central"]
        return CentralQuery(settings["kind"], settings["count"], settings["batch_size"] / info.num_train,
                            settings["noise_multiplier"], settings["clip"], settings["bins"],
                            settings["count_noise"], settings["downsample"], settings["denoise"])

    def privacy_stages(self, info: DatasetInfo) -> list[PlannedStage]:
        settings = self.config["dpsgd"]
        schedule = DpsgdSchedule(settings["batch_size"], settings["epochs"], info.num_train)
        central = [PlannedStage("central-images", self._query(info).event(info.num_classes))]
        return (central if self.config["central"]["count"] > 0 else []) + [
            PlannedStage("dp-sgd", calibrated=schedule.event)]

    def pretrain(self, context: RunContext, model: torch.nn.Module) -> None:
        """Query the central images (or restore them), save their grid, then warm up on them."""
        if self.config["central"]["count"] == 0:
            return
        info, state = context.dataset.info, context.state
        if state is None:
            central = central_images(context.dataset.train, info.num_classes, self._query(info), context.ledger,
                                     "central-images", context.generator)
            state = {"phase": "warmup", "step": 0, "central_images": central.images,
                     "central_labels": central.labels}
            context.checkpoint({**state, "rng": context.generator.get_state()})
        else:
            central = ImageSet(state["central_images"], state["central_labels"])
        save_png(class_grid(to_uint8(central.images), central.labels.numpy(), info.num_classes),
                 context.run.file(CENTRAL_IMAGES))
        self._warm_up(context, model, central, state)

    def _warm_up(self, context: RunContext, model: torch.nn.Module, central: ImageSet, state: dict[str, Any]
                 ) -> None:
        """Non-private training on augmented central images (post-processing: no privacy cost)."""
        settings = self.config["warmup"]
        optimizer = torch.optim.Adam(model.parameters(), lr=settings["lr"])
        start = state["step"]
        if "model" in state:
            model.load_state_dict(state["model"])
            optimizer.load_state_dict(state["optimizer"])
            torch.set_rng_state(state["torch_rng"])
        if "rng" in state:
            context.generator.set_state(state["rng"])
        augment = RandAugment(settings["augment_ops"], settings["augment_magnitude"], policy=AUGMENTATIONS)
        make_batch = self._batch_maker(context, central)
        model.train()
        for step in tqdm(range(start, settings["iterations"]), desc="warm-up", initial=start,
                         total=settings["iterations"], dynamic_ncols=True):
            index = torch.randint(len(central), (settings["batch_size"],), generator=context.generator)
            images, labels, times, noise = make_batch(index)
            if settings["augment"]:
                images = augmented(augment, images)
            loss = self.diffusion.batch_loss(model, images, labels, times, noise)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            done = step + 1
            if done % settings["checkpoint_every"] == 0 or done == settings["iterations"]:
                context.checkpoint({"phase": "warmup", "step": done, "central_images": central.images,
                                    "central_labels": central.labels, "model": model.state_dict(),
                                    "optimizer": optimizer.state_dict(), "torch_rng": torch.get_rng_state(),
                                    "rng": context.generator.get_state()})
                context.log("warm-up", step=done, loss=float(loss))
