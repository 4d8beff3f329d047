#!/usr/bin/env bash
# Session 38's device calls (carry .whl). PART picks the parts. The first call, PART=flake,graphs,f32small, is
# session 37's next_call.sh with the fp32 flake case in as many processes as the GPU's memory holds (three of four
# ran out of an H100's 80 GB in session 37); the second runs with the routes the first call cleared: the 8bit Gluon
# route on (gluon_q8.ROUTED) and v46 routed at 256-767 tokens (gluon_f32.ROUTE_BY_K).
#   flake   flake_where.py: the 8bit route forced on (FORGE_NUM_GLUON_Q8=1: the staged deep cursor at 1024 tokens;
#           8 of 24 runs parted before session 37's barrier fix, on an H200) and the fp32 wide model with v46 forced
#           (1 of 16 before, on an H200); 4 (8bit) and 4 or 3 (fp32: 3 below 100 GB) processes x 6 runs each
#   graphs  tests/test_gpu_graphs.py with the 8bit Gluon route on
#   f32small v46 beside the default at 256-1024 tokens on issue 5's shapes, with the route, the unfused step and
#           the floor (3 interleaved rounds)
#   verify  the launchers' route tests, the step slot's launches and the routed training layer; the captured steps
#           against eager (tests/test_gpu_graphs.py)
#   train8  the captured 8bit step with the chunked loss beside FlashOptim with gradient release: 8B 1x2048,
#           3B 4x1024, 1B 4x1024 (issue 5's tokens/s target; its last timings, s35, were with this route on)
#   ncu16k  ncu (SpeedOfLight, MemoryWorkloadAnalysis) of the fp32 route's tile and cuBLAS's dW at 4096x14336,
#           16384 tokens (ncu_mainloop.py): is the 128-row tile's mainloop held by L2 throughput?
#   f32kern the fp32 route, the unfused step and the floor at every K of issue 5 on its five shapes (2 rounds)
PART=${PART:-verify,train8,f32kern}
source bench/device_call.sh
call_begin
part_flake() {
  local gib; gib=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
  FORGE_NUM_GLUON_Q8=1 flake q8route 4 6
  FORGE_NUM_GLUON_F32=wsf_64x128x64_st4_w16_rows16_mma96_r96_sl_cur_ss2 flake f32ss2 $(( gib > 100000 ? 4 : 3 )) 6 \
    --precision fp32
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
part_verify() {
  timeout "$(budget 120)" python3 -m pytest -q -m gpu -n 4 tests/test_gpu_gluon.py \
    -k "the_launcher_routes or step_slot or routed_layer" >"$R/verify.log" 2>&1
  echo "verify rc=$?"; grep -E "^FAILED|passed|failed" "$R/verify.log" | cut -c1-200 | tail -6
  timeout "$(budget 150)" python3 -m pytest -q -m gpu -n 4 tests/test_gpu_graphs.py >"$R/graphs.log" 2>&1
  echo "graphs rc=$?"; grep -E "^FAILED|passed|failed" "$R/graphs.log" | cut -c1-200 | tail -6
}
part_train8() {
  A8="--models llama-8b --tokens 1x2048 --steps 5"
  train r8 50 - --methods forge_8bit+cl+graph $A8
  train fo8 50 - --methods flashoptim+cl $A8
  A3="--models llama-3b --tokens 4x1024 --steps 5"
  train r3 50 - --methods forge_8bit+cl+graph,flashoptim+cl $A3
  train r1 50 - --methods forge_8bit+graph,flashoptim+cl --models llama-1b --tokens 4x1024 --steps 5
}
part_ncu16k() {
  echo "== ncu16k $(date -u +%T)"
  timeout "$(budget 120)" ncu --clock-control none --profile-from-start off --section SpeedOfLight \
    --section MemoryWorkloadAnalysis python3 bench/results/2026-12-07-s38/ncu_mainloop.py 4096x14336 16384 \
    >"$R/ncu16k.txt" 2>&1
  echo "ncu rc=$?"
  grep -E "^  [a-z_]+.*\(|Duration|L2 Cache Throughput|DRAM Throughput|Compute \(SM\) Throughput|Memory Throughput|L2 Hit|Mem Busy|Max Bandwidth" \
    "$R/ncu16k.txt" | cut -c1-110 | head -40
}
part_f32kern() {
  timeout "$(budget 220)" python3 bench/kernels.py --precision fp32 --rounds 2 --configs none \
    --out "$R/f32kern.json" >"$R/f32kern.log" 2>&1
  echo "f32kern rc=$?"; tail -45 "$R/f32kern.log"
}
for part in ${PART//,/ }; do "part_$part"; done
call_end
exit 0
