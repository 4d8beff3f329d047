#!/usr/bin/env bash
# Session 39's third call (carry .whl), on the route patch of session 38 applied: what calls 1-2
# (bench/results/2026-12-07-s38/call.sh) left open.
#   routes  the route tests again (the routed-layer test now expects config_for's tile at 256 tokens, v46)
#   f32kern the full fp32 table (bench/kernels.py --configs none failed on an empty tile list in call 2)
#   flake   v46 forced, 2 processes x 12 runs (3 of an H100's 80 GB ran out of memory in call 1, 2 of 3)
PART=${PART:-routes,flake,f32kern}
source bench/device_call.sh
call_begin
part_routes() {
  timeout "$(budget 120)" python3 -m pytest -q -m gpu -n 4 tests/test_verify.py tests/test_gpu_gluon.py \
    -k "the_launcher_routes or step_slot or routed_layer or verify or launcher_tile" >"$R/routes.log" 2>&1
  echo "routes rc=$?"; grep -E "^FAILED|passed|failed" "$R/routes.log" | cut -c1-200 | tail -6
}
part_flake() {
  FORGE_NUM_GLUON_F32=wsf_64x128x64_st4_w16_rows16_mma96_r96_sl_cur_ss2 flake f32ss2 2 12 --precision fp32
}
part_f32kern() {
  timeout "$(budget 240)" python3 bench/kernels.py --precision fp32 --rounds 2 --configs none \
    --out "$R/f32kern.json" >"$R/f32kern.log" 2>&1
  echo "f32kern rc=$?"; grep -E "^fp32" "$R/f32kern.log" | cut -c1-150 | tail -40
}
for part in ${PART//,/ }; do "part_$part"; done
call_end
exit 0
