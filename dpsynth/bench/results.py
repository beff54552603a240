"""The bench's results: one row per cell from its run directory, written as CSV, Markdown and plots."""
from __future__ import annotations

import csv
import io
import json
import os
import platform
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from .. import __version__
from ..diffusion.pretrain import TRAINING_STATE
from ..evaluation import METRICS
from ..hardware import cpuinfo
from ..provenance import source_commit
from ..runs import LOG, PRIVACY, SAMPLES
from ..utils.io import atomic_write, atomic_write_text

if TYPE_CHECKING:
    from . import Cell

ATTEMPTS, OUTPUT = "bench.jsonl", "bench.out"
GIB = 2**30


def write_results(out: Path, cells: list[Cell], preset: str) -> list[dict[str, Any]]:
    """Write results.csv, results.md and the plots for ``cells`` under ``out``; returns the rows."""
    rows = [{**cell_row(out / "runs" / cell.name, cell), "run_dir": f"runs/{cell.name}"} for cell in cells]
    columns = list(dict.fromkeys(key for row in rows for key in row))
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, columns, lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    atomic_write_text(out / "results.csv", buffer.getvalue())
    atomic_write_text(out / "results.md", results_markdown(rows, preset))
    _plots(out, rows, cells)
    return rows


def cell_row(path: Path, cell: Cell) -> dict[str, Any]:
    """What the cell's run directory says: status, privacy split, metrics, cost (None where not yet known)."""
    privacy, metrics = _json(path / PRIVACY), _json(path / METRICS)
    attempts, log = _jsonl(path / ATTEMPTS), _jsonl(path / LOG)
    row: dict[str, Any] = {"dataset": cell.dataset, "method": cell.method, "target_epsilon": cell.epsilon,
                           "synthesis": cell.synthesis, "status": _status(privacy, metrics, attempts)}
    row["epsilon"] = privacy.get("epsilon") if privacy else None
    row["delta"] = privacy.get("delta") if privacy else None
    row["privacy_split"] = "; ".join(
        f"{stage['name']} {stage['epsilon_share']:.3f}" if stage["epsilon_share"] is not None else
        f"{stage['name']} none" for stage in privacy.get("stages", [])) if privacy else None
    for key in ("fid", "fid_infinity", "precision", "recall"):
        row[key] = metrics.get(key) if metrics else None
    row["kid"] = metrics["kid"]["mean"] if metrics else None
    for name, result in (metrics or {}).get("accuracy", {}).items():
        row[f"accuracy_{name}"] = result["test_accuracy"]
        row[f"accuracy_{name}_std"] = result.get("test_accuracy_std")
    row["selection_epsilon"] = metrics["evaluation_privacy"]["epsilon"] if metrics else None
    for phase in ("synthesis", "evaluation"):
        spent = [a for a in attempts if a["phase"] == phase]
        row[f"{phase}_wall_min"] = round(sum(a["wall_s"] for a in spent) / 60, 2) if spent else None
        row[f"{phase}_cpu_min"] = round(sum(a["cpu_s"] for a in spent) / 60, 2) if spent else None
    row["peak_rss_gib"] = round(max(a["max_rss_bytes"] for a in attempts) / GIB, 2) if attempts else None
    row["peak_cuda_gib"] = _cuda_peak(log)
    public = path.parent.parent / "public" / f"{cell.method}-{cell.dataset}"  # what the bench pre-trained for it
    row["public_pretraining_min"] = _public_minutes(log, public)
    row["machine"] = "; ".join(dict.fromkeys(a["machine"] for a in attempts if "machine" in a)) or None
    return row


def _status(privacy: dict | None, metrics: dict | None, attempts: list[dict]) -> str:
    if metrics:
        return "done"
    if attempts and attempts[-1].get("interrupted"):
        return f"interrupted ({attempts[-1]['phase']})"
    if attempts and attempts[-1]["returncode"] != 0:
        return f"failed ({attempts[-1]['phase']}, exit status {attempts[-1]['returncode']})"
    return "released" if privacy else "pending"


def _json(path: Path) -> dict | None:
    return json.loads(path.read_text()) if path.exists() else None


def _jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line] if path.exists() else []


def _cuda_peak(log: list[dict]) -> float | None:
    peaks = [r["cuda_peak_bytes"] for r in log if "cuda_peak_bytes" in r]
    return round(max(peaks) / GIB, 2) if peaks else None


def _public_minutes(log: list[dict], public: Path) -> float | None:
    """Minutes the public model the run started from (``model.init_from``) took to pre-train, as its
    pretraining.json says: a one-off cost, shared by every run started from it, so not the run's own. The run's log
    names it; where the log is not kept (a record in git keeps none), the bench's own ``public`` model of the cell's
    method and data does."""
    seconds = [r.get("seconds") for r in log if r.get("event") == "public model"]
    if not seconds and (public / TRAINING_STATE).is_file():
        seconds = [json.loads((public / TRAINING_STATE).read_text()).get("seconds")]
    return round(seconds[-1] / 60, 2) if seconds and seconds[-1] is not None else None


def _cell(value: Any, digits: int = 3, percent: bool = False) -> str:
    if value is None:
        return "–"
    return f"{100 * value:.1f} %" if percent else f"{value:.{digits}f}"


def results_markdown(rows: list[dict[str, Any]], preset: str) -> str:
    """One table per dataset, headed by the machine, preset, date and version that produced it."""
    classifiers = list(dict.fromkeys(k.removeprefix("accuracy_") for row in rows for k in row
                                     if k.startswith("accuracy_") and not k.endswith("_std")))
    lines = ["# dpsynth bench", "", f"- generated {time.strftime('%Y-%m-%d %H:%M %Z')} by dpsynth {__version__}"
             f"{_commit()}, preset `{preset}`", f"- machine: {machine()}",
             "- time: wall and CPU minutes of the child processes (summed over resumes); synthesis is training "
             "plus sampling the release, evaluation is FID/KID/precision/recall and the downstream classifiers; "
             "memory: peak resident set of any child (and peak CUDA memory allocated, on a GPU)",
             "- accuracy: mean ± standard deviation over the classifier seeds (`evaluation.classifier_seeds`), each "
             "at the epoch Report Noisy Max picks on the validation split",
             "- public pre-training: the minutes the public model a cell started from (`model.init_from`) took, on "
             "whatever machine trained it; a one-off cost, not in the cell's synthesis time (PrivImage's pre-training "
             "follows its private class selection, so it is in its synthesis time)",
             "- epsilon: spent by the synthesis, from its ledger (privacy split: each stage's share); model "
             "selection in the evaluation spends its own budget (selection epsilon), reported apart", ""]
    machines = list(dict.fromkeys(row["machine"] for row in rows if row.get("machine")))
    mixed = len(machines) > 1
    if machines:
        lines.insert(-1, f"- every cell ran on: {machines[0]}" if not mixed else
                     "- **the cells ran on different machines** (machine column): compare times within one only")
    repeated = any(row["synthesis"] > 1 for row in rows)
    header = (["method", "target ε", *(["synthesis"] if repeated else []), "ε spent", "FID (FID∞)", "KID", "precision",
               "recall"]
              + [f"acc. {name}" for name in classifiers]
              + ["synthesis min (CPU)", "public pre-training min", "evaluation min (CPU)", "peak memory GiB",
                 "privacy split", "status", *(["machine"] if mixed else [])])
    for dataset in dict.fromkeys(row["dataset"] for row in rows):
        lines += [f"## {dataset}", "", "| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
        for row in (r for r in rows if r["dataset"] == dataset):
            fid = f"{_cell(row['fid'], 1)} ({_cell(row['fid_infinity'], 1)})" if row["fid"] is not None else "–"
            memory = _cell(row["peak_rss_gib"], 2) + (f" (CUDA {row['peak_cuda_gib']:.2f})"
                                                      if row["peak_cuda_gib"] is not None else "")
            cells = ([row["method"], f"{row['target_epsilon']:g}", *([str(row["synthesis"])] if repeated else []),
                      _cell(row["epsilon"], 3), fid, _cell(row["kid"]),
                      _cell(row["precision"]), _cell(row["recall"])]
                     + [seeds_accuracy(row, name) for name in classifiers]
                     + [_minutes(row, "synthesis"), _cell(row["public_pretraining_min"], 1),
                        _minutes(row, "evaluation"), memory,
                        row["privacy_split"] or "–", row["status"], *([row.get("machine") or "–"] if mixed else [])])
            lines.append("| " + " | ".join(cells) + " |")
        lines.append("")
        if repeated:
            lines += _across_syntheses([r for r in rows if r["dataset"] == dataset], classifiers)
    return "\n".join(lines)


def _across_syntheses(rows: list[dict[str, Any]], classifiers: list[str]) -> list[str]:
    """Per method and target epsilon: the mean ± standard deviation over its finished syntheses of each
    classifier's accuracy (its mean over classifier seeds) and of FID∞."""
    header = ["method", "target ε", "syntheses", *[f"acc. {name}" for name in classifiers], "FID∞"]
    lines = ["Across syntheses (mean ± standard deviation over the finished ones):", "",
             "| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    for method, epsilon in dict.fromkeys((r["method"], r["target_epsilon"]) for r in rows):
        done = [r for r in rows if (r["method"], r["target_epsilon"]) == (method, epsilon) and r["status"] == "done"]
        accuracy = [spread([r[f"accuracy_{name}"] for r in done], 100, 1, " %") for name in classifiers]
        lines.append("| " + " | ".join([method, f"{epsilon:g}", str(len(done)), *accuracy,
                                         spread([r["fid_infinity"] for r in done], 1, 1, "")]) + " |")
    return [*lines, ""]


def spread(values: list[float | None], scale: float, digits: int, unit: str) -> str:
    """The values (None skipped) times ``scale``: one as it is, several as mean ± sample standard deviation."""
    found = np.array([v for v in values if v is not None], dtype=float) * scale
    if not len(found):
        return "–"
    if len(found) == 1:
        return f"{found[0]:.{digits}f}{unit}"
    return f"{found.mean():.{digits}f} ± {found.std(ddof=1):.{digits}f}{unit}"


def seeds_accuracy(row: dict[str, Any], classifier: str) -> str:
    """Mean test accuracy ± its standard deviation over the classifier seeds, in percent."""
    mean, std = row.get(f"accuracy_{classifier}"), row.get(f"accuracy_{classifier}_std")
    if mean is None or std is None:
        return _cell(mean, percent=True)
    return f"{100 * mean:.1f} ± {100 * std:.1f} %"


def _minutes(row: dict[str, Any], phase: str) -> str:
    wall, cpu = row[f"{phase}_wall_min"], row[f"{phase}_cpu_min"]
    return "–" if wall is None else f"{wall:.1f} ({cpu:.1f})"


def machine() -> str:
    """CPU model and count, torch threads, GPU if any, OS."""
    gpu = f", GPU {torch.cuda.get_device_name(0)}" if torch.cuda.is_available() else ", no GPU"
    return (f"{_cpu_model()}, {os.cpu_count()} cores, torch {torch.__version__} with {torch.get_num_threads()} "
            f"threads{gpu}, {platform.system()} {platform.release()}")


def machine_type() -> str:
    """What sets a cell's speed: the CPU model, core count, vector capability, AMX tiles, bf16 support, and the GPU
    if any (each attempt records it, so cells measured on different machines are not compared unawares). AMX
    matters apart: two CPUs with the same name and capability ran a DP-SGD step 1.3x apart with and without it."""
    bf16 = "native" if torch.ops.mkldnn._is_mkldnn_bf16_supported() else "emulated"
    amx = ", AMX" if "amx_bf16" in (cpuinfo("flags") or "").split() else ""
    gpu = f", GPU {torch.cuda.get_device_name(0)}" if torch.cuda.is_available() else ""
    return (f"{_cpu_model()}, {os.cpu_count()} cores, {torch.backends.cpu.get_cpu_capability()}{amx}, "
            f"bf16 {bf16}{gpu}")


def _cpu_model() -> str:
    return cpuinfo("model name") or platform.processor() or platform.machine()


def _commit() -> str:
    commit = source_commit()
    return f" (commit {commit})" if commit else ""


def _plots(out: Path, rows: list[dict[str, Any]], cells: list[Cell]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    metrics = {"fid.png": ["fid"], "accuracy.png": [k for k in dict.fromkeys(k for r in rows for k in r)
                                                    if k.startswith("accuracy_") and not k.endswith("_std")]}
    datasets = list(dict.fromkeys(row["dataset"] for row in rows))
    for filename, keys in metrics.items():
        if not keys:
            continue
        figure, axes = plt.subplots(len(keys), len(datasets), figsize=(6 * len(datasets), 3.2 * len(keys)),
                                    squeeze=False)
        for i, key in enumerate(keys):
            for j, dataset in enumerate(datasets):
                _bars(axes[i][j], [r for r in rows if r["dataset"] == dataset], key, f"{dataset}: {_label(key)}")
        figure.tight_layout()
        _save(figure, out / filename)
        plt.close(figure)
    for dataset in datasets:
        for epsilon in dict.fromkeys(c.epsilon for c in cells):
            grids = {c.method: out / "runs" / c.name / SAMPLES for c in cells
                     if c.dataset == dataset and c.epsilon == epsilon and c.synthesis == 1}
            _sample_grids(grids, f"{dataset}, target ε = {epsilon:g}", out / f"samples-{dataset}-eps{epsilon:g}.png")


def _label(key: str) -> str:
    if key.startswith("accuracy_"):
        return f"test accuracy of a {key.removeprefix('accuracy_')} trained on the release"
    return {"fid": "FID (lower is better)"}.get(key, key)


def _bars(axis: Any, rows: list[dict[str, Any]], key: str, title: str) -> None:
    """Grouped bars: one group per method, one bar per target epsilon (absent where not measured yet): the mean
    over the cell's syntheses, with error bars of their standard deviation (of ``<key>_std``, the classifier
    seeds' spread, for one synthesis)."""
    methods = list(dict.fromkeys(r["method"] for r in rows))
    epsilons = list(dict.fromkeys(r["target_epsilon"] for r in rows))
    width = 0.8 / len(epsilons)
    for k, epsilon in enumerate(epsilons):
        measured = [[r for r in rows if r["method"] == m and r["target_epsilon"] == epsilon
                     and r.get(key) is not None] for m in methods]
        values = [np.mean([r[key] for r in found]) if found else np.nan for found in measured]
        spreads = [np.std([r[key] for r in found], ddof=1) if len(found) > 1
                   else (found[0].get(f"{key}_std") or 0.0) if found else np.nan for found in measured]
        axis.bar(np.arange(len(methods)) + (k - (len(epsilons) - 1) / 2) * width, values, width,
                 yerr=spreads, capsize=3, label=f"ε = {epsilon:g}")
    axis.set_xticks(np.arange(len(methods)), methods, rotation=20)
    axis.set(title=title)
    axis.legend()


def _sample_grids(grids: dict[str, Path], title: str, path: Path) -> None:
    """Each method's ``samples.png`` (its release's class grid) side by side; skipped if none exists yet."""
    from matplotlib import image as mpimg
    from matplotlib import pyplot as plt

    found = {method: mpimg.imread(grid) for method, grid in grids.items() if grid.exists()}
    if not found:
        return
    figure, axes = plt.subplots(1, len(found), figsize=(3 * len(found), 3.6), squeeze=False)
    for axis, (method, grid) in zip(axes[0], found.items(), strict=True):
        axis.imshow(grid, cmap="gray", vmin=0, vmax=1)
        axis.set_title(method)
        axis.axis("off")
    figure.suptitle(title)
    figure.tight_layout()
    _save(figure, path)
    plt.close(figure)


def _save(figure: Any, path: Path) -> None:
    atomic_write(path, lambda handle: figure.savefig(handle, format="png", dpi=100))
