#!/usr/bin/env bash
# Session 31, call 4 (carry .whl): the Gluon default 8bit tile above 8192 tokens, where the launcher takes the
# Triton tiles (call 3: at 8192 the Gluon default took 0.78-0.84x their time).
#   kern     the default beside the launcher's pick (the Triton tile) at 12288 and 16384 tokens
#   train    1B and 3B 8x2048 forge_8bit+graph routed (Triton above 8192), then with the default forced
set -uo pipefail
PART=${PART:-kern,train}
DEADLINE=$((SECONDS + ${CALL_BUDGET_S:-400}))
budget() { local left=$((DEADLINE - SECONDS)); echo $(( $1 < left ? $1 : (left > 5 ? left : 5) )); }
OUT=${OUT:-out}; R=/tmp/fn_call; rm -rf "$R"; mkdir -p "$R" "$OUT"
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . >"$R/install.log" 2>&1 || { cat "$R/install.log"; exit 1; }
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"; date -u; } 2>&1 \
  | tee "$R/env.txt"
DEF=ws8_64x128x64_st4_w8_rows16_mma104_r128
part_kern() {
  echo "== kern $(date -u +%T)"
  timeout "$(budget 100)" python3 bench/kernels.py --precision 8bit --configs "$DEF" \
    --shapes 4096x14336,14336x4096,4096x4096 --tokens 12288,16384 --out "$R/kern.json" >"$R/kern.log" 2>&1
  echo "kern rc=$?"; grep -E "^8bit" "$R/kern.log" | cut -c1-200
}
train() {  # $1 tag, $2 seconds, $3 FORGE_NUM_GLUON_Q8 (- for unset), the rest: train_step.py's arguments
  local tag=$1 secs=$2 flag=$3; shift 3
  echo "== $tag $(date -u +%T) FORGE_NUM_GLUON_Q8=$flag"
  ( [ "$flag" != - ] && export FORGE_NUM_GLUON_Q8=$flag
    timeout "$(budget "$secs")" python3 bench/train_step.py --checkpointing on --warmup 3 \
      --steps 4 --budget-s "$(( $(budget "$secs") - 15 ))" --out "$R/$tag.json" "$@" >"$R/$tag.log" 2>&1 )
  echo "$tag rc=$?"; grep -E "^(forge|flash|torch)|rror|ran;" "$R/$tag.log" | cut -c1-200
}
part_train() {
  train big_routed 120 - --methods forge_8bit+graph --models llama-1b,llama-3b --tokens 8x2048
  train big_def 120 "$DEF" --methods forge_8bit+graph --models llama-1b,llama-3b --tokens 8x2048
}
for part in ${PART//,/ }; do "part_$part"; done
echo "== done $(date -u +%T)"
date -u >>"$R/env.txt"
tar czf "$OUT/results.tgz" -C "$R" . ; cp "$R/env.txt" "$OUT/"
exit 0
