"""FID, FID-infinity and KID of one trained run's model sampled by each sampler and step count, with times.

Loads the EMA weights of a finished DPDM-family run (its private checkpoint: run this where the run is), samples
``--images`` images per contender from the same initial noise and labels (``sampling.bf16`` / ``compile`` as the
run resolves them on this machine), and scores them as the run's evaluation does (same real images, Inception
precision and cached real features). The release's default sampler is chosen from this table.

Usage: python benchmarks/sampler_quality.py RUN_DIR [--contenders ddim:25 dpm-solver++:10 dpm-solver++:15
       dpm-solver++:25 unipc:10] [--images 2000]
"""
from __future__ import annotations

import argparse
import time

import torch
from trained import final_state, trained_method

from dpsynth.api import dataset_from_config
from dpsynth.evaluation import EvaluationSettings
from dpsynth.evaluation.evaluate import fidelity_metrics, inception_extractor, real_features
from dpsynth.runs import RunDirectory
from dpsynth.utils.images import to_uint8


def main() -> None:
    args = _arguments()
    run = RunDirectory(args.run)
    config = run.config()
    dataset = dataset_from_config(config)
    state = final_state(run)
    settings = EvaluationSettings.from_config(config["evaluation"])
    extractor = inception_extractor(settings, torch.device("cpu"))
    _, real = real_features(dataset, settings, extractor)
    print(f"{args.run}: {args.images} images per contender against {len(real)} real ({settings.real_split}), "
          f"CPU capability {torch.backends.cpu.get_cpu_capability()}")
    print("| sampler | steps | seconds | FID | FID∞ | KID |\n| --- | --- | --- | --- | --- | --- |")
    for contender in args.contenders:
        sampler, steps = contender.split(":")
        method = trained_method(config, state, dataset.info, sampler=sampler, sample_steps=int(steps))
        start = time.perf_counter()
        images = method.generate(args.images, torch.Generator().manual_seed(0)).images
        seconds = time.perf_counter() - start
        metrics = fidelity_metrics(extractor(to_uint8(images)), real, settings)
        print(f"| {sampler} | {steps} | {seconds:.1f} | {metrics['fid']:.1f} | {metrics['fid_infinity']:.1f} | "
              f"{metrics['kid']['mean']:.4f} ± {metrics['kid']['std']:.4f} |", flush=True)


def _arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("run", help="a finished run directory (DPDM, DP-FETA or FETA-Pro)")
    parser.add_argument("--contenders", nargs="+", default=["ddim:25", "dpm-solver++:10", "dpm-solver++:15",
                                                             "dpm-solver++:25", "unipc:10"])
    parser.add_argument("--images", type=int, default=2000)
    return parser.parse_args()


if __name__ == "__main__":
    main()
