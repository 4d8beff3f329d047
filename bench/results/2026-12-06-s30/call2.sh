#!/usr/bin/env bash
# Session 30, call 2 (carry .whl): the 8bit Gluon tiles at 2048 tokens, where no route sends an update
# today (gluon_q8.config_for: the sixteen-warp tile at 1024-2047, the default at 4096-8191), and the 8B
# 1x2048 step with each forced; the fixed bf16 capture test; the 1x1024 / 1x2048 steps retimed with
# one_sequence_per_row.
#   check    pytest -m gpu tests/test_gpu_graphs.py -k bf16 (the whole step under the math backend now)
#   kernels  bench/kernels.py --precision 8bit, Llama-8B's layer shapes at 2048 tokens, the Gluon tiles
#   train8b  8B 1x2048: forge_8bit+graph with FORGE_NUM_GLUON_Q8 unset (Triton), =<wide>, =<default>
#   cand     the two Gluon candidates never run (cur, pf) at 2048 tokens, after the rest that matters
#   small    3B 1x1024 and 1B 1x2048, the four methods, in what time is left
set -uo pipefail
PART=${PART:-check,kernels,train8b,cand,small}
DEADLINE=$((SECONDS + ${CALL_BUDGET_S:-570}))
budget() { local left=$((DEADLINE - SECONDS)); echo $(( $1 < left ? $1 : (left > 5 ? left : 5) )); }
OUT=${OUT:-out}; R=/tmp/s30; rm -rf "$R"; mkdir -p "$R" "$OUT"
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . >"$R/install.log" 2>&1 || { cat "$R/install.log"; exit 1; }
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/flashoptim-0.1.4-py3-none-any.whl >>"$R/install.log" 2>&1
python3 -m pip install -q --no-index --no-deps .whl/execnet-*.whl .whl/pytest_xdist-*.whl >>"$R/install.log" 2>&1
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python3 -c "import torch, triton, transformers; print('torch', torch.__version__, 'triton', triton.__version__, \
'transformers', transformers.__version__)"; git rev-parse HEAD 2>/dev/null; date -u; } 2>&1 | tee "$R/env.txt"
WIDE=ws8_64x128x64_st3_w16_rows16_mma96_r96_sl
DEF=ws8_64x128x64_st4_w8_rows16_mma104_r128
part_check() {
  echo "== check $(date -u +%T)"
  timeout "$(budget 100)" python3 -m pytest -m gpu -v -rA -p no:cacheprovider -n 2 tests/test_gpu_graphs.py -k bf16 \
    >"$R/check.log" 2>&1
  echo "check rc=$?"
  grep -E "^(FAILED|ERROR|SKIPPED|PASSED)|passed|failed" "$R/check.log" | cut -c1-300 | tail -8
  grep -E "^E  .*(Error|assert)" "$R/check.log" | sort | uniq -c | sort -rn | head -4 | cut -c1-300
}
kern() {  # $1 tag, $2 seconds, $3 configs
  echo "== kernels $1 $(date -u +%T)"
  timeout "$(budget "$2")" python3 bench/kernels.py --precision 8bit --shapes 4096x4096,1024x4096,14336x4096,4096x14336 \
    --tokens 2048 --configs "$3" --out "$R/$1.json" >"$R/$1.log" 2>&1
  echo "$1 rc=$?"; tail -12 "$R/$1.log" | cut -c1-220
}
part_kernels() { kern kernels 170 "$DEF,$WIDE"; }
part_cand() { kern cand 120 "ws8_64x128x64_st3_w16_rows16_mma96_r96_sl_cur,ws8_64x128x64_st4_w8_rows16_mma104_r128_pf"; }
train() {  # $1 tag, $2 seconds, $3 FORGE_NUM_GLUON_Q8 (- for unset), the rest: train_step.py's arguments
  local tag=$1 secs=$2 flag=$3; shift 3
  echo "== $tag $(date -u +%T)"
  ( [ "$flag" != - ] && export FORGE_NUM_GLUON_Q8=$flag
    PYTHONPATH=/tmp/site timeout "$(budget "$secs")" python3 bench/train_step.py --checkpointing on --warmup 3 \
      --steps 4 --budget-s "$(( $(budget "$secs") - 30 ))" --out "$R/$tag.json" "$@" >"$R/$tag.log" 2>&1 )
  echo "$tag rc=$?"; grep -E "^(forge|flash|torch)|rror|ran;" "$R/$tag.log" | cut -c1-200
}
part_train8b() {
  train train8b_triton 90 - --methods forge_8bit+graph,flashoptim+cl --models llama-8b --tokens 1x2048
  train train8b_wide 60 "$WIDE" --methods forge_8bit+graph --models llama-8b --tokens 1x2048
  train train8b_def 60 "$DEF" --methods forge_8bit+graph --models llama-8b --tokens 1x2048
}
M4=forge_8bit+graph,flashoptim+cl,forge+graph,torch_adamw
part_small() {
  train small3b 90 - --methods "$M4" --models llama-3b --tokens 1x1024
  train small1b 70 - --methods "$M4" --models llama-1b --tokens 1x2048
}
for part in ${PART//,/ }; do "part_$part"; done
echo "== done $(date -u +%T)"
date -u >>"$R/env.txt"
tar czf "$OUT/results.tgz" -C "$R" . ; cp "$R/env.txt" "$OUT/"
exit 0
