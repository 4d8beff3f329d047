#!/usr/bin/env bash
# A/B of the training step: an older build of forge_num (a wheel) beside the working tree's, in one
# device call, so that the two are measured on the same machine within minutes of each other.
#
#   bash bench/ab_train.sh WHEEL OUTDIR [train_step.py arguments...]
#
# Runs, in this order, B (working tree), A (the wheel), B again, each method list in a fresh
# train_step.py; the JSON of each goes to OUTDIR/ab_{B1,A,B2}.json, and meta.forge_num_path in each
# names the package that ran. The wheel is installed with --target into a private directory that
# goes first on PYTHONPATH, and train_step.py runs from a copy outside the repository (run from the
# repository, it puts the repository root first on sys.path).
set -uo pipefail
WHEEL=$1; OUTDIR=$2; shift 2
mkdir -p "$OUTDIR"
A=/tmp/forge_ab; rm -rf "$A"; mkdir -p "$A/site" "$A/bench"
python3 -m pip install -q --no-index --no-deps --no-compile --target "$A/site" "$WHEEL" || exit 1
cp bench/train_step.py "$A/bench/"
BASE=${PYTHONPATH:-}
run_b() { local l=$1; shift; echo "== $l $(date -u +%H:%M:%S)"; PYTHONPATH="$BASE" python3 bench/train_step.py "$@" --out "$OUTDIR/ab_$l.json" 2>&1 | tail -8; }
run_a() { local l=$1; shift; echo "== $l $(date -u +%H:%M:%S)"; PYTHONPATH="$A/site${BASE:+:$BASE}" python3 "$A/bench/train_step.py" "$@" --out "$OUTDIR/ab_$l.json" 2>&1 | tail -8; }
run_b B1 "$@"
run_a A "$@"
run_b B2 "$@"
