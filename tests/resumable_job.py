"""A checkpointed loop of a real DP mechanism on real data, run as a subprocess by test_runs.py.

Usage: python resumable_job.py RUN_ROOT_OR_DIR STEPS [--resume] [--sleep SECONDS]
"""
from __future__ import annotations

import argparse
import time

import torch

from dpsynth.api import dataset_from_config, resolve_config
from dpsynth.methods import run_config_of
from dpsynth.privacy import Accountant, ledger_report
from dpsynth.privacy.mechanisms import release_subsampled_mean
from dpsynth.privacy.randomness import SecretStream, derived_key
from dpsynth.runs import Checkpoint, RunDirectory
from dpsynth.utils.images import as_floats

CHECKPOINT_EVERY = 5


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("path")
    parser.add_argument("steps", type=int)
    parser.add_argument("--resume", action="store_true")
    parser.add_argument("--sleep", type=float, default=0.0)
    args = parser.parse_args()
    if args.resume:
        run = RunDirectory.open(args.path)
        config = run.config()
    else:
        config = resolve_config("dpdm", dataset="mnist-5k", epsilon=5.0, overrides=["run.seed=0"])  # reproducible
        run = RunDirectory.create(run_config_of(config), args.path)
        print(run.path, flush=True)
    images = as_floats(dataset_from_config(config).train.images).flatten(1)
    noise = SecretStream(derived_key(config["run"]["seed"], "noise"))
    restored, ledger = run.restore()
    state = restored or Checkpoint(parts={"total": torch.zeros(images.shape[1])}, rng=noise.get_state())
    noise.set_state(state.rng)
    while state.step < args.steps:
        state.parts["total"] += release_subsampled_mean(images, 0.05, 10.0, 2.0, ledger, "noisy-mean", noise)
        state.step += 1
        if state.step % CHECKPOINT_EVERY == 0:
            state.rng = noise.get_state()
            run.save_checkpoint(state, ledger)
        time.sleep(args.sleep)
    torch.save(state.parts["total"], run.file("total.pt"))
    run.write_privacy_report(ledger_report(ledger, Accountant("pld"), 1e-5))


if __name__ == "__main__":
    main()
