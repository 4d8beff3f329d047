#!/usr/bin/env bash
# Session 34, call 6 (carry .whl): the route with v44's staged deep cursor (MMA_STAGED_CONFIG) from 1024 to 3071
# tokens, its steps against the tiles routed there before, forced (the cursor at 2048-3071, the sixteen-warp
# tile at 1024-2047), and FlashOptim beside them; then the 8bit route tests on the GPU.
source bench/device_call.sh
call_begin
CUR=ws8_64x128x64_st3_w16_rows16_mma96_r96_sl_cur
WIDE=ws8_64x128x64_st3_w16_rows16_mma96_r96_sl
ARGS8="--models llama-8b --tokens 1x2048 --steps 5"
ARGS3="--models llama-3b --tokens 1x1024 --steps 6"
train r8 45 - --methods forge_8bit+cl+graph $ARGS8
train cur8 45 "$CUR" --methods forge_8bit+cl+graph $ARGS8
train r3 40 - --methods forge_8bit+cl+graph $ARGS3
train wide3 40 "$WIDE" --methods forge_8bit+cl+graph $ARGS3
echo "== routes $(date -u +%T)"
FORGE_NUM_TEST_Q8_ROUTED=1 timeout "$(budget 80)" python3 -m pytest -q -m gpu -n 8 tests/test_gpu_gluon.py \
  -k "8bit and rout" >"$R/routes.log" 2>&1
echo "routes rc=$?"; tail -3 "$R/routes.log" | cut -c1-200
train fo8 45 - --methods flashoptim+cl $ARGS8
train fo3 40 - --methods flashoptim+cl $ARGS3
call_end
exit 0
