"""Accuracy and FID-inf against synthesis time: one point per finished cell of some bench records.

Each point is a cell's results.csv row and its run's config.yaml: CNN accuracy (with its spread over classifier
seeds) and FID-inf against the synthesis's wall-clock hours on the machine that ran it, one series per method and
target epsilon (inf: DP-SGD without noise). All points should come from one CPU type, which each record's
results.md names; ``table`` says which, and refuses records from different machines.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from ..errors import DpsynthError
from . import record
from .results import seeds_accuracy

RAN_ON = re.compile(r"^- every cell ran on: (.*)$", re.MULTILINE)


def points(benches: list[Path]) -> list[dict[str, Any]]:
    """The finished cells of ``benches``, each with its configuration's model and schedule, sorted by method,
    epsilon and hours."""
    found = []
    for bench in benches:
        for row in record.read_rows(bench):
            if row["status"] != "done":
                continue
            run = bench / "runs" / Path(row["run_dir"]).name  # older records give the whole path
            config = yaml.safe_load((run / "config.yaml").read_text())
            found.append({**row, "bench": bench.name, "hours": row["synthesis_wall_min"] / 60,
                          "cpu_hours": row["synthesis_cpu_min"] / 60, "model": _model(config)})
    return sorted(found, key=lambda p: (p["method"], p["target_epsilon"], p["hours"]))


def _model(config: dict[str, Any]) -> str:
    model, dpsgd = config["model"], config.get("dpsgd", {})
    return (f"{list(model['block_channels'])} x{model['layers_per_block']}, batch {dpsgd.get('batch_size')}, "
            f"{dpsgd.get('epochs')} epochs")


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


def table(benches: list[Path]) -> str:
    """A Markdown table of the points of ``benches``, under a line naming the machine that measured them."""
    lines = [f"Measured on {machine(benches)}.", "",
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

    figure, (accuracy, fid) = plt.subplots(1, 2, figsize=(10, 4))
    for method, epsilon in dict.fromkeys((p["method"], p["target_epsilon"]) for p in found):
        own = [p for p in found if (p["method"], p["target_epsilon"]) == (method, epsilon)]
        hours = [p["hours"] for p in own]
        label = f"{method}, ε = {epsilon:g}" + (" (no noise)" if epsilon == float("inf") else "")
        accuracy.errorbar(hours, [100 * p["accuracy_cnn"] for p in own],
                          yerr=[100 * (p["accuracy_cnn_std"] or 0) for p in own], marker="o", capsize=3,
                          label=label)
        fid.plot(hours, [p["fid_infinity"] for p in own], marker="o", label=label)
    for axis, title in ((accuracy, "CNN accuracy on real test images (%)"), (fid, "FID∞ (lower is better)")):
        axis.set_xlabel("synthesis, wall-clock hours on 2 cores")
        axis.set_title(title)
        axis.set_xlim(left=0)
        axis.grid(alpha=0.3)
    accuracy.legend(fontsize=8)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=120)
    plt.close(figure)
