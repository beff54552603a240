"""The release's datasheet, ``release/README.md``: what a data holder hands over with the synthetic images, written
by the release step from the privacy report and the released labels, never by hand."""
from __future__ import annotations

from typing import Any

import numpy as np

from .api import SHAPE_STAGE
from .data import DatasetInfo
from .methods.base import Method

SIZE_RULES = {"published": "the standard split's published size", "declared": "declared public by the data holder",
              "noisy": "a noisy count, released as the first stage of the budget below"}


def datasheet(report: dict[str, Any], method: Method, info: DatasetInfo, labels: np.ndarray,
              soft_labels: bool) -> str:
    """The datasheet's Markdown: what the release is, its guarantee, what was public, images per class, and what
    it is not."""
    return "\n".join([
        f"# Synthetic images imitating `{info.name}`, made with {method.name}", "",
        "A differentially private synthetic release made by dpsynth. The files this folder's `privacy.json` lists "
        "by SHA-256, and `privacy.json` itself, are the release and may be shared; anything else put here is not.",
        "", *_what(report, method, info, labels, soft_labels), "", *_guarantee(report), "", *_public(report, info),
        "", *_per_class(info, labels), "", *_not(report), ""])


def _what(report: dict[str, Any], method: Method, info: DatasetInfo, labels: np.ndarray,
          soft_labels: bool) -> list[str]:
    shape = " x ".join(map(str, info.shape))
    arrays = "`images` (uint8, N x C x H x W), `labels`, `class_names`" + (
        ", `soft_labels` and `soft_label_temperature` (the teacher's class probabilities)" if soft_labels else "")
    made = report["dpsynth"]
    return ["## What it is", "",
            f"- {len(labels):,} synthetic images of {shape} (C x H x W) in `synthetic.npz`: arrays {arrays}; "
            "`samples.png` shows one row per class.",
            f"- They imitate the training split of `{info.name}` ({info.num_classes} classes).",
            f"- Method: `{method.name}`, {method.description}.",
            f"- {method.paper.markdown().removeprefix('**Paper:** ')}",
            f"- Made by dpsynth {made['version']} (commit {made['commit'] or 'unknown'}), released "
            f"{report['released']}."]


def _guarantee(report: dict[str, Any]) -> list[str]:
    lines = ["## Privacy guarantee", ""]
    if not report["dp_guarantee"]:
        return [*lines, f"**No differential-privacy guarantee.** {report['no_guarantee']}. Do not share this "
                        "release as private."]
    lines.append(f"- (ε, δ) = ({report['epsilon']:.4f}, {report['delta']:.3g}) for the whole release, all stages "
                 f"composed by the `{report['accountant']}` accountant from the ledger of the mechanisms that ran "
                 f"(target ε {report['target_epsilon']:g}).")
    lines.append(f"- Neighbouring data sets: {report['neighbouring']} of {report['unit']}.")
    lines.append("- Stages and their shares of ε: " + "; ".join(
        f"{stage['name']} {stage['epsilon_share']:.4f}" for stage in report["stages"]) + ".")
    if report["noise_seed"] == "secret":
        lines.append("- The noise came from secret streams, each keyed with 256 bits of OS entropy; no seed of it "
                     "is recorded anywhere.")
    else:
        lines.append("- **The noise seed was set by the user (`run.seed`): whoever knows it can recompute the noise, "
                     "so this release is NOT private.**")
    return lines


def _public(report: dict[str, Any], info: DatasetInfo) -> list[str]:
    voted = SHAPE_STAGE in [stage["name"] for stage in report.get("stages", [])]
    lines = ["## Treated as public", "",
             f"- The class names ({', '.join(info.class_names)}) and the number of classes.",
             f"- The image size ({' x '.join(map(str, info.shape))}): " + (
                 f"a noisy vote of the images, released as the stage {SHAPE_STAGE} below." if voted else
                 "declared by the data holder or fixed by the data set's format."),
             f"- The training set's size, {report['dataset_size']:,}: {SIZE_RULES[report['dataset_size_rule']]}."]
    public = report.get("public_data") or {}
    if not public:
        return [*lines, "- No public image set was read."]
    for name, digest in public.items():
        lines.append(f"- {name}: {digest['distinct_images']:,} distinct images, checked to hold none of the private "
                     f"images; SHA-256 of their fingerprints {digest['fingerprints_sha256']}.")
    return lines


def _per_class(info: DatasetInfo, labels: np.ndarray) -> list[str]:
    counts = np.bincount(labels, minlength=info.num_classes)
    return ["## Images per class", "", "| class | images |", "| --- | --- |",
            *(f"| {name} | {count:,} |" for name, count in zip(info.class_names, counts, strict=True))]


def _not(report: dict[str, Any]) -> list[str]:
    unit = report["unit"].split(":")[0]
    return ["## What this release is not", "",
            f"- Not a guarantee beyond (ε, δ): it bounds how much the release can change when {unit} is added or "
            "removed, nothing more; what is listed as public above is not protected.",
            "- Not a utility guarantee: nothing here says the images are good for a purpose. Their evaluation "
            "against real data is private to the data holder and is not part of this release.",
            "- Not the private data: no private image is released; the images come from the method's model, "
            "population or aligned public images, which read the private data only through the mechanisms above."]
