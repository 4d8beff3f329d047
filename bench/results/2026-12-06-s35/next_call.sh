#!/usr/bin/env bash
# The next session's first device call (written in session 35; carry .whl): NOTES "Next device session (plan,
# written after session 35)", item 1.
#   flake  tests/test_gpu_graphs.py's 8bit-hf-wide case repeated (flake.py): four processes at once (call 5 failed
#          under -n 8), eight runs each, with the route (the staged deep cursor at 1024 tokens), then with the deep
#          cursor forced (unstaged), then two processes with the Triton 8bit tile (FORGE_NUM_GLUON_Q8=0)
#   graphs tests/test_gpu_graphs.py whole under -n 8, twice
#   f32bits (second call, PART=f32bits,f32kern) the fp32 split tiles' GPU tests, v45b's one-buffer tiles among them
#   f32kern  the 128-row split tile beside its one-buffer twins (four and five stages) at 3072-16384 tokens, the route,
#          the unfused step and the floor
PART=${PART:-flake,graphs}
source bench/device_call.sh
call_begin
DEEP=ws8_64x128x64_st4_w16_rows16_mma96_r96_sl_cur
FLAKE=bench/results/2026-12-06-s35/flake.py
batch() {  # batch TAG PROCS RUNS FLAG: PROCS processes of RUNS runs each, FORGE_NUM_GLUON_Q8=FLAG (- unset)
  local tag=$1 procs=$2 runs=$3 flag=$4
  echo "== $tag $(date -u +%T)"
  for p in $(seq "$procs"); do
    ( [ "$flag" != - ] && export FORGE_NUM_GLUON_Q8=$flag
      timeout "$(budget 110)" python3 "$FLAKE" "$runs" "$tag$p" >"$R/$tag$p.log" 2>&1 ) &
  done
  wait
  grep -h "differed\|DIFFER" "$R/$tag"*.log | cut -c1-240
}
part_flake() {
  batch routed 4 6 -
  batch deep 4 6 "$DEEP"
  batch triton 2 6 0
}
part_graphs() {
  for i in 1; do
    timeout "$(budget 90)" python3 -m pytest -q -m gpu -n 8 tests/test_gpu_graphs.py >"$R/graphs$i.log" 2>&1
    echo "graphs $i rc=$?"; grep -E "^FAILED|passed|failed" "$R/graphs$i.log" | cut -c1-240 | tail -4
  done
}
TALL=wsf_128x128x64_st3_w8_rows16_mma96_r128_sl_cur
part_f32bits() {
  timeout "$(budget 120)" python3 -m pytest -q -m gpu -n 8 tests/test_gpu_gluon.py -k f32 >"$R/f32bits.log" 2>&1
  echo "f32bits rc=$?"; grep -E "^FAILED|passed|failed" "$R/f32bits.log" | cut -c1-200 | tail -6
}
part_f32kern() {
  timeout "$(budget 150)" python3 bench/kernels.py --precision fp32 --rounds 2 \
    --configs "$TALL,${TALL/st3/st4}_gb1,${TALL/st3/st5}_gb1" --shapes 4096x14336,14336x4096,4096x4096 \
    --tokens 3072,4096,8192,16384 --out "$R/f32kern.json" >"$R/f32kern.log" 2>&1
  echo "f32kern rc=$?"; kern_table "$R/f32kern.json"
}
for part in ${PART//,/ }; do "part_$part"; done
call_end
exit 0
