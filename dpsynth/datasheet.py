"""The release's datasheet, ``release/README.md``: what a data holder hands over with the synthetic images, written
by the release step from the privacy report and the released labels, never by hand."""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from .config import DatasetSettings, EvaluationSection, PrivacySettings, ReleaseSettings, RunConfig
from .data import DatasetInfo
from .generators import CARD, MODEL_WEIGHTS, Generator
from .methods.base import Method
from .planning import HOLDER_SOURCES
from .privacy.dataset_facts import SHAPE

SIZE_RULES = {"published": "the standard split's published size", "declared": "declared public by the data holder",
              "noisy": "a noisy count (the exact number is private), released as the first stage of the budget below"}
# How strong a promise an ε is, on the scale of the guide "What ε means": (the largest ε, the words).
EPSILON_SCALE = ((1.0, "a strong promise"), (4.0, "a moderate promise"), (10.0, "a weak promise"),
                 (math.inf, "a very weak promise"))
SCALE_WORDS = {"a strong promise": "an attacker's certainty can grow only a little",
               "a moderate promise": "it bounds an attacker's certainty, though not tightly",
               "a weak promise": "the bound is loose; the field's papers report ε up to 10 because measured attacks "
                                 "stay far below it, but only the bound is guaranteed",
               "a very weak promise": "the bound says almost nothing a person can rely on"}


def epsilon_verdict(epsilon: float) -> str:
    """The guide's words for how strong a promise ``epsilon`` is."""
    return next(words for most, words in EPSILON_SCALE if epsilon <= most)


def certainty_after(epsilon: float, prior: float) -> float:
    """The most an attacker ``prior`` sure that a person is in the data can be after the release (prior odds times
    e^ε; δ aside)."""
    factor = math.exp(min(epsilon, 700.0))
    return factor * prior / (factor * prior + 1 - prior)


def percent(share: float) -> str:
    """``share`` as a percentage with the fewest decimals (at least one) that keep it below 100 %."""
    decimals = 1
    while decimals < 4 and round(100 * share, decimals) >= 100:
        decimals += 1
    return f"{100 * share:.{decimals}f} %"


def unit_name(info: DatasetInfo, dataset: DatasetSettings) -> str:
    """What one record is called: the holder's ``dataset.unit_name``, else person (with groups) or image."""
    return dataset.unit_name or ("person" if info.unit == "group" else "image")


def data_name(info: DatasetInfo) -> str:
    """The data set's name as a holder knows it: a folder's or file's own name, else the standard set's."""
    return Path(info.source).name if info.name in HOLDER_SOURCES and info.source else info.name


def datasheet(report: dict[str, Any], method: Method, info: DatasetInfo, labels: np.ndarray,
              soft_labels: bool, config: RunConfig, model: Generator | None = None) -> str:
    """The datasheet's Markdown: the holder's title, description, owner, purpose and reason for ε, the verdict on ε,
    what the release is, its guarantee (in numbers and in plain words), the generator when ``model`` is released with
    the images, what was public, what was not released, images per class, and what it is not."""
    dataset = DatasetSettings.of(config)
    title = dataset.title or f"Synthetic images imitating `{data_name(info)}`, made with {method.declaration.name}"
    return "\n".join([
        f"# {title}", "", *([dataset.description, ""] if dataset.description else []),
        "A differentially private synthetic release made by dpsynth. The files this folder's `privacy.json` lists "
        "by SHA-256, and `privacy.json` itself, are the release and may be shared; anything else put here is not.",
        "", *_record(report, config), "", *_verdict(report, info, dataset), "",
        *_what(report, method, info, labels, soft_labels, model), "", *_guarantee(report), "",
        *_plainly(report, info, dataset), "", *_model(report, model), *_public(report, info, config), "",
        *_unreleased(info, dataset), "", *_per_class(info, labels, method), "", *_not(report, config), ""])


def _record(report: dict[str, Any], config: RunConfig) -> list[str]:
    """Who answers for the release, what it is for, why this ε, and where it stands among the data's releases."""
    dataset, privacy = DatasetSettings.of(config), PrivacySettings.of(config)
    missing = "not given (set `{}`)"
    rows = [("Data owner", dataset.owner or missing.format("dataset.owner")),
            ("Purpose", ReleaseSettings.of(config).purpose or missing.format("release.purpose")),
            ("Why this ε", privacy.epsilon_reason or missing.format("privacy.epsilon_reason"))]
    held = report.get("releases")
    if held:
        together = ("no DP guarantee" if held["epsilon"] is None else
                    f"ε = {held['epsilon']:.4f} at δ = {held['delta']:.3g}")
        running = f", {held['running']} of them not released yet (counted at its plan)" if held["running"] else ""
        rows.append(("Releases from this data", f"this is release {held['number']} of {held['listed']} from this data "
                     f"in the holder's ledger; the {held['counted']} shared {'one' if held['counted'] == 1 else 'ones'}"
                     f"{running} together: {together}, composed by the {held['accountant']} accountant"))
    if privacy.total_epsilon is not None:
        rows.append(("The holder's cap", f"ε = {privacy.total_epsilon:g} for all releases from this data together "
                                         "(`privacy.total_epsilon`)"))
    return ["| | |", "| --- | --- |", *(f"| {name} | {value} |" for name, value in rows)]


def _verdict(report: dict[str, Any], info: DatasetInfo, dataset: DatasetSettings) -> list[str]:
    """One line: how strong a promise the chosen ε is, with the odds an attacker ends at; for a rehearsal, that it
    is one."""
    if "rehearsal" in report:
        rehearsal = report["rehearsal"]
        return [f"**In one line: a rehearsal, not a release of private data.** The plan of a "
                f"`{rehearsal['private_data']}` run, run on the public stand-in `{rehearsal['stand_in']}` at a batch "
                f"{rehearsal['shrink']} times smaller (same steps and σ/B): no private image was read and no ε of it "
                "spent. The ε below is the stand-in's own, under the smaller batch: it promises nothing."]
    if not report["dp_guarantee"]:
        return ["**In one line: no differential-privacy guarantee; do not share this release as private.**"]
    epsilon, unit = report["epsilon"], unit_name(info, dataset)
    verdict = epsilon_verdict(epsilon)
    return [f"**In one line: ε = {epsilon:.2f} per {unit} is {verdict}** on the scale of dpsynth's guide *What ε "
            f"means* (ε ≤ 1 strong, up to 4 moderate, up to 10 weak, above 10 very weak): {SCALE_WORDS[verdict]}. "
            f"An attacker 50 % sure that a given {unit} is in the data ends at most "
            f"{percent(certainty_after(epsilon, 0.5))} sure; one 1 % sure, at most "
            f"{percent(certainty_after(epsilon, 0.01))}."]


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
            f"- They imitate the training split of `{data_name(info)}` ({info.num_classes} classes).",
            f"- Method: `{method.declaration.name}`, {method.declaration.description}.",
            f"- {method.declaration.paper.markdown().removeprefix('**Paper:** ')}",
            f"- Made by dpsynth {made['version']} (commit {made['commit'] or 'unknown'}), released "
            f"{report['released']}.", *_uncommitted(made['commit']), *_stopped(report)]


def _stopped(report: dict[str, Any]) -> list[str]:
    """Where the holder's time limit stopped training early: which stage ran how many of its steps."""
    return [f"- Training stopped early at the data holder's time limit (`run.time_limit`): {stage} ran "
            f"{ran['steps']:,} of its {ran['planned']:,} planned steps. The guarantee below is that of the steps that "
            "ran, below the target; the images show what was trained by then." for stage, ran in
            report.get("stopped_early", {}).items()]


def _uncommitted(commit: str | None) -> list[str]:
    """A warning when the code that made the release was not a commit of dpsynth."""
    if commit and not commit.endswith("+modified"):
        return []
    why = "had uncommitted changes" if commit else "was not a git checkout of dpsynth, so no commit names it"
    return [f"- **The code that made this release {why}: no published dpsynth can be shown to be the code that ran. "
            "An auditor should ask for the changes, or the release should be made again from a commit.**"]


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


def _plainly(report: dict[str, Any], info: DatasetInfo, dataset: DatasetSettings) -> list[str]:
    """The guarantee in plain words: the odds bound for one unit, delta against 1 / N, the unit, and what DP does
    not hide."""
    if not report["dp_guarantee"]:
        return []
    epsilon, delta, size = report["epsilon"], report["delta"], report["dataset_size"]
    unit = unit_name(info, dataset)
    about = "about " if report["dataset_size_rule"] == "noisy" else ""
    lines = ["## In plain words", "",
             f"- Take any one {unit} of the private data. Whatever anyone concludes from this release about whether "
             f"that {unit} was in the data, their odds for it are at most e^ε = {_times(math.exp(epsilon))} times what "
             "they would be had it been left out, whatever else they know. So an attacker 50 % sure beforehand ends "
             f"at most {percent(certainty_after(epsilon, 0.5))} sure, and one 1 % sure at most "
             f"{percent(certainty_after(epsilon, 0.01))}.",
             f"- δ = {delta:.3g} is the chance that this bound fails. " + (
                 f"It is {1 / (delta * size):.3g} times smaller than 1/N = {1 / size:.3g} for N = {about}{size:,} "
                 f"{unit}s: a mechanism that published one {unit}'s record in full, chosen at random, would have "
                 "δ = 1/N, so a δ below it rules that out." if delta * size < 1 else
                 f"It is NOT below 1/N = {1 / size:.3g} (N = {about}{size:,} {unit}s): a mechanism could publish one "
                 f"{unit}'s record in full with probability δ. Set privacy.delta lower.")]
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
                 "dpsynth's documentation.")
    return lines


def _times(factor: float) -> str:
    return f"{factor:,.1f}" if factor < 100 else (f"{factor:,.0f}" if factor < 1e9 else f"{factor:.3g}")


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


def _public(report: dict[str, Any], info: DatasetInfo, config: RunConfig) -> list[str]:
    """Every fact of the data the release shows without noise or decided by a recorded vote: the classes, the shape,
    the size, the window, the cap on a person's images, and the public images read."""
    voted = SHAPE.stage in [stage["name"] for stage in report.get("stages", [])]
    dataset, privacy = DatasetSettings.of(config), PrivacySettings.of(config)
    unit = unit_name(info, dataset)
    about = "about " if report["dataset_size_rule"] == "noisy" else ""
    lines = ["## Treated as public", "",
             f"- The class names ({', '.join(info.class_names)}) and the number of classes.",
             f"- The image size ({' x '.join(map(str, released_shape(info)))}): " + (
                 f"a noisy vote of the images, released as the stage {SHAPE.stage} below." if voted else
                 "declared by the data holder (`dataset.resolution`, `dataset.channels`)." if info.name in
                 HOLDER_SOURCES else "fixed by the data set's format."),
             f"- The training set's size, {about}{report['dataset_size']:,} {unit}s: "
             f"{SIZE_RULES[report['dataset_size_rule']]}."]
    if info.pixel_rule:
        how = ("voted with the image size" if config.drawn.window is not None else
               "declared by the data holder (`dataset.window`)" if dataset.window not in ("auto", "full") else
               "the rule dpsynth applies to every folder")
        lines.append(f"- How pixel values became 8 bits: {info.pixel_rule} ({how}).")
    if info.unit == "group":
        lines.append(f"- The most of one {unit}'s images a DP-SGD step reads: {privacy.max_images_per_group} "
                     "(`privacy.max_images_per_group`, declared by the data holder).")
    public = report.get("public_data") or {}
    if not public:
        return [*lines, "- No public image set was read."]
    for name, digest in public.items():
        lines.append(f"- {name}: {digest['distinct_images']:,} distinct images, checked to hold none of the private "
                     f"images; SHA-256 of their fingerprints {digest['fingerprints_sha256']}.")
    return lines


def _unreleased(info: DatasetInfo, dataset: DatasetSettings) -> list[str]:
    """What the data holder keeps: nothing of the private files reaches the release but through the mechanisms."""
    unit = unit_name(info, dataset)
    return ["## Not released", "",
            f"- No private image, file name, folder name or {unit} identifier, and no DICOM header or other file "
            "metadata: the release holds only the arrays and files listed above.",
            f"- Not the exact number of {unit}s or images, nor how many images each {unit} or class has.",
            "- Not the run's log, checkpoints, configuration or evaluation: they stay with the data holder (the "
            "evaluation compares the release with the real images)."]


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


def _not(report: dict[str, Any], config: RunConfig) -> list[str]:
    unit, selection = report["unit"].split(":")[0], EvaluationSection.of(config).selection_epsilon
    return ["## What this release is not", "",
            f"- Not a guarantee beyond (ε, δ): it bounds how much the release can change when {unit} is added or "
            "removed, nothing more; what is listed as public above is not protected.",
            "- Not a utility guarantee: nothing here says the images are good for a purpose. Their evaluation "
            "against real data is private to the data holder and is not part of this release; where it selects "
            f"classifiers on the private validation images it spends ε = {selection:g} more on those images, "
            "in a ledger of its own (its result stays with the holder).",
            *_regime(report),
            "- Not the private data: no private image is released; the images come from the method's model, "
            "population or aligned public images, which read the private data only through the mechanisms above."]
