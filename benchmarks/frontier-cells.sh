#!/usr/bin/env bash
# The cells of the compute frontier (docs/benchmarks.md, "What more compute buys" and "What each lever buys"): each
# one `dpsynth bench` of one run on Fashion-MNIST, in ROOT/CELL. Rerun to resume a cell; a finished one is not
# repeated. Run them alone on the machine: their times are the measurement.
#
# Usage: bash benchmarks/frontier-cells.sh ROOT CELL [CELL ...]      (from the repository root)
# Frontier cells (5,000 released images): dpdm-6-epochs dpdm-12-epochs dpdm-26-epochs dpdm-wide-6-epochs
#   dpdm-6-epochs-no-noise dpdm-12-epochs-no-noise dpdm-26-epochs-no-noise pdp-diffusion-26-epochs
# Lever cells (the cpu protocol: 20,000 released images; DPDM's cpu preset at equal CPU time, one lever changed):
#   lever-LEVER-epsE with E in 1, 10, inf and LEVER one of base k4 k8 b256 b1024 b2048 levels public public-part
#   ldm-public ldm-public-attention (DP-LDM's cpu preset from the public latent glyph model, all of it or its attention)
# Every cell but `levels` draws t uniformly, as the cpu preset did when they were measured; `levels` is the preset's
# log-normal noise levels.
set -euo pipefail
python=${PYTHON:-.venv/bin/python}
[ $# -ge 2 ] || { sed -n 6,12p "$0" >&2; exit 2; }
root=$1
shift
glyphs=benchmarks/results/cpu-zen4/public/pdp-diffusion-fashion-mnist  # the bench record's public glyph model
# the same, on the default autoencoder's latents: dpsynth pretrain --for dp-ldm --preset cpu --dataset glyphs
#   --iterations 2000 --set dataset.resolution=28 --set dataset.channels=1 --out $latent_glyphs
latent_glyphs=benchmarks/results/cpu-dp-ldm/public/glyphs-latents-28

lever() {  # sets method and extra for one lever; the preset's K = 1 at batch 512 for 6 epochs is the base
    case $1 in
        base) ;;
        # K x the rows: steps / K, and chunks of 128 rows as K = 1's (K = 4 in chunks of 128 examples took 13 s a
        # step instead of 4 x 1.8 on the AMX Xeon)
        k4) extra=(--set dpsgd.noise_multiplicity=4 --set dpsgd.epochs=1.5 --set dpsgd.physical_batch_size=32) ;;
        k8) extra=(--set dpsgd.noise_multiplicity=8 --set dpsgd.epochs=0.75 --set dpsgd.physical_batch_size=16) ;;
        b256|b1024|b2048) extra=(--set "dpsgd.batch_size=${1#b}") ;;             # same epochs: same rows
        levels) uniform=() ;;  # the cpu preset's levels: ln sigma ~ N(0.5, 1.2^2)
        public) method=pdp-diffusion extra=(--set "model.init_from=$glyphs") ;;
        public-part) method=pdp-diffusion
            extra=(--set "model.init_from=$glyphs" --set "model.trainable=[norms, biases, attention, class_embedding]") ;;
        ldm-public) method=dp-ldm uniform=() extra=(--set "model.init_from=$latent_glyphs") ;;
        ldm-public-attention) method=dp-ldm uniform=()
            extra=(--set "model.init_from=$latent_glyphs" --set "model.trainable=[attention]") ;;
        *) return 1 ;;
    esac
}

for cell in "$@"; do
    method=dpdm epsilon=10 extra=() protocol=(--set sampling.num_samples=5000 --set "evaluation.classifiers=[cnn]")
    uniform=(--set diffusion.noise_levels=uniform --set diffusion.noise_level_mean=-1.2)  # t uniform, as measured
    case $cell in
        dpdm-6-epochs) extra=(--set dpsgd.epochs=6) ;;
        dpdm-12-epochs) extra=(--set dpsgd.epochs=12) ;;
        dpdm-26-epochs) extra=(--set dpsgd.epochs=26) ;;
        dpdm-wide-6-epochs) extra=(--set dpsgd.epochs=6 --set "model.block_channels=[32, 64, 64]") ;;
        dpdm-6-epochs-no-noise) epsilon=inf extra=(--set dpsgd.epochs=6 --set run.allow_non_private=true) ;;
        dpdm-12-epochs-no-noise) epsilon=inf extra=(--set dpsgd.epochs=12 --set run.allow_non_private=true) ;;
        dpdm-26-epochs-no-noise) epsilon=inf extra=(--set dpsgd.epochs=26 --set run.allow_non_private=true) ;;
        pdp-diffusion-26-epochs) method=pdp-diffusion extra=(--set dpsgd.epochs=26 --set "model.init_from=$glyphs") ;;
        lever-*-eps1|lever-*-eps10|lever-*-epsinf)
            name=${cell#lever-} epsilon=${cell##*-eps} protocol=()
            lever "${name%-eps*}" || { echo "unknown lever in '$cell'" >&2; exit 2; }
            [ "$epsilon" = inf ] && extra+=(--set run.allow_non_private=true) ;;
        *) echo "unknown frontier cell '$cell'; see: sed -n 6,12p $0" >&2
           exit 2 ;;
    esac
    "$python" -m dpsynth bench --methods "$method" --datasets fashion-mnist --epsilons "$epsilon" --preset cpu \
        --out "$root/$cell" "${protocol[@]}" "${uniform[@]}" "${extra[@]}"
done
