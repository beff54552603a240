"""Evaluation pictures: synthetic images beside their nearest real images, and curves from a run's log."""
from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import numpy as np

from ..utils.images import save_png
from ..utils.io import atomic_write


def nearest_real(synthetic: np.ndarray, real: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For each synthetic feature row, the index of and distance to the nearest real feature row."""
    distances = (np.square(synthetic).sum(1)[:, None] - 2 * synthetic @ real.T + np.square(real).sum(1)[None, :])
    index = distances.argmin(axis=1)
    return index, np.sqrt(np.maximum(distances[np.arange(len(index)), index], 0))


def pairs_grid(top: np.ndarray, bottom: np.ndarray, pad: int = 2) -> np.ndarray:
    """A 2-row H x W x C uint8 mosaic: ``top[i]`` above ``bottom[i]`` in column i."""
    count, channels, height, width = top.shape
    grid = np.full((2 * (height + pad) + pad, count * (width + pad) + pad, channels), 255, np.uint8)
    for row, images in enumerate((top, bottom)):
        for col, image in enumerate(images):
            y, x = pad + row * (height + pad), pad + col * (width + pad)
            grid[y:y + height, x:x + width] = image.transpose(1, 2, 0)
    return grid


def save_nearest_neighbours(synthetic_images: np.ndarray, real_images: np.ndarray, path: str | Path) -> None:
    """Synthetic images (top row) over their nearest real training images in Inception space (bottom row)."""
    save_png(pairs_grid(synthetic_images, real_images), path)


def log_curves_png(log_path: str | Path) -> bytes | None:
    """Every numeric field of the log records that carry a ``step``, one panel per (event, field), as PNG;
    None when the log has no such records."""
    series: dict[tuple[str, str], list[tuple[float, float]]] = {}
    for line in Path(log_path).read_text().splitlines():
        record = json.loads(line)
        if "step" not in record:
            continue
        for key, value in record.items():
            if key not in ("step", "time", "event") and isinstance(value, (int, float)) and not isinstance(value, bool):
                series.setdefault((record["event"], key), []).append((record["step"], value))
    if not series:
        return None
    from matplotlib.figure import Figure

    figure = Figure(figsize=(4 * len(series), 3))
    axes = figure.subplots(1, len(series), squeeze=False)
    for axis, ((event, key), points) in zip(axes[0], series.items(), strict=True):
        steps, values = zip(*points, strict=True)
        axis.plot(steps, values)
        axis.set(title=f"{event}: {key}", xlabel="step")
    return figure_png(figure)


def figure_png(figure: Any) -> bytes:
    """A matplotlib ``Figure`` (made without pyplot, so no GUI backend is involved) as PNG bytes."""
    figure.tight_layout()
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=100)
    return buffer.getvalue()


def save_log_curves(log_path: str | Path, path: str | Path) -> bool:
    """Write :func:`log_curves_png` to ``path``; False (and nothing written) when the log has no step records."""
    data = log_curves_png(log_path)
    if data is not None:
        atomic_write(path, lambda handle: handle.write(data))
    return data is not None
