#!/usr/bin/env bash
# Session 37's second device call (carry .whl), after the barrier fix (every Gluon kernel now invalidates its
# mbarriers at its end, which keeps them allocated for the whole kernel: before, an unused barrier array's
# bytes were reused, the staged tiles' staging slot 0 among them, a TMA destination):
#   consan  ConSan (consan.py) on seven Gluon tiles at once, one process each, in the background
#   flake   flake_where.py (session 36) with the fix: the 8bit route forced on (FORGE_NUM_GLUON_Q8=1, the staged
#           deep cursor at 1024 tokens: 8 of 24 runs parted before), the fp32 wide model with v46's streamed
#           tile forced (1 of 16 before), the 8bit deep cursor forced (1 of 24 before); 4 processes x 6 runs (the deep cursor x 4)
#   f32small v46 (the default fp32 tile streaming W and the states through two TMA slots, ss2) beside the
#           default at 256-1024 tokens on issue 5's five shapes, the launcher's route, the unfused step and the
#           floor in the same run (3 rounds): may v46 be routed below 1024 tokens, if its flake is gone?
#   bits    tests/test_gpu_gluon.py (every Gluon tile's bits against the reference), what the budget allows
PART=${PART:-consan,flake,f32small,bits}
source bench/device_call.sh
call_begin
W=bench/results/2026-12-06-s36/flake_where.py
procs() {  # procs TAG N RUNS ARGS... : N processes of RUNS runs, the environment as exported
  local tag=$1 n=$2 runs=$3; shift 3
  echo "== $tag $(date -u +%T)"
  for p in $(seq "$n"); do timeout "$(budget 120)" python3 $W "$runs" "$tag$p" "$@" >"$R/$tag$p.log" 2>&1 & done
  wait
  grep -h "parted" "$R/$tag"*.log | grep -v Warning | cut -c1-200 | head -8
}
part_consan() {
  for t in q8_staged q8_deep q8_stage_state q8_default f32_default f32_ss2 f32_tall_gb1; do
    ( timeout "$(budget 300)" python3 bench/results/2026-12-06-s37/consan.py $t >"$R/consan_$t.log" 2>&1
      echo "consan $t rc=$?" >>"$R/consan_$t.log" ) &
  done
}
consan_report() {
  wait
  for f in "$R"/consan_*.log; do grep -hE "clean|rc=|ssert|race|Race|rror" "$f" | grep -v Warning | cut -c1-240 | head -6; done
}
part_flake() {
  FORGE_NUM_GLUON_Q8=1 procs q8route 4 6
  FORGE_NUM_GLUON_F32=wsf_64x128x64_st4_w16_rows16_mma96_r96_sl_cur_ss2 procs f32ss2 4 6 --precision fp32
  FORGE_NUM_GLUON_Q8=ws8_64x128x64_st4_w16_rows16_mma96_r96_sl_cur procs q8deep 4 4
}
part_f32small() {
  wait  # ConSan's processes off the GPU before anything is timed
  local D=wsf_64x128x64_st4_w16_rows16_mma96_r96_sl_cur
  timeout "$(budget 240)" python3 bench/kernels.py --precision fp32 --rounds 3 --configs "$D,${D}_ss2" \
    --shapes 4096x4096,14336x4096,4096x14336,8192x8192,28672x8192 --tokens 256,512,768,1024 \
    --out "$R/f32small.json" >"$R/f32small.log" 2>&1
  echo "f32small rc=$?"; kern_table "$R/f32small.json"
}
part_bits() {
  timeout "$(budget 200)" python3 -m pytest -q -m gpu -n 8 tests/test_gpu_gluon.py -k "f32_split_kernel_gives or 8bit_gives or staged_state or nothing_outside" >"$R/bits.log" 2>&1
  echo "bits rc=$?"; grep -E "^FAILED|passed|failed" "$R/bits.log" | cut -c1-200 | tail -8
}
for part in ${PART//,/ }; do "part_$part"; done
[[ $PART == *consan* ]] && consan_report
call_end
exit 0
