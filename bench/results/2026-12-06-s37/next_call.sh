#!/usr/bin/env bash
# The next session's first device call (written in session 37; carry .whl; ask for an H200: every failure before
# session 37's barrier fix was on one). NOTES "Next device session (plan, written after session 37)".
#   flake   flake_where.py (session 36's): the 8bit route forced on (FORGE_NUM_GLUON_Q8=1: the staged deep cursor
#           at 1024 tokens; 8 of 24 parted before the fix, on an H200) and the fp32 wide model with v46 forced
#           (1 of 16 before, on an H200); four processes x 6 runs each
#   graphs  tests/test_gpu_graphs.py with the 8bit Gluon route on
#   f32small v46 beside the default at 256-1024 tokens on issue 5's shapes with the unfused step and the floor (as
#           session 37's call 2 on the H100)
PART=${PART:-flake,graphs,f32small}
source bench/device_call.sh
call_begin
part_flake() {
  FORGE_NUM_GLUON_Q8=1 flake q8route 4 6
  FORGE_NUM_GLUON_F32=wsf_64x128x64_st4_w16_rows16_mma96_r96_sl_cur_ss2 flake f32ss2 4 6 --precision fp32
}
part_graphs() {
  FORGE_NUM_GLUON_Q8=1 timeout "$(budget 200)" python3 -m pytest -q -m gpu -n 4 tests/test_gpu_graphs.py \
    >"$R/graphs.log" 2>&1
  echo "graphs rc=$?"; grep -E "^FAILED|passed|failed" "$R/graphs.log" | cut -c1-200 | tail -6
}
part_f32small() {
  local D=wsf_64x128x64_st4_w16_rows16_mma96_r96_sl_cur
  timeout "$(budget 240)" python3 bench/kernels.py --precision fp32 --rounds 3 --configs "$D,${D}_ss2" \
    --shapes 4096x4096,14336x4096,4096x14336,8192x8192,28672x8192 --tokens 256,512,768,1024 \
    --out "$R/f32small.json" >"$R/f32small.log" 2>&1
  echo "f32small rc=$?"; kern_table "$R/f32small.json"
}
for part in ${PART//,/ }; do "part_$part"; done
call_end
exit 0
