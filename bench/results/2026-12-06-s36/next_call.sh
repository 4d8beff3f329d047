#!/usr/bin/env bash
# The next session's first device call (written in session 36; carry .whl): NOTES "Next device session (plan,
# written after session 36)", items 1-2. flake_where.py trains the 8bit-hf-wide model twice a run and prints,
# where the runs part, which tensors, tiles and rows differ.
#   canary    tests/test_gpu_gluon.py's test that no kernel writes outside its tensors (guard bytes around each:
#             a write past a tensor would change a neighbour, in a model perhaps another weight)
#   sanitize  compute-sanitizer (Firecracker machines have it: .library/device/KINDS.md) on stress.py's 8bit tiles,
#             one update each from fixed inputs at down_proj's shapes: memcheck (stray global accesses), then
#             racecheck (shared-memory hazards; the async proxy's copies may not be modelled)
#   where     FORGE_NUM_GLUON_Q8=1 (the staged deep cursor at 1024 tokens): four processes x 4 runs, eager
#             against captured; then eager against eager (does the fault need the capture?)
#   blocking  the same, eager against captured, with CUDA_LAUNCH_BLOCKING=1 (does it need launches in flight?)
#   alone     one process, 8 runs (does it need other processes on the GPU?)
#   handover  the staged tile copying at the hand-over instead (mma_stage=2)
#   fp32      the fp32 wide model, routed, then with v46's streamed tile forced (4 x 4 each)
#   f32tall   v46b (the one-buffer 128-row tile streaming its state) beside the default, v46 and the one-buffer
#             128-row tile at 512-3072 tokens: is the 1024-token tile's partial overlap the operands' L2 traffic?
# Too much for one call's 600 s: run it as three, PART=canary,sanitize then PART=where,blocking,alone then
# PART=handover,fp32,f32tall (each part's time is capped by what is left of its call: bench/device_call.sh's budget)
PART=${PART:-canary,sanitize}
source bench/device_call.sh
call_begin
W=bench/results/2026-12-06-s36/flake_where.py
procs() {  # procs TAG N RUNS ARGS... : N processes of RUNS runs, the environment as exported
  local tag=$1 n=$2 runs=$3; shift 3
  echo "== $tag $(date -u +%T)"
  for p in $(seq "$n"); do timeout "$(budget 120)" python3 $W "$runs" "$tag$p" "$@" >"$R/$tag$p.log" 2>&1 & done
  wait
  grep -h "PARTED\|  \|parted" "$R/$tag"*.log | grep -v Warning | cut -c1-300 | head -40
}
part_canary() {
  timeout "$(budget 120)" python3 -m pytest -q -m gpu tests/test_gpu_gluon.py -k nothing_outside >"$R/canary.log" 2>&1
  echo "canary rc=$?"; grep -E "^E  .*changed|^FAILED|passed|failed" "$R/canary.log" | cut -c1-200 | tail -6
}
part_sanitize() {
  for tool in memcheck racecheck; do
    timeout "$(budget 150)" compute-sanitizer --tool $tool --print-limit 20 \
      python3 bench/results/2026-12-06-s36/stress.py 1 8bit >"$R/sanitize_$tool.log" 2>&1
    echo "sanitize $tool rc=$?"; grep -E "ERROR SUMMARY|RACECHECK SUMMARY|Invalid|Race|differ" "$R/sanitize_$tool.log" | cut -c1-200 | head -12
  done
}
part_where() { FORGE_NUM_GLUON_Q8=1 procs where 4 4; FORGE_NUM_GLUON_Q8=1 procs eager 4 4 --eager-eager; }
part_blocking() { FORGE_NUM_GLUON_Q8=1 CUDA_LAUNCH_BLOCKING=1 procs blocking 4 4; }
part_alone() { FORGE_NUM_GLUON_Q8=1 procs alone 1 8; }
part_handover() { FORGE_NUM_GLUON_Q8=ws8_64x128x64_st4_w16_rows16_mma96_r96_sl_cur_msh procs handover 4 4; }
part_fp32() {
  procs fp32 4 4 --precision fp32
  FORGE_NUM_GLUON_F32=wsf_64x128x64_st4_w16_rows16_mma96_r96_sl_cur_ss2 procs fp32ss2 4 4 --precision fp32
}
part_f32tall() {
  local D=wsf_64x128x64_st4_w16_rows16_mma96_r96_sl_cur T=wsf_128x128x64_st3_w8_rows16_mma96_r128_sl_cur_gb1_ss2
  timeout "$(budget 150)" python3 bench/kernels.py --precision fp32 --rounds 2 \
    --configs "$D,${D}_ss2,$T,wsf_128x128x64_st4_w8_rows16_mma96_r128_sl_cur_gb1" \
    --shapes 4096x14336,14336x4096,4096x4096 --tokens 512,1024,2048,3072 --out "$R/f32tall.json" >"$R/f32tall.log" 2>&1
  echo "f32tall rc=$?"; kern_table "$R/f32tall.json"
}
for part in ${PART//,/ }; do "part_$part"; done
call_end
exit 0
