#!/usr/bin/env bash
# Idempotent set-up on a fresh Debian machine, as root: system packages, a virtual environment in .venv,
# the CPU build of PyTorch (pinned first, so no dependency pulls a multi-GB CUDA build), then dpsynth.
# --tests adds what only the test suite needs: Debian's chromium (the report test opens report.html in it),
# pytest and pytest-xdist, Opacus, MkDocs and mkdocstrings.
# DPSYNTH_TORCH names another PyTorch requirement, e.g. DPSYNTH_TORCH=torch==2.13.0 for PyPI's CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
for_tests=false
[ "${1:-}" = "--tests" ] && for_tests=true

apt_packages=()
if $for_tests; then
    command -v chromium >/dev/null 2>&1 || apt_packages+=(chromium)
fi
dpkg -s dataset-fashion-mnist >/dev/null 2>&1 || apt_packages+=(dataset-fashion-mnist)
for font in fonts-dejavu-core fonts-liberation fonts-freefont-ttf; do  # PE's text-rendering API
    dpkg -s "$font" >/dev/null 2>&1 || apt_packages+=("$font")
done
python3 -c "import ensurepip, venv" >/dev/null 2>&1 || apt_packages+=(python3-venv)
if [ ${#apt_packages[@]} -gt 0 ]; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq "${apt_packages[@]}" >/dev/null
fi

[ -x .venv/bin/python ] || python3 -m venv .venv
torch_requirement="${DPSYNTH_TORCH:-torch==2.13.0+cpu}"
# The CPU build is not on PyPI: a local copy (pip's find-links) or PyTorch's CPU index has it.
.venv/bin/python -m pip install -q --disable-pip-version-check "$torch_requirement" 2>/dev/null \
    || .venv/bin/python -m pip install -q --disable-pip-version-check "$torch_requirement" \
        --index-url https://download.pytorch.org/whl/cpu
if $for_tests; then
    .venv/bin/python -m pip install -q --disable-pip-version-check -e ".[test,docs]"
else
    .venv/bin/python -m pip install -q --disable-pip-version-check -e .
fi
echo "dpsynth is set up: .venv/bin/dpsynth --help"
