"""Inception feature extraction against the CPU's limit: each path's images/s, GFLOP/s and share of the machine's peak,
and its FID beside fp32's on a fixed pair of sets, judged against the spread between draws of one model.

Paths (:data:`dpsynth.evaluation.inception.PATHS`): ``fp32`` (the TorchScript as shipped, the baseline), ``fp32-fused``
(frozen, batch norms folded, oneDNN rewrites, channels-last), ``bf16-fused`` (the same in bf16; timed on one batch
only where oneDNN emulates bf16) and ``fp32 compiled`` (``torch.compile`` of the shipped network; recorded as it
fails or runs). The peak is :func:`dpsynth.hardware.flop_peak` (cores x clock x FLOP per cycle, formula printed);
beside it the GFLOP/s of a large matrix product in each dtype, what the machine's BLAS reaches. An image's FLOP are
counted on the shipped network (``torch.utils.flop_counter``).

Sets: ``--draws`` disjoint slices of ``--images`` images of a release (``--release``, a run's ``synthetic.npz``:
independent draws of one model; default Fashion-MNIST's training split, the data as a model) against as many real
Fashion-MNIST test images. The spread is the mean |FID(draw i) - FID(draw j)| in fp32; a path is eligible when its
FID on draw 1 differs from fp32's by less than a tenth of it. Appends one JSON line to
benchmarks/results/inception-paths/records.jsonl.

Usage: python benchmarks/inception_features.py [--release RUN/release/synthetic.npz] [--images 1000] [--draws 3]
       [--batch 50] [--threads 2]    (ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 measures an AVX2-only CPU)
"""
from __future__ import annotations

import argparse
import datetime
import itertools
import json
import statistics
import time
from pathlib import Path

import numpy as np
import torch
from torch.utils.flop_counter import FlopCounterMode

from dpsynth.bench.results import machine_type
from dpsynth.data import load_dataset
from dpsynth.evaluation import InceptionFeatures, Moments, fid, read_release
from dpsynth.evaluation.inception import chosen_path, load_network, preprocess
from dpsynth.hardware import flop_peak
from dpsynth.provenance import source_commit
from dpsynth.utils.images import to_uint8

RECORDS = Path(__file__).parent / "results" / "inception-paths" / "records.jsonl"


def image_flops() -> float:
    """FLOP of one image through the shipped network, counted."""
    model = load_network(torch.device("cpu"))
    counter = FlopCounterMode(display=False)
    with counter, torch.inference_mode():
        model(preprocess(np.zeros((1, 1, 28, 28), np.uint8)))
    return float(counter.get_total_flops())


def matmul_gflops(dtype: torch.dtype, size: int = 2048, rounds: int = 5) -> float:
    """GFLOP/s of a ``size`` x ``size`` matrix product in ``dtype``, the best of ``rounds``."""
    a, b = (torch.randn(size, size).to(dtype) for _ in range(2))
    torch.mm(a, b)
    best = min(_seconds(lambda: torch.mm(a, b)) for _ in range(rounds))
    return 2 * size ** 3 / best / 1e9


def _seconds(work) -> float:
    start = time.perf_counter()
    work()
    return time.perf_counter() - start


def timed(extractor, images: np.ndarray) -> tuple[np.ndarray, float]:
    """Features of ``images`` and images/s, after one warm-up batch that is not timed."""
    extractor(images[:extractor.batch_size])
    start = time.perf_counter()
    features = extractor(images)
    return features, len(images) / (time.perf_counter() - start)


class Compiled(InceptionFeatures):
    """The shipped fp32 network through ``torch.compile``."""

    def __init__(self, batch_size: int) -> None:
        super().__init__("cpu", "fp32", batch_size)
        self.model = torch.compile(self.model)


def sets(args: argparse.Namespace) -> tuple[list[np.ndarray], np.ndarray]:
    """``args.draws`` disjoint draws of ``args.images`` images and as many real test images, uint8."""
    dataset = load_dataset("fashion-mnist")
    source = read_release(args.release).images if args.release else dataset.train.images
    pool = to_uint8(torch.as_tensor(source))
    if len(pool) < args.draws * args.images:
        raise SystemExit(f"{args.release or 'fashion-mnist train'}: {len(pool)} images, fewer than "
                         f"{args.draws} draws x {args.images}")
    order = np.random.default_rng(0).permutation(len(pool))
    draws = [pool[np.sort(order[i * args.images:(i + 1) * args.images])] for i in range(args.draws)]
    return draws, to_uint8(dataset.test.images[:args.images])


def main() -> None:
    args = _arguments()
    torch.set_num_threads(args.threads)
    draws, real = sets(args)
    peak, flops = flop_peak(), image_flops()
    ceilings = {"fp32": matmul_gflops(torch.float32)}
    if peak.bf16_per_cycle:
        ceilings["bf16"] = matmul_gflops(torch.bfloat16)
    products = ", ".join(f"{dtype} {gflops:.0f}" for dtype, gflops in ceilings.items())
    print(f"{machine_type()}; an image {flops / 1e9:.2f} GFLOP; peak fp32 {peak.formula(torch.float32)}; "
          f"bf16 {peak.formula(torch.bfloat16)}; matrix product {products} GFLOP/s")
    base = InceptionFeatures("cpu", "fp32", args.batch)
    first, base_speed = timed(base, draws[0])
    real_moments = Moments.of(base(real))
    fids = [fid(Moments.of(first), real_moments)] + [fid(Moments.of(base(d)), real_moments) for d in draws[1:]]
    spread = statistics.mean(abs(a - b) for a, b in itertools.combinations(fids, 2))
    print(f"fp32 FID of {args.draws} draws of {args.images}: {', '.join(f'{v:.3f}' for v in fids)}; "
          f"spread {spread:.3f}, threshold {spread / 10:.3f}")
    paths = {"fp32": _row(base_speed, fids[0], fids[0], spread, flops, peak, ceilings, torch.float32)}
    print(f"{'fp32':<14} {json.dumps(paths['fp32'])}")
    for name in ("fp32-fused", "bf16-fused", "fp32 compiled"):
        paths[name] = _measure(name, args, draws[0], real, fids[0], spread, flops, peak, ceilings)
        print(f"{name:<14} {json.dumps(paths[name])}")
    auto, why = chosen_path("auto")
    print(f"evaluation.fast_inception=auto takes {auto} ({why.reason}): "
          f"{paths[auto]['images_per_s'] / base_speed:.2f}x fp32's images/s")
    _append({"date": datetime.date.today().isoformat(), "machine": machine_type(), "commit": source_commit(),
             "threads": args.threads, "batch": args.batch, "images": args.images, "release": args.release or
             "fashion-mnist train", "image_gflop": flops / 1e9, "peak": {"fp32": peak.formula(torch.float32),
             "bf16": peak.formula(torch.bfloat16)}, "matmul_gflops": ceilings, "draw_fids": fids,
             "spread": spread, "paths": paths, "auto": auto})


def _measure(name: str, args: argparse.Namespace, draw: np.ndarray, real: np.ndarray, base_fid: float,
             spread: float, flops: float, peak, ceilings: dict[str, float]) -> dict:
    """One path's row; bf16 where emulated is timed on one batch only, a path that fails records its error."""
    try:
        extractor = Compiled(args.batch) if name == "fp32 compiled" else InceptionFeatures("cpu", name, args.batch)
        if name == "bf16-fused" and not peak.bf16_per_cycle:
            _, speed = timed(extractor, draw[:args.batch])
            return {"images_per_s": round(speed, 3), "note": "bf16 emulated: timed on one batch, no FID"}
        features, speed = timed(extractor, draw)
        path_fid = fid(Moments.of(features), Moments.of(extractor(real)))
    except Exception as error:  # a path this torch cannot run is a finding, recorded
        return {"error": f"{type(error).__name__}: {str(error).splitlines()[0][:200]}"}
    return _row(speed, path_fid, base_fid, spread, flops, peak, ceilings, extractor.dtype)


def _row(speed: float, path_fid: float, base_fid: float, spread: float, flops: float, peak,
         ceilings: dict[str, float], dtype: torch.dtype) -> dict:
    """images/s, GFLOP/s, their share of the formula's peak and of the matrix product's in ``dtype``, the FID."""
    gflops = speed * flops / 1e9
    product = ceilings.get("bf16" if dtype == torch.bfloat16 else "fp32", ceilings["fp32"])
    return {"images_per_s": round(speed, 3), "gflops": round(gflops, 1),
            "share_of_peak": round(gflops / peak.gflops(dtype), 3), "share_of_matmul": round(gflops / product, 3),
            "fid": round(path_fid, 4),
            "fid_difference": round(abs(path_fid - base_fid), 4), "eligible": abs(path_fid - base_fid) < spread / 10}


def _append(record: dict) -> None:
    RECORDS.parent.mkdir(parents=True, exist_ok=True)
    with RECORDS.open("a") as handle:
        handle.write(json.dumps(record) + "\n")
    print(f"appended to {RECORDS}")


def _arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--release", help="a run's release/synthetic.npz (default: Fashion-MNIST train)")
    parser.add_argument("--images", type=int, default=1000, help="images per set")
    parser.add_argument("--draws", type=int, default=3)
    parser.add_argument("--batch", type=int, default=50)
    parser.add_argument("--threads", type=int, default=2)
    return parser.parse_args()


if __name__ == "__main__":
    main()
