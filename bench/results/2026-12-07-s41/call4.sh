#!/usr/bin/env bash
# Session 41's fourth call (carry .whl), on the tree with v49 routed (kernels/gluon_f32.py ROUTE_BY_K: v46 from 256
# tokens, its GROUP_M = 16 twin from 640, the default's from 896, v47 from 2304) and v49b added (v47 with GROUP_M
# = 16 and 32). PART picks parts, in this order by default; each prints a short table, the logs go to $OUT.
#   exact    the route tests (the launcher's tile bit for bit) and v49b's tiles bit for bit
#            (tests/test_gpu_gluon.py)
#   tall     v47 against v49b's two twins at 2560-16384 tokens, issue 5's five shapes, 3 interleaved rounds
#   flake    the flake case (the wide model trained eager and captured, compared bit for bit) on the new route
#            (its 1024 tokens now take the grouped default), 2 processes x 3 runs
#   route    the route, the unfused step and the floor at 256-2048 tokens, 2 rounds (README's table)
#   train3b  Llama-3B 4x1024 fp32 step, captured, checkpointing, against torch AdamW with AMP
PART=${PART:-exact,tall,flake,route,train3b}
source bench/device_call.sh
call_begin
T8=wsf_128x128x64_st4_w8_rows8_mma96_r128_sl_cur_gb1
T8G() { echo "wsf_128x128x64_st4_w8_rows8_g$1_mma96_r128_sl_cur_gb1"; }
SHAPES=4096x4096,14336x4096,4096x14336,8192x8192,28672x8192
part_exact() {
  timeout "$(budget 100)" python3 -m pytest -q -m gpu -n 4 tests/test_gpu_gluon.py \
    -k "route or routed or (test_f32_split_kernel_gives and rows8 and (g16 or g32))" >"$R/exact.log" 2>&1
  echo "exact rc=$?"; grep -E "^FAILED|passed|failed" "$R/exact.log" | cut -c1-200 | tail -6
}
part_tall() {
  timeout "$(budget 200)" python3 bench/kernels.py --precision fp32 --rounds 3 --configs "$T8,$(T8G 16),$(T8G 32)" \
    --shapes $SHAPES --tokens 2560,4096,8192,16384 --out "$R/tall.json" >"$R/tall.log" 2>&1
  echo "tall rc=$?"; kern_table "$R/tall.json"
}
part_flake() {
  flake f32v49 2 3 --precision fp32
}
part_route() {
  timeout "$(budget 90)" python3 bench/kernels.py --precision fp32 --rounds 2 --configs none --shapes $SHAPES \
    --tokens 256,512,768,1024,1536,2048 --out "$R/route.json" >"$R/route.log" 2>&1
  echo "route rc=$?"; grep -E "^fp32" "$R/route.log" | cut -c1-130
}
part_train3b() {
  train f32step3b 150 - --methods forge+graph,torch_adamw --models llama-3b --tokens 4x1024
}
for part in ${PART//,/ }; do "part_$part"; done
call_end
exit 0
