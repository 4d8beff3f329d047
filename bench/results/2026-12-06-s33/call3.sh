#!/usr/bin/env bash
# Session 33's third device call (carry .whl). NOTES "Session 33".
#   graphs   tests/test_gpu_graphs.py with the capture's memory fix (one warm-up stream, cuBLAS workspaces
#            cleared before the capture) and its new test
#   residue  Llama-1B 4x1024: forge_8bit+cl eager beside forge_8bit+cl+graph, the capturing call's residue
#   train3b  Llama-3B 4x1024 (every update at K = 4096): forge_8bit+graph routed (since 8de977b the K-block-128
#            cursor), with the deep cursor forced (the route before), and flashoptim+cl, side by side
#   train1b  Llama-1B 4x1024: forge_8bit+cl+graph with the deep cursor forced beside flashoptim+cl (the routed
#            step: residue's)
set -uo pipefail
PART=${PART:-graphs,residue,train3b,train1b}
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
DEEP=ws8_64x128x64_st4_w16_rows16_mma96_r96_sl_cur
part_graphs() {
  echo "== graphs $(date -u +%T)"
  timeout "$(budget 110)" python3 -m pytest -v -p no:cacheprovider -n 4 -m "gpu or exactness" tests/test_gpu_graphs.py \
    >"$R/graphs.log" 2>&1
  echo "graphs rc=$?"
  grep -E " (FAILED|ERROR) |passed|failed|assert" "$R/graphs.log" | cut -c1-300 | tail -8
}
train() {  # $1 tag, $2 seconds, $3 FORGE_NUM_GLUON_Q8 (- for unset), the rest: train_step.py's arguments
  local tag=$1 secs=$2 flag=$3; shift 3
  echo "== $tag $(date -u +%T) FORGE_NUM_GLUON_Q8=$flag"
  ( [ "$flag" != - ] && export FORGE_NUM_GLUON_Q8=$flag
    PYTHONPATH=/tmp/site timeout "$(budget "$secs")" python3 bench/train_step.py --checkpointing on --warmup 3 \
      --budget-s "$(( $(budget "$secs") - 20 ))" --out "$R/$tag.json" "$@" >"$R/$tag.log" 2>&1 )
  echo "$tag rc=$?"; grep -vE "^#|^$|^ratios" "$R/$tag.log" | cut -c1-220 | tail -24
}
part_residue() {
  train residue 100 - --methods forge_8bit+cl,forge_8bit+cl+graph --models llama-1b --tokens 4x1024 --steps 4 \
    --capture-history sizes
}
part_train3b() {
  train train3b_routed 140 - --methods forge_8bit+graph,flashoptim+cl --models llama-3b --tokens 4x1024 --steps 5
  train train3b_deep 70 "$DEEP" --methods forge_8bit+graph --models llama-3b --tokens 4x1024 --steps 5
}
part_train1b() {
  train train1b_deep 80 "$DEEP" --methods forge_8bit+cl+graph,flashoptim+cl --models llama-1b --tokens 4x1024 \
    --steps 5
}
for part in ${PART//,/ }; do "part_$part"; done
echo "== done $(date -u +%T)"
date -u >>"$R/env.txt"
tar czf "$OUT/results.tgz" -C "$R" . ; cp "$R/env.txt" "$OUT/"
exit 0
