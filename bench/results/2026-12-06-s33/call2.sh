#!/usr/bin/env bash
# Session 33's second device call (carry .whl). NOTES "Session 33".
#   residue  the captured tied 8bit step at Llama-1B 4x1024 (forge_8bit+cl+graph): what the capturing call
#            leaves alive (held between replays), with Python stacks, beside the eager step's peak
#   bits     the unrouted 8bit Gluon candidates' bits with v41's stream (if call 1 did not finish them)
set -uo pipefail
PART=${PART:-residue}
DEADLINE=$((SECONDS + ${CALL_BUDGET_S:-570}))
budget() { local left=$((DEADLINE - SECONDS)); echo $(( $1 < left ? $1 : (left > 5 ? left : 5) )); }
OUT=${OUT:-out}; R=/tmp/fn_call; rm -rf "$R"; mkdir -p "$R" "$OUT"
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . >"$R/install.log" 2>&1 || { cat "$R/install.log"; exit 1; }
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/flashoptim-0.1.4-py3-none-any.whl >>"$R/install.log" 2>&1
python3 -m pip install -q --no-index --no-deps .whl/execnet-*.whl .whl/pytest_xdist-*.whl >>"$R/install.log" 2>&1
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python3 -c "import torch, triton, transformers; print('torch', torch.__version__, 'triton', triton.__version__, \
'transformers', transformers.__version__)"; date -u; } 2>&1 | tee "$R/env.txt"
train() {  # $1 tag, $2 seconds, the rest: train_step.py's arguments
  local tag=$1 secs=$2; shift 2
  echo "== $tag $(date -u +%T)"
  PYTHONPATH=/tmp/site timeout "$(budget "$secs")" python3 bench/train_step.py --checkpointing on --warmup 3 \
    --budget-s "$(( $(budget "$secs") - 20 ))" --out "$R/$tag.json" "$@" >"$R/$tag.log" 2>&1
  echo "$tag rc=$?"; grep -vE "^#|^$" "$R/$tag.log" | cut -c1-220 | tail -40
}
part_residue() {
  train residue 200 --methods forge_8bit+cl,forge_8bit+cl+graph --models llama-1b --tokens 4x1024 --steps 3 \
    --capture-history stacks
}
part_bits() {
  echo "== bits $(date -u +%T)"
  timeout "$(budget 300)" python3 -m pytest -v -p no:cacheprovider -n 10 -m "gpu or exactness" tests/test_gpu_gluon.py \
    -k "8bit" >"$R/bits.log" 2>&1
  echo "bits rc=$?"
  grep -cE " PASSED " "$R/bits.log"; grep -E " (FAILED|ERROR) |passed|failed" "$R/bits.log" | cut -c1-300 | tail -8
}
for part in ${PART//,/ }; do "part_$part"; done
echo "== done $(date -u +%T)"
date -u >>"$R/env.txt"
tar czf "$OUT/results.tgz" -C "$R" . ; cp "$R/env.txt" "$OUT/"
exit 0
