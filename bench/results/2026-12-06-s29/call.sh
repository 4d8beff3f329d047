#!/usr/bin/env bash
# Session 29's device calls (carry .whl). Parts, run in the order PART names them:
#   check   pytest -m gpu tests/test_gpu_graphs.py tests/test_gpu_training.py (v34: checkpointed segments
#           take the two-node form), beside bench/results/2026-12-06-s28/diag5.py run twice (as is, and
#           with CUBLAS_WORKSPACE_CONFIG=:4096:8)
#   train1b  v34's captured steps at 1B 4x1024 beside flashoptim+cl and torch AdamW AMP, checkpointing on
#   train3b  the same at 3B 4x1024, with --profile (where the device-bound step's time goes)
#   train8b  8B 1x2048: forge_8bit+graph beside flashoptim+cl
set -uo pipefail
PART=${PART:-check,train1b,train3b,train8b}
DEADLINE=$((SECONDS + ${CALL_BUDGET_S:-570}))
budget() { local left=$((DEADLINE - SECONDS)); echo $(( $1 < left ? $1 : (left > 5 ? left : 5) )); }
OUT=${OUT:-out}; R=/tmp/s29; rm -rf "$R"; mkdir -p "$R" "$OUT"
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . >"$R/install.log" 2>&1 || { cat "$R/install.log"; exit 1; }
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/flashoptim-0.1.4-py3-none-any.whl >>"$R/install.log" 2>&1
python3 -m pip install -q --no-index --no-deps .whl/execnet-*.whl .whl/pytest_xdist-*.whl >>"$R/install.log" 2>&1
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"; date -u; } | tee "$R/env.txt"
part_check() {
  echo "== check $(date -u +%T)"
  ( cd bench/results/2026-12-06-s28 && timeout "$(budget 150)" python3 diag5.py >"$R/diag5.log" 2>&1
    CUBLAS_WORKSPACE_CONFIG=:4096:8 timeout "$(budget 150)" python3 diag5.py >"$R/diag5_ws.log" 2>&1 ) &
  timeout "$(budget 240)" python3 -m pytest -m gpu -v -rA -p no:cacheprovider -n 8 tests/test_gpu_graphs.py \
    tests/test_gpu_training.py >"$R/check.log" 2>&1
  echo "check rc=$?"
  grep -E "^(FAILED|ERROR)|passed|failed" "$R/check.log" | cut -c1-300 | tail -20
  grep -E "^E  .*(Error|assert)" "$R/check.log" | sort | uniq -c | sort -rn | head -6 | cut -c1-300
  wait
  for f in diag5 diag5_ws; do echo "-- $f"; grep -vE "^\s*$|Warning|warn" "$R/$f.log" | cut -c1-300 | tail -25; done
}
train() {  # $1 tag, $2 seconds, the rest: train_step.py's arguments
  local tag=$1 secs=$2; shift 2
  echo "== $tag $(date -u +%T)"
  PYTHONPATH=/tmp/site timeout "$(budget "$secs")" python3 bench/train_step.py --checkpointing on --warmup 3 \
    --steps 4 --budget-s "$(( $(budget "$secs") - 40 ))" --out "$R/$tag.json" "$@" >"$R/$tag.log" 2>&1
  echo "$tag rc=$?"; grep -E "^(forge|flash|torch)|rror|ran;|profiled step" "$R/$tag.log" | cut -c1-260
}
M=forge_8bit+graph,flashoptim+cl,forge+graph,torch_adamw
part_train1b() { train train1b 130 --methods "$M" --models llama-1b --tokens 4x1024; }
part_train3b() { train train3b 200 --methods "$M" --models llama-3b --tokens 4x1024 --profile; }
part_train8b() { train train8b 110 --methods forge_8bit+graph,flashoptim+cl --models llama-8b --tokens 1x2048; }
for part in ${PART//,/ }; do "part_$part"; done
echo "== done $(date -u +%T)"
date -u >>"$R/env.txt"
tar czf "$OUT/results.tgz" -C "$R" . ; cp "$R/env.txt" "$OUT/"
exit 0
