"""Reading a large folder of your own images: first load (decoded in parallel, written to the cache) and cached load
(a memory map), against a serial decode without cache measured in the same run; wall time and peak RSS, each in a
process of its own, and peak RSS as a multiple of the uint8 array.

Builds (once, kept for the next run) a folder of N RGB JPEGs, 160 x 144 px crops of scikit-learn's two sample
photographs in 10 class folders, read at 128 px. Appends one JSON line per run to
benchmarks/results/folder-load/records.jsonl with the machine type and date.

Usage: python benchmarks/folder_load.py [--images 100000] [--folder /tmp/dpsynth-folder-100000] [--skip-serial]
"""
from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

RECORDS = Path(__file__).parent / "results" / "folder-load" / "records.jsonl"
SIDE, STORED = 128, (160, 144)


def _write_class(folder: Path, label: int, count: int, seed: int) -> None:
    from PIL import Image
    from sklearn.datasets import load_sample_images

    photos = load_sample_images().images
    rng = np.random.default_rng(seed)
    target = folder / f"class-{label}"
    target.mkdir(parents=True, exist_ok=True)
    for index in range(count):
        photo = photos[index % len(photos)]
        top, left = rng.integers(0, photo.shape[0] - STORED[1]), rng.integers(0, photo.shape[1] - STORED[0])
        crop = photo[top:top + STORED[1], left:left + STORED[0]]
        Image.fromarray(crop).save(target / f"{index:06d}.jpg", quality=90)


def build(folder: Path, images: int) -> None:
    """The folder, unless a finished one is there."""
    done = folder / ".complete"
    if done.exists():
        return
    per_class = images // 10
    with ProcessPoolExecutor() as pool:
        list(pool.map(_write_class, [folder] * 10, range(10), [per_class] * 10, range(10)))
    done.write_text(str(images))


def measure(folder: str, cache: str | None, serial: bool) -> dict[str, float]:
    """One load in this process: seconds, peak RSS of this process and of its workers (bytes), array bytes."""
    from dpsynth.data import folder as folder_module
    from dpsynth.data.pixels import WindowRule

    if serial:
        folder_module.PARALLEL_FROM = 10**12
    files = folder_module.folder_layout(Path(folder)).files
    start = time.perf_counter()
    images = folder_module.decoded_images(files, SIDE, 3, WindowRule(), cache)
    checksum = int(images[:, :, ::16, ::16].sum(dtype=np.int64))  # touches every image
    seconds = time.perf_counter() - start
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    workers = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
    return {"seconds": seconds, "rss": own, "worker_rss": workers, "array": images.nbytes, "checksum": checksum}


def in_process(folder: Path, cache: str | None, serial: bool) -> dict[str, float]:
    """:func:`measure` in a fresh interpreter (its own peak RSS)."""
    code = (f"import json, sys; sys.path.insert(0, {str(Path(__file__).parent)!r}); import folder_load; "
            f"print(json.dumps(folder_load.measure({str(folder)!r}, {cache!r}, {serial})))")
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    from dpsynth.bench.results import machine_type

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--images", type=int, default=100_000)
    parser.add_argument("--folder", type=Path)
    parser.add_argument("--skip-serial", action="store_true", help="leave out the serial baseline (slow at 10^5)")
    args = parser.parse_args()
    folder = args.folder or Path(tempfile.gettempdir()) / f"dpsynth-folder-{args.images}"
    start = time.perf_counter()
    build(folder, args.images)
    print(f"folder of {args.images:,} JPEGs ({STORED[0]} x {STORED[1]}) at {folder}: "
          f"{time.perf_counter() - start:.0f} s to build")
    results = {}
    with tempfile.TemporaryDirectory() as cache:
        if not args.skip_serial:
            results["serial, no cache"] = in_process(folder, None, serial=True)
        results["first load (parallel, to the cache)"] = in_process(folder, cache, serial=False)
        results["cached load (memory map)"] = in_process(folder, cache, serial=False)
    checksums = {result["checksum"] for result in results.values()}
    assert len(checksums) == 1, f"the loads differ: {checksums}"
    base = next(iter(results.values()))
    machine = machine_type()
    print(f"{machine}; read at {SIDE} px RGB; array {base['array'] / 2**30:.2f} GiB")
    for name, result in results.items():
        peak = max(result["rss"], result["worker_rss"])
        print(f"  {name:<38} {result['seconds']:7.1f} s ({result['seconds'] / base['seconds']:.2f}x the first)  "
              f"peak RSS {peak / 2**30:.2f} GiB = {peak / result['array']:.2f}x the array")
    RECORDS.parent.mkdir(parents=True, exist_ok=True)
    with RECORDS.open("a") as handle:
        handle.write(json.dumps({"date": time.strftime("%Y-%m-%d"), "machine": machine, "images": args.images,
                                 "side": SIDE, "results": results}) + "\n")


if __name__ == "__main__":
    main()
