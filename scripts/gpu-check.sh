#!/usr/bin/env bash
# The GPU check, one prepared script for a machine with a CUDA GPU (about 10 minutes): DPDM's derived plan
# (--preset auto) on Fashion-MNIST, its DP-SGD throughput probed and measured over 200 real steps and its chunk's
# memory estimated and measured (benchmarks/gpu_check.py); then `dpsynth doctor --device cuda` on every method.
#
# Usage: scripts/gpu-check.sh [FASHION_MNIST_DIR] [WORK_DIR]     (PYTHON: the interpreter, default python3)
set -euo pipefail
data=${1:-/usr/share/datasets/fashion-mnist}
work=${2:-gpu-check}
python=${PYTHON:-python3}
mkdir -p "$work"
echo "== DPDM's derived plan on Fashion-MNIST: probe against 200 steps"
"$python" benchmarks/gpu_check.py --data-dir "$data" --steps 200 --out "$work/runs"
echo "== dpsynth doctor --device cuda"
"$python" -m dpsynth doctor --device cuda || echo "(the doctor reported failures, above)"
