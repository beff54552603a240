#!/usr/bin/env bash
# The cells of the compute frontier (docs/benchmarks.md, "What more compute buys"): each one `dpsynth bench` of one
# run on Fashion-MNIST under the 5,000-image protocol (one CNN x 3 seeds), in ROOT/CELL. Rerun to resume a cell;
# a finished one is not repeated. Run them alone on the machine: their times are the measurement.
#
# Usage: bash benchmarks/frontier-cells.sh ROOT CELL [CELL ...]      (from the repository root)
# Cells: dpdm-6-epochs dpdm-12-epochs dpdm-26-epochs dpdm-wide-6-epochs dpdm-6-epochs-no-noise
#        dpdm-12-epochs-no-noise dpdm-26-epochs-no-noise pdp-diffusion-26-epochs
set -euo pipefail
python=${PYTHON:-.venv/bin/python}
[ $# -ge 2 ] || { sed -n 6,8p "$0" >&2; exit 2; }
root=$1
shift
glyphs=benchmarks/results/cpu/public/pdp-diffusion-fashion-mnist  # the record's public glyph model

for cell in "$@"; do
    method=dpdm epsilon=10 extra=()
    case $cell in
        dpdm-6-epochs) extra=(--set dpsgd.epochs=6) ;;
        dpdm-12-epochs) extra=(--set dpsgd.epochs=12) ;;
        dpdm-26-epochs) extra=(--set dpsgd.epochs=26) ;;
        dpdm-wide-6-epochs) extra=(--set dpsgd.epochs=6 --set "model.block_channels=[32, 64, 64]") ;;
        dpdm-6-epochs-no-noise) epsilon=inf extra=(--set dpsgd.epochs=6 --set run.allow_non_private=true) ;;
        dpdm-12-epochs-no-noise) epsilon=inf extra=(--set dpsgd.epochs=12 --set run.allow_non_private=true) ;;
        dpdm-26-epochs-no-noise) epsilon=inf extra=(--set dpsgd.epochs=26 --set run.allow_non_private=true) ;;
        pdp-diffusion-26-epochs) method=pdp-diffusion extra=(--set dpsgd.epochs=26 --set "model.init_from=$glyphs") ;;
        *) echo "unknown frontier cell '$cell'; one of: $(sed -n 7,8p "$0" | cut -c10- | tr -s ' \n' ' ')" >&2
           exit 2 ;;
    esac
    "$python" -m dpsynth bench --methods "$method" --datasets fashion-mnist --epsilons "$epsilon" --preset cpu \
        --out "$root/$cell" --set sampling.num_samples=5000 --set "evaluation.classifiers=[cnn]" "${extra[@]}"
done
