"""The GPU check of a derived plan: DPDM on Fashion-MNIST with ``--preset auto`` on a CUDA device.

Prints the derived plan, then a table: the probe's DP-SGD seconds per step against those measured over
``--steps`` real steps of the plan (the run's own log), and the memory estimate of a chunk against the peak
that CUDA measured. The run is real (epsilon = 10 over the steps taken, its release small and not evaluated).

Usage: python benchmarks/gpu_check.py --data-dir DIR [--steps 200] [--out DIR]
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from dpsynth.api import dataset_from_config, resolve_config
from dpsynth.autoplan.memory import probe_memory
from dpsynth.methods import create_method, run_config_of
from dpsynth.pipeline import start
from dpsynth.planning import planned_config


def step_seconds(log: Path, stage: str = "dp-sgd") -> float:
    """Mean seconds per DP-SGD step between the first and the last logged step of ``stage``."""
    events = [json.loads(line) for line in log.read_text().splitlines()]
    steps = [(time.mktime(time.strptime(e["time"], "%Y-%m-%dT%H:%M:%S")), e["step"]) for e in events
             if e.get("event") == stage]
    (t0, s0), (t1, s1) = steps[0], steps[-1]
    return (t1 - t0) / max(s1 - s0, 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data-dir", required=True, help="the four Fashion-MNIST IDX files")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--out", default="gpu-check")
    parser.add_argument("--device", default="cuda", help="cuda (a dry run of the script: cpu)")
    parser.add_argument("--time-budget", default="10m", help="the plan's budget (short: the check takes its steps)")
    args = parser.parse_args()
    device = torch.device(args.device)
    cuda = device.type == "cuda"
    overrides = [f"run.device={args.device}", f"run.out_dir={args.out}", "evaluation.enabled=false",
                 "sampling.num_samples=1000", "dpsgd.checkpoint_every=25"]
    config = resolve_config("dpdm", dataset="fashion-mnist", data_dir=args.data_dir, epsilon=10.0,
                            overrides=[*overrides, f"plan.time_budget={args.time_budget}"])
    planned, dataset = planned_config(run_config_of(config), dataset_from_config(config), device)
    config = planned.to_dict()  # changed below, then started: start() prints the plan
    batch, n = config["dpsgd"]["batch_size"], dataset.info.num_train
    planned_steps = int(config["dpsgd"]["epochs"] / (batch / n))
    config["dpsgd"]["epochs"] = float(args.steps * batch / n) + 1e-9
    config["plan"]["user_keys"] = sorted({*config["plan"]["user_keys"], "dpsgd.epochs"})
    probe = create_method(config).throughput_probes(dataset.info.shape, dataset.info.num_classes, device)
    estimate = probe_memory(probe.dpsgd["dpsgd"][0]).bytes(config["dpsgd"]["physical_batch_size"])
    if cuda:
        torch.cuda.reset_peak_memory_stats(device)
    start_time = time.perf_counter()
    run = start(config)
    wall = time.perf_counter() - start_time
    peak = torch.cuda.max_memory_allocated(device) if cuda else float("nan")
    cost = config["derived"]["probe"]["dpsgd"]["dpsgd"]
    rows = batch * config["dpsgd"]["noise_multiplicity"]
    predicted, measured = cost["fixed"] + cost["per_row"] * rows, step_seconds(run.file("log.jsonl"))
    table = [("device", torch.cuda.get_device_name(device) if cuda else "cpu"),
             ("plan", f"batch {batch}, K = {config['dpsgd']['noise_multiplicity']}, chunk "
                      f"{config['dpsgd']['physical_batch_size']}, {planned_steps} steps in the budget"),
             ("DP-SGD s/step, probe", f"{predicted:.3f}"), ("DP-SGD s/step, measured", f"{measured:.3f}"),
             ("ratio measured / probe", f"{measured / predicted:.2f}"),
             ("chunk memory, estimate GiB", f"{estimate / 2 ** 30:.2f}"), ("peak memory, measured GiB",
                                                                        f"{peak / 2 ** 30:.2f}"),
             (f"{args.steps} steps + release, wall s", f"{wall:.1f}")]
    width = max(len(name) for name, _ in table)
    print("\n".join(f"| {name:<{width}} | {value} |" for name, value in table))


if __name__ == "__main__":
    main()
