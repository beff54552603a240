"""PrivImage (Li et al. 2024): pre-train only on the public images whose classes the private data resembles, as a DP
histogram of a public classifier's labels picks them, then DP-SGD as PDP-Diffusion.

1. A classifier is trained on the public set's labels (public data only: no privacy cost).
2. Its top ``selection.top_k`` classes for each private training image are counted per public class. Adding or
   removing one image changes k counts by 1, so the histogram has L2 sensitivity sqrt(k) and gets Gaussian noise
   of std ``selection.noise_multiplier`` x sqrt(k), recorded as stage ``semantic-histogram``. (DPImageBench
   accounts its noise, sigma = 50 with k = 5 words, as if the sensitivity were 1; we do not.)
3. The public classes with the largest noisy counts, a ``selection.ratio`` share of them, are kept, and the
   diffusion model is pre-trained on their images (post-processing: no privacy cost), unconditionally (every
   image labelled with the null class); every class row of the label embedding then starts at the null row.
4. DPDM's DP-SGD, its noise calibrated so the whole run meets the target.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from ..config import Config, positive, preset_with, section_settings
from ..data import DatasetInfo, ImageSet, load_public
from ..data.fingerprints import fingerprints
from ..errors import ConfigError
from ..evaluation.downstream import TrainingSettings, correct_count, train_epochs
from ..models.classifiers import build_classifier
from ..privacy import GaussianMechanism, PlannedStage, PrivacyLedger
from ..privacy.mechanisms import release_counts
from ..privacy.randomness import SecretStream
from ..utils.device import to_device
from .base import RunContext, register
from .dpdm import DPDM, DPSGD_STAGE
from .warmup import Warmup, WarmupSettings, diffusion_loss

SELECTION_STAGE, PHASE = "semantic-histogram", "pretrain-public"


@dataclass(frozen=True, kw_only=True)
class SelectionSettings:
    """The ``selection`` section: the public set (a name, its directory, how many of its images), the share of
    its classes kept, how many top classes each private image counts for and the histogram's noise multiplier,
    and the public classifier's architecture and training."""

    public: str
    public_data_dir: str | None = None
    public_num_images: int | None = positive(default=None)
    ratio: float = positive()
    top_k: int = positive()
    noise_multiplier: float = positive()
    classifier: str = "cnn"
    classifier_epochs: int = positive()
    classifier_batch_size: int = positive()
    classifier_lr: float = positive()


@register
class PrivImage(DPDM):
    """A DP histogram of a public classifier's labels selects public classes; pre-training on them; DP-SGD."""

    name = "privimage"
    description = "pre-training on the public classes a DP semantic histogram selects, then DP-SGD"
    sections = {
        **DPDM.sections,
        "selection": {"public": "glyphs", "public_data_dir": None, "public_num_images": None, "ratio": 0.2,
                      "top_k": 5, "noise_multiplier": 50.0, "classifier": "cnn", "classifier_epochs": 5,
                      "classifier_batch_size": 128, "classifier_lr": 3e-3},
        "public_pretrain": {"iterations": 2000, "batch_size": 64, "lr": 1e-3, "augment": False, "augment_ops": 2,
                            "augment_magnitude": 10, "checkpoint_every": 500},
    }
    presets = {
        # DPImageBench (F-MNIST / MNIST): top 5 words, sigma 50, 1 % of ImageNet's 1,000 classes, then DPDM's
        # DP-SGD; its pre-training (25 epochs of batch 64) is public_pretrain.iterations here.
        "paper": preset_with(DPDM.presets["paper"], {"selection": {"ratio": 0.01}}),
        # DPDM's cpu preset with one of its DP-SGD epochs given to the selection and 1,000 pre-training steps, as
        # DP-FETA's cpu preset gives it to its warm-up: about the same CPU time as DPDM's.
        "cpu": preset_with(DPDM.presets["cpu"], {"dpsgd": {"epochs": 5.0},
                                             "public_pretrain": {"iterations": 1000, "checkpoint_every": 250}}),
    }

    def __init__(self, config: Config) -> None:
        super().__init__(config)
        self.selection_settings = section_settings(SelectionSettings, config, "selection")
        self.pretrain_settings = section_settings(WarmupSettings, config, "public_pretrain")

    def privacy_stages(self, info: DatasetInfo) -> list[PlannedStage]:
        schedule = self.dpsgd_settings.schedule(info.num_train)
        return [PlannedStage(SELECTION_STAGE, GaussianMechanism(self.selection_settings.noise_multiplier)),
                PlannedStage(DPSGD_STAGE, calibrated=schedule.event)]

    def public_data(self, info: DatasetInfo) -> dict[str, np.ndarray]:
        public = self._public(info)[0]
        return {**super().public_data(info),
                f"selection.public {self.selection_settings.public!r}": fingerprints(public.images)}

    def _public(self, info: DatasetInfo) -> tuple[ImageSet, list[str]]:
        settings = self.selection_settings
        return load_public(settings.public, settings.public_data_dir, info, settings.public_num_images)

    def pretrain(self, context: RunContext, model: torch.nn.Module) -> None:
        """Select the public classes (or restore the selection), pre-train on them, start every class at null."""
        public = self._selected_public(context)
        settings = self.pretrain_settings
        loss = diffusion_loss(self.diffusion.batch_loss, self._batch_maker(context, public), len(public), settings,
                              context.generator)
        Warmup([PHASE]).train(context, model, PHASE, settings, loss)
        embedding = model.get_submodule("class_embedding")
        assert isinstance(embedding, torch.nn.Embedding)
        with torch.no_grad():
            embedding.weight.copy_(embedding.weight[-1].expand_as(embedding.weight).clone())

    def _selected_public(self, context: RunContext) -> ImageSet:
        """The public images of the selected classes, labelled with the null class (unconditional pre-training)."""
        info = context.dataset.info
        public, names = self._public(info)
        chosen, noisy = context.released(SELECTION_STAGE, lambda: self._select(context, public, len(names)))
        context.log("public selection", classes=[names[c] for c in chosen.tolist()],
                    noisy_counts=[int(noisy[c]) for c in chosen.tolist()])
        keep = torch.isin(public.labels, chosen)
        return ImageSet(public.images[keep], torch.full((int(keep.sum()),), info.num_classes))

    def _select(self, context: RunContext, public: ImageSet, num_public: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The chosen public classes and the noisy histogram (recorded before it is released)."""
        top_k, device = self.selection_settings.top_k, context.device
        if top_k > num_public:
            raise ConfigError(f"selection.top_k must be a whole number in [1, {num_public}] (the public classes), "
                              f"got {top_k!r}")
        classifier = self._public_classifier(context, public, num_public)
        train = context.dataset.train
        with torch.no_grad():
            top = torch.cat([classifier(to_device(train.images[start:start + 1000], device) * 2 - 1)
                             .topk(top_k, dim=1).indices.cpu() for start in range(0, len(train), 1000)])
        event = context.planned_event(SELECTION_STAGE, GaussianMechanism)
        noisy = semantic_histogram(top, num_public, event.noise_multiplier, context.ledger, SELECTION_STAGE,
                                   context.noise)
        keep = max(1, round(self.selection_settings.ratio * num_public))
        return noisy.topk(min(keep, num_public)).indices.sort().values, noisy

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


def semantic_histogram(top_classes: torch.Tensor, num_classes: int, noise_multiplier: float, ledger: PrivacyLedger,
                       stage: str, noise: SecretStream) -> torch.Tensor:
    """Per class, how many records (rows of ``top_classes``: k distinct classes each) name it, plus Gaussian noise
    of std noise_multiplier x sqrt(k), the histogram's L2 sensitivity; recorded before it runs."""
    counts = torch.bincount(top_classes.flatten(), minlength=num_classes).double()
    return release_counts(counts, math.sqrt(top_classes.shape[1]), noise_multiplier, ledger, stage, noise)
