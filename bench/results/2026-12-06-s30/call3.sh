#!/usr/bin/env bash
# Session 30, call 3 (carry .whl): the cursor tile (gluon_q8.CURSOR_CONFIG), routed at 2048-4095 tokens
# since call 2 (0.81-0.84x the Triton tile at 2048): its bits, where else it is faster, and the 8B step.
#   tests    pytest tests/test_gpu_gluon.py: the cursor's and the prefetch tile's 8bit cases (bits against the
#            Triton 8bit tile and the emulator), every tile's shard / walk / non-finite checks, the routes
#   kernels  the cursor beside the default and the sixteen-warp tile at 1024 and 4096 tokens (their ranges),
#            and Llama-8B's head (128256x4096) at 2048
#   train8b  8B 1x2048, forge_8bit+graph (the cursor routed) beside flashoptim+cl
set -uo pipefail
PART=${PART:-tests,kernels,train8b}
DEADLINE=$((SECONDS + ${CALL_BUDGET_S:-570}))
budget() { local left=$((DEADLINE - SECONDS)); echo $(( $1 < left ? $1 : (left > 5 ? left : 5) )); }
OUT=${OUT:-out}; R=/tmp/s30; rm -rf "$R"; mkdir -p "$R" "$OUT"
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . >"$R/install.log" 2>&1 || { cat "$R/install.log"; exit 1; }
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/flashoptim-0.1.4-py3-none-any.whl >>"$R/install.log" 2>&1
python3 -m pip install -q --no-index --no-deps .whl/execnet-*.whl .whl/pytest_xdist-*.whl >>"$R/install.log" 2>&1
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python3 -c "import torch, triton, transformers; print('torch', torch.__version__, 'triton', triton.__version__, \
'transformers', transformers.__version__)"; date -u; } 2>&1 | tee "$R/env.txt"
WIDE=ws8_64x128x64_st3_w16_rows16_mma96_r96_sl
DEF=ws8_64x128x64_st4_w8_rows16_mma104_r128
CUR=ws8_64x128x64_st3_w16_rows16_mma96_r96_sl_cur
part_tests() {
  echo "== tests $(date -u +%T)"
  timeout "$(budget 200)" python3 -m pytest -m gpu -v -rA -p no:cacheprovider -n 6 tests/test_gpu_gluon.py \
    -k "8bit and (cur or pf or shards or routes)" >"$R/tests.log" 2>&1
  echo "tests rc=$?"
  grep -E "^(FAILED|ERROR)|passed|failed" "$R/tests.log" | cut -c1-300 | tail -12
  grep -E "^E  .*(Error|assert)" "$R/tests.log" | sort | uniq -c | sort -rn | head -4 | cut -c1-300
}
kern() {  # $1 tag, $2 seconds, $3 configs, the rest: bench/kernels.py's arguments
  local tag=$1 secs=$2 configs=$3; shift 3
  echo "== kernels $tag $(date -u +%T)"
  timeout "$(budget "$secs")" python3 bench/kernels.py --precision 8bit --configs "$configs" --out "$R/$tag.json" "$@" \
    >"$R/$tag.log" 2>&1
  echo "$tag rc=$?"; grep -E "^8bit" "$R/$tag.log" | cut -c1-150
}
part_kernels() {
  kern kernels 120 "$DEF,$WIDE,$CUR" --shapes 4096x14336,2048x8192,4096x4096 --tokens 1024,4096
  kern head 50 "$WIDE,$CUR" --shapes 128256x4096 --tokens 2048
}
part_train8b() {
  echo "== train8b $(date -u +%T)"
  PYTHONPATH=/tmp/site timeout "$(budget 120)" python3 bench/train_step.py --checkpointing on --warmup 3 --steps 4 \
    --budget-s "$(( $(budget 120) - 15 ))" --out "$R/train8b.json" --methods forge_8bit+graph,flashoptim+cl \
    --models llama-8b --tokens 1x2048 >"$R/train8b.log" 2>&1
  echo "train8b rc=$?"; grep -E "^(forge|flash|torch)|rror|ran;" "$R/train8b.log" | cut -c1-200
}
for part in ${PART//,/ }; do "part_$part"; done
echo "== done $(date -u +%T)"
date -u >>"$R/env.txt"
tar czf "$OUT/results.tgz" -C "$R" . ; cp "$R/env.txt" "$OUT/"
exit 0
