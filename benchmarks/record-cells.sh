#!/usr/bin/env bash
# The bench record: every method x epsilon {10, 1} on Fashion-MNIST with the `cpu` presets, one record per CPU
# type (a record mixes no machines): benchmarks/results/cpu-zen4 on an AVX-512 CPU with native bf16 and no AMX,
# cpu-amx with AMX, cpu-avx2 where bf16 is emulated. Rerun to resume: a finished cell is kept, an interrupted one
# resumes from its checkpoint. Every cell runs the code of one commit (RECORD_COMMIT), from a git worktree of it,
# so that later commits (and edits in this checkout) leave the record at that commit. Run it alone on the machine;
# commit each finished cell (its runs/ folder and the regenerated results.md) as it lands. The real side of FID (the
# Inception features of the 2,000 real images every cell compares with) is computed into the feature cache before
# the first cell, so that no cell's evaluation minutes hold it and the cells of a fresh machine compare alike.
#
# Usage: bash benchmarks/record-cells.sh        (from the repository root)
set -euo pipefail
repo=$(pwd)
python=${PYTHON:-$repo/.venv/bin/python}
commit=${RECORD_COMMIT:-a94650e}
tree=${RECORD_TREE:-/tmp/dpsynth-record-$commit}
[ -d "$tree" ] || { git worktree prune; git worktree add --detach "$tree" "$commit"; }
machine=$("$python" -c "from dpsynth.bench.results import machine_type; print(machine_type())")
case "$machine" in
    *AMX*) out=benchmarks/results/cpu-amx ;;
    *"bf16 native"*) out=benchmarks/results/cpu-zen4 ;;
    *) out=benchmarks/results/cpu-avx2 ;;
esac
echo "$machine: $out, the code of commit $commit ($tree)"
cd "$tree"
"$python" -c "
import torch
from dpsynth.api import dataset_from_config, resolve_config
from dpsynth.evaluation.evaluate import EvaluationSettings, inception_extractor, real_features
config = resolve_config('dpdm', dataset='fashion-mnist', preset='cpu')
settings = EvaluationSettings.of(config)
real_features(dataset_from_config(config), settings, inception_extractor(settings, torch.device('cpu')))
print('the real side of FID is in the feature cache')"
exec "$python" -m dpsynth bench --methods dpdm feta-pro dp-feta pdp-diffusion privimage dp-sad dp-imgsyn pe dp-merf \
    dp-ldm --epsilons 10 1 --preset cpu --out "$repo/$out"
