"""DP-FETA (Li et al.): DP central images warm up the diffusion model, then DP-SGD fine-tunes it.

With ``central.count = 0`` there is no warm-up and DP-FETA is DPDM. Stage I queries noisy mean or mode
images per class (parallel composition) with fixed noise; the DP-SGD noise of stage II is calibrated
afterwards so the whole run meets the target epsilon (the paper's three-step procedure).
"""
from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import torch
from kornia.augmentation.auto import RandAugment
from kornia.augmentation.auto.rand_augment.rand_augment import default_policy
from tqdm.auto import tqdm

from ...data import DatasetInfo, ImageSet
from ...privacy import PlannedStage
from ...utils.images import class_grid, save_png, to_uint8
from ..base import RunContext, register
from ..dpdm import DPDM
from ..training import dpsgd_schedule
from .central import CentralQuery, central_images

CENTRAL_IMAGES = "central_images.png"
# Checkpoint keys of artefacts computed from private data (released: restored on resume, never recomputed).
RELEASED_PREFIXES = ("central_", "frequency_", "auxiliary_", "selection_")  # the last: PrivImage's
LossFn = Callable[[torch.nn.Module, int], torch.Tensor]
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
            "dpsgd": {"epochs": 5.0},
            "warmup": {"iterations": 1000, "lr": 1e-3, "checkpoint_every": 250},
        }),
    }

    def _query(self, info: DatasetInfo) -> CentralQuery:
        settings = self.config["central"]
        return CentralQuery(settings["kind"], settings["count"], settings["batch_size"] / info.num_train,
                            self._central_noise(), settings["clip"], settings["bins"],
                            settings["count_noise"], settings["downsample"], settings["denoise"])

    def _central_noise(self) -> float:
        return self.config["central"]["noise_multiplier"]

    def _uses_central(self) -> bool:
        return self.config["central"]["count"] > 0

    def _feature_stages(self, info: DatasetInfo) -> list[PlannedStage]:
        """Fixed-noise stages released after the central images (none for DP-FETA)."""
        return []

    def privacy_stages(self, info: DatasetInfo) -> list[PlannedStage]:
        schedule = dpsgd_schedule(self.config, "dpsgd", info.num_train)
        central = [PlannedStage("central-images", self._query(info).event(info.num_classes))]
        return ((central if self._uses_central() else []) + self._feature_stages(info)
                + [PlannedStage("dp-sgd", calibrated=schedule.event)])

    def warmup_phases(self) -> list[str]:
        """Names of the non-private training phases, in order (each a checkpointed ``phase``)."""
        return ["warmup"]

    def pretrain(self, context: RunContext, model: torch.nn.Module) -> None:
        """Query the central images (or restore them), save their grid, then warm up on them."""
        if not self._uses_central():
            return
        self._restore(context, model)
        central = self._released_central(context)
        settings = self.config["warmup"]
        self._train_phase(context, model, "warmup", settings, self._diffusion_loss(context, central, settings))

    def _restore(self, context: RunContext, model: torch.nn.Module) -> None:
        """Released artefacts, model and RNGs of the checkpoint being resumed (nothing on a fresh run)."""
        state = context.state or {}
        self._released = {key: state[key] for key in state if key.startswith(RELEASED_PREFIXES)}
        if "model" in state:
            model.load_state_dict(state["model"])
        if "rng" in state:
            context.restore_random(state["rng"])
        if "torch_rng" in state:
            torch.set_rng_state(state["torch_rng"])

    def _checkpoint(self, context: RunContext, phase: str, step: int, **training: Any) -> None:
        """Checkpoint at ``step`` of ``phase`` with every released artefact so far and both RNGs."""
        context.checkpoint({"phase": phase, "step": step, **self._released, **training,
                            "rng": context.random_state(), "torch_rng": torch.get_rng_state()})

    def _released_central(self, context: RunContext) -> ImageSet:
        """The central images: restored, or queried (recorded first) and checkpointed; saves their grid."""
        info = context.dataset.info
        if "central_images" not in self._released:
            central = central_images(context.dataset.train, info.num_classes, self._query(info), context.ledger,
                                     "central-images", context.noise)
            self._released.update(central_images=central.images, central_labels=central.labels)
            self._checkpoint(context, self.warmup_phases()[0], 0)
        central = ImageSet(self._released["central_images"], self._released["central_labels"])
        per_class = min(10, self.config["central"]["count"])
        save_png(class_grid(to_uint8(central.images), central.labels.numpy(), info.num_classes, per_class),
                 context.run.file(CENTRAL_IMAGES))
        return central

    def _diffusion_loss(self, context: RunContext, data: ImageSet, settings: dict[str, Any]) -> LossFn:
        """The diffusion loss on a random batch of ``data``, RandAugmented when ``settings['augment']``."""
        augment = RandAugment(settings["augment_ops"], settings["augment_magnitude"], policy=AUGMENTATIONS)
        make_batch = self._batch_maker(context, data)

        def loss(model: torch.nn.Module, batch_size: int) -> torch.Tensor:
            index = torch.randint(len(data), (batch_size,), generator=context.generator)
            images, labels, times, noise = make_batch(index)
            if settings["augment"]:
                images = augmented(augment, images)
            return self.diffusion.batch_loss(model, images, labels, times, noise)

        return loss

    def _train_phase(self, context: RunContext, model: torch.nn.Module, phase: str, settings: dict[str, Any],
                     loss_fn: LossFn) -> None:
        """Non-private Adam on ``loss_fn`` for ``settings['iterations']`` (post-processing: no privacy cost).

        Skipped when the resumed checkpoint is in a later phase; continued from its step when in this one.
        """
        phases, state = self.warmup_phases(), context.state or {}
        resumed = phases.index(state["phase"]) if state.get("phase") in phases else -1
        if resumed > phases.index(phase):
            return
        optimizer = torch.optim.Adam(model.parameters(), lr=settings["lr"])
        start = state["step"] if resumed == phases.index(phase) else 0
        if start and "optimizer" in state:
            optimizer.load_state_dict(state["optimizer"])
        model.train()
        for step in tqdm(range(start, settings["iterations"]), desc=phase, initial=start,
                         total=settings["iterations"], dynamic_ncols=True):
            loss = loss_fn(model, settings["batch_size"])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            done = step + 1
            if done % settings["checkpoint_every"] == 0 or done == settings["iterations"]:
                self._checkpoint(context, phase, done, model=model.state_dict(), optimizer=optimizer.state_dict())
                context.log("warm-up", phase=phase, step=done, loss=float(loss))
