#!/usr/bin/env bash
# Cells of the (sigma/B, T) plane for the planner's regime check (dpsynth.autoplan.regime): DPDM on scikit-learn's
# digits upscaled to 28 x 28 (benchmarks/digits_npz.py, 1,437 training images, size declared), with the batch and
# epochs forced so that each cell lands at another noise per example sigma/B and step count T. Each cell is one
# measured run (benchmarks/plan-run.sh) in benchmarks/results/cpu-regime/NAME, its evaluation kept whatever the
# budget (the outcome is the measurement, not the time); a finished cell is not repeated.
# Run it alone on the machine. Then: python benchmarks/regime_records.py --write.
#
# Usage: bash benchmarks/regime-cells.sh [NAME ...]     (from the repository root; no NAME: every cell)
set -euo pipefail
python=${PYTHON:-.venv/bin/python}
root=benchmarks/results/cpu-regime
data=${DIGITS_NPZ:-/tmp/dpsynth-data/digits-28.npz}
[ -f "$data" ] || { mkdir -p "$(dirname "$data")"; "$python" benchmarks/digits_npz.py --side 28 --out "$data"; }
declare -A cells=(  # name: epsilon batch epochs (T = epochs x 1,437 / batch)
    [digits28-b16-t800-eps10]="10 16 8.91"
    [digits28-b128-t836-eps1]="1 128 74.5"
    [digits28-b32-t800-eps10]="10 32 17.8"
    [digits28-b16-t3000-eps10]="10 16 33.4"
    [digits28-b64-t800-eps1]="1 64 35.6"
)
order=(digits28-b16-t800-eps10 digits28-b128-t836-eps1 digits28-b32-t800-eps10 digits28-b16-t3000-eps10
       digits28-b64-t800-eps1)
for name in "${@:-${order[@]}}"; do
    read -r epsilon batch epochs <<< "${cells[$name]}"
    bash benchmarks/plan-run.sh "$root" "$name" dpdm --dataset npz --data-dir "$data" --epsilon "$epsilon" \
        --time-budget 30m --set privacy.dataset_size=1797 --set "dpsgd.batch_size=$batch" \
        --set "dpsgd.epochs=$epochs" --set plan.force=true --set evaluation.enabled=true \
        --set evaluation.classifier_seeds=3
done
