"""``report.html``: one static page per run that a data holder can show (written at release and after each
evaluation): the privacy guarantee and its split over stages, samples per class, the evaluation's metrics
with their sample counts, the nearest real neighbours, training curves, and which files are the release.

Every picture is embedded (PNG as a data URI), so the page opens from disk with no network and survives being
copied alone. The page itself is PRIVATE to the data holder: it shows real training images and measurements
against the private data.
"""
from __future__ import annotations

import base64
import html
import json
import time
from pathlib import Path
from typing import Any

import numpy as np

from .config import DatasetSettings, method_name
from .evaluation.evaluate import METRICS, NEIGHBOURS
from .evaluation.plots import figure_png, log_curves_png
from .runs import CONFIG, LOG, PRIVACY, RELEASE, SYNTHETIC, RunDirectory
from .utils.images import class_grid, png_bytes
from .utils.io import atomic_write_text

REPORT = "report.html"
PER_CLASS = 10  # images shown per class

STYLE = """
body { font-family: sans-serif; max-width: 60em; margin: 2em auto; padding: 0 1em; color: #222; }
h1 { font-size: 1.5em; } h2 { border-bottom: 1px solid #ccc; padding-bottom: .2em; }
table { border-collapse: collapse; margin: .5em 0; } td, th { border: 1px solid #ccc; padding: .25em .6em; }
th { background: #f3f3f3; text-align: left; } td.number { text-align: right; font-variant-numeric: tabular-nums; }
.files { background: #fff7e0; border: 1px solid #e0c060; padding: .6em 1em; }
.guarantee { font-size: 1.2em; } .warning { background: #fde8e8; border: 1px solid #d04040; padding: .6em 1em; }
img { image-rendering: pixelated; max-width: 100%; } .note { color: #555; font-size: .9em; }
"""


def write_run_report(run: RunDirectory) -> Path:
    """Write ``report.html`` from what the run directory holds now; return its path."""
    config = run.config()
    privacy = json.loads(run.file(PRIVACY).read_text())
    title = f"{method_name(config)} on {DatasetSettings.of(config).name}: {run.path.name}"
    sections = [
        f"<h1>{_text(title)}</h1>",
        _files_line(),
        _privacy_section(privacy, _metrics(run).get("evaluation_privacy")),
        _groups_line(run.file(LOG)),
        _samples_section(run.file(SYNTHETIC)),
        _metrics_section(run),
        _neighbours_section(run.file(NEIGHBOURS)),
        _curves_section(run.file(LOG)),
        _files_section(run),
        f'<p class="note">Written by dpsynth on {time.strftime("%Y-%m-%d %H:%M:%S %Z")}; a static page with every '
        "picture embedded: it needs no network.</p>",
    ]
    page = (f'<!doctype html>\n<html lang="en"><head><meta charset="utf-8"><title>{_text(title)}</title>'
            f"<style>{STYLE}</style></head>\n<body>\n" + "\n".join(sections) + "\n</body></html>\n")
    path = run.file(REPORT)
    atomic_write_text(path, page)
    return path


def _text(value: object) -> str:
    return html.escape(str(value))


def _image(png: bytes, alt: str, width: int | None = None) -> str:
    size = f' width="{width}"' if width else ""
    return f'<img src="data:image/png;base64,{base64.b64encode(png).decode()}" alt="{_text(alt)}"{size}>'


def _table(header: list[str], rows: list[list[str]], numeric: tuple[int, ...] = ()) -> str:
    """An HTML table; cells are HTML already (escape text with :func:`_text`); the ``numeric`` columns are
    right-aligned."""
    head = "".join(f"<th>{cell}</th>" for cell in header)
    body = "".join("<tr>" + "".join(f'<td{" class=number" if i in numeric else ""}>{cell}</td>'
                                    for i, cell in enumerate(row)) + "</tr>" for row in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def _files_line() -> str:
    return (f'<p class="files" id="release-line"><strong>The release, which may be shared:</strong> the folder '
            f"<code>{RELEASE}/</code> (the synthetic images <code>{SYNTHETIC}</code>, their grid and the privacy "
            f"report <code>{PRIVACY}</code>), nothing else. <strong>Private to the data holder:</strong> every "
            "other file in this run directory, this page included: it shows real training images and measurements "
            "against the private data.</p>")


def _number(value: float | None, digits: int = 4) -> str:
    return "none" if value is None else f"{value:.{digits}f}"


def _privacy_section(privacy: dict[str, Any], evaluation: dict[str, Any] | None) -> str:
    parts = ["<h2>Privacy</h2>"]
    if privacy["dp_guarantee"]:
        parts.append(f'<p class="guarantee">({_text("ε, δ")})-differential privacy with ε = '
                     f'<strong id="epsilon">{privacy["epsilon"]:.4f}</strong> (target {privacy["target_epsilon"]:g}), '
                     f'δ = {privacy["delta"]:.3g}, for adding or removing {_text(privacy.get("unit", "one image"))} '
                     f'of the training data ({_size(privacy)}); accountant {_text(privacy["accountant"])}.</p>')
    else:
        parts.append(f'<p class="warning">NO differential-privacy guarantee: ε = <strong id="epsilon">none</strong>. '
                     f'{_text(privacy["no_guarantee"])}</p>')
    if privacy.get("noise_seed") == "user-set":
        parts.append('<p class="warning">run.seed was set: whoever knows it can recompute the noise, so this release '
                     "is NOT private.</p>")
    if privacy.get("not_covered_by_epsilon"):
        parts.append(f'<p class="warning">Not covered by ε: {_text(privacy["not_covered_by_epsilon"])}</p>')
    parts.append(_stages(privacy["stages"], "synthesis"))
    if evaluation:
        parts.append(f"<p>Model selection on the validation split has its own budget, not part of the release's ε: "
                     f"every selection on these validation images, by any evaluation of any release, adds up to "
                     f"ε = {_number(evaluation['epsilon'])}:</p>")
        parts.append(_stages(evaluation["stages"], "evaluation"))
    return "\n".join(parts)


SIZE_RULES = {"published": "the standard data set's published size", "declared": "declared public by the data holder",
              "noisy": "a noisy count, part of ε"}


def _size(privacy: dict[str, Any]) -> str:
    """The public training-set size planning used, and how it became public."""
    rule = privacy.get("dataset_size_rule")
    return f"{privacy['dataset_size']:,} for planning" + (f": {SIZE_RULES[rule]}" if rule in SIZE_RULES else "")


def _stages(stages: list[dict[str, Any]], budget: str) -> str:
    """ε per stage as a chart (the synthesis budget) and as a table of mechanisms."""
    rows = [[_text(stage["name"]), _text(part["mechanism"]),
             _number(part["noise_multiplier"], 3) if part["noise_multiplier"] is not None else "–",
             f"{part['sample_rate']:.4g}", f"{part['steps']:,}",
             _number(stage["epsilon_share"]), _number(stage["epsilon_alone"])]
            for stage in stages for part in stage["mechanisms"]]
    table = _table(["stage", "mechanism", "noise multiplier", "sample rate", "steps", "ε share", "ε alone"], rows,
                   (2, 3, 4, 5, 6))
    if budget != "synthesis" or any(stage["epsilon_share"] is None for stage in stages):
        return table
    return _image(_epsilon_chart(stages), "epsilon per stage") + table


def _epsilon_chart(stages: list[dict[str, Any]]) -> bytes:
    """A horizontal bar per stage: its share of ε, labelled."""
    from matplotlib.figure import Figure

    names, shares = [stage["name"] for stage in stages], [stage["epsilon_share"] for stage in stages]
    figure = Figure(figsize=(7, 0.5 + 0.45 * len(stages)))
    axis = figure.subplots()
    bars = axis.barh(names[::-1], shares[::-1], color="#4a78b0")
    axis.bar_label(bars, labels=[f"{share:.3f}" for share in shares[::-1]], padding=3)
    axis.set(xlabel="ε share (adds up to the run's ε)", xlim=(0, 1.15 * max(max(shares), 1e-9)))
    return figure_png(figure)


def _samples_section(path: Path) -> str:
    with np.load(path) as release:
        images, labels, names = release["images"], release["labels"], [str(n) for n in release["class_names"]]
    rows = []
    for label, name in enumerate(names):
        members = labels == label
        strip = (_image(png_bytes(class_grid(images[members], np.zeros(int(members.sum()), np.int64), 1, PER_CLASS),
                                  min_size=480), f"samples of {name}")
                 if members.any() else "–")
        rows.append([_text(name), f"{int(members.sum()):,}", strip])
    return (f"<h2>Samples per class</h2><p>The first {PER_CLASS} released images of each class, of "
            f"{len(labels):,} released in <code>{SYNTHETIC}</code>.</p>"
            + _table(["class", "released", "images"], rows, (1,)))


def _metrics(run: RunDirectory) -> dict[str, Any]:
    """The run's metrics.json (private: the evaluation against real data), or nothing before an evaluation."""
    path = run.file(METRICS)
    return json.loads(path.read_text()) if path.exists() else {}


def _metrics_section(run: RunDirectory) -> str:
    metrics = _metrics(run)
    if not metrics:
        return ("<h2>Evaluation</h2><p id=\"metrics\">Not evaluated yet: <code>dpsynth evaluate "
                f"{_text(run.path)}</code> measures the release against real data.</p>")
    images, kid = metrics["images"], metrics["kid"]
    counts = f"{images['synthetic']:,} synthetic vs {images['real']:,} real ({_text(images['real_split'])} split)"
    rows = [["FID", f"{metrics['fid']:.2f}", counts],
            ["FID∞", f"{metrics['fid_infinity']:.2f}", "extrapolated to infinitely many images"],
            ["KID", f"{kid['mean']:.4f} ± {kid['std']:.4f}", f"{kid['subsets']} subsets of {kid['subset_size']:,}"],
            ["precision", f"{metrics['precision']:.3f}", f"{counts}, k = {metrics['pr_k']}"],
            ["recall", f"{metrics['recall']:.3f}", f"{counts}, k = {metrics['pr_k']}"]]
    for name, result in metrics["accuracy"].items():
        seeds = len(result.get("seeds", [result]))
        rows.append([f"accuracy, {_text(name)}",
                     f"{100 * result['test_accuracy']:.2f} ± {100 * result.get('test_accuracy_std', 0.0):.2f} %",
                     f"trained on {result['trained_on']:,} synthetic, tested on {result['test_size']:,} real test "
                     f"images; mean ± std over {seeds} seed(s)"])
    for name, value in metrics.get("method", {}).items():
        rows.append([_text(name), _text(f"{value:.4f}" if isinstance(value, float) else value), "the method's own"])
    return (f'<h2>Evaluation</h2><div id="metrics">{_table(["metric", "value", "measured on"], rows, (1,))}</div>'
            f'<p class="note">{_text(metrics["note"])}</p>')


def _neighbours_section(path: Path) -> str:
    if not path.exists():
        return "<h2>Nearest real neighbours</h2><p>Written by the evaluation.</p>"
    return ("<h2>Nearest real neighbours</h2><p>Top row: one synthetic image per class; bottom row: the real "
            "training image nearest to it in Inception space. A near-copy would show here.</p>"
            + _image(path.read_bytes(), "synthetic images above their nearest real training images", 640))


def _groups_line(log: Path) -> str:
    """With groups: how many the training split holds and how many have more images than a DP-SGD step reads
    (from log.jsonl's ``groups`` record; private, like this page)."""
    lines = log.read_text().splitlines() if log.exists() else []
    groups = next((record for record in map(json.loads, lines) if record.get("event") == "groups"), None)
    if groups is None:
        return ""
    return (f'<p>Groups: the training split holds {groups["train_groups"]:,}, the largest {groups["largest"]:,} '
            f'images; {groups["capped"]:,} hold more than the {groups["cap"]} images a DP-SGD step reads of one '
            "(each such step reads a random choice of them). Every other mechanism weighs a group's images "
            "1 / their number.</p>")


def _curves_section(path: Path) -> str:
    curves = log_curves_png(path) if path.exists() else None
    if curves is None:
        return "<h2>Training curves</h2><p>The run logged no per-step values.</p>"
    return (f"<h2>Training curves</h2><p>Per-step values from <code>{LOG}</code>.</p>"
            + _image(curves, "training curves"))


def _files_section(run: RunDirectory) -> str:
    """Every file, marked release only when the release step wrote it (privacy.json's manifest) unchanged."""
    rows, released = [], run.released_files()
    for entry in sorted(run.path.iterdir()):
        if entry.name.startswith(".") or entry.name == REPORT:
            continue
        for item in sorted(entry.iterdir()) if entry.is_dir() else [entry]:
            files = [path for path in item.rglob("*") if path.is_file()] if item.is_dir() else [item]
            size = sum(path.stat().st_size for path in files)
            name = item.relative_to(run.path).as_posix() + ("/" if item.is_dir() else "")
            rows.append([f"<code>{_text(name)}</code>", f"{size / 1024:,.1f} KiB",
                         "<strong>release: may be shared</strong>" if item in released else "private"])
    rows.append([f"<code>{REPORT}</code>", "this page", "private"])
    return ("<h2>Files</h2>" + _table(["file", "size", "who may see it"], rows, (1,))
            + f'<p class="note"><code>{CONFIG}</code> holds the resolved settings and what <code>auto</code> chose '
            "on this machine.</p>")
