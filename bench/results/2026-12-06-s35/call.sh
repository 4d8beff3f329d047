#!/usr/bin/env bash
# Session 35's device calls (carry .whl; bench/device_call.sh does the rest). NOTES "v45" and "Session 35, call 1".
#   f32bits  v45's fp32 split tiles (kernels/gluon_f32.py) against the Triton tile and the emulator, the launcher
#            naming one, and the step slot's launches (tests/test_gpu_gluon.py -k "f32 or step_slot")
#   routes   v44's 8bit route on the GPU: the launcher's 8bit route test and the captured steps against eager
#            (tests/test_gpu_graphs.py), not yet run with the staged deep cursor routed
#   f32kern  the fp32 split tiles beside the launcher's fp32 route, the unfused step and the floor, 1024-16384 tokens
#   q8bits   session 34's hand-over staged tile (msh) against the Triton tile and the emulator
#   q8kern   the cursor, the deep cursor, the staged deep cursor, its hand-over twin and the K-block-128 cursor at
#            1024-4096 tokens, three interleaved rounds (session 34's next_call.sh, part kern)
#   verify   (call 4, with v45's fp32 route and the staged deep cursor to 3583) the fp32 and 8bit route tests, the
#            step slot's launches, the routed training layer, and the captured steps against eager
#   f32train (call 4) 1B and 3B 4x1024 fp32 (forge+graph) routed, torch AdamW with AMP beside, and 3B with the split
#            tiles off (FORGE_NUM_GLUON_F32=0)
#   train    3B 4x1024 fp32 (forge+graph) routed against the best split tile forced (SPLIT, set by the caller),
#            and 8B 1x2048 8bit routed against the cursor forced, flashoptim+cl beside it
PART=${PART:-f32bits,routes,f32kern}
source bench/device_call.sh
call_begin
WSF=wsf_64x128x64_st4_w16_rows16_mma96_r96_sl_cur
WSF_PF=${WSF}_pf
WSF32=wsf_64x128x64_st4_w16_rows32_mma96_r96_sl_cur
WSF_LD=wsf_64x128x64_st4_w8_rows16_mma104_r128
TALL=wsf_128x128x64_st3_w8_rows16_mma96_r128_sl_cur
CUR=ws8_64x128x64_st3_w16_rows16_mma96_r96_sl_cur
DEEP=ws8_64x128x64_st4_w16_rows16_mma96_r96_sl_cur
K128=ws8_64x128x128_st3_w16_rows16_mma96_r96_sl_cur
part_f32bits() {
  echo "== f32bits $(date -u +%T)"
  timeout "$(budget 150)" python3 -m pytest -q -m gpu -n 8 tests/test_gpu_gluon.py -k "f32 or step_slot" \
    >"$R/f32bits.log" 2>&1
  echo "f32bits rc=$?"; grep -E "^FAILED|passed|failed" "$R/f32bits.log" | cut -c1-200 | tail -8
}
part_routes() {
  echo "== routes $(date -u +%T)"
  timeout "$(budget 60)" python3 -m pytest -q -m gpu -n 8 tests/test_gpu_gluon.py -k "8bit and rout" >"$R/routes.log" 2>&1
  echo "routes rc=$?"; tail -2 "$R/routes.log" | cut -c1-200
  timeout "$(budget 90)" python3 -m pytest -q -m gpu -n 8 tests/test_gpu_graphs.py >"$R/graphs.log" 2>&1
  echo "graphs rc=$?"; tail -2 "$R/graphs.log" | cut -c1-200
}
part_f32kern() {
  echo "== f32kern $(date -u +%T)"
  timeout "$(budget 150)" python3 bench/kernels.py --precision fp32 --configs "$WSF,$WSF_PF,$WSF32,$WSF_LD,${WSF_LD}_pf,$TALL" \
    --shapes 4096x14336,14336x4096,4096x4096 --tokens 1024,2048,4096,8192,16384 --out "$R/f32kern.json" \
    >"$R/f32kern.log" 2>&1
  echo "f32kern rc=$?"
  kern_table "$R/f32kern.json"
}
part_q8bits() {
  echo "== q8bits $(date -u +%T)"
  FORGE_NUM_TEST_Q8_TILES="${DEEP}_msh" timeout "$(budget 110)" python3 -m pytest -q -m gpu -n 8 \
    tests/test_gpu_gluon.py -k 8bit >"$R/q8bits.log" 2>&1
  echo "q8bits rc=$?"; tail -2 "$R/q8bits.log" | cut -c1-200
}
part_q8kern() {
  echo "== q8kern $(date -u +%T)"
  timeout "$(budget 130)" python3 bench/kernels.py --precision 8bit \
    --configs "$CUR,$DEEP,${DEEP}_ms,${DEEP}_msh,$K128" --rounds 3 --shapes 4096x14336,14336x4096,4096x4096 \
    --tokens 1024,2048,3072,4096 --out "$R/q8kern.json" >"$R/q8kern.log" 2>&1
  echo "q8kern rc=$?"
  kern_table "$R/q8kern.json"
}
part_train() {
  A3="--models llama-3b --tokens 4x1024 --steps 5"
  train f32r 60 - --methods forge+graph $A3
  train f32s 60 "FORGE_NUM_GLUON_F32=${SPLIT:-$WSF}" --methods forge+graph $A3
  A8="--models llama-8b --tokens 1x2048 --steps 5"
  train r8 45 - --methods forge_8bit+cl+graph $A8
  train cur8 45 "$CUR" --methods forge_8bit+cl+graph $A8
  train fo8 45 - --methods flashoptim+cl $A8
}
part_verify() {
  echo "== verify $(date -u +%T)"
  timeout "$(budget 150)" python3 -m pytest -q -m gpu -n 8 tests/test_gpu_gluon.py \
    -k "f32 or step_slot or routed_layer or routes_where or rout" >"$R/verify.log" 2>&1
  echo "verify rc=$?"; grep -E "^FAILED|passed|failed" "$R/verify.log" | cut -c1-200 | tail -8
  timeout "$(budget 90)" python3 -m pytest -q -m gpu -n 8 tests/test_gpu_graphs.py >"$R/graphs2.log" 2>&1
  echo "graphs rc=$?"; tail -1 "$R/graphs2.log" | cut -c1-200
}
part_f32train() {
  train f32b1 70 - --methods forge+graph,torch_adamw --models llama-1b --tokens 4x1024 --steps 5
  train f32b3 90 - --methods forge+graph,torch_adamw --models llama-3b --tokens 4x1024 --steps 5
  train f32o3 40 FORGE_NUM_GLUON_F32=0 --methods forge+graph --models llama-3b --tokens 4x1024 --steps 5
}
for part in ${PART//,/ }; do "part_$part"; done
call_end
exit 0
