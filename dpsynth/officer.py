"""``officer.html``: the release's datasheet as one page a privacy officer reads and signs before the release is
shared, with what only the data holder may see beside it: the release's own evaluation against the real images,
summarised, with a plain warning when it found the images useless. Written at release and after each evaluation;
PRIVATE to the data holder, like ``report.html`` (it measures the release against private data). ``dpsynth officer
RUN_DIR --pdf FILE`` prints it to PDF with a headless Chromium; any browser prints it too."""
from __future__ import annotations

import html
import json
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import markdown
import numpy as np

from .errors import DpsynthError
from .evaluation.evaluate import METRICS
from .runs import DATASHEET, SYNTHETIC, RunDirectory
from .utils.io import atomic_write_text

OFFICER_PAGE = "officer.html"
# A downstream accuracy less than this share of the way from chance to 100 % is "near chance".
NEAR_CHANCE = 0.1

STYLE = """
body { font-family: sans-serif; max-width: 50em; margin: 2em auto; padding: 0 1em; color: #222; line-height: 1.4; }
h1 { font-size: 1.5em; } h2 { border-bottom: 1px solid #ccc; padding-bottom: .2em; font-size: 1.2em; }
table { border-collapse: collapse; margin: .5em 0; } td, th { border: 1px solid #ccc; padding: .25em .6em; }
.holder { background: #eef3fb; border: 1px solid #7090c0; padding: .2em 1em 1em; margin-top: 2em; }
.warning { background: #fde8e8; border: 1px solid #d04040; padding: .6em 1em; }
.sign td { height: 2.2em; min-width: 14em; }
@media print { .holder, .sign { break-inside: avoid; } body { margin: 0; } }
"""


def near_chance(accuracy: float, classes: int) -> bool:
    """Whether ``accuracy`` lies less than :data:`NEAR_CHANCE` of the way from chance (1 / ``classes``) to 100 %."""
    chance = 1 / classes
    return accuracy < chance + NEAR_CHANCE * (1 - chance)


def evaluation_summary(metrics: dict[str, Any], classes: int) -> list[str]:
    """The evaluation in a few plain sentences (HTML), a warning first where a classifier trained on the release
    is near chance on the real test images."""
    if not metrics:
        return ["<p>Not evaluated: <code>dpsynth evaluate RUN_DIRECTORY</code> measures the release against the real "
                "images before an officer signs.</p>"]
    warnings, lines, chance = [], [], 1 / classes
    for name, result in metrics.get("accuracy", {}).items():
        accuracy = result["test_accuracy"]
        lines.append(f"<li>A {html.escape(name)} classifier trained on {result['trained_on']:,} released images "
                     f"scores <strong>{100 * accuracy:.1f} %</strong> on {result['test_size']:,} real test images "
                     f"(chance: {100 * chance:.1f} %; {len(result.get('seeds', [result]))} seed(s)).</li>")
        if near_chance(accuracy, classes):
            warnings.append(f'<p class="warning"><strong>Near chance:</strong> a {html.escape(name)} classifier '
                            f"trained on this release does little better than guessing ({100 * accuracy:.1f} % "
                            f"against {100 * chance:.1f} %). The release spends its ε and shows almost nothing of "
                            "the classes: consider not sharing it (mark it with <code>dpsynth budget --not-shared"
                            "</code> once deleted), and read the recipes for this data's size before another.</p>")
    images = metrics.get("images", {})
    if "fid" in metrics:
        lines.append(f"<li>FID {metrics['fid']:.1f} between {images.get('synthetic', 0):,} released and "
                     f"{images.get('real', 0):,} real images (0 for identical sets; lower is closer); precision "
                     f"{metrics['precision']:.2f} and recall {metrics['recall']:.2f} (the shares of released images "
                     "that look real, and of real images the release covers).</li>")
    spent = metrics.get("evaluation_privacy") or {}
    if spent.get("epsilon") is not None:
        lines.append(f"<li>Choosing the classifiers on the private validation images spent ε = {spent['epsilon']:.2f} "
                     f"(δ = {spent['delta']:.3g}) in the validation images' own ledger, beside the release's.</li>")
    return [*warnings, "<ul>", *lines, "</ul>"]


BROWSERS = ("chromium", "chromium-browser", "google-chrome", "chrome")


def officer_pdf(run: RunDirectory, out: Path) -> Path:
    """``officer.html`` rewritten and printed to the PDF ``out`` by a headless Chromium or Chrome on the PATH;
    DpsynthError when there is none or it fails."""
    page = write_officer_page(run)
    browser = next((found for name in BROWSERS if (found := shutil.which(name))), None)
    if browser is None:
        raise DpsynthError(f"printing {page} to PDF needs Chromium or Chrome on the PATH ({', '.join(BROWSERS)}); "
                           "or open the page in any browser and print it to PDF")
    out.parent.mkdir(parents=True, exist_ok=True)
    done = subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--no-pdf-header-footer",
                           f"--print-to-pdf={out.resolve()}", page.resolve().as_uri()], capture_output=True, text=True,
                          timeout=120)
    if not out.is_file() or out.stat().st_size == 0:
        raise DpsynthError(f"{browser} did not print {page} to {out} (exit {done.returncode}): {done.stderr[-500:]}")
    return out


def write_officer_page(run: RunDirectory) -> Path:
    """Write ``officer.html`` from the release's datasheet and the run's evaluation so far; return its path."""
    sheet = run.file(DATASHEET).read_text()
    metrics = json.loads(run.file(METRICS).read_text()) if run.file(METRICS).exists() else {}
    with np.load(run.file(SYNTHETIC), allow_pickle=False) as release:
        classes = len(release["class_names"])
    body = markdown.markdown(sheet, extensions=["tables"], output_format="html")
    holder = ["<section class=\"holder\"><h2>For the data holder only: the release's evaluation</h2>",
              "<p>Measured against the real images without noise, so it is not covered by ε and stays with the "
              "holder: this section is not in the release's README.md.</p>", *evaluation_summary(metrics, classes),
              "</section>"]
    sign = ['<h2>Sign-off</h2><table class="sign">',
            *(f"<tr><th>{what}</th><td></td></tr>" for what in ("Reviewed by", "Role", "Decision (share / do not "
                                                                "share)", "Date", "Signature")), "</table>"]
    title = sheet.splitlines()[0].removeprefix("# ")
    page = (f'<!doctype html>\n<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>'
            f"<style>{STYLE}</style></head>\n<body>\n{body}\n" + "\n".join([*holder, *sign]) +
            f'\n<p><small>Written by dpsynth on {time.strftime("%Y-%m-%d")} from the run {html.escape(run.path.name)}'
            "; the page needs no network.</small></p>\n</body></html>\n")
    path = run.file(OFFICER_PAGE)
    atomic_write_text(path, page)
    return path

