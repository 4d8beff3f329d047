#!/usr/bin/env bash
# Session 31, call 5 (carry .whl): v40, the 8bit route with the Gluon default from 5120 to 16384 tokens.
#   routes   the launcher's 8bit route at 1024, 2048, 3072, 4096 and 8192 tokens (bits of each path, cached
#            launches) and the routed tiles reading a step slot (tests/test_gpu_gluon.py)
#   big      1B and 3B 8x2048 forge_8bit+graph routed (the default tile at 16384 tokens now)
set -uo pipefail
PART=${PART:-routes,big}
DEADLINE=$((SECONDS + ${CALL_BUDGET_S:-300}))
budget() { local left=$((DEADLINE - SECONDS)); echo $(( $1 < left ? $1 : (left > 5 ? left : 5) )); }
OUT=${OUT:-out}; R=/tmp/fn_call; rm -rf "$R"; mkdir -p "$R" "$OUT"
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . >"$R/install.log" 2>&1 || { cat "$R/install.log"; exit 1; }
python3 -m pip install -q --no-index --no-deps .whl/execnet-*.whl .whl/pytest_xdist-*.whl >>"$R/install.log" 2>&1
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"; date -u; } 2>&1 \
  | tee "$R/env.txt"
part_routes() {
  echo "== routes $(date -u +%T)"
  timeout "$(budget 150)" python3 -m pytest -v -rA -p no:cacheprovider -n 6 tests/test_gpu_gluon.py \
    -k "routes_8bit or (step_slot and 8bit)" >"$R/routes.log" 2>&1
  echo "routes rc=$?"
  grep -E "^(FAILED|ERROR)|passed|failed" "$R/routes.log" | cut -c1-300 | tail -8
}
part_big() {
  echo "== big $(date -u +%T)"
  timeout "$(budget 130)" python3 bench/train_step.py --checkpointing on --warmup 3 --steps 4 \
    --budget-s "$(( $(budget 130) - 15 ))" --out "$R/big.json" --methods forge_8bit+graph \
    --models llama-1b,llama-3b --tokens 8x2048 >"$R/big.log" 2>&1
  echo "big rc=$?"; grep -E "^(forge|flash|torch)|rror|ran;" "$R/big.log" | cut -c1-200
}
for part in ${PART//,/ }; do "part_$part"; done
echo "== done $(date -u +%T)"
date -u >>"$R/env.txt"
tar czf "$OUT/results.tgz" -C "$R" . ; cp "$R/env.txt" "$OUT/"
exit 0
