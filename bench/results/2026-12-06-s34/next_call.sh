#!/usr/bin/env bash
# The next session's first device call (written in session 34; carry .whl; bench/device_call.sh does the rest).
# NOTES "Next device session (plan, written after session 34)", items 1-2.
#   bits   the hand-over staged tile (msh, not yet run) against the Triton tile and the emulator; the launcher's
#          8bit route test and the captured steps (tests/test_gpu_graphs.py) with v44's route, which no GPU test
#          has run
#   kern   the cursor, the deep cursor, the staged deep cursor (routed at 1024-3071), its hand-over twin and the
#          K-block-128 cursor at 1024-4096 tokens, three interleaved rounds
#   train  call 6 of session 34, which found no machine: 8B 1x2048 and 3B 1x1024 routed against the tiles routed
#          there before, forced, and flashoptim+cl beside them
PART=${PART:-bits,kern,train}
source bench/device_call.sh
call_begin
CUR=ws8_64x128x64_st3_w16_rows16_mma96_r96_sl_cur
WIDE=ws8_64x128x64_st3_w16_rows16_mma96_r96_sl
DEEP=ws8_64x128x64_st4_w16_rows16_mma96_r96_sl_cur
K128=ws8_64x128x128_st3_w16_rows16_mma96_r96_sl_cur
part_bits() {
  echo "== bits $(date -u +%T)"
  FORGE_NUM_TEST_Q8_TILES="${DEEP}_msh" timeout "$(budget 110)" python3 -m pytest -q -m gpu -n 8 \
    tests/test_gpu_gluon.py -k 8bit >"$R/bits.log" 2>&1
  echo "bits rc=$?"; tail -2 "$R/bits.log" | cut -c1-200
  timeout "$(budget 60)" python3 -m pytest -q -m gpu -n 8 tests/test_gpu_gluon.py -k "8bit and rout" >"$R/routes.log" 2>&1
  echo "routes rc=$?"; tail -2 "$R/routes.log" | cut -c1-200
  timeout "$(budget 90)" python3 -m pytest -q -m gpu -n 8 tests/test_gpu_graphs.py >"$R/graphs.log" 2>&1
  echo "graphs rc=$?"; tail -2 "$R/graphs.log" | cut -c1-200
}
part_kern() {
  echo "== kern $(date -u +%T)"
  timeout "$(budget 130)" python3 bench/kernels.py --precision 8bit \
    --configs "$CUR,$DEEP,${DEEP}_ms,${DEEP}_msh,$K128" --rounds 3 --shapes 4096x14336,14336x4096,4096x4096 \
    --tokens 1024,2048,3072,4096 --out "$R/kern.json" >"$R/kern.log" 2>&1
  echo "kern rc=$?"
  kern_table "$R/kern.json"
}
part_train() {
  A8="--models llama-8b --tokens 1x2048 --steps 5"
  A3="--models llama-3b --tokens 1x1024 --steps 6"
  train r8 45 - --methods forge_8bit+cl+graph $A8
  train cur8 45 "$CUR" --methods forge_8bit+cl+graph $A8
  train r3 40 - --methods forge_8bit+cl+graph $A3
  train wide3 40 "$WIDE" --methods forge_8bit+cl+graph $A3
  train fo8 45 - --methods flashoptim+cl $A8
  train fo3 40 - --methods flashoptim+cl $A3
}
for part in ${PART//,/ }; do "part_$part"; done
call_end
exit 0
