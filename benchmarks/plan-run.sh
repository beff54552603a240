#!/usr/bin/env bash
# One measured run of a derived plan (--preset auto): `dpsynth run ARGS` (`dpsynth rehearse ARGS` with
# COMMAND=rehearse) in ROOT/NAME, its whole wall time (the
# probe, training, sampling and evaluation) in ROOT/NAME/wall.txt and the machine type in ROOT/NAME/machine.txt,
# for the docs' table of expected against measured times (dpsynth.bench.plans). A plan refused for a budget too short
# is a finished measurement too (its run.out names the budget that would do). A finished NAME is not repeated.
# Run it alone on the machine: its time is the measurement.
#
# Usage: [COMMAND=rehearse] bash benchmarks/plan-run.sh ROOT NAME METHOD [dpsynth run options ...]   (from the repository root)
set -euo pipefail
python=${PYTHON:-.venv/bin/python} command=${COMMAND:-run}
[ $# -ge 3 ] || { sed -n 9p "$0" >&2; exit 2; }
root=$1 name=$2
shift 2
out=$root/$name
if [ -f "$out/wall.txt" ]; then echo "$out: measured already"; exit 0; fi
mkdir -p "$out"
"$python" -c "from dpsynth.bench.results import machine_type; print(machine_type())" > "$out/machine.txt"
start=$(date +%s)
if ! TQDM_MININTERVAL=30 "$python" -m dpsynth "$command" "$@" --set "run.out_dir=$out" > "$out/run.out" 2>&1; then
    grep -q "is too short on this machine" "$out/run.out" || { tail -5 "$out/run.out" >&2; exit 1; }
fi
echo $(( $(date +%s) - start )) > "$out/wall.txt"
