#!/usr/bin/env bash
# Session 31, call 3 (carry .whl): v39, the four-stage cursor routed at 3072-8191 tokens (gluon_q8.ROUTE_BY_K).
#   routes   the launcher's 8bit route at 1024, 2048, 3072 and 4096 tokens (bits of each path, cached launches)
#            and the routed tiles reading a step slot (tests/test_gpu_gluon.py)
#   kern     the deep cursor beside the default at 6144 and 8192 tokens (the route's unmeasured top; at 8192
#            the launcher's pick is the Triton tile)
#   train3b  3B 4x1024: forge_8bit+graph (the route now) beside flashoptim+cl
#   train1b  1B 4x1024: forge_8bit+graph, forge_8bit+cl+graph, flashoptim+cl
set -uo pipefail
PART=${PART:-routes,kern,train3b,train1b}
DEADLINE=$((SECONDS + ${CALL_BUDGET_S:-480}))
budget() { local left=$((DEADLINE - SECONDS)); echo $(( $1 < left ? $1 : (left > 5 ? left : 5) )); }
OUT=${OUT:-out}; R=/tmp/fn_call; rm -rf "$R"; mkdir -p "$R" "$OUT"
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . >"$R/install.log" 2>&1 || { cat "$R/install.log"; exit 1; }
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/flashoptim-0.1.4-py3-none-any.whl >>"$R/install.log" 2>&1
python3 -m pip install -q --no-index --no-deps .whl/execnet-*.whl .whl/pytest_xdist-*.whl >>"$R/install.log" 2>&1
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python3 -c "import torch, triton, transformers; print('torch', torch.__version__, 'triton', triton.__version__, \
'transformers', transformers.__version__)"; date -u; } 2>&1 | tee "$R/env.txt"
DEF=ws8_64x128x64_st4_w8_rows16_mma104_r128
DEEP=ws8_64x128x64_st4_w16_rows16_mma96_r96_sl_cur
part_routes() {
  echo "== routes $(date -u +%T)"
  timeout "$(budget 150)" python3 -m pytest -v -rA -p no:cacheprovider -n 6 tests/test_gpu_gluon.py \
    -k "routes_8bit or (step_slot and 8bit)" >"$R/routes.log" 2>&1
  echo "routes rc=$?"
  grep -E "^(FAILED|ERROR)|passed|failed" "$R/routes.log" | cut -c1-300 | tail -8
  grep -cE " PASSED" "$R/routes.log"
}
part_kern() {
  echo "== kern $(date -u +%T)"
  timeout "$(budget 90)" python3 bench/kernels.py --precision 8bit --configs "$DEF,$DEEP" \
    --shapes 4096x14336,14336x4096,4096x4096 --tokens 6144,8192 --out "$R/kern.json" >"$R/kern.log" 2>&1
  echo "kern rc=$?"; grep -E "^8bit" "$R/kern.log" | cut -c1-240
}
train() {  # $1 tag, $2 seconds, the rest: train_step.py's arguments
  local tag=$1 secs=$2; shift 2
  echo "== $tag $(date -u +%T)"
  PYTHONPATH=/tmp/site timeout "$(budget "$secs")" python3 bench/train_step.py --checkpointing on --warmup 3 \
    --steps 4 --budget-s "$(( $(budget "$secs") - 20 ))" --out "$R/$tag.json" "$@" >"$R/$tag.log" 2>&1
  echo "$tag rc=$?"; grep -E "^(forge|flash|torch)|rror|ran;" "$R/$tag.log" | cut -c1-200
}
part_train3b() { train train3b 110 --methods forge_8bit+graph,flashoptim+cl --models llama-3b --tokens 4x1024; }
part_train1b() {
  train train1b 90 --methods forge_8bit+graph,forge_8bit+cl+graph,flashoptim+cl --models llama-1b --tokens 4x1024
}
for part in ${PART//,/ }; do "part_$part"; done
echo "== done $(date -u +%T)"
date -u >>"$R/env.txt"
tar czf "$OUT/results.tgz" -C "$R" . ; cp "$R/env.txt" "$OUT/"
exit 0
