"""Seconds of a DP-SGD step over groups (one person's images as the unit of privacy) against the same images
ungrouped, for the planner's price of a grouped step (the probe times ungrouped steps).

The method's own probe model and random public batches at a run's training shape: G groups of ``--images``
images each, sampled at ``--batch`` groups a step, against ``--batch x --images`` ungrouped examples a step. Each
round times one step of each in turn (so a busy machine slows them alike), after a warm-up step of each; the
median is printed, and the ratio grouped / ungrouped.

Usage: python benchmarks/grouped_step.py RUN_DIR [--batch 224] [--images 5] [--rounds 5]
"""
from __future__ import annotations

import argparse
import statistics
from pathlib import Path

import torch

from dpsynth.autoplan.probe import probe_engine, probe_step
from dpsynth.bench.results import machine_type
from dpsynth.methods import create_method
from dpsynth.privacy.dpsgd import Groups
from dpsynth.runs import RunDirectory


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run", type=Path, help="a run directory whose config gives the method and shape")
    parser.add_argument("--batch", type=int, default=224, help="groups a step")
    parser.add_argument("--images", type=int, default=5, help="images of each group")
    parser.add_argument("--groups", type=int, default=1545, help="groups in the data")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    config = RunDirectory(args.run).config()
    data = config["dataset"]
    side = data.get("train_resolution") or data["resolution"]
    shape = (data["channels"], side, side)
    device = torch.device("cpu")
    probe, _ = create_method(config).throughput_probes(shape, 10, device).dpsgd["dpsgd"]
    images = args.groups * args.images
    ungrouped = probe_engine(probe, device, images)
    grouped = probe_engine(probe, device, args.groups)
    grouped.groups = Groups.of(torch.arange(images) // args.images, args.images)
    times: dict[str, list[float]] = {"ungrouped": [], "grouped": []}
    for round_ in range(args.rounds + 1):
        for name, engine, size in (("ungrouped", ungrouped, args.batch * args.images),
                                   ("grouped", grouped, args.batch)):
            drawn, seconds = probe_step(engine, probe, size, device)
            if round_:  # the first round warms up
                times[name].append(seconds * size / max(drawn, 1.0))
    medians = {name: statistics.median(values) for name, values in times.items()}
    print(f"{machine_type()}; {shape[1]} px, {args.batch} groups x {args.images} images, "
          f"physical batch {probe.physical_batch_size}, {args.rounds} rounds")
    for name, seconds in medians.items():
        print(f"{name:>9}: {seconds:.2f} s a step ({', '.join(f'{t:.2f}' for t in times[name])})")
    print(f"grouped / ungrouped: {medians['grouped'] / medians['ungrouped']:.2f}")


if __name__ == "__main__":
    main()
