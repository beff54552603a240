"""Accuracy and FID-inf against synthesis time: one point per finished cell of some bench records.

Each point is a cell's results.csv row and its run's config.yaml: CNN accuracy (with its spread over classifier
seeds) and FID-inf against the synthesis's wall-clock hours on the machine that ran it, one series per method,
target epsilon (a colour; inf: DP-SGD without noise) and setup (all but the epochs). All points should come from
one CPU type, which each record's results.md names; ``table`` says which, and refuses records from different
machines.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from ..config import Config, DatasetSettings, SamplingSettings, load_config, method_name
from ..errors import DpsynthError
from ..methods import get_method
from ..runs import CONFIG
from . import record
from .results import seeds_accuracy

RAN_ON = re.compile(r"^- every cell ran on: (.*)$", re.MULTILINE)
RELEASED_SHAPE = re.compile(r"synthetic images of (\d+) x (\d+) x (\d+) \(C x H x W\)")  # release/README.md


def points(benches: list[Path]) -> list[dict[str, Any]]:
    """The finished cells of ``benches``, each with its configuration's model and schedule, sorted by method,
    epsilon and hours."""
    found = []
    for bench in benches:
        for row in record.read_rows(bench):
            if row["status"] != "done":
                continue
            run = bench / "runs" / Path(row["run_dir"]).name  # older records give the whole path
            config = load_config((run / CONFIG).read_text(), str(run / CONFIG))
            images = _images(run, DatasetSettings.of(config))
            found.append({**row, "bench": bench.name, "hours": row["synthesis_wall_min"] / 60,
                          "cpu_hours": row["synthesis_cpu_min"] / 60, "model": f"{images}, {_model(config)}",
                          "setup": f"{images}, {_model(config, with_epochs=False)}"})
    return sorted(found, key=lambda p: (p["method"], p["target_epsilon"], p["hours"]))


def _images(run: Path, dataset: DatasetSettings) -> str:
    """The released images' size and colour (``28 x 28 grey``): as the config declares them, else as the
    release's README states them."""
    if isinstance(dataset.resolution, int) and isinstance(dataset.channels, int):
        channels, height, width = dataset.channels, dataset.resolution, dataset.resolution
    else:
        found = RELEASED_SHAPE.search((run / "release" / "README.md").read_text())
        if found is None:
            raise DpsynthError(f"{run / 'release' / 'README.md'}: no line saying the released images' C x H x W")
        channels, height, width = (int(value) for value in found.groups())
    return f"{height} x {width} {'grey' if channels == 1 else 'RGB' if channels == 3 else f'{channels} channels'}"


def _model(config: Config, with_epochs: bool = True) -> str:
    """The UNet and DP-SGD schedule of a cell (a diffusion method's), with each lever set away from its default (K,
    noise levels, a public start, trained parameter groups) and the release's size; without the epochs, what a
    series of more compute keeps the same."""
    method = get_method(method_name(config))
    model, dpsgd, diffusion = (method.settings(config, name) for name in ("model", "dpsgd", "diffusion"))
    parts = [f"{list(model.block_channels)} x{model.layers_per_block}", f"batch {dpsgd.batch_size}"]
    if with_epochs:
        parts.append(f"{dpsgd.epochs} epochs")
    if dpsgd.noise_multiplicity != 1:
        parts.append(f"K = {dpsgd.noise_multiplicity}")
    if diffusion.noise_levels != "uniform":
        parts.append(f"ln σ ~ N({diffusion.noise_level_mean:g}, {diffusion.noise_level_std:g}²)")
    if model.init_from:
        parts.append("public start")
    if list(model.trainable) != ["all"]:
        parts.append("trains " + " + ".join(model.trainable))
    parts.append(f"{SamplingSettings.of(config).num_samples:,} released")
    return ", ".join(parts)


def machine(benches: list[Path]) -> str:
    """The one CPU type every record names (model and cores from results.md's machine line, with the vector
    capability and bf16 support where its cells recorded them); DpsynthError naming the records when they differ."""
    found = {bench: _machine_type(bench) for bench in benches}
    cpus = {cpu for cpu, _ in found.values()}
    capabilities = {capability for _, capability in found.values() if capability}
    if len(cpus) > 1 or len(capabilities) > 1:
        listed = "; ".join(f"{bench}: {', '.join(filter(None, about))}" for bench, about in found.items())
        raise DpsynthError(f"frontier points come from different machines, not comparable: {listed}")
    return ", ".join([cpus.pop(), *capabilities])


def _machine_type(bench: Path) -> tuple[str, str | None]:
    """(CPU model and cores, vector capability and bf16 support or None where the record predates them)."""
    cpu = record.provenance(bench)["machine"].split(", torch")[0]
    ran_on = RAN_ON.search((bench / "results.md").read_text())
    return cpu, ran_on.group(1).removeprefix(cpu + ", ") if ran_on else None


def _dates(benches: list[Path]) -> str:
    """The days the records of ``benches`` were written: one date, or the first and the last."""
    days = sorted({record.provenance(bench)["generated"].split()[0] for bench in benches})
    return days[0] if len(days) == 1 else f"{days[0]} to {days[-1]}"


def table(benches: list[Path]) -> str:
    """A Markdown table of the points of ``benches``, under a line naming the machine that measured them."""
    lines = [f"Measured on {machine(benches)}, {_dates(benches)}.", "",
             "| method | ε | model, DP-SGD | synthesis h (CPU-h) | acc. cnn | FID∞ | bench |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for p in points(benches):
        lines.append(f"| {p['method']} | {p['target_epsilon']:g} | {p['model']} | {p['hours']:.2f} "
                     f"({p['cpu_hours']:.2f}) | {seeds_accuracy(p, 'cnn')} | {p['fid_infinity']:.1f} | "
                     f"{p['bench']} |")
    return "\n".join(lines) + "\n"


def plot(found: list[dict[str, Any]], path: Path) -> None:
    """Accuracy (left, with the seed spread) and FID-inf (right) against synthesis hours, one line per series."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    figure, (accuracy, fid) = plt.subplots(1, 2, figsize=(11, 5))
    colours = {1.0: "tab:red", 10.0: "tab:blue", float("inf"): "tab:green"}
    series = list(dict.fromkeys((p["method"], p["target_epsilon"], p["setup"]) for p in found))
    for number, (method, epsilon, setup) in enumerate(series):
        own = [p for p in found if (p["method"], p["target_epsilon"], p["setup"]) == (method, epsilon, setup)]
        hours = [p["hours"] for p in own]
        style = {"marker": "osD^v<>ph*"[number % 10], "color": colours.get(epsilon, "tab:grey"),
                 "label": f"{method}, ε = {epsilon:g}: {setup}"}
        accuracy.errorbar(hours, [100 * p["accuracy_cnn"] for p in own],
                          yerr=[100 * (p["accuracy_cnn_std"] or 0) for p in own], capsize=3, **style)
        fid.plot(hours, [p["fid_infinity"] for p in own], **style)
    for axis, title in ((accuracy, "CNN accuracy on real test images (%)"), (fid, "FID∞ (lower is better)")):
        axis.set_xlabel("synthesis, wall-clock hours on 2 cores")
        axis.set_title(title)
        axis.set_xlim(left=0)
        axis.grid(alpha=0.3)
    figure.legend(*accuracy.get_legend_handles_labels(), loc="lower center", fontsize=7, ncol=2)
    figure.tight_layout(rect=(0, 0.06 + 0.025 * ((len(series) + 1) // 2), 1, 1))
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=120, bbox_inches="tight")  # the legend may be wider than the plots
    plt.close(figure)
