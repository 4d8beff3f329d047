#!/usr/bin/env bash
# Session 38's device calls (carry .whl), with the routes the flake case is to clear in the tree: the 8bit Gluon
# route on (gluon_q8.ROUTED) and v46 routed at 256-895 tokens (gluon_f32.ROUTE_BY_K); if the flake case parts, the
# other parts' numbers are set aside with the routes. Machines were scarce, so the parts go in two calls on one
# machine: PART=flake,routes,train8b,ncu16k (the default), then PART=graphs,train31,f32kern,f32small. The flake
# case is session 37's next_call.sh's, the fp32 one in as many processes as the GPU's memory holds (three of four
# ran out of an H100's 80 GB in session 37).
#   flake   flake_where.py: the 8bit route forced on (FORGE_NUM_GLUON_Q8=1: the staged deep cursor at 1024 tokens;
#           8 of 24 runs parted before session 37's barrier fix, on an H200) and the fp32 wide model with v46 forced
#           (1 of 16 before, on an H200); 4 processes x 11 runs (8bit: ~4 s a run after ~40 s of compiling), 4 (3 below
#           100 GB) x 12 (fp32: ~3 s a run)
#   graphs  tests/test_gpu_graphs.py with the 8bit Gluon route on
#   f32small v46 beside the default at 256-1024 tokens on issue 5's shapes, with the route, the unfused step and
#           the floor (3 interleaved rounds)
#   routes  the launchers' route tests, the step slot's launches and the routed training layer; forge-num verify
#           --operands bf16 and kernels.launcher_tile against the launches (tests/test_verify.py)
#   train8b the captured 8bit step with the chunked loss beside FlashOptim with gradient release, 8B 1x2048 (issue
#           5's tokens/s target; its last timings, s35, were with this route on); train31: 3B and 1B 4x1024
#   ncu16k  ncu (SpeedOfLight, MemoryWorkloadAnalysis, DRAM and L2 bytes) of the fp32 route's tile and cuBLAS's dW
#           at 4096x14336 (ncu_mainloop.py), 16384 tokens (is the 128-row tile's mainloop held by L2 throughput?)
#           and 1024 (do the default tile's operand reads miss L2 beside the state's stream: DRAM bytes over the
#           update's 24 B an element?)
#   f32kern the fp32 route, the unfused step and the floor at every K of issue 5 on its five shapes (2 rounds)
PART=${PART:-flake,routes,train8b,ncu16k}
source bench/device_call.sh
call_begin
part_flake() {
  local gib; gib=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
  FORGE_NUM_GLUON_Q8=1 flake q8route 4 11
  FORGE_NUM_GLUON_F32=wsf_64x128x64_st4_w16_rows16_mma96_r96_sl_cur_ss2 flake f32ss2 $(( gib > 100000 ? 4 : 3 )) 12 \
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
part_routes() {
  timeout "$(budget 120)" python3 -m pytest -q -m gpu -n 4 tests/test_verify.py tests/test_gpu_gluon.py \
    -k "the_launcher_routes or step_slot or routed_layer or verify or launcher_tile" >"$R/routes.log" 2>&1
  echo "routes rc=$?"; grep -E "^FAILED|passed|failed" "$R/routes.log" | cut -c1-200 | tail -6
}
part_train8b() {
  A8="--models llama-8b --tokens 1x2048 --steps 5"
  train r8 55 - --methods forge_8bit+cl+graph $A8
  train fo8 55 - --methods flashoptim+cl $A8
}
part_train31() {
  train r3 100 - --methods forge_8bit+cl+graph,flashoptim+cl --models llama-3b --tokens 4x1024 --steps 5
  train r1 80 - --methods forge_8bit+graph,flashoptim+cl --models llama-1b --tokens 4x1024 --steps 5
}
part_ncu16k() {
  for K in 16384 1024; do
    echo "== ncu $K $(date -u +%T)"
    timeout "$(budget 90)" ncu --clock-control none --profile-from-start off --section SpeedOfLight \
      --section MemoryWorkloadAnalysis --metrics dram__bytes_read.sum,dram__bytes_write.sum,lts__t_bytes.sum \
      python3 bench/results/2026-12-07-s38/ncu_mainloop.py 4096x14336 $K >"$R/ncu$K.txt" 2>&1
    echo "ncu rc=$?"
    grep -E "^  [a-zA-Z_].*\(|launcher.s kernel|Duration|L2 Cache Throughput|DRAM Throughput|Compute \(SM\) Throughput|L2 Hit|Mem Busy|Max Bandwidth|dram__bytes|lts__t_bytes" \
      "$R/ncu$K.txt" | cut -c1-110 | head -40
  done
}
part_f32kern() {
  timeout "$(budget 220)" python3 bench/kernels.py --precision fp32 --rounds 2 --configs none \
    --out "$R/f32kern.json" >"$R/f32kern.log" 2>&1
  echo "f32kern rc=$?"; tail -45 "$R/f32kern.log"
}
for part in ${PART//,/ }; do "part_$part"; done
call_end
exit 0
