"""The release's datasheet, ``release/README.md``: what a data holder hands over with the synthetic images, written
by the release step from the privacy report and the released labels, never by hand."""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from .api import SHAPE_STAGE
from .config import DatasetSettings
from .data import DatasetInfo
from .generators import CARD, MODEL_WEIGHTS, Generator
from .methods.base import Method

SIZE_RULES = {"published": "the standard split's published size", "declared": "declared public by the data holder",
              "noisy": "a noisy count, released as the first stage of the budget below"}


def datasheet(report: dict[str, Any], method: Method, info: DatasetInfo, labels: np.ndarray,
              soft_labels: bool, dataset: DatasetSettings, model: Generator | None = None) -> str:
    """The datasheet's Markdown: the holder's title and description, what the release is, its guarantee (in
    numbers and in plain words), the generator when ``model`` is released with the images, what was public, images
    per class, and what it is not."""
    title = dataset.title or f"Synthetic images imitating `{info.name}`, made with {method.name}"
    return "\n".join([
        f"# {title}", "", *([dataset.description, ""] if dataset.description else []),
        "A differentially private synthetic release made by dpsynth. The files this folder's `privacy.json` lists "
        "by SHA-256, and `privacy.json` itself, are the release and may be shared; anything else put here is not.",
        "", *_what(report, method, info, labels, soft_labels, model), "", *_guarantee(report), "",
        *_plainly(report, info), "", *_model(report, model), *_public(report, info), "",
        *_per_class(info, labels, method), "", *_not(report), ""])


def released_shape(info: DatasetInfo) -> tuple[int, int, int]:
    """The released images' shape: the data's, also where training read them smaller."""
    side = info.release_side or info.height
    return (info.channels, side, side)


def _what(report: dict[str, Any], method: Method, info: DatasetInfo, labels: np.ndarray,
          soft_labels: bool, model: Generator | None) -> list[str]:
    shape = " x ".join(map(str, released_shape(info)))
    arrays = "`images` (uint8, N x C x H x W), `labels`, `class_names`" + (
        ", `soft_labels` and `soft_label_temperature` (the teacher's class probabilities)" if soft_labels else "")
    made = report["dpsynth"]
    return ["## What it is", "",
            f"- {len(labels):,} synthetic images of {shape} (C x H x W) in `synthetic.npz`: arrays {arrays}; "
            "`samples.png` shows one row per class.",
            *([f"- The generator they were sampled from, in `{MODEL_WEIGHTS}` and `{CARD}` (see The model)."]
              if model is not None else []),
            *_lifted(report),
            f"- They imitate the training split of `{info.name}` ({info.num_classes} classes).",
            f"- Method: `{method.name}`, {method.description}.",
            f"- {method.paper.markdown().removeprefix('**Paper:** ')}",
            f"- Made by dpsynth {made['version']} (commit {made['commit'] or 'unknown'}), released "
            f"{report['released']}."]


def _lifted(report: dict[str, Any]) -> list[str]:
    """Where the release was made smaller than its side: the side the private data was read at and the public
    model that lifted it."""
    lifted = report.get("upscaling")
    if not lifted:
        return []
    low, high = lifted["private_side"], lifted["release_side"]
    return [f"- Made at {low} x {low} px (the private images were read only at that side) and lifted to {high} x "
            f"{high} by the upscaler `{lifted['upscaler']}` (weights' SHA-256 {lifted['upscaler_sha256']}), trained "
            f"only on {lifted['public_images']:,} public images ({lifted['trained_on']}) and never on a private "
            "one: post-processing, so it spends no ε."]


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


def _plainly(report: dict[str, Any], info: DatasetInfo) -> list[str]:
    """The guarantee in plain words: the odds bound for one unit, delta against 1 / N, the unit, and what DP does
    not hide."""
    if not report["dp_guarantee"]:
        return []
    epsilon, delta, size = report["epsilon"], report["delta"], report["dataset_size"]
    unit = "person" if info.unit == "group" else "image"
    lines = ["## In plain words", "",
             f"- Take any one {unit} of the private data. Whatever anyone concludes from this release about whether "
             f"that {unit} was in the data, their odds for it are at most e^ε = {math.exp(epsilon):.3g} times what "
             "they would be had it been left out, whatever else they know; δ is the small probability with which "
             "this bound may fail.",
             f"- δ = {delta:.3g} is {delta * size:.2g} of 1/N = {1 / size:.3g} (N = {size:,} {unit}s): " + (
                 "below 1/N, so δ does not cover releasing even one whole record." if delta * size < 1 else
                 "NOT below 1/N: a mechanism could release a whole record with probability δ.")]
    if info.unit == "image":
        lines.append("- The unit is one image. A person with k images in the data is protected as k records: the "
                     f"bound for them is up to e^(kε) (k = 5: {math.exp(5 * epsilon):.3g}) instead. Give the data "
                     "groups (a sub-folder per person, or groups.csv) so that one person is the unit.")
    lines.append("- What DP does not hide: facts about the population. The release is meant to show what the data "
                 "shows as a whole (what the classes look like, how they differ); what holds of most people in it "
                 "will show, whether or not any one of them took part.")
    lines.append("- The run's evaluation (kept by the data holder, not part of this release) shows each synthetic "
                 "image beside its nearest real training images: a check that helps spot copies of training "
                 "images, not a proof of privacy. The proof is the (ε, δ) above; a release can pass that check and "
                 "still leak, or look close to a real image and be private.")
    lines.append("- How to read ε, with the odds at ε = 1 to 10 and how to choose it: the guide *What ε means* in "
                 "dpsynth's documentation (`docs/guides/epsilon.md` in its source).")
    return lines


def _model(report: dict[str, Any], model: Generator | None) -> list[str]:
    """What the released generator is, that its (epsilon, delta) is the release's whatever is drawn from it, and
    how to draw more; nothing without one."""
    if model is None:
        return []
    tensors = model.tensors()
    parameters = sum(value.numel() for value in tensors.values())
    guarantee = (f"(ε, δ) = ({report['epsilon']:.4f}, {report['delta']:.3g}), the release's" if report["dp_guarantee"]
                 else "no differential-privacy guarantee, as the images")
    return ["## The model", "",
            f"- `{MODEL_WEIGHTS}` and `{CARD}`: the {model.method} {model.kind} generator, {parameters:,} numbers in "
            f"{len(tensors)} tensors: {model.contents()}. Nothing else is in them: no optimiser state, no noise, no "
            "other statistic of the data.",
            f"- It carries {guarantee}: it was trained only through the mechanisms above, and whatever is computed "
            "from it is post-processing. Any number of images drawn from it later, with any class balance or "
            "sampler, keeps that guarantee and spends nothing more.",
            "- It shows more than a fixed set of images does (anyone holding it can read its weights and draw "
            "without limit); the guarantee covers all of that alike.",
            "- Draw more with `dpsynth sample THIS_FOLDER --images 100000 --out more.npz` (`--per-class CLASS=COUNT` "
            "for another balance; CPU or GPU), or in Python `dpsynth.api.load_generator(THIS_FOLDER).sample(100000)`. "
            "Both first check the two files against `privacy.json`.", ""]


def _public(report: dict[str, Any], info: DatasetInfo) -> list[str]:
    voted = SHAPE_STAGE in [stage["name"] for stage in report.get("stages", [])]
    lines = ["## Treated as public", "",
             f"- The class names ({', '.join(info.class_names)}) and the number of classes.",
             f"- The image size ({' x '.join(map(str, released_shape(info)))}): " + (
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


def _per_class(info: DatasetInfo, labels: np.ndarray, method: Method) -> list[str]:
    counts = np.bincount(labels, minlength=info.num_classes)
    return ["## Images per class", "", f"Spread over the classes {method.class_balance()}.", "",
            "| class | images |", "| --- | --- |",
            *(f"| {name} | {count:,} |" for name, count in zip(info.class_names, counts, strict=True))]


REGIME_WORDS = {"learns": "where a recorded run with as much noise and no more steps learned",
                "untested": "between the recorded runs: no record says whether it learns",
                "fails": "where a recorded run with more signal against its noise over at least half its steps "
                         "learned nothing"}


def _regime(report: dict[str, Any]) -> list[str]:
    """What the recorded outcomes said of the DP-SGD plan before it ran, and whether the holder forced it."""
    lines = []
    for item in report.get("training_regime", []):
        line = (f"- The training ({item['stage']}, {item['steps']:,} steps at a noise per example σ/B of "
                f"{item['noise_per_example']:.3g}, {item['side']} px) was planned "
                f"{REGIME_WORDS[item['verdict']]}")
        if item["forced"]:
            line += (f" (`{item['deciding_record']}`). **The data holder forced it (`plan.force`): expect images "
                     "that show little of the data.**")
        lines.append(line + ("" if item["forced"] else "."))
    return lines


def _not(report: dict[str, Any]) -> list[str]:
    unit = report["unit"].split(":")[0]
    return ["## What this release is not", "",
            f"- Not a guarantee beyond (ε, δ): it bounds how much the release can change when {unit} is added or "
            "removed, nothing more; what is listed as public above is not protected.",
            "- Not a utility guarantee: nothing here says the images are good for a purpose. Their evaluation "
            "against real data is private to the data holder and is not part of this release.",
            *_regime(report),
            "- Not the private data: no private image is released; the images come from the method's model, "
            "population or aligned public images, which read the private data only through the mechanisms above."]
