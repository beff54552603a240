"""PrivImage (Li et al. 2024): pre-train only on the public images whose classes the private data resembles, as a DP
histogram of a public classifier's labels picks them, then DP-SGD as PDP-Diffusion.

1. A classifier is trained on the public set's labels (public data only: no privacy cost).
2. Its top ``selection.top_k`` public classes for each private training image are counted, per private class and
   public class. Adding or removing one image changes k counts of its own class's row by 1, so the histogram has
   L2 sensitivity sqrt(k) (per-class rows cost no more than one row: each image is in one; a group's images,
   weighted 1 / their number, move it by at most that too, whatever their classes) and gets Gaussian noise
   of std ``selection.noise_multiplier`` x sqrt(k), recorded as stage ``semantic-histogram``. (DPImageBench
   accounts its noise, sigma = 50 with k = 5 words, as if the sensitivity were 1; we do not.)
3. The public classes with the largest noisy counts summed over the private classes, a ``selection.ratio`` share
   of them, are kept, and the diffusion model is pre-trained on their images (post-processing: no privacy cost).
   ``model.class_start`` says how: ``matched`` (default), each private class gets the kept public class its images
   voted for most (one each, the assignment of the largest total count), whose images are pre-trained with that
   class's label, the other kept images with the null label, so the classes are told apart from the first DP-SGD
   step; ``shared`` (DPImageBench), every image with the null label (unconditional), every class row then
   starting at the null row.
4. DPDM's DP-SGD, its noise calibrated so the whole run meets the target.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import cache
from typing import ClassVar

import numpy as np
import torch
from scipy.optimize import linear_sum_assignment

from ...config import RunConfig, one_of, positive, preset_with, section_settings
from ...data import DatasetInfo, ImageSet
from ...data.fingerprints import fingerprints
from ...diffusion.settings import CLASS_STARTS, UNetSettings
from ...errors import ConfigError
from ...evaluation.downstream import TrainingSettings, correct_count, train_epochs
from ...models.classifiers import build_classifier
from ...privacy import GaussianMechanism, PlannedStage
from ...privacy.semantic_histogram import semantic_histogram
from ...training.context import RunContext
from ...training.probes import Probes, classifier_cost
from ...training.warmup import Warmup, WarmupSettings
from ...utils.device import to_device
from ...utils.images import as_floats
from ..dpdm.method import DPDM
from . import DECLARATION

SELECTION_STAGE, PHASE = "semantic-histogram", "pretrain-public"
CLASSIFIER_PHASE = "public classifier"  # one: its training and its accuracy on the public set
QUERY_PHASE = "semantic query"  # per private image


@dataclass(frozen=True, kw_only=True)
class SelectionSettings:
    """The ``selection`` section: the public set (a name, its directory, how many of its images), the share of
    its classes kept, how many top classes each private image counts for and the histogram's noise multiplier,
    and the public classifier's architecture and training."""

    public: str = "glyphs"
    public_data_dir: str | None = None
    public_num_images: int | None = positive(default=None)
    ratio: float = positive(default=0.2)
    top_k: int = positive(default=5)
    noise_multiplier: float = positive(default=50.0)
    classifier: str = "cnn"
    classifier_epochs: int = positive(default=5)
    classifier_batch_size: int = positive(default=128)
    classifier_lr: float = positive(default=3e-3)


@dataclass(frozen=True, kw_only=True)
class MatchedUNetSettings(UNetSettings):
    """DPDM's ``model`` section, its class rows starting at the public classes the histogram matched."""

    class_start: str = one_of(*CLASS_STARTS, default="matched")


@dataclass(frozen=True, kw_only=True)
class PublicPretrainSettings(WarmupSettings):
    """The ``public_pretrain`` section: a warm-up on the selected public images, at Adam 1e-3 without
    augmentation."""

    lr: float = positive(default=1e-3)
    augment: bool = False


class PrivImage(DPDM):
    """A DP histogram of a public classifier's labels selects public classes; pre-training on them; DP-SGD."""

    declaration = DECLARATION
    public_sections = ("public_pretrain",)
    probed_keys = ("selection",)
    class_starts: ClassVar[tuple[str, ...]] = ("matched", "shared")
    sections = {**DPDM.sections, "model": MatchedUNetSettings, "selection": SelectionSettings,
                "public_pretrain": PublicPretrainSettings}
    presets = {
        # DPImageBench (F-MNIST / MNIST): top 5 words, sigma 50, 1 % of ImageNet's 1,000 classes, then DPDM's
        # DP-SGD; its pre-training (25 epochs of batch 64) is public_pretrain.iterations here.
        "paper": preset_with(DPDM.presets["paper"], {"selection": {"ratio": 0.01}}),
        # DPDM's cpu preset with one of its DP-SGD epochs given to the selection and 1,000 pre-training steps, as
        # DP-FETA's cpu preset gives it to its warm-up: about the same CPU time as DPDM's.
        "cpu": preset_with(DPDM.presets["cpu"], {"dpsgd": {"epochs": 5.0},
                                             "public_pretrain": {"iterations": 1000, "checkpoint_every": 250}}),
    }

    def __init__(self, config: RunConfig) -> None:
        super().__init__(config)
        self.selection_settings = section_settings(SelectionSettings, config, "selection")
        self.pretrain_settings = section_settings(PublicPretrainSettings, config, "public_pretrain")

    def stages_before_dpsgd(self, info: DatasetInfo) -> list[PlannedStage]:
        return [PlannedStage(SELECTION_STAGE, GaussianMechanism(self.selection_settings.noise_multiplier))]

    def starts_from_public_model(self) -> bool:
        return True  # pre-trained on the public classes its DP histogram picks

    def public_data(self, info: DatasetInfo) -> dict[str, np.ndarray]:
        public = self._public(info)[0]
        return {**self.trainer.public_data(),
                f"selection.public {self.selection_settings.public!r}": fingerprints(public.images)}

    def throughput_probes(self, shape: tuple[int, int, int], num_classes: int, device: torch.device) -> Probes:
        """DPDM's, and the public classifier: its training on the public set (loaded, for its size and classes)
        and a query per private image."""
        settings = self.selection_settings

        @cache
        def public() -> tuple[int, dict[str, float]]:  # the public set's size, the classifier's seconds per image
            images, names = self._public(DatasetInfo("probe", *shape, [str(c) for c in range(num_classes)], "probe"))
            return len(images), classifier_cost(settings.classifier, shape, len(names),
                                                 settings.classifier_batch_size, device)

        def training() -> float:
            size, seconds = public()
            return size * (settings.classifier_epochs * seconds["train"] + seconds["test"])

        phases = {CLASSIFIER_PHASE: training, QUERY_PHASE: lambda: public()[1]["test"]}
        return replace(super().throughput_probes(shape, num_classes, device), phases=phases)

    @classmethod
    def phase_units(cls, config: RunConfig, num_images: float) -> dict[str, float]:
        return {CLASSIFIER_PHASE: 1, QUERY_PHASE: num_images}

    def _public(self, info: DatasetInfo) -> tuple[ImageSet, list[str]]:
        settings = self.selection_settings
        return self.public_set(settings.public, settings.public_data_dir, info, settings.public_num_images)

    def warm_up(self, context: RunContext) -> Callable[[torch.nn.Module], None]:
        """The public pre-training on the selected classes."""
        return lambda model: self._pretrain(context, model)

    def _pretrain(self, context: RunContext, model: torch.nn.Module) -> None:
        """Select the public classes (or restore the selection) and pre-train on them; the private class rows no
        public class was matched to start at the null row."""
        public, matched = self._selected_public(context)
        settings = self.pretrain_settings
        loss = self.trainer.warmup_loss(context, public, self.dpsgd_settings.noise_multiplicity, settings)
        Warmup([PHASE]).train(context, model, PHASE, settings, loss)
        embedding = model.get_submodule("class_embedding")
        assert isinstance(embedding, torch.nn.Embedding)
        unmatched = [c for c in range(context.dataset.info.num_classes) if c not in matched]
        with torch.no_grad():
            embedding.weight[unmatched] = embedding.weight[-1].clone()

    def _selected_public(self, context: RunContext) -> tuple[ImageSet, dict[int, int]]:
        """The public images of the selected classes, labelled with the private class each was matched to or the
        null class, and the matching (private class -> public class)."""
        info = context.dataset.info
        public, names = self._public(info)
        chosen, noisy = context.released(SELECTION_STAGE, lambda: self._select(context, public, len(names)))
        matched = self._match(noisy, chosen)
        context.log("public selection", classes=[names[c] for c in chosen.tolist()],
                    noisy_counts=[int(noisy[:, c].sum()) for c in chosen.tolist()],
                    matched={info.class_names[p]: names[c] for p, c in matched.items()})
        labels = torch.full((len(names),), info.num_classes)
        for private, public_class in matched.items():
            labels[public_class] = private
        keep = torch.isin(public.labels, chosen)
        return ImageSet(public.images[keep], labels[public.labels[keep]]), matched

    def _match(self, noisy: torch.Tensor, chosen: torch.Tensor) -> dict[int, int]:
        """Private class -> the chosen public class its images voted for, one each, of the largest total noisy
        count (``model.class_start: matched``); none for ``shared``."""
        if self.trainer.unet_settings.class_start == "shared":
            return {}
        rows, columns = linear_sum_assignment(noisy[:, chosen].numpy(), maximize=True)
        return {int(r): int(chosen[c]) for r, c in zip(rows, columns, strict=True)}

    def _select(self, context: RunContext, public: ImageSet, num_public: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The chosen public classes and the noisy histogram, private class x public class (recorded before it is
        released)."""
        top_k, device = self.selection_settings.top_k, context.device
        if top_k > num_public:
            raise ConfigError(f"selection.top_k must be a whole number in [1, {num_public}] (the public classes), "
                              f"got {top_k!r}")
        classifier = self._public_classifier(context, public, num_public)
        train = context.dataset.train
        with torch.no_grad():
            top = torch.cat([classifier(to_device(as_floats(train.images[start:start + 1000]), device) * 2 - 1)
                             .topk(top_k, dim=1).indices.cpu() for start in range(0, len(train), 1000)])
        event = context.planned_event(SELECTION_STAGE, GaussianMechanism)
        noisy = semantic_histogram(top, train.labels, train.unit_weights(), context.dataset.info.num_classes,
                                   num_public, event.noise_multiplier, context.ledger, SELECTION_STAGE, context.noise)
        keep = max(1, round(self.selection_settings.ratio * num_public))
        return noisy.sum(0).topk(min(keep, num_public)).indices.sort().values, noisy

    def _public_classifier(self, context: RunContext, public: ImageSet, num_public: int) -> torch.nn.Module:
        """The classifier of the public labels (public data only), its public accuracy logged."""
        settings, info = self.selection_settings, context.dataset.info
        classifier = build_classifier(settings.classifier, info.channels, num_public).to(context.device)
        training = TrainingSettings(settings.classifier_epochs, settings.classifier_batch_size, settings.classifier_lr)
        train_epochs(classifier, public.images, public.labels, training, context.device, context.generator,
                     lambda model: None, "public classifier")
        accuracy = correct_count(classifier, public.images, public.labels, context.device) / len(public)
        context.log("public classifier", train_accuracy=accuracy)
        return classifier.eval()
