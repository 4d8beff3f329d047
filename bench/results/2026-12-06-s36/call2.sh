#!/usr/bin/env bash
# Session 36's second device call (carry .whl): NOTES "Next device session (plan, written after session 35)",
# item 1's second call, with the default fp32 split tile's deeper rings beside it.
#   f32bits  the fp32 split tiles' GPU tests (tests/test_gpu_gluon.py -k f32), every candidate among them
#   f32kern  the 128-row split tile beside its one-buffer twins (four and five stages) at 3072-16384 tokens
#   f32small the default split tile beside its five- and six-stage twins and v46's staged tiles (W and the states
#            streamed through shared memory by TMA) at 256-2048 tokens
# each kern part with the route, the unfused step and the floor.
PART=${PART:-f32bits,f32kern,f32small}
source bench/device_call.sh
call_begin
TALL=wsf_128x128x64_st3_w8_rows16_mma96_r128_sl_cur
DEF=wsf_64x128x64_st4_w16_rows16_mma96_r96_sl_cur
SHAPES=4096x14336,14336x4096,4096x4096
part_f32bits() {
  timeout "$(budget 150)" python3 -m pytest -q -m gpu -n 8 tests/test_gpu_gluon.py -k f32 >"$R/f32bits.log" 2>&1
  echo "f32bits rc=$?"; grep -E "^FAILED|passed|failed" "$R/f32bits.log" | cut -c1-200 | tail -6
}
part_f32kern() {
  timeout "$(budget 150)" python3 bench/kernels.py --precision fp32 --rounds 2 \
    --configs "$TALL,${TALL/st3/st4}_gb1,${TALL/st3/st5}_gb1" --shapes $SHAPES \
    --tokens 3072,4096,8192,16384 --out "$R/f32kern.json" >"$R/f32kern.log" 2>&1
  echo "f32kern rc=$?"; kern_table "$R/f32kern.json"
}
part_f32small() {
  timeout "$(budget 200)" python3 bench/kernels.py --precision fp32 --rounds 2 \
    --configs "$DEF,${DEF/st4/st5},${DEF/st4/st6},${DEF/st4/st3}_ss3,${DEF}_ss2,${DEF}_gb1_ss3" --shapes $SHAPES \
    --tokens 256,1024,2048 --out "$R/f32small.json" >"$R/f32small.log" 2>&1
  echo "f32small rc=$?"; kern_table "$R/f32small.json"
}
for part in ${PART//,/ }; do "part_$part"; done
call_end
exit 0
